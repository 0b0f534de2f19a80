//! The NCCL settings written into a manifest, for the machine profile the
//! pods will run on ([`crate::nccl::machine`]), not the machine inject runs on.

use std::path::Path;

use super::InjectError;
use crate::config::flags::Flags;
use crate::config::presets;
use crate::nccl::{self, NcclEnv};

pub use crate::nccl::machine::{preset, view, DEFAULT, NAMES};

/// The GPUs a node of the machine type has.
pub fn gpus(machine: &str) -> Option<u64> {
    (machine == DEFAULT).then_some(8)
}

/// The NCCL settings for `machine`, the daemon's `flags` giving the
/// topology (its preset) and the socket folder.
pub fn nccl_env(machine: &str, flags: &Flags) -> Result<NcclEnv, InjectError> {
    let view = view(machine)
        .ok_or_else(|| InjectError::Option(format!("--machine: {}", nccl::machine::unknown(machine))))?;
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
