//! `--gpu_shmem_type file`: the legacy pool, `cuMemAlloc` memory shared by its
//! 64-byte CUDA IPC handle (served on `get_gpu_by_gpu_pci`). There is no
//! shareable fd; a dma-buf of the allocation is still exported for binding.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::context::Device;
use super::error::{check, check_in_drop, CudaError};
use crate::gpu::RxPool;

/// `cuMemAlloc` memory, freed on drop.
#[derive(Debug)]
struct DeviceMemory(sys::CUdeviceptr);

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemAlloc and is freed exactly once,
        // with the owning context made current by IpcPool::drop.
        check_in_drop("cuMemFree", unsafe { sys::cuMemFree_v2(self.0) });
    }
}

/// Field order is drop order: dma-buf fd, memory, context reference.
#[derive(Debug)]
pub(crate) struct IpcPool {
    dmabuf: Result<OwnedFd, CudaError>,
    memory: DeviceMemory,
    handle: [u8; 64],
    size: usize,
    granularity: usize,
    dev: Arc<Device>,
}

impl IpcPool {
    pub(crate) fn create(dev: Arc<Device>, size: usize) -> Result<IpcPool, CudaError> {
        // Same rounding as the VMM pools, so both modes report one alignment.
        let layout = dev.begin_pool(size)?;
        let size = layout.size;

        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the device's context is current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, size) })?;
        let memory = DeviceMemory(ptr);

        let mut ipc = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: valid out-pointer; `ptr` is the base of a cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut ipc, memory.0) })?;
        let handle = ipc.reserved.map(|b| b as u8);

        let dmabuf = dev.export_dmabuf(memory.0, size);
        Ok(IpcPool { dmabuf, memory, handle, size, granularity: layout.granularity, dev })
    }
}

impl Drop for IpcPool {
    fn drop(&mut self) {
        // Runs before the fields drop: cuMemFree needs the context current.
        self.dev.enter_for_drop();
    }
}

impl RxPool for IpcPool {
    fn share_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn size(&self) -> u64 {
        self.size as u64
    }

    fn alignment(&self) -> u64 {
        self.granularity as u64
    }

    fn dmabuf_fd(&self) -> Option<BorrowedFd<'_>> {
        self.dmabuf.as_ref().ok().map(|fd| fd.as_fd())
    }

    fn ipc_handle(&self) -> Option<[u8; 64]> {
        Some(self.handle)
    }

    fn describe(&self) -> String {
        format!(
            "cuda ipc pool on {} (device {}) at {:#x}: {} bytes{}",
            self.dev.pci,
            self.dev.ordinal,
            self.memory.0,
            self.size,
            if self.dmabuf.is_ok() { ", dma-buf exported" } else { ", no dma-buf" }
        )
    }
}
