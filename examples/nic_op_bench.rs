//! NIC programming cost per rule: our one `SIOCETHTOOL` ioctl
//! against the reference's `system("ethtool -N …")`, side by side in one run,
//! on a veth in a private network namespace. veth has no ntuple support, so
//! both paths reach the driver and get EOPNOTSUPP back: the numbers compare
//! the mechanism (ioctl vs. fork+exec of the ethtool CLI), not a NIC's
//! firmware. Needs root, iproute2 and the `ethtool` CLI (for the comparison
//! only; the daemon never runs it).
//!
//! cargo run --release --example nic_op_bench -- [N]

use std::fs::File;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};
use tcpx_rxdm::nic::ethtool::EthtoolNic;
use tcpx_rxdm::nic::{FlowSpec, RuleControl};

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {args:?}");
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
}

fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().expect("N")).unwrap_or(200);
    let ns = Netns(format!("rxdm-bench-{}", std::process::id()));
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p"]);
    ip(&["-n", &ns.0, "link", "set", "eth1", "up"]);

    let flow = FlowSpec { src: "10.1.0.2:40000".parse().unwrap(), dst: "10.0.0.1:5000".parse().unwrap() };
    let name = ns.0.clone();
    let (mut ioctl, errno) = std::thread::spawn(move || {
        let fd = File::open(format!("/run/netns/{name}")).unwrap();
        setns(&fd, CloneFlags::CLONE_NEWNET).unwrap();
        let nic = EthtoolNic::open().expect("ethtool netlink");
        let mut lat = Vec::with_capacity(n);
        let mut last = None;
        for i in 0..n {
            let t = Instant::now();
            let r = nic.add_rule("eth1", &flow, 8, i as u32);
            lat.push(t.elapsed());
            last = r.err().map(|e| e.errno);
        }
        (lat, last)
    })
    .join()
    .unwrap();

    let mut cli = Vec::with_capacity(n);
    let mut cli_status = None;
    for i in 0..n {
        let loc = i.to_string();
        let t = Instant::now();
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.0, "ethtool", "-N", "eth1", "flow-type", "tcp4"])
            .args(["src-ip", "10.1.0.2", "dst-ip", "10.0.0.1", "src-port", "40000", "dst-port", "5000"])
            .args(["action", "8", "loc", &loc])
            .output()
            .expect("run ethtool (apt-get install ethtool)");
        cli.push(t.elapsed());
        cli_status = out.status.code();
    }
    // `ip netns exec` itself costs a fork+exec; time it alone to subtract.
    let mut exec_only = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        Command::new("ip").args(["netns", "exec", &ns.0, "true"]).output().unwrap();
        exec_only.push(t.elapsed());
    }

    let (i50, i99) = (pct(&mut ioctl, 0.5), pct(&mut ioctl, 0.99));
    let (c50, c99) = (pct(&mut cli, 0.5), pct(&mut cli, 0.99));
    let e50 = pct(&mut exec_only, 0.5);
    println!("# NIC rule insert cost on veth (n={n}; both end in EOPNOTSUPP from the driver)");
    println!("ioctl_us:        p50 {i50:.1} p99 {i99:.1} (last errno {errno:?})");
    println!("ethtool_cli_us:  p50 {c50:.1} p99 {c99:.1} (exit {cli_status:?}; includes `ip netns exec`)");
    println!("netns_exec_us:   p50 {e50:.1} (the `ip netns exec true` share of the line above)");
    println!("ratio_p50:       {:.0}x (cli minus netns exec: {:.0}x)", c50 / i50, (c50 - e50).max(0.0) / i50);
}
