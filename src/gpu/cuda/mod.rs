//! `cuda` pool backend: one CUDA VMM allocation per GPU, exported as a POSIX fd
//! for clients and as a dma-buf for queue binding.
//!
//! The driver library is loaded at run time (cudarc `dynamic-loading`), so the
//! binary builds and runs on machines without CUDA: [`CudaAllocator::new`]
//! checks for `libcuda` and for every entry point we call before touching the
//! driver, and reports [`GpuError::Unavailable`] instead of panicking.
//!
//! Contexts: each device's primary context is retained once (per allocator) and
//! made current on whichever thread allocates or frees, so pools can be created
//! in parallel and dropped from any thread.

mod context;
mod ipc;
mod vmm;

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use self::context::PrimaryContext;
use super::{GpuError, PoolAllocator, RxPool, ShmemType};
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

/// Formats a failed driver call as `NAME (description)`.
pub(crate) fn check(res: sys::CUresult) -> Result<(), String> {
    match res {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        other => {
            let err = DriverError(other);
            let name = err.error_name().map(|c| c.to_string_lossy().into_owned());
            let text = err.error_string().map(|c| c.to_string_lossy().into_owned());
            Err(match (name, text) {
                (Ok(n), Ok(t)) => format!("{n} ({t})"),
                (Ok(n), Err(_)) => n,
                _ => format!("CUresult {}", other as u32),
            })
        }
    }
}

/// Wraps a raw fd returned by the driver, rejecting the `-1` some calls leave
/// behind on failure.
fn owned_fd(raw: i32, op: &str) -> Result<OwnedFd, String> {
    if raw < 0 {
        return Err(format!("{op} returned fd {raw}"));
    }
    // SAFETY: the driver just created this descriptor for us and nothing else
    // owns it; wrapping it makes us responsible for closing it exactly once.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Loads libcuda and initialises the driver once per process.
fn init_driver() -> Result<(), GpuError> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries to dlopen the library by its candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err("CUDA driver library (libcuda.so) not found: no NVIDIA driver on this host \
                        (use --gpu_backend=host to run without GPUs)"
                .into());
        }
        // SAFETY: presence was checked just above, so `culib` finds the library
        // instead of panicking; `get` only looks symbols up, it calls nothing.
        let lib = unsafe { sys::culib() };
        for name in REQUIRED_SYMBOLS {
            // SAFETY: symbol lookup only; the pointer is never called here.
            if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
                return Err(format!("libcuda lacks {name}: NVIDIA driver too old for CUDA VMM pools"));
            }
        }
        // SAFETY: cuInit takes flags by value and may be called from any thread.
        check(unsafe { sys::cuInit(0) }).map_err(|e| format!("cuInit failed: {e}"))
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

/// One CUDA device as the allocator uses it.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) pci: PciAddr,
    pub(crate) ordinal: sys::CUdevice,
    pub(crate) ctx: PrimaryContext,
    /// `GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: request RDMA-capable memory.
    pub(crate) rdma_vmm: bool,
}

impl Device {
    fn open(pci: PciAddr) -> Result<Device, GpuError> {
        let op_err = |op: &'static str, msg: String| GpuError::Op { gpu: pci.to_string(), op, msg };
        let bus_id = CString::new(pci.to_string()).expect("PCI address has no NUL");
        let mut ordinal: sys::CUdevice = 0;
        // SAFETY: `ordinal` is a valid out-pointer and `bus_id` a NUL-terminated
        // string that outlives the call.
        let res = unsafe { sys::cuDeviceGetByPCIBusId(&mut ordinal, bus_id.as_ptr()) };
        match res {
            sys::CUresult::CUDA_SUCCESS => {}
            sys::CUresult::CUDA_ERROR_INVALID_DEVICE | sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                return Err(GpuError::NotFound(format!("{pci} (no CUDA device at this PCI address)")));
            }
            other => return Err(op_err("cuDeviceGetByPCIBusId", check(other).unwrap_err())),
        }
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED;
        let mut rdma_vmm = 0;
        // SAFETY: valid out-pointer, device ordinal just returned by the driver.
        check(unsafe { sys::cuDeviceGetAttribute(&mut rdma_vmm, attr, ordinal) })
            .map_err(|e| op_err("cuDeviceGetAttribute", e))?;
        let ctx = PrimaryContext::retain(ordinal).map_err(|e| op_err("cuDevicePrimaryCtxRetain", e))?;
        Ok(Device { pci, ordinal, ctx, rdma_vmm: rdma_vmm != 0 })
    }
}

/// Lazily opened devices; each slot has its own lock so that opening (context
/// creation, ~100 ms) runs in parallel across GPUs.
type DeviceSlot = Arc<Mutex<Option<Arc<Device>>>>;

/// `--gpu_backend cuda`.
#[derive(Debug)]
pub struct CudaAllocator {
    devices: Mutex<HashMap<PciAddr, DeviceSlot>>,
}

impl CudaAllocator {
    /// Loads the driver. Fails with [`GpuError::Unavailable`] (never panics)
    /// when libcuda is missing, too old, or finds no usable device.
    pub fn new() -> Result<CudaAllocator, GpuError> {
        init_driver()?;
        Ok(CudaAllocator { devices: Mutex::new(HashMap::new()) })
    }

    /// Whether the CUDA driver library can be loaded, without initialising it
    /// (`--gpu_backend auto`).
    pub fn driver_present() -> bool {
        // SAFETY: only tries to dlopen the library by its candidate names.
        unsafe { sys::is_culib_present() }
    }

    /// The driver's CUDA version as `major.minor` (`cuDriverGetVersion`).
    pub fn driver_version(&self) -> Result<String, GpuError> {
        let mut v = 0;
        // SAFETY: valid out-pointer; the driver is initialised (see `new`).
        check(unsafe { sys::cuDriverGetVersion(&mut v) }).map_err(|msg| GpuError::Op {
            gpu: "*".into(),
            op: "cuDriverGetVersion",
            msg,
        })?;
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
        let op_err = |op: &'static str, msg: String| GpuError::Op { gpu: "*".into(), op, msg };
        let mut count = 0;
        // SAFETY: valid out-pointer; the driver is initialised (see `new`).
        check(unsafe { sys::cuDeviceGetCount(&mut count) }).map_err(|e| op_err("cuDeviceGetCount", e))?;
        let mut gpus = Vec::new();
        for i in 0..count {
            let mut ordinal = 0;
            // SAFETY: valid out-pointer, ordinal below the device count.
            check(unsafe { sys::cuDeviceGet(&mut ordinal, i) }).map_err(|e| op_err("cuDeviceGet", e))?;
            let mut buf = [0 as std::ffi::c_char; 32];
            // SAFETY: the driver writes at most `len` bytes, NUL included.
            check(unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, ordinal) })
                .map_err(|e| op_err("cuDeviceGetPCIBusId", e))?;
            let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            let raw = String::from_utf8_lossy(&bytes).into_owned();
            let pci = parse_bus_id(&raw)
                .ok_or_else(|| op_err("cuDeviceGetPCIBusId", format!("unparsable bus id {raw:?}")))?;
            gpus.push(pci);
        }
        Ok(Some(gpus))
    }

    fn allocate(&self, gpu: PciAddr, size: u64, shmem: ShmemType) -> Result<Box<dyn RxPool>, GpuError> {
        let dev = self.device(gpu)?;
        let size = usize::try_from(size).map_err(|_| GpuError::Op {
            gpu: gpu.to_string(),
            op: "allocate",
            msg: format!("size {size}"),
        })?;
        let pool: Box<dyn RxPool> = match shmem {
            ShmemType::Fd => Box::new(vmm::VmmPool::create(dev, size)?),
            ShmemType::File => Box::new(ipc::IpcPool::create(dev, size)?),
        };
        Ok(pool)
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
            Err(GpuError::Unavailable(msg)) => assert!(msg.contains("libcuda"), "{msg}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        // Twice: the cached outcome must stay an error, not a panic.
        assert!(matches!(CudaAllocator::new(), Err(GpuError::Unavailable(_))));
    }
}
