//! The NCCL plugin's IPv6 requests, byte for byte: it reads both ends of an
//! accepted socket into a buffer the size of an IPv4 address, so the first 8
//! bytes of each IPv6 address are real and the last 8 are whatever its stack
//! held, different on every call. The daemon finds the connection they mean
//! (ports and /64 prefixes) in the client's network namespace and steers its
//! true 4-tuple; a garbled uninstall removes it; a second install is the same
//! rule; a request that fits another tenant's connection is refused under
//! `enforce`; one that fits several is refused in every mode.
//!
//! Real connections between two network namespaces of the test's own, over a
//! veth pair with addresses in a real /64 (not only `::1`), from clients in
//! cgroups of their own: root only.

mod common;

use std::net::SocketAddr;

use common::ipv6::*;
use common::tenant::{refused, Agent, Cgroup, Reply};
use common::{require_root, Daemon};

/// The reply's bytes name neither tenant `cg` nor the addresses of `ends`
/// (the connection a request was repaired to, when it is not the client's).
fn names_none_of(r: &Reply, cg: &Cgroup, ends: &[SocketAddr]) {
    let bytes = match r {
        Reply::Fd => return,
        Reply::Message(m) => common::encoded(m),
    };
    let has = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(!has(&cg.name()), "names the other tenant's cgroup: {}", r.text());
    for e in ends {
        assert!(!has(&e.ip().to_string()), "names {e}: {}", r.text());
    }
}

fn ok(r: &Reply, what: &str) {
    assert_eq!(r.code(), 0, "{what}: {}", r.text());
}

fn repairs_the_plugins_flows(mode: &str) {
    require_root("network namespaces and cgroups");
    let (rx, tx) = link();
    let d = Daemon::start(&[&format!("--tenant_isolation={mode}")]);
    let (rm, un) = (d.sock("rx_rule_manager"), d.sock("rx_rule_uninstall"));
    let (cga, cgb, cgt) = (Cgroup::new("a"), Cgroup::new("b"), Cgroup::new("t"));
    let mut a = Agent::start_in(&cga, 0, rx.name());
    let mut b = Agent::start_in(&cgb, 2, rx.name());
    let mut t = Agent::start_in(&cgt, 5, tx.name());

    // A accepts a connection from the other namespace and installs for it,
    // garbled as the plugin sends it: the NIC gets the true 4-tuple.
    let port = a.listen(RX);
    t.dial(RX, port, None);
    let (local, remote) = a.accept();
    assert_eq!(local.ip().to_string(), RX);
    ok(&a.req(&rm, &plugin_rule(local, remote, GPU_A)), "garbled install");
    let want = (remote.to_string(), local.to_string(), true);
    assert_eq!(booked(&d), vec![want.clone()], "the true flow, marked repaired");
    let nic = on_nic(&d);
    assert_eq!(nic.len(), 1, "{nic:?}");
    assert!(nic[0].contains(&remote.to_string()) && nic[0].contains(&local.to_string()), "{nic:?}");
    // The same connection garbled differently is the same rule.
    ok(&a.req(&rm, &plugin_rule(local, remote, GPU_A)), "second install");
    assert_eq!(booked(&d), vec![want.clone()], "no second rule");
    assert_eq!(repaired(&d, "install"), 2.0);

    // A garbled request that fits only B's connection: B's, not A's.
    let port_b = b.listen(RX);
    t.dial(RX, port_b, None);
    let (lb, rb) = b.accept();
    let r = a.req(&rm, &plugin_rule(lb, rb, GPU_A));
    let (_, metrics) = d.http_get("/metrics");
    match mode {
        "enforce" => {
            assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
            assert!(r.text().contains("another tenant's"), "{}", r.text());
            names_none_of(&r, &cgb, &[lb, rb]);
            assert_eq!(booked(&d).len(), 1, "nothing installed");
            assert_eq!(refused(&metrics, "rule_manager", "flow", mode), 1.0);
        }
        "audit" => {
            ok(&r, "audit serves it");
            assert_eq!(booked(&d).len(), 2);
            assert_eq!(refused(&metrics, "rule_manager", "flow", mode), 1.0);
            ok(&a.req(&un, &plugin_rule(lb, rb, GPU_A)), "its uninstall");
        }
        _ => ok(&r, "off serves it"),
    }
    if mode == "off" {
        ok(&a.req(&un, &plugin_rule(lb, rb, GPU_A)), "its uninstall");
    }

    // Two connections of A and one of B with the same ports, to three
    // addresses of the /64: a garbled request of A's fits all three, and is
    // refused in every mode, naming only A's own (where A's tenant is known).
    let shared = a.listen_on(RX, 0);
    let from = t.dial(RX, shared, Some(47001));
    let one = a.accept();
    a.listen_on(RX2, shared);
    t.dial(RX2, shared, Some(from));
    let two = a.accept();
    b.listen_on(RX3, shared);
    t.dial(RX3, shared, Some(from));
    let three = b.accept();
    assert_eq!((one.0.port(), one.1.port()), (two.0.port(), two.1.port()));
    assert_eq!((one.0.port(), one.1.port()), (three.0.port(), three.1.port()));
    let r = a.req(&rm, &plugin_rule(one.0, one.1, GPU_A));
    assert_eq!(r.code(), FAILED_PRECONDITION, "{}", r.text());
    names_none_of(&r, &cgb, &[three.0]);
    let named = r.text().contains(&one.0.to_string()) && r.text().contains(&two.0.to_string());
    match mode {
        "off" => assert!(!r.text().contains(&one.0.to_string()), "no tenant known: names none: {}", r.text()),
        _ => assert!(named && r.text().contains("1 not its own"), "names its own: {}", r.text()),
    }
    assert_eq!(booked(&d).len(), 1, "nothing installed");

    // The garbled uninstall removes A's rule.
    ok(&a.req(&un, &plugin_rule(local, remote, GPU_A)), "garbled uninstall");
    assert!(booked(&d).is_empty(), "{:?}", booked(&d));
    assert!(on_nic(&d).is_empty());
    // Enforce removed B's flow for nobody; audit and off removed it for A.
    assert_eq!(repaired(&d, "uninstall"), if mode == "enforce" { 1.0 } else { 2.0 });
    assert_eq!(counter(&d, "tcpx_rxdm_rules_installed{nic=\"eth1\"}"), 0.0);
    drop((a, b, t));
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn the_plugins_ipv6_flows_are_repaired_under_enforce() {
    repairs_the_plugins_flows("enforce");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn the_plugins_ipv6_flows_are_repaired_under_audit() {
    repairs_the_plugins_flows("audit");
}

#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn the_plugins_ipv6_flows_are_repaired_with_isolation_off() {
    repairs_the_plugins_flows("off");
}

/// A garbled request that fits no connection: `enforce` refuses it, `audit`
/// installs it as sent and counts the refusal it would have been.
#[test]
#[ignore = "needs root: network namespaces and cgroups"]
fn a_garbled_request_that_fits_nothing_is_handled_as_before() {
    require_root("network namespaces and cgroups");
    let (rx, _tx) = link();
    let cg = Cgroup::new("a");
    for mode in ["enforce", "audit"] {
        let d = Daemon::start(&[&format!("--tenant_isolation={mode}")]);
        let mut a = Agent::start_in(&cg, 0, rx.name());
        let nobody =
            (SocketAddr::new(RX.parse().unwrap(), 5000), SocketAddr::new(TX.parse().unwrap(), 40001));
        let r = a.req(&d.sock("rx_rule_manager"), &plugin_rule(nobody.0, nobody.1, GPU_A));
        let (_, metrics) = d.http_get("/metrics");
        assert_eq!(refused(&metrics, "rule_manager", "flow", mode), 1.0);
        assert_eq!(repaired(&d, "install"), 0.0);
        match mode {
            "enforce" => {
                assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
                assert!(booked(&d).is_empty());
            }
            _ => {
                ok(&r, "audit installs it as sent");
                let rules = booked(&d);
                assert_eq!(rules.len(), 1);
                assert!(!rules[0].2, "not marked repaired");
                assert_ne!(rules[0].0, nobody.1.to_string(), "the garbage as sent");
            }
        }
    }
}
