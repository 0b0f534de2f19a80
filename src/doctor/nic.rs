//! The NIC checks: presence, link and driver, header split, ntuple, channels,
//! RSS and resets, through the daemon's own [`NicControl`] read calls.

use std::path::Path;
use std::sync::Arc;

use nix::errno::Errno;

use super::header_split::header_split_lines;
use super::{ranges, Ctx, Report, Status};
use crate::nic::ethtool::EthtoolNic;
use crate::nic::sim::SimNic;
use crate::nic::{HeaderSplit, NicControl, FEATURE_NTUPLE, STAT_RESET_CNT};
use crate::types::topology::Topology;

pub(super) fn check_nics(r: &mut Report, ctx: &Ctx) {
    let Some(topo) = &ctx.topo else {
        r.add("NICs", "NIC checks", Status::Skip, "no topology, so no NIC to check", None);
        return;
    };
    let nic: Arc<dyn NicControl> = if ctx.sim_nic {
        let names: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        Arc::new(SimNic::new(&names))
    } else {
        match EthtoolNic::open() {
            Ok(n) => Arc::new(n),
            Err(e) => {
                r.add(
                    "NICs",
                    "ethtool netlink",
                    Status::Fail,
                    e.to_string(),
                    Some("the daemon programs NICs through ethtool netlink: needs Linux ≥ 5.6 and CAP_NET_ADMIN".into()),
                );
                return;
            }
        }
    };
    for spec in &topo.nics {
        check_nic(r, ctx, topo, nic.as_ref(), &spec.ifname);
    }
}

fn check_nic(r: &mut Report, ctx: &Ctx, topo: &Topology, nic: &dyn NicControl, ifname: &str) {
    let sec = format!("NIC {ifname}");
    let s = sec.as_str();
    let sysfs = ctx.views.root();
    let class =
        ctx.views.interface_dir(ifname).unwrap_or_else(|| ctx.views.own().join("class/net").join(ifname));
    match nic.ifindex(ifname) {
        Ok(i) if ctx.sim_nic => {
            r.add(s, "present", Status::Pass, format!("simulated NIC, ifindex {i}"), None)
        }
        Ok(i) => r.add(s, "present", Status::Pass, format!("ifindex {i}"), None),
        Err(e) => {
            r.add(
                s,
                "present",
                Status::Fail,
                format!("no interface {ifname} ({})", e.errno),
                Some("check `ip link`; if the NICs have other names, use --gpu_nic_preset=auto or a manual topology".into()),
            );
            return;
        }
    }
    if ctx.sim_nic {
        r.add(s, "link and driver", Status::Skip, "simulated NIC: no sysfs link state or driver", None);
    } else {
        let oper = std::fs::read_to_string(class.join("operstate")).map(|v| v.trim().to_string());
        match oper.as_deref() {
            Ok("up") => r.add(s, "link", Status::Pass, "operstate up", None),
            Ok(st) => r.add(
                s,
                "link",
                Status::Fail,
                format!("operstate {st}"),
                Some(format!("bring it up (`ip link set {ifname} up`) and check the VPC/network attachment")),
            ),
            Err(e) => r.add(
                s,
                "link",
                Status::Warn,
                format!("cannot read {}: {e}", class.join("operstate").display()),
                None,
            ),
        }
        let info = crate::nic::ethtool::ioctl::EthtoolIoctl::open().and_then(|io| io.drvinfo(ifname));
        let line = match info {
            Ok([driver, version, fw, bus]) => {
                let mut l = format!("{driver} {version}");
                if !fw.is_empty() && fw != "N/A" {
                    l.push_str(&format!(", firmware {fw}"));
                }
                if !bus.is_empty() && bus != "N/A" {
                    l.push_str(&format!(", bus {bus}"));
                }
                l.trim().to_string()
            }
            Err(_) => driver_line(sysfs, &class),
        };
        r.add(s, "driver", Status::Pass, line, None);
    }

    match HeaderSplit::probe(nic, ifname) {
        Ok(f) => header_split_lines(r, ctx, s, ifname, &f),
        Err(e) => r.add(s, "header split", Status::Fail, format!("probing the driver failed: {e}"), None),
    }

    let capacity = match nic.rule_capacity(ifname) {
        Ok(cap) if cap < topo.max_rx_rules => {
            r.add(
                s,
                "ntuple",
                Status::Warn,
                format!(
                    "supported, {cap} rule slots: fewer than max_rx_rules {}; the daemon uses {cap}",
                    topo.max_rx_rules
                ),
                None,
            );
            true
        }
        Ok(cap) => {
            r.add(s, "ntuple", Status::Pass, format!("supported, {cap} rule slots"), None);
            true
        }
        Err(e) => {
            let found = if e.errno == Errno::EOPNOTSUPP {
                format!("not supported: the driver has no ntuple rule table ({e})")
            } else {
                format!("cannot read the rule table: {e}")
            };
            r.add(
                s,
                "ntuple",
                Status::Fail,
                found,
                Some(format!(
                    "flow steering needs ntuple filters (gVNIC on A3 VMs); `ethtool -n {ifname}` shows what the driver offers"
                )),
            );
            false
        }
    };
    if capacity {
        let on = nic.feature(ifname, FEATURE_NTUPLE);
        let rules = nic.list_rules(ifname);
        match (on, rules) {
            (Ok(on), Ok(rules)) => {
                let state = if on { "on" } else { "off" };
                if let Some(pid) = ctx.daemon_on_these_nics() {
                    r.add(
                        s,
                        "ntuple state",
                        Status::Pass,
                        format!("{state}, {} rules (the running daemon, {pid}, owns them)", rules.len()),
                        None,
                    );
                } else if rules.is_empty() {
                    r.add(
                        s,
                        "ntuple state",
                        Status::Pass,
                        format!("{state}, no rules (the daemon turns ntuple on at start)"),
                        None,
                    );
                } else if ctx.daemon_unknown() {
                    r.add(
                        s,
                        "ntuple state",
                        Status::Warn,
                        format!(
                            "{state}, {} rules: a running daemon's, or stale ones a previous daemon left                              (whether a daemon runs cannot be told here: see the host section)",
                            rules.len()
                        ),
                        None,
                    );
                } else {
                    r.add(
                        s,
                        "ntuple state",
                        Status::Warn,
                        format!("{state}, {} stale rules and no daemon running: a previous daemon did not clean up", rules.len()),
                        Some(format!(
                            "harmless: the daemon flushes them at start (ntuple off, then on); by hand: `ethtool -K {ifname} ntuple off; ethtool -K {ifname} ntuple on`"
                        )),
                    );
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                r.add(s, "ntuple state", Status::Warn, format!("cannot read: {e}"), None)
            }
        }
    }

    let spec = topo.nics.iter().find(|n| n.ifname == ifname);
    let queues: Vec<u32> =
        spec.map(|n| n.gpus.iter().flat_map(|g| g.queues.iter().copied()).collect()).unwrap_or_default();
    let top = queues.iter().copied().max().unwrap_or(0);
    match nic.channels(ifname) {
        Ok(ch) if ch > top && ch >= topo.rss_set_size => r.add(
            s,
            "channels",
            Status::Pass,
            format!(
                "{ch} rx queues; the topology uses RSS 0..{} and GPU queues {}",
                topo.rss_set_size,
                ranges(&queues)
            ),
            None,
        ),
        Ok(ch) => r.add(
            s,
            "channels",
            Status::Fail,
            format!("{ch} rx queues, but the topology uses queue {top} (GPU queues {})", ranges(&queues)),
            Some(format!(
                "`ethtool -L {ifname} combined {}` (or rx), or a topology within {ch} queues",
                top + 1
            )),
        ),
        Err(e) => r.add(s, "channels", Status::Fail, format!("cannot read: {e}"), None),
    }

    match nic.rss_table(ifname) {
        Ok(t) => {
            let used: Vec<u32> = t.to_vec();
            let into_gpu = used.iter().any(|q| queues.contains(q));
            let found = format!("{} entries over queues {}", t.len(), ranges(&used));
            if ctx.daemon_on_these_nics().is_some() && into_gpu {
                r.add(
                    s,
                    "RSS",
                    Status::Warn,
                    format!("{found}: spreads into GPU queues while the daemon runs (changed after start?)"),
                    Some("restart the daemon; it sets RSS to the first rss_set_size queues".into()),
                );
            } else {
                let note = if into_gpu { "; the daemon narrows it to 0..rss_set_size at start" } else { "" };
                r.add(s, "RSS", Status::Pass, format!("{found}{note}"), None);
            }
        }
        Err(e) => r.add(
            s,
            "RSS",
            Status::Fail,
            format!("cannot read the indirection table: {e}"),
            Some("the daemon sets RSS at start and would fail the same way".into()),
        ),
    }

    match nic.stat(ifname, STAT_RESET_CNT) {
        Ok(Some(n)) => r.add(s, "resets", Status::Pass, format!("{STAT_RESET_CNT} {n}"), None),
        Ok(None) => r.add(s, "resets", Status::Skip, format!("the driver reports no {STAT_RESET_CNT}"), None),
        Err(e) => r.add(s, "resets", Status::Warn, format!("cannot read driver stats: {e}"), None),
    }
}

/// `gve 1.4.0` style: the driver link and the module version under sysfs.
fn driver_line(sysfs: &Path, class: &Path) -> String {
    let driver = std::fs::read_link(class.join("device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    match driver {
        None => "no device driver link (a virtual interface)".into(),
        Some(d) => {
            let version = std::fs::read_to_string(sysfs.join("module").join(&d).join("version"))
                .map(|v| format!("version {}", v.trim()))
                .unwrap_or_else(|_| "no module version (built in)".into());
            format!("{d}, {version}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags::Flags;
    use crate::config::presets::Source;
    use crate::doctor::report::Check;
    use crate::doctor::Lock;
    use crate::nic::NicOp;
    use crate::nic::PRIV_HEADER_SPLIT;

    use crate::nic::sim::{SimDriver, SimNic};
    use crate::nic::{FlowSpec, NicSetup, RuleControl};

    fn flags() -> Flags {
        Flags::parse_args(
            ["tcpx-rxdm", "--gpu_nic_preset=manual", "--gpu_nic_topology_proto=x"].map(String::from),
        )
        .unwrap()
    }

    /// The NIC lines for `eth1` of a topology using queues 8-11 and `top`,
    /// with the socket folder's lock as `lock`.
    fn nic_lines(nic: &SimNic, lock: Lock, top: u32) -> Vec<Check> {
        let flags = flags();
        let text = format!(
            r#"gpu_rxq_configs {{ gpu_infos {{ gpu_pci_addr: "0000:04:00.0" queue_ids: 8 queue_ids: 9 queue_ids: 10 queue_ids: {top} }} ifname: "eth1" }} rss_set_size: 8 max_rx_rules: 100"#
        );
        let topo = crate::config::presets::topology_from_text(&text, "test").unwrap();
        // A NIC the daemon would own (not simulated in its own process), but
        // driven through the simulated backend so its state can be prepared.
        let ctx = Ctx {
            flags: &flags,
            topo: Some(topo.clone()),
            source: Some(Source::Inline),
            sim_nic: false,
            daemon: match &lock {
                Lock::Held(pid) => Some(pid.clone()),
                _ => None,
            },
            lock,
            binding_needed: false,
            placed_gpus: None,
            views: crate::config::views::SysfsViews::new(&flags),
            netns: crate::host::netns::Netns::new(crate::host::netns::Place::Unknown, "test"),
        };
        let mut r = Report::default();
        check_nic(&mut r, &ctx, &topo, nic, "eth1");
        r.checks
    }

    fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no {name} in {checks:?}"))
    }

    #[test]
    fn a_nic_left_primed_warns_unless_a_daemon_owns_it() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        for port in [1u32, 2] {
            let f = FlowSpec {
                src: format!("10.0.0.2:{port}").parse().unwrap(),
                dst: "192.168.1.2:5".parse().unwrap(),
            };
            nic.add_rule("eth1", &f, 8, port).unwrap();
        }
        nic.set_priv_flag("eth1", PRIV_HEADER_SPLIT, true).unwrap();
        let before = (nic.list_rules("eth1").unwrap(), nic.priv_flags("eth1").unwrap());

        let alone = nic_lines(&nic, Lock::Free("the lock is free"), 11);
        let state = find(&alone, "ntuple state");
        assert_eq!(state.status, Status::Warn);
        assert!(state.found.contains("on, 2 stale rules"), "{state:?}");
        let hs = find(&alone, "header split state");
        assert_eq!(hs.status, Status::Warn);
        assert!(hs.fix.as_deref().unwrap().contains("ethtool --set-priv-flags eth1 enable-header-split off"));

        let owned = nic_lines(&nic, Lock::Held("pid 7".into()), 11);
        let state = find(&owned, "ntuple state");
        assert_eq!(state.status, Status::Pass);
        assert!(state.found.contains("the running daemon, pid 7, owns them"), "{state:?}");
        assert_eq!(find(&owned, "header split state").status, Status::Pass);

        // A lock this user cannot read: neither owned nor said to be stale.
        let unknown = nic_lines(&nic, Lock::Unknown("permission denied".into()), 11);
        for name in ["ntuple state", "header split state"] {
            let line = find(&unknown, name);
            assert!(line.found.contains("whether a daemon runs cannot be told"), "{line:?}");
            assert!(!line.found.contains("no daemon"), "{line:?}");
        }
        // Only read calls were made.
        assert_eq!((nic.list_rules("eth1").unwrap(), nic.priv_flags("eth1").unwrap()), before);
        for op in [NicOp::SetFeature, NicOp::SetPrivFlag, NicOp::SetRss, NicOp::AddRule, NicOp::DelRule] {
            let setup = match op {
                NicOp::SetFeature | NicOp::SetPrivFlag => 1,
                NicOp::AddRule => 2,
                _ => 0,
            };
            assert_eq!(nic.calls(op), setup, "{op} called by the checks");
        }
    }

    #[test]
    fn too_few_channels_fail_and_small_rule_tables_warn() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_capacity("eth1", 50);
        nic.model_driver("eth1", SimDriver::RingSizeOnly);
        let checks = nic_lines(&nic, Lock::Free("the lock is free"), 20);
        let ch = find(&checks, "channels");
        assert_eq!(ch.status, Status::Fail);
        assert!(ch.found.contains("16 rx queues, but the topology uses queue 20"), "{ch:?}");
        assert!(ch.fix.as_deref().unwrap().contains("ethtool -L eth1 combined 21"), "{ch:?}");
        let nt = find(&checks, "ntuple");
        assert_eq!(nt.status, Status::Warn);
        assert!(nt.found.contains("50 rule slots: fewer than max_rx_rules 100"), "{nt:?}");
        let hs = find(&checks, "header split");
        assert_eq!(hs.status, Status::Warn);
        assert!(hs.found.contains("rx ring 1024 of 4096"), "{hs:?}");
    }
}
