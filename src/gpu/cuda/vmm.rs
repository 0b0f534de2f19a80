//! `--gpu_shmem_type fd`: a CUDA VMM allocation exported as a POSIX fd, mapped
//! in the daemon, with a dma-buf of the mapping for queue binding.
//!
//! Each driver object is a small RAII type; [`VmmPool`] declares them so that
//! they drop in reverse order of creation: dma-buf fd, mapping, address range,
//! allocation, shareable fd, and last the context reference.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::{check, owned_fd, Device};
use crate::gpu::{GpuError, RxPool};

/// Allocation properties shared by the granularity query and `cuMemCreate`.
pub(crate) fn allocation_prop(dev: &Device) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev.ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: u8::from(dev.rdma_vmm),
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The minimum allocation granularity (the pool's alignment).
pub(crate) fn granularity(prop: &sys::CUmemAllocationProp) -> Result<usize, String> {
    let mut gran = 0usize;
    let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: valid out-pointer and a fully initialised property struct.
    check(unsafe { sys::cuMemGetAllocationGranularity(&mut gran, prop, flag) })?;
    if gran == 0 {
        return Err("granularity 0".into());
    }
    Ok(gran)
}

/// A physical allocation (`cuMemCreate`), released on drop.
#[derive(Debug)]
struct Allocation(sys::CUmemGenericAllocationHandle);

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate and is released once; the
        // mapping that used it was dropped before (field order in VmmPool).
        if let Err(e) = check(unsafe { sys::cuMemRelease(self.0) }) {
            tracing::warn!(error = %e, "cuMemRelease failed");
        }
    }
}

/// A reserved virtual address range, freed on drop.
#[derive(Debug)]
struct AddressRange {
    va: sys::CUdeviceptr,
    size: usize,
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        // SAFETY: exactly the range cuMemAddressReserve returned, unmapped by now.
        if let Err(e) = check(unsafe { sys::cuMemAddressFree(self.va, self.size) }) {
            tracing::warn!(error = %e, "cuMemAddressFree failed");
        }
    }
}

/// An allocation mapped into an address range, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    va: sys::CUdeviceptr,
    size: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range mapped by cuMemMap; nothing in this
        // process uses the pointer any more (the dma-buf fd was closed first).
        if let Err(e) = check(unsafe { sys::cuMemUnmap(self.va, self.size) }) {
            tracing::warn!(error = %e, "cuMemUnmap failed");
        }
    }
}

/// One GPU's receive pool. Field order is drop order (see module docs).
#[derive(Debug)]
pub(crate) struct VmmPool {
    dmabuf: Result<OwnedFd, String>,
    mapping: Mapping,
    _range: AddressRange,
    _allocation: Allocation,
    share_fd: OwnedFd,
    granularity: usize,
    dev: Arc<Device>,
}

impl VmmPool {
    pub(crate) fn create(dev: Arc<Device>, size: usize) -> Result<VmmPool, GpuError> {
        let op_err = |op: &'static str, msg: String| GpuError::Op { gpu: dev.pci.to_string(), op, msg };
        dev.ctx.make_current().map_err(|e| op_err("cuCtxSetCurrent", e))?;
        let prop = allocation_prop(&dev);
        let gran = granularity(&prop).map_err(|e| op_err("cuMemGetAllocationGranularity", e))?;
        let size = size.max(1).div_ceil(gran) * gran;

        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; `size` is a multiple of the granularity.
        check(unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) })
            .map_err(|e| op_err("cuMemCreate", e))?;
        let allocation = Allocation(handle);

        let mut raw_fd: i32 = -1;
        let fd_type = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the driver writes an int through the
        // pointer; the allocation was created with that handle type requested.
        check(unsafe {
            sys::cuMemExportToShareableHandle((&mut raw_fd as *mut i32).cast(), allocation.0, fd_type, 0)
        })
        .map_err(|e| op_err("cuMemExportToShareableHandle", e))?;
        let share_fd = owned_fd(raw_fd, "cuMemExportToShareableHandle")
            .map_err(|e| op_err("cuMemExportToShareableHandle", e))?;

        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address requested.
        check(unsafe { sys::cuMemAddressReserve(&mut va, size, gran, 0, 0) })
            .map_err(|e| op_err("cuMemAddressReserve", e))?;
        let range = AddressRange { va, size };

        // SAFETY: maps the whole allocation at offset 0 into the whole range we
        // just reserved; both have the same granularity-aligned size.
        check(unsafe { sys::cuMemMap(range.va, size, 0, allocation.0, 0) })
            .map_err(|e| op_err("cuMemMap", e))?;
        let mapping = Mapping { va, size };

        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one descriptor passed with count 1.
        check(unsafe { sys::cuMemSetAccess(mapping.va, size, &access, 1) })
            .map_err(|e| op_err("cuMemSetAccess", e))?;

        // A missing dma-buf (closed-source kernel module, old kernel) only
        // rules out queue binding, not sharing: keep the reason for the binder.
        let dmabuf = export_dmabuf(mapping.va, size);
        if let Err(e) = &dmabuf {
            tracing::warn!(gpu = %dev.pci, error = %e, "no dma-buf for the pool; queue binding will fail");
        }
        Ok(VmmPool {
            dmabuf,
            mapping,
            _range: range,
            _allocation: allocation,
            share_fd,
            granularity: gran,
            dev,
        })
    }
}

/// `cuMemGetHandleForAddressRange(DMA_BUF_FD)` over a mapped range.
pub(crate) fn export_dmabuf(va: sys::CUdeviceptr, size: usize) -> Result<OwnedFd, String> {
    let mut raw_fd: i32 = -1;
    let kind = sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
    // SAFETY: for DMA_BUF_FD the driver writes an int through the pointer; the
    // range is mapped and accessible on the current context's device.
    check(unsafe { sys::cuMemGetHandleForAddressRange((&mut raw_fd as *mut i32).cast(), va, size, kind, 0) })
        .map_err(|e| format!("cuMemGetHandleForAddressRange: {e}"))?;
    owned_fd(raw_fd, "cuMemGetHandleForAddressRange")
}

impl Drop for VmmPool {
    fn drop(&mut self) {
        // Runs before the fields drop: the unmap/free/release calls below need
        // this device's context current on whatever thread drops the pool.
        if let Err(e) = self.dev.ctx.make_current() {
            tracing::warn!(gpu = %self.dev.pci, error = %e, "cuCtxSetCurrent before freeing the pool failed");
        }
    }
}

impl RxPool for VmmPool {
    fn share_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.share_fd.as_fd())
    }

    fn size(&self) -> u64 {
        self.mapping.size as u64
    }

    fn alignment(&self) -> u64 {
        self.granularity as u64
    }

    fn dmabuf_fd(&self) -> Option<BorrowedFd<'_>> {
        self.dmabuf.as_ref().ok().map(|fd| fd.as_fd())
    }

    fn describe(&self) -> String {
        let dmabuf = match &self.dmabuf {
            Ok(_) => "dma-buf exported".to_string(),
            Err(e) => format!("no dma-buf ({e})"),
        };
        format!(
            "cuda vmm pool on {} (device {}): {} bytes, granularity {}, gpuDirectRDMA {}, {}",
            self.dev.pci, self.dev.ordinal, self.mapping.size, self.granularity, self.dev.rdma_vmm, dmabuf
        )
    }
}
