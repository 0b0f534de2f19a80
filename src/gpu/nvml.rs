//! The few NVML calls that tell whether a GPU is in MIG mode, through
//! `libnvidia-ml` loaded at run time (found as libcuda is, see
//! [`super::driver_lib`]). Read-only: nothing here changes a device's
//! settings.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::PathBuf;

use super::driver_lib::{self, DriverLibError, DriverLibrary};
use crate::types::pci::PciAddr;

/// `nvmlReturn_t` values we tell apart.
const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_NOT_FOUND: c_int = 6;
/// `nvmlDeviceGetMigMode`'s value for MIG on.
const NVML_DEVICE_MIG_ENABLE: c_uint = 1;

type NvmlDevice = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type ByBusIdFn = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int;
type MigModeFn = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut c_uint) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// NVML's MIG mode of one GPU: now, and after the GPU's next reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// Why NVML could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    #[error("{0}")]
    Library(#[from] DriverLibError),
    #[error("libnvidia-ml lacks {0}")]
    MissingSymbol(&'static str),
    #[error("{call} failed: {text} (NVML error {code})")]
    Call { call: &'static str, code: i32, text: String },
}

/// A source of MIG modes: NVML, or a fake in tests.
pub trait MigModes {
    /// `Ok(None)`: the GPU has no MIG (not supported) or NVML does not know it.
    fn mig_mode(&self, gpu: PciAddr) -> Result<Option<MigMode>, NvmlError>;
    /// What answered, for reports (the library file).
    fn describe(&self) -> String;
}

/// An initialised NVML; shut down on drop.
pub struct Nvml {
    lib: DriverLibrary,
    by_bus_id: ByBusIdFn,
    mig_mode: MigModeFn,
    error_string: Option<ErrorStringFn>,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml").field("lib", &self.lib.name).finish()
    }
}

fn symbol<T: Copy>(lib: &DriverLibrary, name: &'static str) -> Result<T, NvmlError> {
    // SAFETY: `T` is the C signature NVML documents for `name`; the value is
    // a plain function pointer, valid while `lib` stays loaded (it lives in
    // the same `Nvml` as the pointer).
    unsafe { lib.lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|_| NvmlError::MissingSymbol(name))
}

impl Nvml {
    /// Loads libnvidia-ml and initialises it.
    pub fn open() -> Result<Nvml, NvmlError> {
        let lib = driver_lib::open(&["libnvidia-ml.so.1", "libnvidia-ml.so"], &driver_lib::search_dirs())?;
        let init: InitFn = symbol(&lib, "nvmlInit_v2")?;
        // Every symbol is resolved before init, so that NVML is never left
        // initialised without an `Nvml` whose Drop shuts it down.
        symbol::<InitFn>(&lib, "nvmlShutdown")?;
        let by_bus_id = symbol(&lib, "nvmlDeviceGetHandleByPciBusId_v2")?;
        let mig_mode = symbol(&lib, "nvmlDeviceGetMigMode")?;
        let error_string = symbol(&lib, "nvmlErrorString").ok();
        // SAFETY: nvmlInit_v2 takes no arguments and may be called from any thread.
        let code = unsafe { init() };
        if code != NVML_SUCCESS {
            return Err(call_error(error_string, "nvmlInit_v2", code));
        }
        Ok(Nvml { lib, by_bus_id, mig_mode, error_string })
    }

    /// The library file NVML was loaded from.
    pub fn path(&self) -> Option<PathBuf> {
        self.lib.path_of_symbol("nvmlInit_v2")
    }

    fn error(&self, call: &'static str, code: c_int) -> NvmlError {
        call_error(self.error_string, call, code)
    }
}

/// A failed call, with NVML's own words for the code where it has them.
fn call_error(error_string: Option<ErrorStringFn>, call: &'static str, code: c_int) -> NvmlError {
    let text = error_string
        // SAFETY: nvmlErrorString returns a static NUL-terminated string for any code.
        .map(|f| unsafe { f(code) })
        .filter(|p| !p.is_null())
        // SAFETY: non-null, static and NUL-terminated (see above).
        .map(|p| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .unwrap_or_else(|| "unknown error".into());
    NvmlError::Call { call, code, text }
}

impl MigModes for Nvml {
    fn mig_mode(&self, gpu: PciAddr) -> Result<Option<MigMode>, NvmlError> {
        let bus_id = CString::new(gpu.to_string()).expect("a PCI address has no NUL");
        let mut dev: NvmlDevice = std::ptr::null_mut();
        // SAFETY: a NUL-terminated bus id that outlives the call and a valid out-pointer.
        match unsafe { (self.by_bus_id)(bus_id.as_ptr(), &mut dev) } {
            NVML_SUCCESS => {}
            NVML_ERROR_NOT_FOUND => return Ok(None),
            code => return Err(self.error("nvmlDeviceGetHandleByPciBusId_v2", code)),
        }
        let (mut current, mut pending) = (0, 0);
        // SAFETY: `dev` was just returned by NVML; both out-pointers are valid.
        match unsafe { (self.mig_mode)(dev, &mut current, &mut pending) } {
            NVML_SUCCESS => Ok(Some(MigMode {
                current: current == NVML_DEVICE_MIG_ENABLE,
                pending: pending == NVML_DEVICE_MIG_ENABLE,
            })),
            // A GPU without MIG (anything before A100): never partitioned.
            NVML_ERROR_NOT_SUPPORTED => Ok(Some(MigMode { current: false, pending: false })),
            code => Err(self.error("nvmlDeviceGetMigMode", code)),
        }
    }

    fn describe(&self) -> String {
        match self.path() {
            Some(p) => format!("NVML ({})", p.display()),
            None => "NVML".into(),
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        if let Ok(shutdown) = symbol::<InitFn>(&self.lib, "nvmlShutdown") {
            // SAFETY: NVML was initialised in `open`; this releases that one reference.
            let code = unsafe { shutdown() };
            if code != NVML_SUCCESS {
                tracing::debug!(error = %self.error("nvmlShutdown", code), "NVML shutdown failed");
            }
        }
    }
}
