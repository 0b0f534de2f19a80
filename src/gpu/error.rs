//! The GPU layer's errors: what failed, on which GPU, and the typed cause.

use nix::errno::Errno;

use super::cuda::{CudaError, LoadError};
use super::devmem::DevmemError;
use super::recording::InjectedFailure;
use super::tcpx::TcpxError;
use super::ShmemType;
use crate::types::pci::PciAddr;

/// Why allocating a pool, or asking the backend about its GPUs, failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The backend cannot run on this host (no driver, or one too old).
    #[error("GPU backend unavailable: {0}")]
    Unavailable(#[from] LoadError),
    #[error("GPU {0} not found (no CUDA device at this PCI address)")]
    NotFound(PciAddr),
    #[error("GPU {gpu}: opening the device: {source}")]
    OpenDevice { gpu: PciAddr, source: CudaError },
    #[error("GPU {gpu}: creating the pool: {source}")]
    CreatePool { gpu: PciAddr, source: CudaError },
    #[error("listing the CUDA devices: {0}")]
    ListDevices(#[source] CudaError),
    #[error("listing the CUDA devices: unparsable PCI bus id \"{}\"", .0.escape_debug())]
    BadBusId(String),
    #[error("asking the CUDA driver version: {0}")]
    DriverVersion(#[source] CudaError),
    #[error("GPU {gpu}: pool size {size} does not fit this host's address space")]
    SizeTooLarge { gpu: PciAddr, size: u64 },
    #[error("GPU {gpu}: --gpu_shmem_type={} needs the cuda backend", shmem.name())]
    Unsupported { gpu: PciAddr, shmem: ShmemType },
    #[error("GPU {gpu}: memfd_create failed: {source}")]
    CreateMemfd { gpu: PciAddr, source: Errno },
    #[error("GPU {gpu}: ftruncate failed: {source}")]
    SizeMemfd { gpu: PciAddr, source: Errno },
    #[error("GPU {gpu}: spawning the allocation thread failed: {source}")]
    SpawnWorker { gpu: PciAddr, source: std::io::Error },
    #[error("GPU {gpu}: the allocation thread panicked")]
    WorkerPanicked { gpu: PciAddr },
    #[error("GPU {gpu}: taking the pool over: {why}")]
    CannotAdopt { gpu: PciAddr, why: String },
    /// A driver call failed while importing or mapping a handed pool.
    #[error("GPU {gpu}: taking the pool over: {source}")]
    AdoptPool { gpu: PciAddr, source: CudaError },
    /// A failure a test asked the recording allocator for.
    #[error(transparent)]
    Injected(#[from] InjectedFailure),
}

/// Binding one GPU's pool to a NIC's queues failed: where, and the binder's own error.
#[derive(Debug, thiserror::Error)]
#[error("binding {gpu} to {ifname} queues {}: {cause}", crate::types::list(.queues))]
pub struct BindError {
    pub gpu: PciAddr,
    pub ifname: String,
    pub queues: Vec<u32>,
    #[source]
    pub cause: BindFailure,
}

impl BindError {
    pub fn new(gpu: PciAddr, ifname: &str, queues: &[u32], cause: impl Into<BindFailure>) -> Self {
        BindError { gpu, ifname: ifname.into(), queues: queues.to_vec(), cause: cause.into() }
    }
}

/// The binder's own error inside a [`BindError`].
#[derive(Debug, thiserror::Error)]
pub enum BindFailure {
    #[error("tcpx: {0}")]
    Tcpx(#[from] TcpxError),
    /// Boxed, as the largest: every bind returns this error type.
    #[error("devmem: {0}")]
    Devmem(#[source] Box<DevmemError>),
    /// `--bind_backend auto`: the kernel has no TCPX ioctls and devmem failed too.
    #[error(
        "no queue binder works on this host: tcpx: {tcpx}; devmem: {devmem} \
         (--bind_backend=none shares pools without binding)"
    )]
    NoBinderWorks { tcpx: TcpxError, devmem: Box<DevmemError> },
    /// A failure a test asked the recording binder for.
    #[error(transparent)]
    Injected(#[from] InjectedFailure),
}

impl From<DevmemError> for BindFailure {
    fn from(e: DevmemError) -> Self {
        BindFailure::Devmem(Box::new(e))
    }
}
