//! The GPU checks: the CUDA driver, the GPUs it sees against the topology, and
//! one small test allocation per GPU (freed at once) for VMM, fd and dma-buf.

use super::{Ctx, Report, Status};
use crate::config::flags::GpuBackendKind;
use crate::config::presets::Source;

/// Size of the test allocation per GPU (one VMM granule on current GPUs).
const TEST_ALLOC: u64 = 2 << 20;

pub(super) fn check_gpus(r: &mut Report, ctx: &mut Ctx) {
    use crate::gpu::CudaAllocator;
    use crate::gpu::{LoadError, PoolAllocator, ShmemType};
    let s = "GPUs";
    let flags = ctx.flags;
    let needs_cuda = match flags.gpu_backend {
        GpuBackendKind::Host => false,
        GpuBackendKind::Cuda => true,
        GpuBackendKind::Auto => !ctx.sim_nic,
    };
    if !needs_cuda {
        let driver = if CudaAllocator::driver_present() { "present" } else { "absent" };
        r.add(
            s,
            "pools",
            Status::Skip,
            format!("host memory pools (memfd): no GPU needed for this configuration (libcuda {driver}; --gpu_backend=cuda checks it)"),
            None,
        );
        return;
    }
    if let Some(missing) = CudaAllocator::driver_missing() {
        let found = match &missing {
            LoadError::NoLibrary(e) => e.to_string(),
            other => other.to_string(),
        };
        r.add(
            s,
            "driver",
            Status::Fail,
            found,
            Some("install the NVIDIA driver and give this process its libraries: GKE: the driver installer DaemonSet, \
                  /home/kubernetes/bin/nvidia/lib64 mounted at /usr/local/nvidia/lib64; GPU Operator: runtimeClassName nvidia \
                  with NVIDIA_VISIBLE_DEVICES=all, or /run/nvidia/driver mounted at the same path".into()),
        );
        return;
    }
    let alloc = match CudaAllocator::new() {
        Ok(a) => a,
        Err(e) => {
            r.add(
                s,
                "driver",
                Status::Fail,
                e.to_string(),
                Some("check `nvidia-smi`; the driver must support CUDA VMM (≥ 11.x)".into()),
            );
            return;
        }
    };
    match alloc.driver_version() {
        Ok(v) => r.add(s, "driver", Status::Pass, format!("CUDA driver API {v}, {}", alloc.driver()), None),
        Err(e) => r.add(s, "driver", Status::Warn, format!("{e}; library {}", alloc.driver()), None),
    }
    let visible = match alloc.visible_gpus() {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => {
            r.add(s, "devices", Status::Fail, e.to_string(), None);
            return;
        }
    };
    let sim_placed = ctx.source == Some(Source::Preset("sim"));
    if sim_placed {
        ctx.placed_gpus = Some(visible.clone());
    }
    let wanted: Vec<_> = match &ctx.topo {
        Some(t) if !sim_placed => t.gpus().map(|(_, g)| g.pci).collect(),
        _ => visible.clone(),
    };
    let missing: Vec<String> =
        wanted.iter().filter(|g| !visible.contains(g)).map(|g| g.to_string()).collect();
    if visible.is_empty() {
        r.add(
            s,
            "devices",
            Status::Fail,
            "CUDA sees no GPU",
            Some("check `nvidia-smi` and CUDA_VISIBLE_DEVICES".into()),
        );
        return;
    } else if !missing.is_empty() {
        r.add(
            s,
            "devices",
            Status::Fail,
            format!("CUDA sees {} GPUs, the topology wants {}: not visible {}", visible.len(), wanted.len(), missing.join(", ")),
            Some("a GPU missing from CUDA but present on the PCI bus: check `nvidia-smi -q` for errors (Xid) and CUDA_VISIBLE_DEVICES".into()),
        );
    } else {
        let note = if sim_placed { " (the sim preset places them on its NICs)" } else { "" };
        r.add(s, "devices", Status::Pass, format!("CUDA sees {} GPUs{note}", visible.len()), None);
    }
    for gpu in wanted.iter().filter(|g| visible.contains(g)) {
        let mut parts = Vec::new();
        let mut status = Status::Pass;
        let mut fix = None;
        // Without queue binding (simulated NICs, --bind_backend=none) RDMA and
        // dma-buf are not needed: their absence only warns.
        let needed = if ctx.binding_needed { Status::Fail } else { Status::Warn };
        let mut worse = |s: Status| {
            if s == Status::Fail || status == Status::Pass {
                status = s;
            }
        };
        match alloc.rdma_with_vmm(*gpu) {
            Ok(true) => parts.push("GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED".to_string()),
            Ok(false) => {
                worse(needed);
                parts.push("no GPUDirect RDMA with VMM".into());
                fix = Some("needs a data-center GPU and the open NVIDIA kernel module".to_string());
            }
            Err(e) => {
                worse(Status::Fail);
                parts.push(e.to_string());
            }
        }
        match alloc.allocate(*gpu, TEST_ALLOC, ShmemType::Fd) {
            Ok(pool) => {
                parts.push(if pool.share_fd().is_some() {
                    "VMM + POSIX fd".into()
                } else {
                    "no POSIX fd".into()
                });
                if pool.dmabuf_fd().is_some() {
                    parts.push("dma-buf export".into());
                } else {
                    worse(needed);
                    parts.push(format!("no dma-buf: {}", pool.describe()));
                    fix = Some("dma-buf export needs the open NVIDIA kernel module (nvidia-open) and a kernel with dma-buf".into());
                }
                drop(pool);
            }
            Err(e) => {
                worse(Status::Fail);
                parts.push(format!("test allocation failed: {e}"));
            }
        }
        r.add(s, &gpu.to_string(), status, parts.join(", "), fix);
    }
}
