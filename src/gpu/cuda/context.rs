//! One CUDA device as the pools use it: its retained primary context, made
//! current on whichever thread creates or frees a pool, and the steps every
//! pool shares (granularity, dma-buf export, freeing with the context current).

use std::ffi::CString;
use std::os::fd::OwnedFd;

use cudarc::driver::sys;

use super::error::{check, check_in_drop, owned_fd, CudaError};
use crate::gpu::GpuError;
use crate::types::pci::PciAddr;

/// One reference on a device's primary context; released on drop.
#[derive(Debug)]
struct PrimaryContext {
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
    fn retain(ordinal: sys::CUdevice) -> Result<PrimaryContext, CudaError> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `ordinal` came from the driver.
        check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, ordinal) })?;
        Ok(PrimaryContext { ordinal, ctx })
    }

    /// Binds the context to the calling thread; every driver call that needs a
    /// context is preceded by this, so pools work from any thread.
    fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: `ctx` is retained for as long as `self` lives.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: releases exactly the one reference taken in `retain`.
        check_in_drop("cuDevicePrimaryCtxRelease", unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.ordinal)
        });
    }
}

/// One CUDA device as the allocator uses it.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) pci: PciAddr,
    pub(crate) ordinal: sys::CUdevice,
    ctx: PrimaryContext,
    /// `GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: request RDMA-capable memory.
    pub(crate) rdma_vmm: bool,
}

/// What every pool starts from: the device's allocation properties, their
/// granularity (the pool's alignment), and the pool size rounded up to it.
pub(crate) struct Layout {
    pub(crate) prop: sys::CUmemAllocationProp,
    pub(crate) granularity: usize,
    pub(crate) size: usize,
}

impl Device {
    pub(crate) fn open(pci: PciAddr) -> Result<Device, GpuError> {
        let fail = |source| GpuError::OpenDevice { gpu: pci, source };
        let bus_id = CString::new(pci.to_string()).expect("PCI address has no NUL");
        let mut ordinal: sys::CUdevice = 0;
        // SAFETY: `ordinal` is a valid out-pointer and `bus_id` a NUL-terminated
        // string that outlives the call.
        let res = unsafe { sys::cuDeviceGetByPCIBusId(&mut ordinal, bus_id.as_ptr()) };
        match res {
            sys::CUresult::CUDA_ERROR_INVALID_DEVICE | sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                return Err(GpuError::NotFound(pci));
            }
            other => check("cuDeviceGetByPCIBusId", other).map_err(fail)?,
        }
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED;
        let mut rdma_vmm = 0;
        // SAFETY: valid out-pointer, device ordinal just returned by the driver.
        check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut rdma_vmm, attr, ordinal) })
            .map_err(fail)?;
        let ctx = PrimaryContext::retain(ordinal).map_err(fail)?;
        Ok(Device { pci, ordinal, ctx, rdma_vmm: rdma_vmm != 0 })
    }

    /// Makes the context current on this thread and lays out a pool of `size`
    /// bytes: the first step of creating any pool.
    pub(crate) fn begin_pool(&self, size: usize) -> Result<Layout, CudaError> {
        self.ctx.make_current()?;
        let prop = self.allocation_prop();
        let mut gran = 0usize;
        let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: valid out-pointer and a fully initialised property struct.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(&mut gran, &prop, flag)
        })?;
        if gran == 0 {
            return Err(CudaError::ZeroGranularity);
        }
        Ok(Layout { prop, granularity: gran, size: size.max(1).div_ceil(gran) * gran })
    }

    /// For a pool's `Drop`, before its fields free driver objects: they need
    /// this device's context current on whatever thread drops the pool.
    pub(crate) fn enter_for_drop(&self) {
        if let Err(e) = self.ctx.make_current() {
            tracing::warn!(gpu = %self.pci, error = %e, "cuCtxSetCurrent before freeing the pool failed");
        }
    }

    /// A dma-buf of the mapped range `va..va + size`. A missing dma-buf
    /// (closed-source kernel module, old kernel) only rules out queue binding,
    /// not sharing, so the pool keeps the error for the binder and `describe`.
    pub(crate) fn export_dmabuf(&self, va: sys::CUdeviceptr, size: usize) -> Result<OwnedFd, CudaError> {
        const CALL: &str = "cuMemGetHandleForAddressRange";
        let mut raw_fd: i32 = -1;
        let kind = sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
        // SAFETY: for DMA_BUF_FD the driver writes an int through the pointer;
        // the range is mapped and accessible on the current context's device.
        let res = check(CALL, unsafe {
            sys::cuMemGetHandleForAddressRange((&mut raw_fd as *mut i32).cast(), va, size, kind, 0)
        })
        .and_then(|()| owned_fd(CALL, raw_fd));
        if let Err(e) = &res {
            tracing::warn!(gpu = %self.pci, error = %e, "no dma-buf for the pool; queue binding will fail");
        }
        res
    }

    /// Pinned device memory exportable as a POSIX fd, RDMA-capable where the
    /// device supports it with VMM.
    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: u8::from(self.rdma_vmm),
                usage: 0,
                reserved: [0; 4],
            },
        }
    }
}
