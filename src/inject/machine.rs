//! Machine profiles: the CPU and NIC layout of a machine type, for NCCL
//! settings written into a manifest on a machine other than the GPU node
//! (the bindings depend on the node's NUMA layout, not the laptop's). The
//! values come from the one generator, [`crate::nccl::generate`], fed with
//! the profile instead of sysfs.

use std::path::Path;

use super::InjectError;
use crate::config::flags::Flags;
use crate::config::presets;
use crate::nccl::{self, FakeNode, NcclEnv};

/// The machine type GPUDirect-TCPX runs on.
pub const DEFAULT: &str = "a3-highgpu-8g";

/// Known profiles: name, the daemon preset for it, and its layout.
pub const NAMES: [&str; 1] = [DEFAULT];

/// The preset whose topology fits the machine.
pub fn preset(machine: &str) -> Option<&'static str> {
    (machine == DEFAULT).then_some("a3vm")
}

/// The GPUs a node of the machine type has.
pub fn gpus(machine: &str) -> Option<u64> {
    (machine == DEFAULT).then_some(8)
}

/// The node as the generator sees it: a3-highgpu-8g has two NUMA nodes of 52
/// two-thread cores (208 vCPUs), the host NIC eth0 and the first two GPU
/// NICs on node 0, the other two on node 1.
pub fn view(machine: &str) -> Option<FakeNode> {
    (machine == DEFAULT).then(FakeNode::a3_highgpu_8g)
}

/// The NCCL settings for `machine`, the daemon's `flags` giving the
/// topology (its preset) and the socket folder.
pub fn nccl_env(machine: &str, flags: &Flags) -> Result<NcclEnv, InjectError> {
    let view = view(machine).ok_or_else(|| {
        InjectError::Option(format!("--machine: unknown machine {machine:?} (known: {})", NAMES.join(", ")))
    })?;
    // `auto` (and a node-wide daemon, whose flags are not ours) is resolved
    // on the node: the machine's NICs are those of its preset.
    let mut flags = flags.clone();
    if flags.gpu_nic_preset == "auto" {
        flags.gpu_nic_preset = preset(machine).unwrap_or("auto").to_string();
    }
    let (topo, _) = presets::resolve_topology(&flags).map_err(|e| InjectError::Option(e.to_string()))?;
    nccl::generate(&view, &topo, Path::new(&flags.uds_path))
        .map_err(|e| InjectError::Option(format!("NCCL settings for {machine}: {e}")))
}
