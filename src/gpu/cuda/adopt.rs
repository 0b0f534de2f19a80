//! Taking over a VMM pool from the daemon this one replaces. Nothing is
//! allocated: the memory is imported from the shareable fd the predecessor
//! handed over, mapped like a pool of our own, and the handed fds become the
//! pool's. The handed dma-buf is kept rather than exported anew, so the queue
//! bindings made on it stay valid and the kernel sees the same buffer.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nix::unistd::{lseek, Whence};

use super::context::Device;
use super::vmm::{Allocation, VmmPool};
use crate::gpu::{GpuError, HandedPool};

/// Takes the handed pool's shareable fd, refusing (before the device is
/// touched) a pool without one: the CUDA backend's only such pools are the
/// legacy IPC ones.
pub(crate) fn take_share_fd(pool: &mut HandedPool) -> Result<OwnedFd, GpuError> {
    pool.share_fd.take().ok_or_else(|| GpuError::CannotAdopt {
        gpu: pool.gpu,
        why: "no shareable fd was handed over: a --gpu_shmem_type file pool (cuMemAlloc memory \
              shared by a CUDA IPC handle) dies with the process that allocated it, so it cannot \
              be taken over"
            .into(),
    })
}

/// Imports the memory behind `share_fd` (taken from `pool`), checks it
/// against the handed record and maps it on `dev`.
pub(crate) fn adopt(dev: Arc<Device>, pool: HandedPool, share_fd: OwnedFd) -> Result<VmmPool, GpuError> {
    let HandedPool { gpu, size, alignment, share_fd: _, dmabuf_fd } = pool;
    let refuse = |why: String| GpuError::CannotAdopt { gpu, why };
    let driver = |source| GpuError::AdoptPool { gpu, source };

    let bytes = usize::try_from(size).map_err(|_| GpuError::SizeTooLarge { gpu, size })?;
    let layout = dev.begin_pool(bytes).map_err(driver)?;
    check_layout(size, alignment, layout.granularity as u64).map_err(refuse)?;
    if let Some(fd) = &dmabuf_fd {
        check_dmabuf_size(fd.as_fd(), size).map_err(refuse)?;
    }

    let allocation = Allocation::import(share_fd.as_fd()).map_err(driver)?;
    let at = allocation.location(layout.prop).map_err(driver)?;
    let want = layout.prop.location;
    if at.type_ != want.type_ || at.id != want.id {
        let why =
            format!("the handed fd is memory of CUDA device {}, not of this GPU (device {})", at.id, want.id);
        return Err(refuse(why));
    }
    VmmPool::adopt(dev, allocation, &layout, share_fd, dmabuf_fd).map_err(driver)
}

/// The handed size and alignment against the driver's allocation
/// granularity: the predecessor rounded its pool to the same granularity, so
/// any difference means the fds are not what the record says.
fn check_layout(size: u64, alignment: u64, granularity: u64) -> Result<(), String> {
    if alignment != granularity {
        return Err(format!(
            "the handed pool's alignment {alignment} is not the driver's allocation granularity {granularity}"
        ));
    }
    if size == 0 || size % granularity != 0 {
        return Err(format!(
            "the handed pool's size {size} is not a multiple of the driver's allocation granularity {granularity}"
        ));
    }
    Ok(())
}

/// A dma-buf reports its size at `SEEK_END` (without moving the shared file
/// offset); it must be the pool's, as the predecessor exported the whole mapping.
fn check_dmabuf_size(fd: BorrowedFd<'_>, size: u64) -> Result<(), String> {
    let end = lseek(fd, 0, Whence::SeekEnd).map_err(|e| format!("the handed dma-buf: lseek: {e}"))?;
    if end as u64 != size {
        return Err(format!("the handed dma-buf has {end} bytes, the pool {size}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::pci::PciAddr;

    const MIB2: u64 = 2 << 20;

    #[test]
    fn ipc_pools_are_refused_before_the_device_is_touched() {
        let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
        let mut pool = HandedPool { gpu, size: MIB2, alignment: MIB2, share_fd: None, dmabuf_fd: None };
        let err = take_share_fd(&mut pool).unwrap_err();
        assert!(matches!(err, GpuError::CannotAdopt { gpu: g, .. } if g == gpu));
        let text = err.to_string();
        assert!(text.starts_with("GPU 0000:04:00.0: taking the pool over: no shareable fd"), "{text}");
        assert!(text.contains("--gpu_shmem_type file") && text.contains("dies with the process"), "{text}");
        let memfd =
            nix::sys::memfd::memfd_create("adopt-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
        let mut pool = HandedPool { share_fd: Some(memfd), ..pool };
        assert!(take_share_fd(&mut pool).is_ok());
        assert!(pool.share_fd.is_none(), "taken out of the record");
    }

    #[test]
    fn layout_must_match_the_granularity() {
        assert_eq!(check_layout(3 * MIB2, MIB2, MIB2), Ok(()));
        let odd = check_layout(MIB2 + 4096, MIB2, MIB2).unwrap_err();
        assert!(
            odd.contains("size 2101248 is not a multiple of the driver's allocation granularity 2097152"),
            "{odd}"
        );
        assert!(check_layout(0, MIB2, MIB2).unwrap_err().contains("size 0"));
        let align = check_layout(MIB2, 4096, MIB2).unwrap_err();
        assert!(
            align.contains("alignment 4096 is not the driver's allocation granularity 2097152"),
            "{align}"
        );
    }

    #[test]
    fn dmabuf_size_is_read_at_seek_end() {
        use nix::sys::memfd::{memfd_create, MFdFlags};
        // A memfd reports its size at SEEK_END as a dma-buf does (it also
        // moves its offset there, which a dma-buf does not).
        let fd = memfd_create("adopt-test", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, 8192).unwrap();
        assert_eq!(check_dmabuf_size(fd.as_fd(), 8192), Ok(()));
        let err = check_dmabuf_size(fd.as_fd(), 4096).unwrap_err();
        assert_eq!(err, "the handed dma-buf has 8192 bytes, the pool 4096");
    }
}
