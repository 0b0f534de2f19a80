//! What the NCCL settings need to know of the node, behind a trait: which
//! NUMA node each NIC sits on, the CPUs of each node, which CPUs are SMT
//! siblings, and the interfaces. [`Sysfs`] reads it through the daemon's
//! sysfs views (`--sysfs_root` and its own `/sys`, so tests point it at
//! fabricated trees);
//! [`FakeNode`] holds it in memory for unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::config::views::SysfsViews;

use super::cpus;

/// The node's CPU and NIC layout, as far as the NCCL settings need it.
pub trait NodeView {
    /// The NUMA node of a NIC's PCI device; `None` when the kernel does not
    /// say (`-1`, as single-node VMs report, or no such file).
    fn nic_numa_node(&self, ifname: &str) -> Option<u32>;
    /// Every NUMA node with its CPUs, lowest node first.
    fn nodes(&self) -> Vec<(u32, BTreeSet<u32>)>;
    /// The SMT siblings of `cpu`, itself included; `None` when unknown.
    fn thread_siblings(&self, cpu: u32) -> Option<BTreeSet<u32>>;
    /// Every interface with whether it is backed by a device (`false` for
    /// `lo`, veths, bridges), in natural name order.
    fn interfaces(&self) -> Vec<(String, bool)>;
}

/// [`NodeView`] read from sysfs: the NICs through the daemon's two views
/// (`config::views`: its own namespace's interfaces, their PCI devices
/// wherever a view shows them), CPUs and NUMA nodes under the root.
#[derive(Debug, Clone)]
pub struct Sysfs {
    views: SysfsViews,
}

impl Sysfs {
    /// One sysfs tree (a fabricated one in tests), as `--sysfs_root=ROOT`.
    pub fn new(root: &Path) -> Sysfs {
        Sysfs { views: SysfsViews::single(root) }
    }

    /// The daemon's views for these flags.
    pub fn for_flags(flags: &crate::config::flags::Flags) -> Sysfs {
        Sysfs { views: SysfsViews::new(flags) }
    }

    /// Given views (two fabricated trees in tests).
    pub fn with_views(views: SysfsViews) -> Sysfs {
        Sysfs { views }
    }

    fn read(&self, rel: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(self.views.root().join(rel)).ok()
    }
}

impl NodeView for Sysfs {
    fn nic_numa_node(&self, ifname: &str) -> Option<u32> {
        let device = self.views.device(ifname).ok()??;
        let text = std::fs::read_to_string(device.path.join("numa_node")).ok()?;
        // -1 (no affinity) fails to parse as u32, which is what it means.
        text.trim().parse().ok()
    }

    fn nodes(&self) -> Vec<(u32, BTreeSet<u32>)> {
        let mut out = Vec::new();
        if let Ok(dir) = std::fs::read_dir(self.views.root().join("devices/system/node")) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(n) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else { continue };
                let Some(list) = self.read(format!("devices/system/node/{name}/cpulist")) else { continue };
                if let Ok(set) = cpus::parse(&list) {
                    out.push((n, set));
                }
            }
        }
        // Kernels built without NUMA have no node folder: all online CPUs are one node.
        if out.is_empty() {
            if let Some(set) = self.read("devices/system/cpu/online").and_then(|t| cpus::parse(&t).ok()) {
                out.push((0, set));
            }
        }
        out.sort_by_key(|(n, _)| *n);
        out
    }

    fn thread_siblings(&self, cpu: u32) -> Option<BTreeSet<u32>> {
        let text = self.read(format!("devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"))?;
        cpus::parse(&text).ok().filter(|s| s.contains(&cpu))
    }

    fn interfaces(&self) -> Vec<(String, bool)> {
        let names = self.views.interfaces().unwrap_or_default();
        names.into_iter().map(|name| (name.clone(), self.views.has_device(&name))).collect()
    }
}

/// An in-memory [`NodeView`]: the tests' fixtures, and the machine profiles
/// `inject` generates NCCL settings for.
#[derive(Debug, Clone, Default)]
pub struct FakeNode {
    pub numa: BTreeMap<String, u32>,
    pub nodes: BTreeMap<u32, BTreeSet<u32>>,
    pub siblings: BTreeMap<u32, BTreeSet<u32>>,
    pub interfaces: Vec<(String, bool)>,
}

impl FakeNode {
    /// A node of `cores_per_node` two-thread cores per NUMA node over
    /// `nodes` nodes, numbered as GCE numbers vCPUs: the first threads of all
    /// cores of the machine first, then their siblings (`cpu + total_cores`).
    pub fn smt2(nodes: u32, cores_per_node: u32) -> FakeNode {
        let total = nodes * cores_per_node;
        let mut f = FakeNode::default();
        for n in 0..nodes {
            let first = n * cores_per_node..(n + 1) * cores_per_node;
            let set: BTreeSet<u32> = first.clone().chain(first.map(|c| c + total)).collect();
            for c in n * cores_per_node..(n + 1) * cores_per_node {
                let pair: BTreeSet<u32> = [c, c + total].into();
                f.siblings.insert(c, pair.clone());
                f.siblings.insert(c + total, pair);
            }
            f.nodes.insert(n, set);
        }
        f
    }

    /// An a3-highgpu-8g as GKE names its NICs: two nodes of 52 two-thread
    /// cores, the control NIC `eth0` and `eth1`, `eth2` on node 0, `eth3`,
    /// `eth4` on node 1. The unit tests' fixture, and `inject`'s machine
    /// profile of the TCPX machine type.
    pub fn a3_highgpu_8g() -> FakeNode {
        FakeNode::smt2(2, 52)
            .nic("eth0", Some(0))
            .nic("eth1", Some(0))
            .nic("eth2", Some(0))
            .nic("eth3", Some(1))
            .nic("eth4", Some(1))
    }

    /// Its four TCPX NICs, in topology order.
    pub fn a3_ifnames() -> Vec<String> {
        ["eth1", "eth2", "eth3", "eth4"].map(String::from).to_vec()
    }

    /// Adds a device-backed interface on NUMA node `node` (`None`: unknown).
    pub fn nic(mut self, ifname: &str, node: Option<u32>) -> FakeNode {
        if let Some(n) = node {
            self.numa.insert(ifname.to_string(), n);
        }
        self.interfaces.push((ifname.to_string(), true));
        self.interfaces.sort_by(|a, b| crate::types::ifname::natural_cmp(&a.0, &b.0));
        self
    }
}

impl NodeView for FakeNode {
    fn nic_numa_node(&self, ifname: &str) -> Option<u32> {
        self.numa.get(ifname).copied()
    }

    fn nodes(&self) -> Vec<(u32, BTreeSet<u32>)> {
        self.nodes.iter().map(|(n, s)| (*n, s.clone())).collect()
    }

    fn thread_siblings(&self, cpu: u32) -> Option<BTreeSet<u32>> {
        self.siblings.get(&cpu).cloned()
    }

    fn interfaces(&self) -> Vec<(String, bool)> {
        self.interfaces.clone()
    }
}
