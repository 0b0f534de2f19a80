//! `tcpx-rxdm doctor` on a veth pair in a private network namespace: a NIC
//! without ntuple or header split must fail with the right lines, and the
//! check must change nothing (features, channels, private flags, RSS, the TCP
//! sysctls and the routes' metrics read the same before and after).
//!
//! Needs root and iproute2, so it is ignored by default; run it with
//! `cargo test --test doctor_netns -- --include-ignored` (CI runs as root).
//! The namespace comes from `common::netns`.

mod common;

use common::netns::{veth_topology, Netns};
use tcpx_rxdm::nic::ethtool::EthtoolNic;
use tcpx_rxdm::nic::NicSetup;

/// A namespace holding `eth1` ↔ `eth1p` (4 queues each), up, with an
/// address on eth1, hence a main-table route whose metrics the check reads.
fn doctor_ns() -> Netns {
    let ns = Netns::with_veth("doctor");
    ns.ip(&["addr", "add", "10.9.0.1/24", "dev", "eth1"]);
    ns
}

/// `ip route` of the namespace with metrics (what host tuning would change).
fn routes(ns: &Netns) -> String {
    ns.ip(&["-d", "route", "show", "table", "main"])
}

type Snapshot = (Vec<(String, bool)>, String, Vec<(String, bool)>, String, Vec<String>);

/// What `ethtool -k`, `-l`, `--show-priv-flags`, `-x` and the sysctls show, through our read calls.
fn snapshot() -> Snapshot {
    let nic = EthtoolNic::open().unwrap();
    let sysctls = ["tcp_rmem", "tcp_wmem", "tcp_no_metrics_save", "tcp_slow_start_after_idle"]
        .iter()
        .map(|k| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{k}")).unwrap())
        .collect();
    (
        nic.feature_states("eth1").unwrap(),
        format!("{:?}", nic.channel_counts("eth1").unwrap()),
        nic.priv_flags("eth1").unwrap(),
        format!("{:?}", nic.rss_table("eth1")),
        sysctls,
    )
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn doctor_on_a_veth_reports_no_ntuple_and_changes_nothing() {
    let ns = doctor_ns();
    let before = (ns.run(snapshot), routes(&ns));
    assert!(before.1.contains("10.9.0.0/24"), "{}", before.1);
    let uds = tempfile::tempdir().unwrap();
    let folder = uds.path().join("sockets");
    let out = ns
        .bin()
        .arg("doctor")
        .arg("--gpu_nic_preset=manual")
        .arg(format!("--gpu_nic_topology_proto={}", veth_topology("eth1", None)))
        .args(["--nic_backend=ethtool", "--gpu_backend=host", "--bind_backend=none"])
        .arg(format!("--uds_path={}", folder.display()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let has = |needle: &str| assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    has("✔ present: ifindex");
    has("✔ link: operstate up");
    has("✔ driver: veth");
    has("✗ ntuple: not supported: the driver has no ntuple rule table");
    has("rule_capacity on eth1 failed: EOPNOTSUPP");
    has("✗ header split: none: no private flags, no tcp-data-split, no ring control");
    has("✔ channels: 4 rx queues");
    has("NOT ready");
    // The layout: a namespace of its own, its NIC there, one sysfs (its own /sys).
    has("✔ place: a network namespace of its own, not the host's");
    has("✔ NICs: in this namespace: eth1 (no PCI device)");
    has("host-wide knobs (cubic's hystart_detect, any sysctl outside net) are the node's business");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The IPv4 route (and IPv6 link-local ones where IPv6 is on); none tuned yet.
    has("✔ route metrics: 0 of ");
    has("main-table routes already carry initcwnd 128");
    let after = (ns.run(snapshot), routes(&ns));
    assert_eq!(before, after, "doctor changed the NIC or the sysctls");
    assert!(!folder.exists(), "doctor created the socket folder");
}
