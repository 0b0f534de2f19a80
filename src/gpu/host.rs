//! `host` pool backend: a sealed-size memfd per GPU, shared exactly like a
//! CUDA VMM fd. Lets the whole daemon run (and be tested) without GPUs.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::unistd::ftruncate;

use super::{GpuError, HandedPool, PoolAllocator, RxPool, ShmemType};
use crate::types::pci::PciAddr;

const PAGE: u64 = 4096;

#[derive(Debug, Default)]
pub struct HostAllocator;

/// A memfd standing in for a GPU's memory.
#[derive(Debug)]
pub struct HostPool {
    gpu: PciAddr,
    fd: OwnedFd,
    size: u64,
    /// Unit tests of the binders: the memfd also stands in for a dma-buf.
    fake_dmabuf: bool,
}

impl HostPool {
    /// A pool of at least `size` bytes, rounded up to whole pages.
    pub fn new(gpu: PciAddr, size: u64) -> Result<HostPool, GpuError> {
        let size = size.div_ceil(PAGE).max(1) * PAGE;
        let name = format!("tcpx-rxdm-pool-{gpu}");
        let fd = memfd_create(name.as_str(), MFdFlags::MFD_CLOEXEC)
            .map_err(|source| GpuError::CreateMemfd { gpu, source })?;
        let len = i64::try_from(size).map_err(|_| GpuError::SizeTooLarge { gpu, size })?;
        ftruncate(&fd, len).map_err(|source| GpuError::SizeMemfd { gpu, source })?;
        Ok(HostPool { gpu, fd, size, fake_dmabuf: false })
    }

    /// A one-page pool whose memfd is also offered as its dma-buf, so the
    /// binders can be driven without a GPU (the kernel refuses it as one).
    #[cfg(test)]
    pub(crate) fn with_fake_dmabuf() -> HostPool {
        let gpu = "0000:04:00.0".parse().expect("valid PCI address");
        HostPool { fake_dmabuf: true, ..HostPool::new(gpu, PAGE).expect("memfd pool") }
    }
}

impl PoolAllocator for HostAllocator {
    fn backend(&self) -> &'static str {
        "host"
    }

    fn supports(&self, shmem: ShmemType) -> bool {
        // A memfd has an fd to share but no CUDA IPC handle.
        shmem == ShmemType::Fd
    }

    fn allocate(&self, gpu: PciAddr, size: u64, shmem: ShmemType) -> Result<Box<dyn RxPool>, GpuError> {
        if !self.supports(shmem) {
            return Err(GpuError::Unsupported { gpu, shmem });
        }
        Ok(Box::new(HostPool::new(gpu, size)?))
    }

    fn adopt(&self, pool: HandedPool) -> Result<Box<dyn RxPool>, GpuError> {
        let gpu = pool.gpu;
        let fd = pool
            .share_fd
            .ok_or_else(|| GpuError::CannotAdopt { gpu, why: "no memfd was handed over".into() })?;
        let st = nix::sys::stat::fstat(&fd)
            .map_err(|e| GpuError::CannotAdopt { gpu, why: format!("fstat of the handed memfd: {e}") })?;
        if st.st_size as u64 != pool.size {
            let why = format!("the handed memfd has {} bytes, the pool {}", st.st_size, pool.size);
            return Err(GpuError::CannotAdopt { gpu, why });
        }
        Ok(Box::new(HostPool { gpu, fd, size: pool.size, fake_dmabuf: false }))
    }
}

impl RxPool for HostPool {
    fn share_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn alignment(&self) -> u64 {
        PAGE
    }

    fn dmabuf_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fake_dmabuf.then(|| self.fd.as_fd())
    }

    fn describe(&self) -> String {
        format!("memfd pool for {} ({} bytes)", self.gpu, self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::fstat;

    #[test]
    fn pool_fd_has_rounded_size() {
        let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
        let pool = HostAllocator.allocate(gpu, 10_000, ShmemType::Fd).unwrap();
        assert_eq!(pool.size(), 12_288);
        let st = fstat(pool.share_fd().unwrap()).unwrap();
        assert_eq!(st.st_size as u64, pool.size());
        assert!(HostAllocator.allocate(gpu, 1, ShmemType::File).is_err());
        assert!(pool.dmabuf_fd().is_none(), "a memfd is no dma-buf");
    }

    #[test]
    fn adopted_pool_is_the_same_memory() {
        use std::os::fd::AsFd;
        let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
        let pool = HostAllocator.allocate(gpu, 8192, ShmemType::Fd).unwrap();
        nix::sys::uio::pwrite(pool.share_fd().unwrap(), b"kept", 100).unwrap();
        let fd = pool.share_fd().unwrap().try_clone_to_owned().unwrap();
        let handed = |size| HandedPool {
            gpu,
            size,
            alignment: PAGE,
            share_fd: Some(fd.try_clone().unwrap()),
            dmabuf_fd: None,
        };
        let adopted = HostAllocator.adopt(handed(8192)).unwrap();
        drop(pool);
        let mut back = [0u8; 4];
        nix::sys::uio::pread(adopted.share_fd().unwrap().as_fd(), &mut back, 100).unwrap();
        assert_eq!(&back, b"kept");
        let err = HostAllocator.adopt(handed(4096)).unwrap_err().to_string();
        assert!(err.contains("has 8192 bytes, the pool 4096"), "{err}");
        let none = HandedPool { share_fd: None, ..handed(8192) };
        assert!(HostAllocator.adopt(none).unwrap_err().to_string().contains("no memfd"));
    }
}
