//! `--gpu_shmem_type fd`: a CUDA VMM allocation exported as a POSIX fd, mapped
//! in the daemon, with a dma-buf of the mapping for queue binding.
//!
//! Each driver object is a small RAII type; [`VmmPool`] declares them so that
//! they drop in reverse order of creation: dma-buf fd, mapping, address range,
//! allocation, shareable fd, and last the context reference.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::context::Device;
use super::error::{check, check_in_drop, owned_fd, CudaError};
use crate::gpu::RxPool;

/// A physical allocation (`cuMemCreate`), released on drop.
#[derive(Debug)]
struct Allocation(sys::CUmemGenericAllocationHandle);

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate and is released once; the
        // mapping that used it was dropped before (field order in VmmPool).
        check_in_drop("cuMemRelease", unsafe { sys::cuMemRelease(self.0) });
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
        check_in_drop("cuMemAddressFree", unsafe { sys::cuMemAddressFree(self.va, self.size) });
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
        check_in_drop("cuMemUnmap", unsafe { sys::cuMemUnmap(self.va, self.size) });
    }
}

/// One GPU's receive pool. Field order is drop order (see module docs).
#[derive(Debug)]
pub(crate) struct VmmPool {
    dmabuf: Result<OwnedFd, CudaError>,
    mapping: Mapping,
    _range: AddressRange,
    _allocation: Allocation,
    share_fd: OwnedFd,
    granularity: usize,
    dev: Arc<Device>,
}

impl VmmPool {
    pub(crate) fn create(dev: Arc<Device>, size: usize) -> Result<VmmPool, CudaError> {
        let layout = dev.begin_pool(size)?;
        let (size, gran) = (layout.size, layout.granularity);

        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; `size` is a multiple of the granularity.
        check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, size, &layout.prop, 0) })?;
        let allocation = Allocation(handle);

        const EXPORT: &str = "cuMemExportToShareableHandle";
        let mut raw_fd: i32 = -1;
        let fd_type = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the driver writes an int through the
        // pointer; the allocation was created with that handle type requested.
        check(EXPORT, unsafe {
            sys::cuMemExportToShareableHandle((&mut raw_fd as *mut i32).cast(), allocation.0, fd_type, 0)
        })?;
        let share_fd = owned_fd(EXPORT, raw_fd)?;

        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address requested.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut va, size, gran, 0, 0) })?;
        let range = AddressRange { va, size };

        // SAFETY: maps the whole allocation at offset 0 into the whole range we
        // just reserved; both have the same granularity-aligned size.
        check("cuMemMap", unsafe { sys::cuMemMap(range.va, size, 0, allocation.0, 0) })?;
        let mapping = Mapping { va, size };

        let access = sys::CUmemAccessDesc {
            location: layout.prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one descriptor passed with count 1.
        check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(mapping.va, size, &access, 1) })?;

        let dmabuf = dev.export_dmabuf(mapping.va, size);
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

impl Drop for VmmPool {
    fn drop(&mut self) {
        // Runs before the fields drop, which free driver objects.
        self.dev.enter_for_drop();
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
