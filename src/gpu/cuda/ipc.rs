//! `--gpu_shmem_type file`: the legacy pool, `cuMemAlloc` memory shared by its
//! 64-byte CUDA IPC handle (served on `get_gpu_by_gpu_pci`). There is no
//! shareable fd; a dma-buf of the allocation is still exported for binding.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::vmm::{allocation_prop, export_dmabuf, granularity};
use super::{check, Device};
use crate::gpu::{GpuError, RxPool};

/// `cuMemAlloc` memory, freed on drop.
#[derive(Debug)]
struct DeviceMemory(sys::CUdeviceptr);

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemAlloc and is freed exactly once,
        // with the owning context made current by IpcPool::drop.
        if let Err(e) = check(unsafe { sys::cuMemFree_v2(self.0) }) {
            tracing::warn!(error = %e, "cuMemFree failed");
        }
    }
}

/// Field order is drop order: dma-buf fd, memory, context reference.
#[derive(Debug)]
pub(crate) struct IpcPool {
    dmabuf: Result<OwnedFd, String>,
    memory: DeviceMemory,
    handle: [u8; 64],
    size: usize,
    granularity: usize,
    dev: Arc<Device>,
}

impl IpcPool {
    pub(crate) fn create(dev: Arc<Device>, size: usize) -> Result<IpcPool, GpuError> {
        let op_err = |op: &'static str, msg: String| GpuError::Op { gpu: dev.pci.to_string(), op, msg };
        dev.ctx.make_current().map_err(|e| op_err("cuCtxSetCurrent", e))?;
        // Same rounding as the VMM pools, so both modes report one alignment.
        let gran =
            granularity(&allocation_prop(&dev)).map_err(|e| op_err("cuMemGetAllocationGranularity", e))?;
        let size = size.max(1).div_ceil(gran) * gran;

        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the device's context is current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, size) }).map_err(|e| op_err("cuMemAlloc", e))?;
        let memory = DeviceMemory(ptr);

        let mut ipc = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: valid out-pointer; `ptr` is the base of a cuMemAlloc allocation.
        check(unsafe { sys::cuIpcGetMemHandle(&mut ipc, memory.0) })
            .map_err(|e| op_err("cuIpcGetMemHandle", e))?;
        let handle = ipc.reserved.map(|b| b as u8);

        let dmabuf = export_dmabuf(memory.0, size);
        if let Err(e) = &dmabuf {
            tracing::warn!(gpu = %dev.pci, error = %e, "no dma-buf for the pool; queue binding will fail");
        }
        Ok(IpcPool { dmabuf, memory, handle, size, granularity: gran, dev })
    }
}

impl Drop for IpcPool {
    fn drop(&mut self) {
        // Runs before the fields drop: cuMemFree needs the context current.
        if let Err(e) = self.dev.ctx.make_current() {
            tracing::warn!(gpu = %self.dev.pci, error = %e, "cuCtxSetCurrent before freeing the pool failed");
        }
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
