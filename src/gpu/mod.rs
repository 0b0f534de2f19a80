//! GPU receive pools: the [`PoolAllocator`] trait, its backends, and the
//! [`QueueBinder`] trait that attaches a pool to a NIC's receive queues.

pub mod host;

use std::fmt::Debug;
use std::os::fd::BorrowedFd;

use crate::config::pci::PciAddr;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("GPU {gpu}: {op} failed: {msg}")]
    Op { gpu: String, op: &'static str, msg: String },
    #[error("GPU backend unavailable: {0}")]
    Unavailable(String),
    #[error("GPU {0} not found")]
    NotFound(String),
}

/// One allocated receive pool. Dropping it frees the memory (backend specific).
pub trait RxPool: Send + Sync + Debug {
    /// The shareable fd handed to clients on `get_gpu_fd_<pci>`.
    fn share_fd(&self) -> BorrowedFd<'_>;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShmemType {
    /// VMM memory exported as a POSIX fd.
    Fd,
    /// Legacy CUDA IPC memory handle.
    File,
}

/// Allocates pools.
pub trait PoolAllocator: Send + Sync {
    fn backend(&self) -> &'static str;
    /// GPUs this backend can see, for presets that place GPUs from discovery
    /// (`sim` with real CUDA GPUs). `None`: the backend follows the topology.
    fn visible_gpus(&self) -> Result<Option<Vec<PciAddr>>, GpuError> {
        Ok(None)
    }
    fn allocate(&self, gpu: PciAddr, size: u64, shmem: ShmemType) -> Result<Box<dyn RxPool>, GpuError>;
}

#[derive(Debug, thiserror::Error)]
#[error("binding {gpu} to {ifname} queues {queues:?}: {msg}")]
pub struct BindError {
    pub gpu: String,
    pub ifname: String,
    pub queues: Vec<u32>,
    pub msg: String,
}

/// A live binding; dropping it unbinds.
pub trait Binding: Send + Sync + Debug {
    fn describe(&self) -> String;
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

/// `--bind_backend none`: pools are shared but not bound.
#[derive(Debug, Default)]
pub struct NoBinder;

#[derive(Debug)]
struct NoBinding;

impl Binding for NoBinding {
    fn describe(&self) -> String {
        "unbound".into()
    }
}

impl QueueBinder for NoBinder {
    fn backend(&self) -> &'static str {
        "none"
    }

    fn bind(
        &self,
        _pool: &dyn RxPool,
        _gpu: PciAddr,
        _ifname: &str,
        _nic_pci: Option<PciAddr>,
        _queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError> {
        Ok(Box::new(NoBinding))
    }
}
