//! Which CPUs the plugin's send and receive threads run on, per NIC.
//!
//! The rule, per NIC: take the CPUs of the NIC's NUMA node and group them
//! into cores (a CPU and its SMT siblings; a CPU without sibling information
//! is a core of its own), cores ordered by their lowest CPU. The first
//! [`RESERVED_CORES`] cores stay for the guest OS, interrupts and the
//! daemon; the next [`TX_CORES`] carry the send threads
//! (`NCCL_GPUDIRECTTCPX_TX_BINDINGS`), the [`RX_CORES`] after them the receive
//! threads (`…_RX_BINDINGS`); the rest is left to the training processes.
//! Both threads of a core go to the same side, so TX and RX never share a
//! physical core. These counts are the published profile's for the 52 cores
//! of each a3-highgpu-8g NUMA node; a node with fewer cores gets them scaled
//! down in proportion (rounded down); one with fewer than 4 cores cannot
//! keep them apart ([`NcclError::TooFewCores`]), and the environment then
//! leaves both bindings out. NICs on one node get the same CPUs: their threads share them.
//!
//! A NIC whose NUMA node the kernel does not report (`-1`) is on the only
//! node when the machine has one; with several nodes it is an error.

use std::collections::BTreeSet;

use super::sysfs::NodeView;
use super::{cpus, NcclError};

/// Cores of a node kept for the OS, interrupts and the daemon.
pub const RESERVED_CORES: u32 = 8;
/// Cores of a node for the plugin's send threads.
pub const TX_CORES: u32 = 14;
/// Cores of a node for the plugin's receive threads.
pub const RX_CORES: u32 = 14;
/// The node size the counts above are for.
pub const REFERENCE_CORES: u32 = 52;

/// One NIC's NUMA node and the CPUs its threads get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicCpus {
    pub ifname: String,
    pub node: u32,
    /// Every CPU of the node (what bindings may use at all).
    pub node_cpus: BTreeSet<u32>,
    pub tx: BTreeSet<u32>,
    pub rx: BTreeSet<u32>,
}

/// The NUMA node of `ifname` and its CPUs.
pub fn nic_node(view: &dyn NodeView, ifname: &str) -> Result<(u32, BTreeSet<u32>), NcclError> {
    let nodes = view.nodes();
    if nodes.is_empty() {
        return Err(NcclError::NoCpuInfo);
    }
    match view.nic_numa_node(ifname) {
        Some(n) => nodes
            .into_iter()
            .find(|(m, _)| *m == n)
            .ok_or_else(|| NcclError::NoSuchNode { ifname: ifname.to_string(), node: n }),
        None if nodes.len() == 1 => Ok(nodes.into_iter().next().expect("one node")),
        None => Err(NcclError::NumaUnknown { ifname: ifname.to_string(), nodes: nodes.len() }),
    }
}

/// The node's CPUs grouped into cores, ordered by each core's lowest CPU.
fn cores(view: &dyn NodeView, node_cpus: &BTreeSet<u32>) -> Vec<BTreeSet<u32>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for &cpu in node_cpus {
        if seen.contains(&cpu) {
            continue;
        }
        let mut core: BTreeSet<u32> = view.thread_siblings(cpu).unwrap_or_default();
        core.retain(|c| node_cpus.contains(c));
        core.insert(cpu);
        seen.extend(core.iter().copied());
        out.push(core);
    }
    out
}

/// How many cores are reserved, for TX and for RX on a node of `cores` cores.
pub fn core_counts(cores: u32) -> (u32, u32, u32) {
    let n = cores.min(REFERENCE_CORES);
    (n * RESERVED_CORES / REFERENCE_CORES, n * TX_CORES / REFERENCE_CORES, n * RX_CORES / REFERENCE_CORES)
}

/// Applies the rule to each NIC, in the order given.
pub fn compute(view: &dyn NodeView, ifnames: &[String]) -> Result<Vec<NicCpus>, NcclError> {
    ifnames
        .iter()
        .map(|ifname| {
            let (node, node_cpus) = nic_node(view, ifname)?;
            let cores = cores(view, &node_cpus);
            let (reserved, tx, rx) = core_counts(cores.len() as u32);
            if tx == 0 || rx == 0 {
                return Err(NcclError::TooFewCores { node, cores: cores.len() });
            }
            let take = |from: u32, n: u32| -> BTreeSet<u32> {
                cores.iter().skip(from as usize).take(n as usize).flatten().copied().collect()
            };
            Ok(NicCpus {
                ifname: ifname.clone(),
                node,
                tx: take(reserved, tx),
                rx: take(reserved + tx, rx),
                node_cpus,
            })
        })
        .collect()
}

/// The plugin's binding value: `eth1:8-21,112-125;eth2:…`.
pub fn format(entries: &[(String, BTreeSet<u32>)]) -> String {
    entries.iter().map(|(nic, set)| format!("{nic}:{}", cpus::format(set))).collect::<Vec<_>>().join(";")
}

/// Why a binding value did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{entry}\" is not IFNAME:CPULIST (e.g. eth1:8-21,112-125)")]
pub struct BindingError {
    pub entry: String,
}

/// Parses a binding value back into (NIC, CPUs) pairs, in order.
pub fn parse(text: &str) -> Result<Vec<(String, BTreeSet<u32>)>, BindingError> {
    text.split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let bad = || BindingError { entry: entry.to_string() };
            let (nic, list) = entry.split_once(':').ok_or_else(bad)?;
            let set = cpus::parse(list).map_err(|_| bad())?;
            if nic.trim().is_empty() || set.is_empty() {
                return Err(bad());
            }
            Ok((nic.trim().to_string(), set))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::sysfs::FakeNode;
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_published_profile_comes_out_of_two_52_core_nodes() {
        let node = FakeNode::smt2(2, 52)
            .nic("eth1", Some(0))
            .nic("eth2", Some(0))
            .nic("eth3", Some(1))
            .nic("eth4", Some(1));
        let out = compute(&node, &names(&["eth1", "eth2", "eth3", "eth4"])).unwrap();
        let tx: Vec<_> = out.iter().map(|n| (n.ifname.clone(), n.tx.clone())).collect();
        let rx: Vec<_> = out.iter().map(|n| (n.ifname.clone(), n.rx.clone())).collect();
        assert_eq!(format(&tx), "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177");
        assert_eq!(
            format(&rx),
            "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191"
        );
        for n in &out {
            assert!(n.tx.is_disjoint(&n.rx), "{n:?}");
            assert!(n.tx.is_subset(&n.node_cpus) && n.rx.is_subset(&n.node_cpus), "{n:?}");
        }
    }

    #[test]
    fn small_nodes_scale_down_and_tiny_ones_are_refused() {
        assert_eq!(core_counts(52), (8, 14, 14));
        assert_eq!(core_counts(104), (8, 14, 14));
        assert_eq!(core_counts(26), (4, 7, 7));
        assert_eq!(core_counts(4), (0, 1, 1));
        let node = FakeNode::smt2(1, 13).nic("eth1", None);
        let out = compute(&node, &names(&["eth1"])).unwrap();
        // 13 cores: 2 reserved, 3 TX, 3 RX; siblings 13 above.
        assert_eq!(cpus::format(&out[0].tx), "2-4,15-17");
        assert_eq!(cpus::format(&out[0].rx), "5-7,18-20");
        let tiny = FakeNode::smt2(1, 3).nic("eth1", Some(0));
        assert!(matches!(
            compute(&tiny, &names(&["eth1"])),
            Err(NcclError::TooFewCores { node: 0, cores: 3 })
        ));
    }

    #[test]
    fn an_unknown_numa_node_is_only_guessed_on_a_one_node_machine() {
        let one = FakeNode::smt2(1, 52).nic("eth1", None);
        assert_eq!(compute(&one, &names(&["eth1"])).unwrap()[0].node, 0);
        let two = FakeNode::smt2(2, 52).nic("eth1", None);
        assert!(matches!(compute(&two, &names(&["eth1"])), Err(NcclError::NumaUnknown { nodes: 2, .. })));
        let bad = FakeNode::smt2(1, 52).nic("eth1", Some(3));
        assert!(matches!(compute(&bad, &names(&["eth1"])), Err(NcclError::NoSuchNode { node: 3, .. })));
        assert!(matches!(compute(&FakeNode::default(), &names(&["eth1"])), Err(NcclError::NoCpuInfo)));
    }

    #[test]
    fn without_sibling_information_each_cpu_is_a_core() {
        let mut node = FakeNode::smt2(1, 52).nic("eth1", Some(0));
        node.siblings.clear();
        let out = compute(&node, &names(&["eth1"])).unwrap();
        // 104 one-thread "cores": capped at the reference counts.
        assert_eq!(cpus::format(&out[0].tx), "8-21");
        assert_eq!(cpus::format(&out[0].rx), "22-35");
    }

    #[test]
    fn binding_values_parse_back() {
        let v = parse("eth1:8-21,112-125;eth2:8-21").unwrap();
        assert_eq!(v[0].0, "eth1");
        assert_eq!(v[0].1.len(), 28);
        assert_eq!(format(&v), "eth1:8-21,112-125;eth2:8-21");
        for bad in ["eth1", "eth1:", ":1-2", "eth1:x"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
