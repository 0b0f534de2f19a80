//! GPU receive pools: the [`PoolAllocator`] trait, its backends, and the
//! [`QueueBinder`] trait that attaches a pool to a NIC's receive queues.

mod binder;
mod cuda;
mod devmem;
pub mod driver_lib;
mod error;
mod host;
pub mod mig;
pub mod nvml;
mod placement;
mod recording;
mod tcpx;

use std::fmt::Debug;
use std::os::fd::{BorrowedFd, OwnedFd};

pub use self::binder::{select_binder, BinderKind};
pub use self::cuda::{CudaAllocator, CudaDriver, CudaError, LoadError};
pub use self::devmem::{
    bind_rx_request, netdev_family, DevmemBinder, DevmemError, NETDEV_A_DMABUF_QUEUES, NETDEV_CMD_BIND_RX,
    NETDEV_FAMILY_NAME,
};
pub use self::error::{BindError, BindFailure, GpuError};
pub use self::host::HostAllocator;
pub use self::placement::{spread_gpus, PlacementError};
pub use self::recording::{GpuCall, GpuRecorder, InjectedFailure, RecordingAllocator, RecordingBinder};
pub use self::tcpx::TcpxError;
use crate::types::pci::PciAddr;

/// One allocated receive pool. Dropping it frees the memory (backend specific).
pub trait RxPool: Send + Sync + Debug {
    /// The shareable fd handed to clients on `get_gpu_fd_<pci>`. `None` for
    /// pools shared only by a legacy IPC handle (`--gpu_shmem_type file`).
    fn share_fd(&self) -> Option<BorrowedFd<'_>>;
    /// Pool size in bytes (rounded to the allocation granularity).
    fn size(&self) -> u64;
    /// Alignment (allocation granularity) in bytes.
    fn alignment(&self) -> u64;
    /// A dma-buf fd of the pool's memory, for queue binding, if the backend has one.
    fn dmabuf_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// The 64-byte legacy CUDA IPC handle (`--gpu_shmem_type file`).
    fn ipc_handle(&self) -> Option<[u8; 64]> {
        None
    }
    /// Free-form description for `/debug/config`.
    fn describe(&self) -> String;
}

/// How the pool is shared with clients (`--gpu_shmem_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmemType {
    /// VMM memory exported as a POSIX fd.
    Fd,
    /// Legacy CUDA IPC memory handle.
    File,
}

impl ShmemType {
    /// The flag's words, in the order of the variants.
    pub const NAMES: &'static [&'static str] = &["fd", "file"];

    /// The flag's word for this type.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl std::str::FromStr for ShmemType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fd" => Ok(ShmemType::Fd),
            "file" => Ok(ShmemType::File),
            _ => Err(format!("unknown shared memory type \"{s}\" (fd or file)")),
        }
    }
}

/// Allocates pools.
pub trait PoolAllocator: Send + Sync {
    /// The backend's name, for logs and `/debug/config`; decide on [`supports`](Self::supports).
    fn backend(&self) -> &'static str;
    /// Whether this backend can share its pools as `shmem`.
    fn supports(&self, shmem: ShmemType) -> bool;
    /// GPUs this backend can see, for presets that place GPUs from discovery
    /// (`sim` with real CUDA GPUs). `None`: the backend follows the topology.
    fn visible_gpus(&self) -> Result<Option<Vec<PciAddr>>, GpuError> {
        Ok(None)
    }
    fn allocate(&self, gpu: PciAddr, size: u64, shmem: ShmemType) -> Result<Box<dyn RxPool>, GpuError>;
    /// Takes over a pool that the daemon this one replaces allocated, from
    /// the fds it handed over: nothing is allocated, the memory stays the
    /// same. Backends whose pools cannot outlive their process refuse.
    /// Gets ready to adopt pools on `gpus` (opens each GPU's context), so that
    /// a takeover does this before the running daemon pauses, not during.
    fn prepare(&self, gpus: &[PciAddr]) -> Result<(), GpuError> {
        let _ = gpus;
        Ok(())
    }
    fn adopt(&self, pool: HandedPool) -> Result<Box<dyn RxPool>, GpuError> {
        Err(GpuError::CannotAdopt {
            gpu: pool.gpu,
            why: format!("the {} backend cannot take pools over", self.backend()),
        })
    }
}

/// A pool as one daemon hands it to its successor: the fds that keep its
/// memory alive and what the pool is.
#[derive(Debug)]
pub struct HandedPool {
    pub gpu: PciAddr,
    pub size: u64,
    pub alignment: u64,
    /// The fd clients import (the pool's shareable handle).
    pub share_fd: Option<OwnedFd>,
    /// The pool's dma-buf, where it has one (queue binding holds it too).
    pub dmabuf_fd: Option<OwnedFd>,
}

/// Allocates one pool per `(gpu, size)` request, all GPUs in parallel (one
/// thread each: CUDA context creation and pinning dominate and do not
/// serialise across devices). Results come back in request order.
pub fn allocate_all(
    allocator: &dyn PoolAllocator,
    requests: &[(PciAddr, u64)],
    shmem: ShmemType,
) -> Vec<Result<Box<dyn RxPool>, GpuError>> {
    per_gpu(requests.to_vec(), |gpu, size| allocator.allocate(gpu, size, shmem))
}

/// Adopts the pools a predecessor handed over, all GPUs in parallel as
/// [`allocate_all`] does (opening each GPU's context dominates). Results
/// come back in the order of `pools`.
pub fn adopt_all(
    allocator: &dyn PoolAllocator,
    pools: Vec<HandedPool>,
) -> Vec<Result<Box<dyn RxPool>, GpuError>> {
    let work = pools.into_iter().map(|p| (p.gpu, p)).collect();
    per_gpu(work, |_, pool| allocator.adopt(pool))
}

/// Runs `f` once per item, one thread per item (inline for a single one).
fn per_gpu<T: Send>(
    work: Vec<(PciAddr, T)>,
    f: impl Fn(PciAddr, T) -> Result<Box<dyn RxPool>, GpuError> + Sync,
) -> Vec<Result<Box<dyn RxPool>, GpuError>> {
    if work.len() == 1 {
        return work.into_iter().map(|(gpu, item)| f(gpu, item)).collect();
    }
    let f = &f;
    std::thread::scope(|scope| {
        let workers: Vec<_> = work
            .into_iter()
            .map(|(gpu, item)| {
                let worker = std::thread::Builder::new()
                    .name(format!("pool-{gpu}"))
                    .spawn_scoped(scope, move || f(gpu, item));
                (gpu, worker)
            })
            .collect();
        workers
            .into_iter()
            .map(|(gpu, worker)| match worker {
                Ok(handle) => handle.join().unwrap_or(Err(GpuError::WorkerPanicked { gpu })),
                Err(source) => Err(GpuError::SpawnWorker { gpu, source }),
            })
            .collect()
    })
}

/// A live binding; dropping it unbinds.
pub trait Binding: Send + Sync + Debug {
    fn describe(&self) -> String;
    /// The kernel's id for a devmem binding (`NETDEV_A_DMABUF_ID`), shown in
    /// `/debug/config`.
    fn dmabuf_id(&self) -> Option<u32> {
        None
    }
    /// The fds whose being open keeps the binding alive (a TCPX pages fd,
    /// the devmem netlink socket): a takeover hands them to the successor.
    fn handover_fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }
}

/// A binding taken over from the daemon this one replaced: the kernel keeps
/// the queues bound while these fds are open; dropping closes them (unbinds).
#[derive(Debug)]
pub struct AdoptedBinding {
    pub fds: Vec<OwnedFd>,
    pub description: String,
    pub dmabuf_id: Option<u32>,
}

impl Binding for AdoptedBinding {
    fn describe(&self) -> String {
        format!("{} (taken over)", self.description)
    }

    fn dmabuf_id(&self) -> Option<u32> {
        self.dmabuf_id
    }

    fn handover_fds(&self) -> Vec<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.fds.iter().map(|f| f.as_fd()).collect()
    }
}

/// Attaches pools to NIC receive queues (`--bind_backend`).
pub trait QueueBinder: Send + Sync {
    fn backend(&self) -> &'static str;
    fn bind(
        &self,
        pool: &dyn RxPool,
        gpu: PciAddr,
        ifname: &str,
        nic_pci: Option<PciAddr>,
        queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_all_keeps_request_order_and_per_gpu_errors() {
        let a: PciAddr = "0000:04:00.0".parse().unwrap();
        let b: PciAddr = "0000:05:00.0".parse().unwrap();
        let pools = allocate_all(&host::HostAllocator, &[(a, 10_000), (b, 1), (a, 4096)], ShmemType::Fd);
        let sizes: Vec<u64> = pools.iter().map(|p| p.as_ref().unwrap().size()).collect();
        assert_eq!(sizes, [12_288, 4096, 4096]);
        assert!(pools[0].as_ref().unwrap().describe().contains("0000:04:00.0"));
        let failed = allocate_all(&host::HostAllocator, &[(a, 1), (b, 1)], ShmemType::File);
        assert!(failed
            .iter()
            .all(|r| matches!(r, Err(GpuError::Unsupported { shmem: ShmemType::File, .. }))));
        assert!(allocate_all(&host::HostAllocator, &[], ShmemType::Fd).is_empty());
    }

    #[test]
    fn adopt_all_keeps_order_and_per_pool_errors() {
        let a: PciAddr = "0000:04:00.0".parse().unwrap();
        let b: PciAddr = "0000:05:00.0".parse().unwrap();
        let pools = allocate_all(&host::HostAllocator, &[(a, 8192), (b, 4096)], ShmemType::Fd);
        let hand = |pool: &dyn RxPool, gpu, size| HandedPool {
            gpu,
            size,
            alignment: pool.alignment(),
            share_fd: pool.share_fd().map(|f| f.try_clone_to_owned().unwrap()),
            dmabuf_fd: None,
        };
        let (pa, pb) = (pools[0].as_ref().unwrap(), pools[1].as_ref().unwrap());
        let adopted =
            adopt_all(&host::HostAllocator, vec![hand(pb.as_ref(), b, 4096), hand(pa.as_ref(), a, 4096)]);
        assert_eq!(adopted[0].as_ref().unwrap().size(), 4096);
        assert!(adopted[0].as_ref().unwrap().describe().contains("0000:05:00.0"));
        let err = adopted[1].as_ref().unwrap_err();
        assert!(matches!(err, GpuError::CannotAdopt { gpu, .. } if *gpu == a), "{err}");
        let one = adopt_all(&host::HostAllocator, vec![hand(pa.as_ref(), a, 8192)]);
        assert_eq!(one[0].as_ref().unwrap().size(), 8192);
        assert!(adopt_all(&host::HostAllocator, Vec::new()).is_empty());
    }
}
