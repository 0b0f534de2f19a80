//! `cuda` pool backend: one CUDA VMM allocation per GPU, exported as a POSIX fd
//! for clients and as a dma-buf for queue binding.
//!
//! The driver library is loaded at run time (cudarc `dynamic-loading`), so the
//! binary builds and runs on machines without CUDA: [`CudaAllocator::new`]
//! checks for `libcuda` and for every entry point we call before touching the
//! driver, and reports [`GpuError::Unavailable`] instead of panicking. The
//! library is looked for where GKE and the GPU Operator put it
//! ([`driver_lib`](super::driver_lib) has the order), and the file loaded is
//! reported ([`CudaAllocator::driver`]).
//!
//! Contexts: each device's primary context is retained once (per allocator) and
//! made current on whichever thread allocates or frees, so pools can be created
//! in parallel and dropped from any thread.

mod adopt;
mod context;
mod error;
mod ipc;
mod vmm;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use self::context::Device;
use self::error::check;
pub use self::error::{CudaError, LoadError};
use super::driver_lib::{self, DriverLibError, DriverLibrary, Found};
use super::{GpuError, HandedPool, PoolAllocator, RxPool, ShmemType};
use crate::types::pci::PciAddr;

/// Every driver entry point this backend (and cudarc underneath it) resolves.
/// cudarc panics on a missing symbol, so we check them all up front: an old
/// driver then fails with a message instead of aborting mid-allocation.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetByPCIBusId",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetHandleForAddressRange",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuIpcGetMemHandle",
];

/// The names libcuda is asked for, in cudarc's order of preference.
const LIBCUDA: [&str; 2] = ["libcuda.so", "libcuda.so.1"];

/// The CUDA driver library as loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDriver {
    /// The file mapped, as the loader reports it.
    pub path: Option<PathBuf>,
    /// How the search found it.
    pub found: Found,
}

impl std::fmt::Display for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{} ({})", p.display(), self.found),
            None => write!(f, "libcuda ({})", self.found),
        }
    }
}

/// libcuda, found and loaded once per process; it stays loaded, so that
/// cudarc's own lookup by name gets this file (see `driver_lib`).
fn locate() -> &'static Result<DriverLibrary, DriverLibError> {
    static LIB: OnceLock<Result<DriverLibrary, DriverLibError>> = OnceLock::new();
    LIB.get_or_init(|| driver_lib::open(&LIBCUDA, &driver_lib::search_dirs()))
}

/// Loads libcuda and initialises the driver once per process.
fn init_driver() -> Result<CudaDriver, GpuError> {
    static INIT: OnceLock<Result<CudaDriver, LoadError>> = OnceLock::new();
    INIT.get_or_init(|| {
        let found = locate().as_ref().map_err(|e| LoadError::NoLibrary(e.clone()))?;
        // SAFETY: only tries to dlopen the library by its candidate names.
        if !unsafe { sys::is_culib_present() } {
            let path = found.path_of_symbol("cuInit").unwrap_or_else(|| PathBuf::from(LIBCUDA[1]));
            return Err(LoadError::NotByName(path.display().to_string()));
        }
        // SAFETY: presence was checked just above, so `culib` finds the library
        // instead of panicking; `get` only looks symbols up, it calls nothing.
        let lib = unsafe { sys::culib() };
        for name in REQUIRED_SYMBOLS {
            // SAFETY: symbol lookup only; the pointer is never called here.
            if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
                return Err(LoadError::MissingSymbol(name));
            }
        }
        // The file cudarc uses, from one of its symbols.
        // SAFETY: symbol lookup only; the address is only passed to dladdr.
        let path = unsafe { lib.get::<*const std::ffi::c_void>(b"cuInit") }
            .ok()
            // SAFETY: the symbol's address, valid while libcuda stays loaded (for good).
            .and_then(|s| unsafe { s.try_as_raw_ptr() })
            .and_then(|p| driver_lib::loaded_from(p as usize));
        // SAFETY: cuInit takes flags by value and may be called from any thread.
        check("cuInit", unsafe { sys::cuInit(0) }).map_err(LoadError::Init)?;
        Ok(CudaDriver { path, found: found.found.clone() })
    })
    .clone()
    .map_err(GpuError::Unavailable)
}

/// Parses the driver's PCI bus id (`dddd:bb:dd.f`, the domain sometimes with 8
/// digits) into our normalised form.
fn parse_bus_id(raw: &str) -> Option<PciAddr> {
    let (domain, rest) = raw.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok().filter(|d| *d <= 0xffff)?;
    format!("{domain:04x}:{rest}").parse().ok()
}

/// Lazily opened devices; each slot has its own lock so that opening (context
/// creation, ~100 ms) runs in parallel across GPUs.
type DeviceSlot = Arc<Mutex<Option<Arc<Device>>>>;

/// `--gpu_backend cuda`.
#[derive(Debug)]
pub struct CudaAllocator {
    devices: Mutex<HashMap<PciAddr, DeviceSlot>>,
    driver: CudaDriver,
}

impl CudaAllocator {
    /// Loads the driver. Fails with [`GpuError::Unavailable`] (never panics)
    /// when libcuda is missing, too old, or finds no usable device.
    pub fn new() -> Result<CudaAllocator, GpuError> {
        let driver = init_driver()?;
        Ok(CudaAllocator { devices: Mutex::new(HashMap::new()), driver })
    }

    /// Whether the CUDA driver library can be loaded, without initialising it
    /// (`--gpu_backend auto`).
    pub fn driver_present() -> bool {
        locate().is_ok()
    }

    /// Why libcuda could not be found or loaded, without initialising it.
    pub fn driver_missing() -> Option<LoadError> {
        locate().as_ref().err().map(|e| LoadError::NoLibrary(e.clone()))
    }

    /// The driver library in use: its file and how it was found.
    pub fn driver(&self) -> &CudaDriver {
        &self.driver
    }

    /// The driver's CUDA version as `major.minor` (`cuDriverGetVersion`).
    pub fn driver_version(&self) -> Result<String, GpuError> {
        let mut v = 0;
        // SAFETY: valid out-pointer; the driver is initialised (see `new`).
        check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut v) })
            .map_err(GpuError::DriverVersion)?;
        Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    /// `GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED` for `pci` (opens the device).
    pub fn rdma_with_vmm(&self, pci: PciAddr) -> Result<bool, GpuError> {
        self.device(pci).map(|d| d.rdma_vmm)
    }

    fn device(&self, pci: PciAddr) -> Result<Arc<Device>, GpuError> {
        let slot = {
            let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(devices.entry(pci).or_default())
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dev) = slot.as_ref() {
            return Ok(Arc::clone(dev));
        }
        let dev = Arc::new(Device::open(pci)?);
        *slot = Some(Arc::clone(&dev));
        Ok(dev)
    }
}

impl PoolAllocator for CudaAllocator {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn supports(&self, _shmem: ShmemType) -> bool {
        true
    }

    fn visible_gpus(&self) -> Result<Option<Vec<PciAddr>>, GpuError> {
        let mut count = 0;
        // SAFETY: valid out-pointer; the driver is initialised (see `new`).
        check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })
            .map_err(GpuError::ListDevices)?;
        let mut gpus = Vec::new();
        for i in 0..count {
            let mut ordinal = 0;
            // SAFETY: valid out-pointer, ordinal below the device count.
            check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut ordinal, i) })
                .map_err(GpuError::ListDevices)?;
            let mut buf = [0 as std::ffi::c_char; 32];
            // SAFETY: the driver writes at most `len` bytes, NUL included.
            check("cuDeviceGetPCIBusId", unsafe {
                sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, ordinal)
            })
            .map_err(GpuError::ListDevices)?;
            let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            let raw = String::from_utf8_lossy(&bytes).into_owned();
            let pci = parse_bus_id(&raw).ok_or(GpuError::BadBusId(raw))?;
            gpus.push(pci);
        }
        Ok(Some(gpus))
    }

    fn allocate(&self, gpu: PciAddr, size: u64, shmem: ShmemType) -> Result<Box<dyn RxPool>, GpuError> {
        let dev = self.device(gpu)?;
        let bytes = usize::try_from(size).map_err(|_| GpuError::SizeTooLarge { gpu, size })?;
        let pool: Result<Box<dyn RxPool>, CudaError> = match shmem {
            ShmemType::Fd => vmm::VmmPool::create(dev, bytes).map(|p| Box::new(p) as _),
            ShmemType::File => ipc::IpcPool::create(dev, bytes).map(|p| Box::new(p) as _),
        };
        pool.map_err(|source| GpuError::CreatePool { gpu, source })
    }

    /// Imports the pool's memory from its handed shareable fd and keeps the
    /// handed dma-buf; refuses legacy IPC pools, which have no such fd.
    fn prepare(&self, gpus: &[PciAddr]) -> Result<(), GpuError> {
        // Contexts open per GPU in parallel, as allocation does.
        std::thread::scope(|s| {
            let opened: Vec<_> =
                gpus.iter().map(|&gpu| (gpu, s.spawn(move || self.device(gpu).map(drop)))).collect();
            opened
                .into_iter()
                .try_for_each(|(gpu, h)| h.join().unwrap_or(Err(GpuError::WorkerPanicked { gpu })))
        })
    }

    fn adopt(&self, mut pool: HandedPool) -> Result<Box<dyn RxPool>, GpuError> {
        let share_fd = adopt::take_share_fd(&mut pool)?;
        let dev = self.device(pool.gpu)?;
        adopt::adopt(dev, pool, share_fd).map(|p| Box::new(p) as _)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(parse_bus_id("0000:04:00.0").unwrap().to_string(), "0000:04:00.0");
        assert_eq!(parse_bus_id("00000000:8A:00.0").unwrap().to_string(), "0000:8a:00.0");
        assert!(parse_bus_id("100000:04:00.0").is_none());
        assert!(parse_bus_id("garbage").is_none());
    }

    #[test]
    fn without_libcuda_new_is_a_clean_error() {
        if CudaAllocator::driver_present() {
            return; // a machine with a driver: covered by the device check instead
        }
        match CudaAllocator::new() {
            Err(GpuError::Unavailable(e @ LoadError::NoLibrary(_))) => {
                let text = e.to_string();
                assert!(text.contains("libcuda.so not found"), "{text}");
                // Every place searched is named.
                for dir in driver_lib::search_dirs() {
                    assert!(text.contains(&dir.display().to_string()), "{text}");
                }
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        // Twice: the cached outcome must stay an error, not a panic.
        assert!(matches!(CudaAllocator::new(), Err(GpuError::Unavailable(_))));
    }
}
