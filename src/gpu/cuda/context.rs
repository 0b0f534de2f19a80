//! A retained primary context, made current on whichever thread needs it.

use cudarc::driver::sys;

use super::check;

/// One reference on a device's primary context; released on drop.
#[derive(Debug)]
pub(crate) struct PrimaryContext {
    ordinal: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext is an opaque driver handle that the driver allows any
// thread to make current (`cuCtxSetCurrent`); we never dereference it, and the
// driver serialises the work done through it.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; `&PrimaryContext` only permits `make_current`, which the
// driver supports concurrently from several threads.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    pub(crate) fn retain(ordinal: sys::CUdevice) -> Result<PrimaryContext, String> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `ordinal` came from the driver.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, ordinal) })?;
        Ok(PrimaryContext { ordinal, ctx })
    }

    /// Binds the context to the calling thread; every driver call that needs a
    /// context is preceded by this, so pools work from any thread.
    pub(crate) fn make_current(&self) -> Result<(), String> {
        // SAFETY: `ctx` is retained for as long as `self` lives.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: releases exactly the one reference taken in `retain`.
        if let Err(e) = check(unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.ordinal) }) {
            tracing::warn!(device = self.ordinal, error = %e, "cuDevicePrimaryCtxRelease failed");
        }
    }
}
