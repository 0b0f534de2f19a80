//! Network namespaces for root-only tests against the real kernel.
//!
//! [`Netns`] makes a uniquely named namespace (`ip netns add`), adds veth
//! pairs in it, runs code on a thread that joined it (`setns` is per thread,
//! so sockets and `/proc/sys/net` opened there are the namespace's) or runs a
//! program in it (`ip netns exec`), and deletes it on drop, also when the test
//! panics. Deleting the namespace removes its interfaces.
//!
//! Tests using it are `#[ignore = "needs root: …"]`; [`Netns::new`] fails
//! with a clear message when not run as root.

use std::fs::File;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::sched::{setns, CloneFlags};

use super::{require_root, BIN};

/// Runs `ip ARGS`; panics with its stderr when it fails.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip` ({e}): these tests need iproute2"));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A one-NIC topology for `--gpu_nic_preset=manual`: GPU 0000:04:00.0 on
/// queues 2 and 3 of `ifname`, an RSS set of 2, 100 rule slots.
pub fn veth_topology(ifname: &str, nic_pci: Option<&str>) -> String {
    let pci = nic_pci.map(|p| format!(r#"nic_pci_addr: "{p}" "#)).unwrap_or_default();
    format!(
        r#"gpu_rxq_configs {{ gpu_infos {{ gpu_pci_addr: "0000:04:00.0" queue_ids: 2 queue_ids: 3 }} {pci}ifname: "{ifname}" }} rss_set_size: 2 tcpd_queue_size: 2 max_rx_rules: 100"#
    )
}

/// A network namespace of this test's own, with `lo` up; deleted on drop.
pub struct Netns {
    name: String,
}

impl Netns {
    /// A fresh namespace named `rxdm-TAG-PID-N`. Panics when not root.
    pub fn new(tag: &str) -> Netns {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        require_root("network namespaces");
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("rxdm-{tag}-{}-{seq}", std::process::id());
        // One left by a crashed run whose pid was the same.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        // From here on, drop deletes it, whatever fails next.
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// A fresh namespace holding `eth1` ↔ `eth1p`, 4 rx and 4 tx queues each, up.
    pub fn with_veth(tag: &str) -> Netns {
        let ns = Netns::new(tag);
        ns.add_veth("eth1", "eth1p", Some(4));
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds the veth pair `dev` ↔ `peer` (with `queues` rx and tx queues each,
    /// or the kernel's default) and sets both up.
    pub fn add_veth(&self, dev: &str, peer: &str, queues: Option<u32>) {
        let n = queues.map(|q| q.to_string()).unwrap_or_default();
        let q: &[&str] = match queues {
            Some(_) => &["numrxqueues", n.as_str(), "numtxqueues", n.as_str()],
            None => &[],
        };
        let mut add = vec!["link", "add", dev];
        add.extend(q);
        add.extend(["type", "veth", "peer", "name", peer]);
        add.extend(q);
        self.ip(&add);
        for d in [dev, peer] {
            self.ip(&["link", "set", d, "up"]);
        }
    }

    /// Runs `ip -n NAME ARGS`; panics when it fails.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args);
        ip(&all)
    }

    /// Runs `f` on a thread that joined the namespace (children it spawns
    /// live there too); its panics are the caller's.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                let fd = File::open(format!("/run/netns/{}", self.name)).expect("namespace handle");
                setns(&fd, CloneFlags::CLONE_NEWNET).expect("setns into the test namespace");
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// `program` run in the namespace (`ip netns exec NAME program`); add its arguments.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// The `tcpx-rxdm` binary run in the namespace; add its arguments.
    pub fn bin(&self) -> Command {
        self.command(BIN)
    }

    /// Waits (up to 5 s) for the carrier: veth reports it asynchronously.
    pub fn wait_oper_up(&self, dev: &str) {
        for _ in 0..250 {
            if self.ip(&["-o", "link", "show", dev]).contains("state UP") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{dev} did not come up");
    }

    pub fn ifindex(&self, dev: &str) -> u32 {
        let out = self.ip(&["-o", "link", "show", dev]);
        out.split(':').next().unwrap().trim().parse().unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let out = Command::new("ip").args(["netns", "del", &self.name]).output();
        if !out.is_ok_and(|o| o.status.success()) {
            eprintln!("warning: could not delete network namespace {}", self.name);
        }
    }
}
