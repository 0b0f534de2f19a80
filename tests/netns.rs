//! Privileged tests against the real kernel. Each test makes its own network
//! namespace holding a veth pair (`eth1` ↔ `eth1p`, 4 queues each), runs the
//! code under test on a thread that joined that namespace (sockets opened
//! there belong to it), and deletes the namespace afterwards, also on failure
//! (`common::netns`).
//!
//! Needs root and iproute2 (`ip`): ignored by a plain `cargo test`; CI runs them
//! as root with `cargo test -- --include-ignored`, where missing root or `ip`
//! fails loudly.
//! They run one at a time (they would only compete for the CPU, but `ip`
//! output is easier to read that way).

mod common;

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use common::netns::{veth_topology, Netns};
use nix::errno::Errno;
use tcpx_rxdm::host::tuning::{HostTuning, TuningParams, TuningPlan};
use tcpx_rxdm::nic::ethtool::EthtoolNic;
use tcpx_rxdm::nic::{
    spawn_link_monitor, FlowSpec, HeaderSplit, NicControl, NicEvent, NicInfo, NicOp, NicSetup, RuleControl,
    FEATURE_NTUPLE, STAT_RESET_CNT,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_features_channels_and_stats_on_veth() {
    let _g = serial();
    let ns = Netns::with_veth("feat");
    let peer_index = ns.ifindex("eth1p");
    let index = ns.ifindex("eth1");
    ns.ip(&["addr", "add", "10.77.0.1/24", "dev", "eth1"]);
    ns.ip(&["addr", "add", "fd00:77::1/64", "dev", "eth1", "nodad"]);
    ns.run(|| {
        let nic = EthtoolNic::open().expect("ethtool backend");
        assert_eq!(nic.backend(), "ethtool");
        assert_eq!(nic.ifindex("eth1").unwrap(), index);
        assert_eq!(nic.ifindex("nope0").unwrap_err().errno, Errno::ENODEV);
        let addrs = nic.addresses("eth1").unwrap();
        for a in ["10.77.0.1", "fd00:77::1"] {
            assert!(addrs.contains(&a.parse::<IpAddr>().unwrap()), "{a} not in {addrs:?}");
        }
        assert!(nic.addresses("eth1p").unwrap().iter().all(|a| !a.is_ipv4()));

        // Channels: veth has rx/tx channels, no combined ones.
        assert_eq!(nic.channels("eth1").unwrap(), 4);
        nic.set_channels("eth1", Some(2), None).unwrap();
        assert_eq!(nic.channels("eth1").unwrap(), 2);
        let c = nic.channel_counts("eth1").unwrap();
        assert_eq!((c.rx, c.tx, c.combined, c.rx_max), (2, 4, 0, 4));
        nic.set_channels("eth1", Some(4), None).unwrap();
        assert_eq!(nic.channels("eth1").unwrap(), 4);

        // Features by name: GRO is changeable on veth, ntuple is fixed off.
        assert!(!nic.feature("eth1", "rx-gro").unwrap());
        nic.set_feature("eth1", "rx-gro", true).unwrap();
        assert!(nic.feature("eth1", "rx-gro").unwrap());
        nic.set_feature("eth1", "rx-gro", false).unwrap();
        assert!(!nic.feature("eth1", "rx-gro").unwrap());
        assert!(nic.feature("eth1", "tx-scatter-gather").unwrap());
        assert!(!nic.feature("eth1", FEATURE_NTUPLE).unwrap());
        nic.set_feature("eth1", FEATURE_NTUPLE, false).unwrap(); // already off: no-op
        let e = nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap_err();
        assert_eq!((e.op, e.errno, e.ifname.as_str()), (NicOp::SetFeature, Errno::EOPNOTSUPP, "eth1"));
        assert!(e.to_string().contains("rx-ntuple-filter is fixed off"), "{e}");
        assert_eq!(nic.feature("eth1", "no-such-feature").unwrap_err().errno, Errno::EOPNOTSUPP);

        // No private flags, no rings: the family without header split.
        assert!(nic.priv_flags("eth1").unwrap().is_empty());
        assert_eq!(nic.tcp_data_split("eth1").unwrap_err().errno, Errno::EOPNOTSUPP);
        assert_eq!(nic.rx_ring("eth1").unwrap_err().errno, Errno::EOPNOTSUPP);
        assert_eq!(HeaderSplit::probe(&nic, "eth1").unwrap(), HeaderSplit::Unsupported);
        let e = nic.set_priv_flag("eth1", "enable-header-split", true).unwrap_err();
        assert_eq!((e.op, e.errno), (NicOp::SetPrivFlag, Errno::EOPNOTSUPP));
        let e = nic.set_tcp_data_split("eth1", true).unwrap_err();
        assert_eq!((e.op, e.errno), (NicOp::SetTcpDataSplit, Errno::EOPNOTSUPP));

        // Driver stats through GSSET_INFO/GSTRINGS/GSTATS: veth reports its peer.
        assert_eq!(nic.stat("eth1", "peer_ifindex").unwrap(), Some(u64::from(peer_index)));
        assert_eq!(nic.stat("eth1", STAT_RESET_CNT).unwrap(), None);
        assert_eq!(nic.stat("lo", "anything").unwrap(), None);
    });
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_rule_and_rss_ioctls_reach_the_driver() {
    let _g = serial();
    let ns = Netns::with_veth("rule");
    ns.run(|| {
        let nic = EthtoolNic::open().unwrap();
        let flow =
            FlowSpec { src: "10.1.0.2:40000".parse().unwrap(), dst: "10.77.0.1:5000".parse().unwrap() };
        let e = nic.add_rule("eth1", &flow, 1, 0).unwrap_err();
        assert_eq!((e.op, e.errno, e.ifname.as_str()), (NicOp::AddRule, Errno::EOPNOTSUPP, "eth1"));
        let msg = e.to_string();
        assert!(msg.contains("add_rule on eth1") && msg.contains("ETHTOOL_SRXCLSRLINS"), "{msg}");
        let flow6 = FlowSpec { src: "[fd00::2]:1".parse().unwrap(), dst: "[fd00::1]:2".parse().unwrap() };
        assert_eq!(nic.add_rule("eth1", &flow6, 1, 1).unwrap_err().errno, Errno::EOPNOTSUPP);
        // Same call on a device that does not exist: the kernel's lookup answers.
        assert_eq!(nic.add_rule("nope0", &flow, 1, 0).unwrap_err().errno, Errno::ENODEV);
        for (op, e) in [
            (NicOp::DelRule, nic.del_rule("eth1", 0).unwrap_err()),
            (NicOp::ListRules, nic.list_rules("eth1").unwrap_err()),
            (NicOp::RuleCapacity, nic.rule_capacity("eth1").unwrap_err()),
            (NicOp::GetRss, nic.rss_table("eth1").unwrap_err()),
            (NicOp::SetRss, nic.set_rss_table("eth1", &[0, 1]).unwrap_err()),
        ] {
            assert_eq!((e.op, e.errno), (op, Errno::EOPNOTSUPP), "{e}");
        }
    });
}

/// Waits up to 5 s for an event matching `want`, skipping others.
fn wait_for(
    rt: &tokio::runtime::Runtime,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<NicEvent>,
    want: &NicEvent,
) {
    rt.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(ev)) if &ev == want => return,
                Ok(Some(_)) => continue,
                Ok(None) => panic!("monitor stopped before {want:?}"),
                Err(_) => panic!("no {want:?} within 5 s"),
            }
        }
    })
}

/// Takes whatever events are already queued.
fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<NicEvent>) {
    while rx.try_recv().is_ok() {}
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_monitor_sees_link_down_address_change_and_removal() {
    let _g = serial();
    let ns = Netns::with_veth("mon");
    ns.run(|| {
        // No IPv6 autoconfiguration: its address events would mask ours.
        for dev in ["eth1", "eth1p"] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1").unwrap();
        }
        ns.wait_oper_up("eth1");
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let nic: Arc<dyn NicControl> = Arc::new(EthtoolNic::open().unwrap());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut handle = spawn_link_monitor(vec!["eth1".into()], nic.clone(), tx).expect("monitor");
        std::thread::sleep(Duration::from_millis(50));
        drain(&mut rx);

        ns.ip(&["addr", "add", "10.66.0.1/24", "dev", "eth1"]);
        wait_for(&rt, &mut rx, &NicEvent::AddressesChanged);
        ns.ip(&["link", "set", "eth1", "down"]);
        wait_for(&rt, &mut rx, &NicEvent::LinkDown("eth1".into()));
        ns.ip(&["link", "set", "eth1", "up"]);
        ns.wait_oper_up("eth1");
        drain(&mut rx);
        // The peer going down takes eth1's carrier away: also a link down.
        ns.ip(&["link", "set", "eth1p", "down"]);
        wait_for(&rt, &mut rx, &NicEvent::LinkDown("eth1".into()));
        drain(&mut rx);
        ns.ip(&["addr", "del", "10.66.0.1/24", "dev", "eth1"]);
        wait_for(&rt, &mut rx, &NicEvent::AddressesChanged);
        ns.ip(&["link", "del", "eth1"]);
        wait_for(&rt, &mut rx, &NicEvent::Removed("eth1".into()));

        // Stopping ends the thread (joined inside stop) and closes the channel.
        handle.stop();
        rt.block_on(async {
            while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {}
        });
        assert!(rx.is_closed());
        // A monitor for an interface that is not there does not start.
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let e = spawn_link_monitor(vec!["eth1".into()], nic, tx).unwrap_err();
        assert!(e.to_string().contains("eth1"), "{e}");
    });
}

/// Host tuning applied inside `ns`, undone there when dropped.
struct TuningInNs<'a> {
    ns: &'a Netns,
    tuning: Option<HostTuning>,
}

impl Drop for TuningInNs<'_> {
    fn drop(&mut self) {
        if let Some(mut t) = self.tuning.take() {
            self.ns.run(move || drop(t.restore()));
        }
    }
}

fn read_sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/{name}"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_tuning_sysctls_and_routes_applied_and_restored() {
    let _g = serial();
    let ns = Netns::with_veth("tune");
    ns.ip(&["addr", "add", "10.88.0.1/24", "dev", "eth1"]);
    ns.ip(&["addr", "add", "fd00:88::1/64", "dev", "eth1", "nodad"]);
    ns.ip(&["route", "add", "default", "via", "10.88.0.2", "dev", "eth1", "mtu", "1400"]);
    let host_rmem = read_sysctl("ipv4/tcp_rmem");
    let host_probing = read_sysctl("ipv4/tcp_mtu_probing");
    let routes_before = ns.ip(&["route", "show"]);
    // IPv6 link-local routes appear when the carrier does (asynchronously):
    // compare only the route of our address.
    let route6 = || {
        ns.ip(&["-6", "route", "show"]).lines().find(|l| l.starts_with("fd00:88::/64")).unwrap().to_string()
    };
    let route6_before = route6();
    let sysfs = tempfile::tempdir().unwrap();
    let hystart = sysfs.path().join("module/tcp_cubic/parameters/hystart_detect");
    std::fs::create_dir_all(hystart.parent().unwrap()).unwrap();
    std::fs::write(&hystart, "3\n").unwrap();
    let params = TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 1 };

    let tuning = ns.run(|| {
        let before = read_sysctl("ipv4/tcp_rmem");
        let plan = TuningPlan::Native { procfs_root: "/proc".into(), sysfs_root: sysfs.path().into() };
        let (tuning, errors) = HostTuning::apply(&params, &plan);
        assert!(errors.is_empty(), "{errors:?}");
        // This thread's /proc/sys/net is the namespace's.
        assert_eq!(read_sysctl("ipv4/tcp_rmem"), "4096 1048576 15728640");
        assert_ne!(before, "4096 1048576 15728640");
        assert_eq!(read_sysctl("ipv4/tcp_mtu_probing"), "0");
        assert_eq!(read_sysctl("ipv4/tcp_no_metrics_save"), "1");
        tuning
    });
    // Restore must happen in the namespace too, even if an assert below fails:
    // /proc/sys/net and rtnetlink follow the calling thread's namespace.
    let mut tuning = TuningInNs { ns: &ns, tuning: Some(tuning) };
    // Seen from a process in the namespace too, and not in the host's.
    let in_ns = |name: &str| {
        let out = ns.command("cat").arg(name).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    assert_eq!(in_ns("/proc/sys/net/ipv4/tcp_wmem"), "4096 1048576 67108864");
    assert_eq!(read_sysctl("ipv4/tcp_rmem"), host_rmem);
    assert_eq!(read_sysctl("ipv4/tcp_mtu_probing"), host_probing);
    assert_eq!(std::fs::read_to_string(&hystart).unwrap(), "2");
    let routes = ns.ip(&["route", "show"]);
    for line in routes.lines() {
        assert!(
            line.contains("initcwnd 128") && line.contains("rto_min 2ms") && line.contains("quickack 1"),
            "{line}"
        );
    }
    assert!(routes.contains("default via 10.88.0.2 dev eth1") && routes.contains("mtu 1400"), "{routes}");
    assert!(routes.contains("10.88.0.0/24 dev eth1 proto kernel scope link src 10.88.0.1"), "{routes}");
    let tuned6 = route6();
    assert!(tuned6.contains("initcwnd 128") && tuned6.contains("rto_min 2ms"), "{tuned6}");

    let mut t = tuning.tuning.take().unwrap();
    ns.run(|| {
        t.restore().unwrap();
        t.restore().unwrap();
        assert_ne!(read_sysctl("ipv4/tcp_rmem"), "4096 1048576 15728640");
    });
    assert_eq!(ns.ip(&["route", "show"]), routes_before);
    assert_eq!(route6(), route6_before);
    assert_eq!(std::fs::read_to_string(&hystart).unwrap(), "3");
}

/// What `ethtool -k` and `ethtool -l` show, read through the backend.
fn nic_snapshot(nic: &EthtoolNic) -> (Vec<(String, bool)>, tcpx_rxdm::nic::ethtool::genl::Channels) {
    (nic.feature_states("eth1").unwrap(), nic.channel_counts("eth1").unwrap())
}

/// The real daemon on a veth (no ntuple) fails cleanly, names the interface
/// and the operation, and leaves the NIC as found.
#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_daemon_on_veth_fails_cleanly_and_leaves_the_nic_as_found() {
    let _g = serial();
    let ns = Netns::with_veth("daemon");
    let before = ns.run(|| nic_snapshot(&EthtoolNic::open().unwrap()));
    assert!(before.0.iter().any(|(n, on)| n == "tx-scatter-gather" && *on), "{before:?}");
    let uds = tempfile::tempdir().unwrap();
    let daemon = |backend: &str, ifname: &str| {
        let out = ns
            .bin()
            .arg("--gpu_nic_preset=manual")
            .arg(format!("--gpu_nic_topology_proto={}", veth_topology(ifname, Some("0000:06:00.0"))))
            .arg(format!("--nic_backend={backend}"))
            .args(["--gpu_backend=host", "--bind_backend=none", "--metrics_address="])
            .arg(format!("--uds_path={}", uds.path().display()))
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    for backend in ["ethtool", "auto"] {
        let (code, stderr) = daemon(backend, "eth1");
        assert_eq!(code, Some(1), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let last = stderr.lines().last().unwrap();
        assert!(
            last.contains("eth1") && last.contains("rule_capacity") && last.contains("EOPNOTSUPP"),
            "{last}"
        );
        assert!(std::fs::read_dir(uds.path()).unwrap().next().is_none(), "socket folder cleaned up");
    }
    let after = ns.run(|| nic_snapshot(&EthtoolNic::open().unwrap()));
    assert_eq!(before, after);

    // `auto` with an interface this host lacks is a configuration error.
    let (code, stderr) = daemon("auto", "eth9");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("interface eth9 not found"), "{stderr}");
}
