//! `tcpx-rxdm doctor` on a veth pair in a private network namespace: a NIC
//! without ntuple or header split must fail with the right lines, and the
//! check must change nothing (features, channels, private flags, RSS, the TCP
//! sysctls and the routes' metrics read the same before and after).
//!
//! Needs root and iproute2, so it is ignored by default; run it with
//! `cargo test --test doctor_netns -- --include-ignored` (CI runs as root).

use std::fs::File;
use std::process::Command;

use nix::sched::{setns, CloneFlags};
use tcpx_rxdm::nic::ethtool::EthtoolNic;
use tcpx_rxdm::nic::NicSetup;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("these tests need iproute2 (`ip`)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A namespace holding `eth1` ↔ `eth1p` (4 queues each), up; deleted on drop.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("rxdm-doctor-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        let q = ["numrxqueues", "4", "numtxqueues", "4"];
        let mut add = vec!["-n", ns.0.as_str(), "link", "add", "eth1"];
        add.extend(q);
        add.extend(["type", "veth", "peer", "name", "eth1p"]);
        add.extend(q);
        ip(&add);
        for dev in ["lo", "eth1", "eth1p"] {
            ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        }
        // An address, hence a main-table route whose metrics the check reads.
        ip(&["-n", &ns.0, "addr", "add", "10.9.0.1/24", "dev", "eth1"]);
        ns
    }

    /// Runs `f` on a thread that joined the namespace.
    /// `ip route` of the namespace with metrics (what host tuning would change).
    fn routes(&self) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.0, "-d", "route", "show", "table", "main"])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                let fd = File::open(format!("/run/netns/{}", self.0)).expect("namespace handle");
                setns(&fd, CloneFlags::CLONE_NEWNET).expect("setns");
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !Command::new("ip").args(["netns", "del", &self.0]).output().is_ok_and(|o| o.status.success()) {
            eprintln!("warning: could not delete network namespace {}", self.0);
        }
    }
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
#[ignore = "needs root (network namespaces)"]
fn doctor_on_a_veth_reports_no_ntuple_and_changes_nothing() {
    let ns = Netns::new();
    let before = (ns.run(snapshot), ns.routes());
    assert!(before.1.contains("10.9.0.0/24"), "{}", before.1);
    let uds = tempfile::tempdir().unwrap();
    let folder = uds.path().join("sockets");
    let topo = r#"gpu_rxq_configs { gpu_infos { gpu_pci_addr: "0000:04:00.0" queue_ids: 2 queue_ids: 3 } ifname: "eth1" } rss_set_size: 2 tcpd_queue_size: 2 max_rx_rules: 100"#;
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_tcpx-rxdm"), "doctor"])
        .arg("--gpu_nic_preset=manual")
        .arg(format!("--gpu_nic_topology_proto={topo}"))
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
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The IPv4 route (and IPv6 link-local ones where IPv6 is on); none tuned yet.
    has("✔ route metrics: 0 of ");
    has("main-table routes already carry initcwnd 128");
    let after = (ns.run(snapshot), ns.routes());
    assert_eq!(before, after, "doctor changed the NIC or the sysctls");
    assert!(!folder.exists(), "doctor created the socket folder");
}
