//! `--gpu_shmem_type fd`: a CUDA VMM allocation exported as a POSIX fd, mapped
//! in the daemon, with a dma-buf of the mapping for queue binding.
//!
//! Each driver object is a small RAII type; [`VmmPool`] declares them so that
//! they drop in reverse order of creation: dma-buf fd, mapping, address range,
//! allocation, shareable fd, and last the context reference.
//!
//! A pool taken over from the daemon this one replaces (`adopt.rs`) holds
//! the same types: its allocation imported from the handed shareable fd, its
//! own mapping of it, and the handed fds themselves. Dropping it releases
//! this process's handle and mapping only.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::context::{Device, Layout};
use super::error::{check, check_in_drop, owned_fd, CudaError};
use crate::gpu::RxPool;

/// A physical allocation handle held by this process (`cuMemCreate`, or
/// `cuMemImportFromShareableHandle` for a pool taken over), released on drop.
/// Releasing drops this process's reference only: the memory lives on while
/// other processes, the shareable fd or a dma-buf still reference it.
#[derive(Debug)]
pub(crate) struct Allocation(sys::CUmemGenericAllocationHandle);

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate or cuMemImportFromShareableHandle
        // and is released once; the mapping that used it was dropped before
        // (field order in VmmPool).
        check_in_drop("cuMemRelease", unsafe { sys::cuMemRelease(self.0) });
    }
}

impl Allocation {
    /// Imports the allocation behind a shareable POSIX fd (the driver dups
    /// what it needs; `fd` stays ours). The device's context must be current.
    pub(crate) fn import(fd: BorrowedFd<'_>) -> Result<Allocation, CudaError> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let fd_type = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // For POSIX_FILE_DESCRIPTOR the driver takes the fd's number in the pointer's place.
        let os_handle = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
        // SAFETY: valid out-pointer; `fd` is open for the duration of the call.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(&mut handle, os_handle, fd_type)
        })?;
        Ok(Allocation(handle))
    }

    /// Where the allocation lives, as the driver recorded it (`template`
    /// supplies a fully initialised struct for the driver to overwrite).
    pub(crate) fn location(
        &self,
        template: sys::CUmemAllocationProp,
    ) -> Result<sys::CUmemLocation, CudaError> {
        let mut prop = template;
        // SAFETY: valid out-pointer to an initialised struct; the handle is live.
        check("cuMemGetAllocationPropertiesFromHandle", unsafe {
            sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, self.0)
        })?;
        Ok(prop.location)
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

/// Reserves `size` bytes of address space, maps all of `allocation` there and
/// grants `location` read-write access: what every pool does with its memory,
/// allocated here or imported.
fn map_rw(
    allocation: &Allocation,
    size: usize,
    gran: usize,
    location: sys::CUmemLocation,
) -> Result<(Mapping, AddressRange), CudaError> {
    let mut va: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; no fixed address requested.
    check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut va, size, gran, 0, 0) })?;
    let range = AddressRange { va, size };

    // SAFETY: maps the allocation at offset 0 into the whole range we just
    // reserved; the driver refuses a size beyond the allocation's.
    check("cuMemMap", unsafe { sys::cuMemMap(range.va, size, 0, allocation.0, 0) })?;
    let mapping = Mapping { va, size };

    let access =
        sys::CUmemAccessDesc { location, flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    // SAFETY: the range is mapped; one descriptor passed with count 1.
    check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(mapping.va, size, &access, 1) })?;
    Ok((mapping, range))
}

/// The pool's dma-buf (for queue binding): where it came from, or why there is none.
#[derive(Debug)]
pub(crate) enum Dmabuf {
    /// Exported by this process from its mapping.
    Exported(OwnedFd),
    /// Handed over by the daemon this one replaced: the very dma-buf its
    /// queue bindings use, so they stay valid.
    Handed(OwnedFd),
    /// The driver exported none; queue binding will fail.
    Failed(CudaError),
    /// The daemon this one replaced had none to hand over.
    NotHanded,
}

/// One GPU's receive pool. Field order is drop order (see module docs).
#[derive(Debug)]
pub(crate) struct VmmPool {
    dmabuf: Dmabuf,
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
        let size = layout.size;

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

        Self::mapped(dev, allocation, &layout, share_fd, |dev, va| match dev.export_dmabuf(va, size) {
            Ok(fd) => Dmabuf::Exported(fd),
            Err(e) => Dmabuf::Failed(e),
        })
    }

    /// A pool over memory this process imported from `share_fd` (a pool
    /// taken over): mapped and made accessible like a pool of our own, with
    /// the fds it came with kept as the pool's.
    pub(crate) fn adopt(
        dev: Arc<Device>,
        allocation: Allocation,
        layout: &Layout,
        share_fd: OwnedFd,
        dmabuf: Option<OwnedFd>,
    ) -> Result<VmmPool, CudaError> {
        Self::mapped(dev, allocation, layout, share_fd, |_, _| {
            dmabuf.map_or(Dmabuf::NotHanded, Dmabuf::Handed)
        })
    }

    /// Maps `allocation` read-write on its device and makes the pool, with
    /// the dma-buf `dmabuf` gives for the mapping's address.
    fn mapped(
        dev: Arc<Device>,
        allocation: Allocation,
        layout: &Layout,
        share_fd: OwnedFd,
        dmabuf: impl FnOnce(&Device, sys::CUdeviceptr) -> Dmabuf,
    ) -> Result<VmmPool, CudaError> {
        let (size, gran) = (layout.size, layout.granularity);
        let (mapping, range) = map_rw(&allocation, size, gran, layout.prop.location)?;
        let dmabuf = dmabuf(&dev, mapping.va);
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
        match &self.dmabuf {
            Dmabuf::Exported(fd) | Dmabuf::Handed(fd) => Some(fd.as_fd()),
            Dmabuf::Failed(_) | Dmabuf::NotHanded => None,
        }
    }

    fn describe(&self) -> String {
        let dmabuf = match &self.dmabuf {
            Dmabuf::Exported(_) => "dma-buf exported".to_string(),
            Dmabuf::Handed(_) => "taken over, dma-buf kept".to_string(),
            Dmabuf::Failed(e) => format!("no dma-buf ({e})"),
            Dmabuf::NotHanded => "taken over, no dma-buf (its predecessor had none)".to_string(),
        };
        format!(
            "cuda vmm pool on {} (device {}): {} bytes, granularity {}, gpuDirectRDMA {}, {}",
            self.dev.pci, self.dev.ordinal, self.mapping.size, self.granularity, self.dev.rdma_vmm, dmabuf
        )
    }
}
