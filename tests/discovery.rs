//! Discovery over fabricated sysfs trees laid out like the kernel's: PCI functions
//! nested under `devices/pciDDDD:BB`, `class/net/<if>` as relative symlinks into
//! `devices/…/net/<if>`, and `device` links `../../../<pci>`.

use std::fs;

use tcpx_rxdm::config::discovery::{discover, discover_in, DiscoveryError};
use tcpx_rxdm::config::views::SysfsViews;
use tcpx_rxdm::types::topology::NicSpec;
use tempfile::TempDir;

mod common;
use common::sysfs::*;

fn any_address(_: &str) -> bool {
    true
}

/// `ifname nic_pci: gpu_pci[queues] ...` per NIC, compact enough to assert whole.
fn summary(nics: &[NicSpec]) -> Vec<String> {
    nics.iter()
        .map(|n| {
            let gpus: Vec<String> = n
                .gpus
                .iter()
                .map(|g| {
                    let q: Vec<String> = g.queues.iter().map(u32::to_string).collect();
                    format!("{}[{}]", g.pci, q.join(","))
                })
                .collect();
            format!("{} {}: {}", n.ifname, n.pci.map(|p| p.to_string()).unwrap_or_default(), gpus.join(" "))
        })
        .collect()
}

/// a3-highgpu-8g as discovery sees it: each NIC with its two GPUs and their queues.
const A3_HIGHGPU_8G: [&str; 4] = [
    "eth1 0000:06:00.0: 0000:04:00.0[8,9,10,11] 0000:05:00.0[12,13,14,15]",
    "eth2 0000:0c:00.0: 0000:0a:00.0[8,9,10,11] 0000:0b:00.0[12,13,14,15]",
    "eth3 0000:86:00.0: 0000:84:00.0[8,9,10,11] 0000:85:00.0[12,13,14,15]",
    "eth4 0000:8c:00.0: 0000:8a:00.0[8,9,10,11] 0000:8b:00.0[12,13,14,15]",
];

#[test]
fn a3_highgpu_8g_topology() {
    let fs = a3_highgpu_8g();
    let nics = discover(fs.root(), 2, 8, 8, &any_address).unwrap();
    assert_eq!(summary(&nics), A3_HIGHGPU_8G);
}

#[test]
fn rss_set_size_offsets_queues() {
    let fs = a3_highgpu_8g();
    let nics = discover(fs.root(), 2, 4, 4, &any_address).unwrap();
    assert_eq!(nics.len(), 4);
    assert_eq!(nics[2].gpus[0].queues, [4, 5]);
    assert_eq!(nics[2].gpus[1].queues, [6, 7]);
}

#[test]
fn one_hop_stops_at_the_downstream_port() {
    // One hop up from each NIC is its own downstream port, which holds no GPU.
    let fs = a3_highgpu_8g();
    assert_eq!(summary(&discover(fs.root(), 1, 8, 8, &any_address).unwrap()), Vec::<String>::new());
}

#[test]
fn hops_beyond_the_root_complex_skip_the_nic() {
    // Each NIC has four PCI functions below its root complex: three hops reach the root
    // port (same GPUs), four would reach the root complex itself, so the NIC is skipped.
    let fs = a3_highgpu_8g();
    assert_eq!(discover(fs.root(), 3, 8, 8, &any_address).unwrap().len(), 4);
    assert!(discover(fs.root(), 4, 8, 8, &any_address).unwrap().is_empty());
}

#[test]
fn zero_hops_is_rejected() {
    let fs = a3_highgpu_8g();
    assert!(matches!(discover(fs.root(), 0, 8, 8, &any_address), Err(DiscoveryError::ZeroHops)));
}

#[test]
fn only_nvidia_display_functions_are_gpus() {
    let fs = FakeSysfs::new();
    let up = "pci0000:00/0000:00:01.0/0000:01:00.0";
    fs.pci("pci0000:00/0000:00:01.0", ROOT_PORT).pci(up, BRIDGE);
    for (bus, kind) in [(3, NVSWITCH), (4, AMD_GPU), (5, NVME), (6, GVNIC), (7, H100)] {
        let dsp = format!("{up}/0000:02:{bus:02x}.0");
        fs.pci(&dsp, BRIDGE).pci(&format!("{dsp}/0000:{bus:02x}:00.0"), kind);
    }
    fs.nic("eth10", &format!("{up}/0000:02:06.0/0000:06:00.0"));
    // A second block with no NVIDIA GPU at all: its NIC is skipped.
    let up2 = "pci0000:00/0000:00:02.0/0000:11:00.0";
    fs.pci("pci0000:00/0000:00:02.0", ROOT_PORT).pci(up2, BRIDGE);
    for (bus, kind) in [(0x13, AMD_GPU), (0x14, NVSWITCH), (0x15, GVNIC)] {
        let dsp = format!("{up2}/0000:12:{bus:02x}.0");
        fs.pci(&dsp, BRIDGE).pci(&format!("{dsp}/0000:{bus:02x}:00.0"), kind);
    }
    fs.nic("eth2", &format!("{up2}/0000:12:15.0/0000:15:00.0"));

    let nics = discover(fs.root(), 2, 8, 8, &any_address).unwrap();
    assert_eq!(summary(&nics), ["eth10 0000:06:00.0: 0000:07:00.0[8,9,10,11,12,13,14,15]"]);
}

#[test]
fn uneven_split_is_an_error() {
    let fs = a3_highgpu_8g();
    // A third H100 under eth3's switch: 8 queues do not split over 3 GPUs.
    fs.pci("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:04.0", BRIDGE)
        .pci("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:04.0/0000:83:00.0", H100);
    let err = discover(fs.root(), 2, 8, 8, &any_address).unwrap_err();
    match &err {
        DiscoveryError::UnevenQueueSplit { ifname, gpus, tcpd_queue_size } => {
            assert_eq!((ifname.as_str(), *gpus, *tcpd_queue_size), ("eth3", 3, 8));
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(err.to_string().contains("eth3"), "{err}");
    // 6 queues do split over 3 GPUs (and over 2 on the other NICs).
    let nics = discover(fs.root(), 2, 8, 6, &any_address).unwrap();
    assert_eq!(
        summary(&nics[2..3]),
        ["eth3 0000:86:00.0: 0000:83:00.0[8,9] 0000:84:00.0[10,11] 0000:85:00.0[12,13]"]
    );
    // Fewer queues than GPUs.
    assert!(matches!(
        discover(fs.root(), 2, 8, 1, &any_address),
        Err(DiscoveryError::UnevenQueueSplit { gpus: 2, tcpd_queue_size: 1, .. })
    ));
}

#[test]
fn interfaces_without_an_address_are_skipped() {
    let fs = a3_highgpu_8g();
    let nics = discover(fs.root(), 2, 8, 8, &|ifname: &str| ifname != "eth2" && ifname != "eth4").unwrap();
    let names: Vec<&str> = nics.iter().map(|n| n.ifname.as_str()).collect();
    assert_eq!(names, ["eth1", "eth3"]);
    assert!(discover(fs.root(), 2, 8, 8, &|_: &str| false).unwrap().is_empty());
}

#[test]
fn missing_class_net_names_the_path() {
    let dir = TempDir::new().unwrap();
    let err = discover(dir.path(), 2, 8, 8, &any_address).unwrap_err();
    assert!(matches!(&err, DiscoveryError::ReadDir { path, .. } if path.ends_with("class/net")), "{err}");
}

#[test]
fn malformed_vendor_names_the_file() {
    let fs = a3_highgpu_8g();
    let gpu = fs.root().join("devices/pci0000:00/0000:00:02.0/0000:07:00.0/0000:08:01.0/0000:0a:00.0");
    fs::write(gpu.join("vendor"), "nvidia\n").unwrap();
    let err = discover(fs.root(), 2, 8, 8, &any_address).unwrap_err();
    match err {
        DiscoveryError::BadAttr { path, value } => {
            assert_eq!(path, gpu.canonicalize().unwrap().join("vendor"));
            assert_eq!(value, "nvidia");
        }
        other => panic!("unexpected error {other}"),
    }
}

/// A Pod in a network namespace of its own: its sysfs lists eth1..eth4 with
/// device links into a PCI tree it lacks; the host's sysfs holds the tree
/// and the GPUs but lists only the host's interfaces.
#[test]
fn a_pod_s_interfaces_are_found_in_the_host_s_pci_tree_by_address() {
    let host = a3_highgpu_8g();
    host.bus_links();
    let ifnames = ["eth1", "eth2", "eth3", "eth4"];
    let moved: Vec<(&str, std::path::PathBuf)> = ifnames.iter().map(|i| (*i, host.device_of(i))).collect();
    for i in ifnames {
        host.moved_away(i);
    }
    let pod = pod_sysfs(&moved);
    let views = SysfsViews::pod(pod.root(), host.root());
    let nics = discover_in(&views, 2, 8, 8, &any_address).unwrap();
    assert_eq!(summary(&nics), A3_HIGHGPU_8G);
    // The host's sysfs alone, as read before: the Pod's NICs are not there.
    assert!(discover(host.root(), 2, 8, 8, &any_address).unwrap().is_empty());
    // The Pod's alone: its device links lead nowhere.
    assert!(discover(pod.root(), 2, 8, 8, &any_address).unwrap().is_empty());
    // Addresses are the Pod's own: one without is skipped there too.
    let some = discover_in(&views, 2, 8, 8, &|i: &str| i != "eth3").unwrap();
    assert_eq!(some.iter().map(|n| n.ifname.as_str()).collect::<Vec<_>>(), ["eth1", "eth2", "eth4"]);
}

/// The NCCL settings' NUMA nodes and control NIC in the same layout.
#[test]
fn a_pod_s_nic_numa_nodes_come_from_the_host_s_tree() {
    use tcpx_rxdm::nccl::{NodeView, Sysfs};
    let host = a3_highgpu_8g();
    host.bus_links().numa_node("eth1", 0).numa_node("eth3", 1);
    let moved: Vec<(&str, std::path::PathBuf)> =
        ["eth1", "eth3"].iter().map(|i| (*i, host.device_of(i))).collect();
    host.moved_away("eth1").moved_away("eth3");
    let pod = pod_sysfs(&moved);
    let view = Sysfs::with_views(SysfsViews::pod(pod.root(), host.root()));
    assert_eq!((view.nic_numa_node("eth1"), view.nic_numa_node("eth3")), (Some(0), Some(1)));
    // The Pod's interfaces, its veth eth0 among them (no device), not the host's.
    let names: Vec<(String, bool)> = view.interfaces();
    assert_eq!(
        names,
        [
            ("eth0".to_string(), false),
            ("eth1".to_string(), true),
            ("eth3".to_string(), true),
            ("lo".to_string(), false)
        ]
    );
}
