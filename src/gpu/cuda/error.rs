//! Failed driver calls, typed, printed with the driver's own error name.

use std::os::fd::{FromRawFd, OwnedFd};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

/// One failed driver call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// The call returned something other than `CUDA_SUCCESS`.
    #[error("{call} failed: {}", describe(result.0))]
    Call {
        call: &'static str,
        #[source]
        result: DriverError,
    },
    /// The call reported success but left no valid descriptor (seen on some
    /// drivers instead of an error code).
    #[error("{call} returned fd {fd}")]
    BadFd { call: &'static str, fd: i32 },
    #[error("cuMemGetAllocationGranularity failed: granularity 0")]
    ZeroGranularity,
}

/// Why the driver cannot be used at all (`--gpu_backend cuda` on this host).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    #[error("CUDA driver library: {0} (no NVIDIA driver for this process; use --gpu_backend=host to run without GPUs)")]
    NoLibrary(#[source] crate::gpu::driver_lib::DriverLibError),
    /// Loaded by path, but cudarc's lookup by name does not find it.
    #[error(
        "{0} loaded, but not under the name libcuda.so.1 (a different soname): \
         put its folder on LD_LIBRARY_PATH instead"
    )]
    NotByName(String),
    #[error("libcuda lacks {0}: NVIDIA driver too old for CUDA VMM pools")]
    MissingSymbol(&'static str),
    #[error(transparent)]
    Init(CudaError),
}

/// `NAME (description)` for a result code, as far as the driver can name it.
fn describe(res: sys::CUresult) -> String {
    let err = DriverError(res);
    let name = err.error_name().map(|c| c.to_string_lossy().into_owned());
    let text = err.error_string().map(|c| c.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(n), Ok(t)) => format!("{n} ({t})"),
        (Ok(n), Err(_)) => n,
        _ => format!("CUresult {}", res as u32),
    }
}

/// The result of driver call `call` as a `Result`.
pub(crate) fn check(call: &'static str, res: sys::CUresult) -> Result<(), CudaError> {
    match res {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        other => Err(CudaError::Call { call, result: DriverError(other) }),
    }
}

/// For `Drop` impls, which cannot return the failure: logs it.
pub(crate) fn check_in_drop(call: &'static str, res: sys::CUresult) {
    if let Err(e) = check(call, res) {
        tracing::warn!(error = %e, "freeing a CUDA object failed");
    }
}

/// Wraps a raw fd returned by driver call `call`, rejecting the `-1` some
/// calls leave behind.
pub(crate) fn owned_fd(call: &'static str, raw: i32) -> Result<OwnedFd, CudaError> {
    if raw < 0 {
        return Err(CudaError::BadFd { call, fd: raw });
    }
    // SAFETY: the driver just created this descriptor for us and nothing else
    // owns it; wrapping it makes us responsible for closing it exactly once.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}
