//! Machine profiles: the CPU and NIC layout of a machine type, for NCCL
//! settings worked out on a machine other than the GPU node (`nccl-env
//! --machine`, `inject`): the bindings depend on the node's NUMA layout,
//! not the laptop's. The generator is the same, fed with the profile instead
//! of sysfs.

use super::FakeNode;

/// The machine type GPUDirect-TCPX runs on.
pub const DEFAULT: &str = "a3-highgpu-8g";

/// Known profiles.
pub const NAMES: [&str; 1] = [DEFAULT];

/// The daemon preset whose topology fits the machine.
pub fn preset(machine: &str) -> Option<&'static str> {
    (machine == DEFAULT).then_some("a3vm")
}

/// The node as the generator sees it: a3-highgpu-8g has two NUMA nodes of 52
/// two-thread cores (208 vCPUs), the host NIC eth0 and the first two GPU
/// NICs on node 0, the other two on node 1.
pub fn view(machine: &str) -> Option<FakeNode> {
    (machine == DEFAULT).then(FakeNode::a3_highgpu_8g)
}

/// Why `machine` is not a profile, naming the known ones.
pub fn unknown(machine: &str) -> String {
    format!("unknown machine {machine} (known: {})", NAMES.join(", "))
}
