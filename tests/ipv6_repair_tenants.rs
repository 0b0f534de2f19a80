//! The IPv6 repair between tenants: what it costs and who pays. A host's
//! connections are found by exact lookups once the daemon has seen it, a
//! burst shares one dump, decoys of another tenant (a connection waiting in
//! the client's accept queue, a connect left `SYN-SENT`) fail none of the
//! client's requests, a same-ports connection that appears after an install
//! does not keep its uninstall from removing the rule, two processes of one
//! tenant whose flows share ports and prefixes each remove their own rule and
//! never another's, and a flood of requests that fit nothing is refused past
//! its backlog, installs nothing and grows no threads.
//!
//! Real connections between two network namespaces over a veth pair, from
//! clients in cgroups of their own: root only.

mod common;

use std::net::SocketAddr;

use common::ipv6::*;
use common::tenant::{rule, Agent, Cgroup, Reply};
use common::{require_root, Daemon};
use tcpx_rxdm::wire::client;

fn ok(r: &Reply, what: &str) {
    assert_eq!(r.code(), 0, "{what}: {}", r.text());
}

fn lookups(d: &Daemon, outcome: &str) -> f64 {
    counter(d, &format!("tcpx_rxdm_ipv6_repair_lookups_total{{outcome=\"{outcome}\"}}"))
}

fn dumps(d: &Daemon) -> f64 {
    counter(d, "tcpx_rxdm_ipv6_repair_dumps_total")
}

/// The daemon's threads now (`Threads:` of its `/proc/<pid>/status`).
fn threads(d: &Daemon) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn a_burst_shares_one_dump_and_a_known_hosts_connections_need_none() {
    require_root("network namespaces and cgroups");
    let (rx, tx) = link();
    let d = Daemon::start(&["--tenant_isolation=enforce"]);
    let rm = d.sock("rx_rule_manager");
    let (cga, cgt) = (Cgroup::new("a"), Cgroup::new("t"));
    let mut a = Agent::start_in(&cga, 0, rx.name());
    let mut t = Agent::start_in(&cgt, 5, tx.name());

    // A burst of connections from a host the daemon has not seen: exact
    // lookups cannot find them, and one dump serves them all.
    let mut port = a.listen(RX);
    let mut a_listens_on_rx = true;
    let burst: Vec<(SocketAddr, SocketAddr)> = (0..16)
        .map(|_| {
            t.dial(RX, port, None);
            a.accept()
        })
        .collect();
    let msgs: Vec<_> = burst.iter().map(|(l, r)| plugin_rule(*l, *r, GPU_A)).collect();
    for r in a.reqs(&rm, &msgs) {
        ok(&r.expect("a reply"), "an install of the burst");
    }
    // One dump for the burst; on a busy machine the first may start before
    // the last requests are read, and one more then serves the rest.
    let burst_dumps = dumps(&d);
    assert!(burst_dumps == 1.0 || burst_dumps == 2.0, "{burst_dumps} dumps for 16 installs");
    assert_eq!(lookups(&d, "dump") + lookups(&d, "exact"), 16.0);
    let rules = booked(&d);
    assert_eq!(rules.len(), 16);
    for (l, r) in &burst {
        assert!(rules.contains(&(r.to_string(), l.to_string(), true)), "{l} <- {r}: {rules:?}");
    }

    // The host is known now: its next connections, to any address of A's
    // namespace, are found by exact lookups; no dump. (An agent accepts on
    // the listener it opened last.)
    for addr in [RX, RX, RX2, RX2] {
        if addr == RX2 && a_listens_on_rx {
            port = a.listen(RX2);
            a_listens_on_rx = false;
        }
        t.dial(addr, port, None);
        let (l, r) = a.accept();
        assert_eq!(l.ip().to_string(), addr);
        ok(&a.req(&rm, &plugin_rule(l, r, GPU_A)), "an install from a known host");
    }
    let exact_before = 16.0 - lookups(&d, "dump");
    assert_eq!(lookups(&d, "exact"), exact_before + 4.0);
    assert_eq!(dumps(&d), burst_dumps, "no dump since");
    assert_eq!(booked(&d).len(), 20);
    assert_eq!(repaired(&d, "install"), 20.0);
}

fn decoys_fail_none_of_the_clients_requests(mode: &str) {
    require_root("network namespaces and cgroups");
    let (rx, tx) = link();
    let d = Daemon::start(&[&format!("--tenant_isolation={mode}")]);
    let (rm, un) = (d.sock("rx_rule_manager"), d.sock("rx_rule_uninstall"));
    let (cga, cgb, cgt) = (Cgroup::new("a"), Cgroup::new("b"), Cgroup::new("t"));
    let mut a = Agent::start_in(&cga, 0, rx.name());
    let mut b_here = Agent::start_in(&cgb, 2, rx.name());
    let mut b_there = Agent::start_in(&cgb, 2, tx.name());
    let mut t = Agent::start_in(&cgt, 5, tx.name());

    let port = a.listen(RX);
    // From a port of its choosing, which a second connection may share.
    let from = t.dial(RX, port, Some(47001));
    let (local, remote) = a.accept();
    // B connects to A's listener from the sending /64 with the same port: a
    // connection of A's cgroup that A never accepts, held by no process.
    let other = if remote.ip().to_string() == TX { TX2 } else { TX };
    b_there.dial_from(RX, port, other, from);
    // And, in A's namespace, a connect from A's port to an address of the
    // sending /64 that nobody has: SYN-SENT, in B's cgroup.
    b_here.syn(NOWHERE, from, RX2, port);
    // Both fit A's garbled requests by ports and prefixes; neither is its connection.
    let out = rx.command("ss").args(["-Htan"]).output().unwrap();
    let sockets = String::from_utf8_lossy(&out.stdout);
    let has = |state: &str, local: String, peer: String| {
        sockets.lines().any(|l| l.starts_with(state) && l.contains(&local) && l.contains(&peer))
    };
    assert!(
        has("ESTAB", format!("[{RX}]:{port}"), format!("[{other}]:{from}")),
        "B's queued connection: {sockets}"
    );
    assert!(
        has("SYN-SENT", format!("[{RX2}]:{port}"), format!("[{NOWHERE}]:{from}")),
        "B's connect: {sockets}"
    );
    for what in ["install beside the decoys", "again, by exact lookups"] {
        ok(&a.req(&rm, &plugin_rule(local, remote, GPU_A)), what);
        assert_eq!(booked(&d), [(remote.to_string(), local.to_string(), true)], "{what}");
    }

    // A second connection with the same ports appears after the install (A
    // listens on another address; T connects from the same port): the
    // uninstall still removes the rule A installed.
    a.listen_on(RX3, port);
    t.dial(RX3, port, Some(from));
    let _two = a.accept();
    ok(&a.req(&un, &plugin_rule(local, remote, GPU_A)), "the uninstall");
    assert!(booked(&d).is_empty(), "{:?}", booked(&d));
    assert!(on_nic(&d).is_empty());
    assert_eq!(repaired(&d, "uninstall"), 1.0);
    // An uninstall that fits no rule of A's is the usual "Ok." and removes nothing.
    ok(&a.req(&un, &plugin_rule(local, remote, GPU_A)), "an uninstall of nothing");
    assert_eq!(repaired(&d, "uninstall"), 1.0);
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn decoys_fail_none_of_the_clients_requests_under_enforce() {
    decoys_fail_none_of_the_clients_requests("enforce");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn decoys_fail_none_of_the_clients_requests_with_isolation_off() {
    decoys_fail_none_of_the_clients_requests("off");
}

/// Tenant A's two processes, each holding one of two connections with the
/// same ports to two addresses of one /64, so that a garbled request fits
/// both; each installed its own, and both got "Ok.".
struct TwoOfA {
    d: Daemon,
    a1: Agent,
    a2: Agent,
    t: Agent,
    /// A1's and A2's connections: (local end, remote end).
    one: (SocketAddr, SocketAddr),
    two: (SocketAddr, SocketAddr),
    /// Tenant A's and the sending side's, removed after their processes.
    cga: Cgroup,
    _cgt: Cgroup,
    /// The receiving and the sending namespace.
    ns: (common::netns::Netns, common::netns::Netns),
}

impl TwoOfA {
    fn start(mode: &str) -> TwoOfA {
        require_root("network namespaces and cgroups");
        let (rx, tx) = link();
        let d = Daemon::start(&[&format!("--tenant_isolation={mode}")]);
        let (cga, cgt) = (Cgroup::new("a"), Cgroup::new("t"));
        let mut a1 = Agent::start_in(&cga, 0, rx.name());
        let mut a2 = Agent::start_in(&cga, 0, rx.name());
        let mut t = Agent::start_in(&cgt, 5, tx.name());
        let port = a1.listen(RX);
        let from = t.dial(RX, port, Some(47101));
        let one = a1.accept();
        a2.listen_on(RX2, port);
        t.dial(RX2, port, Some(from));
        let two = a2.accept();
        assert_eq!((one.0.port(), one.1.port()), (two.0.port(), two.1.port()));
        // Each install fits both connections; the one its process holds is taken.
        let rm = d.sock("rx_rule_manager");
        ok(&a1.req(&rm, &plugin_rule(one.0, one.1, GPU_A)), "A1's install");
        ok(&a2.req(&rm, &plugin_rule(two.0, two.1, GPU_A)), "A2's install");
        let s = TwoOfA { d, a1, a2, t, one, two, cga, _cgt: cgt, ns: (rx, tx) };
        let mut want = vec![rule_of(&s.one), rule_of(&s.two)];
        want.sort();
        assert_eq!(s.booked(), want);
        s
    }

    fn booked(&self) -> Vec<(String, String, bool)> {
        let mut b = booked(&self.d);
        b.sort();
        b
    }
}

/// How `booked` shows the repaired rule of connection `c`.
fn rule_of(c: &(SocketAddr, SocketAddr)) -> (String, String, bool) {
    (c.1.to_string(), c.0.to_string(), true)
}

/// Each process's garbled uninstall removes its own rule, although both fit it.
fn each_process_removes_its_own_rule(mode: &str) {
    let mut s = TwoOfA::start(mode);
    let (d, one, two) = (&s.d, s.one, s.two);
    let un = d.sock("rx_rule_uninstall");
    let first = s.a1.req(&un, &plugin_rule(one.0, one.1, GPU_A));
    let after_first = booked(d);
    let second = s.a2.req(&un, &plugin_rule(two.0, two.1, GPU_A));
    assert_eq!(
        (first.code(), second.code()),
        (0, 0),
        "A1's uninstall: {}; A2's: {}",
        first.text(),
        second.text()
    );
    assert_eq!(after_first, [rule_of(&two)], "A1's removed its own rule");
    assert!(booked(d).is_empty(), "{:?}", booked(d));
    assert!(on_nic(d).is_empty());
    assert_eq!(repaired(d, "uninstall"), 2.0);
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn each_process_of_a_tenant_removes_its_own_rule_under_enforce() {
    each_process_removes_its_own_rule("enforce");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn each_process_of_a_tenant_removes_its_own_rule_under_audit() {
    each_process_removes_its_own_rule("audit");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn each_process_of_a_tenant_removes_its_own_rule_with_isolation_off() {
    each_process_removes_its_own_rule("off");
}

/// Nobody's garbled uninstall removes another process's rule: not one of
/// tenant B, not a third process of A's, not A1 once its own rule is gone.
/// Where two of the asking process's own rules fit, it is refused, naming
/// those two only.
fn no_process_removes_anothers_rule(mode: &str) {
    let mut s = TwoOfA::start(mode);
    let (one, two) = (s.one, s.two);
    let (rm, un) = (s.d.sock("rx_rule_manager"), s.d.sock("rx_rule_uninstall"));
    let cgb = Cgroup::new("b");
    let mut a3 = Agent::start_in(&s.cga, 0, s.ns.0.name());
    let mut b = Agent::start_in(&cgb, 2, s.ns.0.name());
    ok(&b.req(&un, &plugin_rule(two.0, two.1, GPU_A)), "a process of B's");
    assert_eq!(s.booked().len(), 2, "none removed");

    // A1 removes its rule by its true flow: only A2's fits a garbled request now.
    ok(&s.a1.req(&un, &rule(one.0, one.1, GPU_A)), "A1's exact uninstall");
    assert_eq!(s.booked(), [rule_of(&two)]);
    ok(&a3.req(&un, &plugin_rule(two.0, two.1, GPU_A)), "a third process of A's");
    assert_eq!(s.booked(), [rule_of(&two)], "A3's uninstall left A2's rule");
    ok(&s.a1.req(&un, &plugin_rule(one.0, one.1, GPU_A)), "A1's garbled uninstall");
    assert_eq!(s.booked(), [rule_of(&two)], "A1's uninstall left A2's rule");
    assert_eq!(repaired(&s.d, "uninstall"), 0.0);

    // Two rules of A1's own fit (installed exact): refused, naming A1's two
    // and not A2's.
    s.a1.listen_on(RX3, one.0.port());
    s.t.dial(RX3, one.0.port(), Some(one.1.port()));
    let three = s.a1.accept();
    for c in [one, three] {
        ok(&s.a1.req(&rm, &rule(c.0, c.1, GPU_A)), "A1's exact install");
    }
    let r = s.a1.req(&un, &plugin_rule(one.0, one.1, GPU_A));
    assert_eq!(r.code(), FAILED_PRECONDITION, "{}", r.text());
    let text = r.text();
    assert!(text.contains("this process installed"), "{text}");
    assert!(text.contains(&one.0.to_string()) && text.contains(&three.0.to_string()), "{text}");
    assert!(!text.contains(&two.0.to_string()), "names A2's rule: {text}");
    assert_eq!(s.booked().len(), 3, "none removed");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn no_process_removes_anothers_rule_under_enforce() {
    no_process_removes_anothers_rule("enforce");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn no_process_removes_anothers_rule_under_audit() {
    no_process_removes_anothers_rule("audit");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn no_process_removes_anothers_rule_with_isolation_off() {
    no_process_removes_anothers_rule("off");
}

/// A garbled install for prefixes nobody uses, with ports of its own.
fn nowhere_rule(i: u16) -> tcpx_rxdm::wire::proto::UnixSocketProto {
    let (src, dst) = (format!("fd00:dead::{i:x}:1:2:3"), format!("fd00:beef::{i:x}:4:5:6"));
    client::rule_request(5, (&src, 20_000 + i32::from(i)), (&dst, 5000), Some(GPU_A), None)
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn a_flood_that_fits_nothing_is_refused_past_its_backlog_and_installs_nothing() {
    require_root("network namespaces and cgroups");
    let (rx, _tx) = link();
    let d =
        Daemon::spawn(&["--tenant_isolation=enforce"], &[("TCPX_RXDM_TEST_REPAIR_BACKLOG", "64")]).ready();
    let rm = d.sock("rx_rule_manager");
    let (cgf, cgv) = (Cgroup::new("flood"), Cgroup::new("victim"));
    let mut flood = Agent::start_in(&cgf, 0, rx.name());
    let mut victim = Agent::start_in(&cgv, 2, rx.name());
    let before = threads(&d);

    let msgs: Vec<_> = (0..512).map(nowhere_rule).collect();
    let (mut busy, mut denied) = (0, 0);
    for r in flood.reqs(&rm, &msgs) {
        let r = r.expect("every request gets a reply, never a bare close");
        match r.code() {
            PERMISSION_DENIED => {
                assert!(r.text().contains("no such TCP connection"), "{}", r.text());
                denied += 1;
            }
            UNAVAILABLE => {
                assert_eq!(r.text(), "too many IPv6 flows of this client wait to be repaired; try again");
                busy += 1;
            }
            other => panic!("{other}: {}", r.text()),
        }
    }
    assert!(busy > 0, "512 at once, 64 may wait: some are refused");
    assert_eq!((lookups(&d, "busy"), lookups(&d, "missing")), (busy as f64, denied as f64));
    assert!(booked(&d).is_empty(), "nothing installed: {:?}", booked(&d));
    let after = threads(&d);
    assert!(after < 64 && after <= before + 8, "threads: {before} before the flood, {after} after");
    assert_eq!(counter(&d, "tcpx_rxdm_ipv6_repairs_waiting"), 0.0);

    // Another tenant's installs are served as ever.
    let (l, r) = victim.conn(false);
    ok(&victim.req(&rm, &common::tenant::rule(l, r, "0000:0a:00.0")), "the victim's IPv4 install");
    assert_eq!(booked(&d).len(), 1);
}
