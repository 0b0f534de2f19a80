//! Pid reuse through a passed connection: tenant B's child connects, passes
//! its connections to its parent and exits; its pid then goes to a process
//! of tenant A (steered there with `ns_last_pid`, in a pid namespace of the
//! test's own where the daemon runs too). Whether that process of A's is a
//! client already or not, B's requests on the passed connections are
//! nobody's: B gets neither A's pool nor A's rules, and never A's lease.
//!
//! Root only: pid namespaces, cgroups, mount namespaces.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::pidns::{self, at_pid, Passer};
use common::tenant::{refused, rule, Agent, Cgroup, Reply};
use common::{encoded, require_root, Daemon};
use tcpx_rxdm::wire::proto::UnixSocketProto;

/// Tenant A's GPU (the sim topology's first: `/dev/nvidia0`).
const GPU_A: &str = "0000:04:00.0";
const PERMISSION_DENIED: i32 = 7;

fn pool(gpu: &str) -> UnixSocketProto {
    UnixSocketProto {
        payload: Some(tcpx_rxdm::wire::proto::unix_socket_proto::Payload::RawBytes(gpu.as_bytes().to_vec())),
        status: None,
    }
}

/// Source addresses of the booked rules.
fn booked(d: &Daemon) -> Vec<String> {
    d.flows_of_all_nics("rules").iter().map(|r| r["src"].as_str().unwrap().to_string()).collect()
}

/// The passed connections, by index.
const POOL: usize = 0;
const UNINSTALL: usize = 1;
const INSTALL: usize = 2;

/// Tenant A with one rule of its own (from `a1`), tenant B holding
/// connections its exited child opened, and `a2`, a process of A's at that
/// child's pid.
struct Reuse {
    d: Daemon,
    cga: Cgroup,
    _cgb: Cgroup,
    a1: Agent,
    /// A1's connection and rule: (local end, remote end).
    rule_a: (SocketAddr, SocketAddr),
    b: Passer,
    a2: Agent,
}

fn set_up(mode: &str) -> Reuse {
    require_root("pid namespaces, cgroups and mount namespaces");
    let d = pidns::daemon(&[&format!("--tenant_isolation={mode}"), "--leases"]);
    let (cga, cgb) = (Cgroup::new("a"), Cgroup::new("b"));
    let mut a1 = Agent::start_under(&cga, 0, &at_pid(&d, 0));
    let rule_a = a1.conn(false);
    let r = a1.req(&d.sock("rx_rule_manager"), &rule(rule_a.0, rule_a.1, GPU_A));
    assert_eq!(r.code(), 0, "A's own rule: {}", r.text());
    let paths =
        [d.sock(&format!("get_gpu_fd_{GPU_A}")), d.sock("rx_rule_uninstall"), d.sock("rx_rule_manager")];
    // Another process of the namespace (a thread of the daemon) may take
    // the pid first: then B starts over.
    for _ in 0..10 {
        let b = Passer::start(&d, &cgb, &paths);
        let mut a2 = Agent::start_under(&cga, 0, &at_pid(&d, b.opener_pid));
        if a2.pid() == b.opener_pid {
            return Reuse { d, cga, _cgb: cgb, a1, rule_a, b, a2 };
        }
    }
    panic!("no process of A's got the pid of B's opener in 10 tries");
}

/// A2 fetches its pool and installs a rule for a connection of its own:
/// it is a client, with a lease, before B asks anything.
fn make_a2_a_client(s: &mut Reuse) -> (SocketAddr, SocketAddr) {
    assert!(matches!(s.a2.req(&s.d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
    let own = s.a2.conn(false);
    let r = s.a2.req(&s.d.sock("rx_rule_manager"), &rule(own.0, own.1, GPU_A));
    assert_eq!(r.code(), 0, "A2's own rule: {}", r.text());
    own
}

/// The reply's bytes name nothing of `cg`'s or of the connections `ends`.
fn names_none_of(r: &Reply, cg: &Cgroup, ends: &[SocketAddr]) {
    let bytes = match r {
        Reply::Fd => return,
        Reply::Message(m) => encoded(m),
    };
    let has = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(!has(&cg.name()), "names the other tenant's cgroup: {}", r.text());
    for e in ends {
        assert!(!has(&e.to_string()) && !has(&format!(":{}", e.port())), "names {e}: {}", r.text());
    }
}

fn refused_as_exited(r: &Reply, what: &str) {
    assert_eq!(r.code(), PERMISSION_DENIED, "{what}: {}", r.text());
    assert!(r.text().contains("the process that opened this connection has exited"), "{what}: {}", r.text());
    assert!(r.text().contains("live process"), "{what}: says what to do: {}", r.text());
}

fn enforce(a2_is_client: bool) {
    let mut s = set_up("enforce");
    let rule_a2 = a2_is_client.then(|| make_a2_a_client(&mut s));
    let mut theirs = vec![s.rule_a.0, s.rule_a.1];
    theirs.extend(rule_a2.iter().flat_map(|(l, r)| [*l, *r]));

    // A's pool: refused, saying why, naming nothing of A's.
    let r = s.b.send(POOL, &pool(GPU_A));
    refused_as_exited(&r, "pool");
    names_none_of(&r, &s.cga, &theirs);
    // A's rules: refused, and still installed.
    let mut rules = vec![s.rule_a];
    rules.extend(rule_a2);
    for (l, r) in &rules {
        let reply = s.b.send(UNINSTALL, &rule(*l, *r, GPU_A));
        refused_as_exited(&reply, "uninstall");
        assert!(booked(&s.d).contains(&r.to_string()), "A's rule for {r} stays");
    }
    let (_, m) = s.d.http_get("/metrics");
    assert_eq!(refused(&m, "gpu_fd", "unidentified", "enforce"), 1.0);
    assert_eq!(refused(&m, "rule_uninstall", "unidentified", "enforce"), rules.len() as f64);
    // A itself is served as before.
    assert!(matches!(s.a1.req(&s.d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
    assert!(matches!(s.a2.req(&s.d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
}

#[test]
#[ignore = "needs root: pid namespaces, cgroups and mount namespaces"]
fn a_passed_connection_gets_nothing_of_the_tenant_that_reused_its_openers_pid_already_a_client() {
    enforce(true);
}

#[test]
#[ignore = "needs root: pid namespaces, cgroups and mount namespaces"]
fn a_passed_connection_gets_nothing_of_the_tenant_that_reused_its_openers_pid_not_yet_a_client() {
    enforce(false);
}

#[test]
#[ignore = "needs root: pid namespaces, cgroups and mount namespaces"]
fn audit_serves_a_passed_connection_as_nobodys_and_counts_it() {
    let mut s = set_up("audit");
    make_a2_a_client(&mut s);
    assert!(matches!(s.b.send(POOL, &pool(GPU_A)), Reply::Fd), "audit serves it");
    let (_, m) = s.d.http_get("/metrics");
    assert_eq!(refused(&m, "gpu_fd", "unidentified", "audit"), 1.0);
    assert!(s.d.wait_for_log("would refuse (tenant_isolation=audit)", Duration::from_secs(5)).is_some());
}

/// With isolation off nothing is refused, but a rule installed on a passed
/// connection is still nobody's: it does not go away with the process of
/// A's that holds the pid now.
#[test]
#[ignore = "needs root: pid namespaces, cgroups and mount namespaces"]
fn with_isolation_off_a_passed_connection_never_gets_anothers_lease() {
    let mut s = set_up("off");
    let own = make_a2_a_client(&mut s);
    let flow: (SocketAddr, SocketAddr) =
        ("192.168.1.2:5999".parse().unwrap(), "10.9.9.9:4242".parse().unwrap());
    let r = s.b.send(INSTALL, &rule(flow.0, flow.1, GPU_A));
    assert_eq!(r.code(), 0, "{}", r.text());
    let of = |src: &SocketAddr| {
        s.d.flows_of_all_nics("rules").into_iter().find(|r| r["src"] == src.to_string().as_str())
    };
    let b_rule = of(&flow.1).expect("B's rule");
    assert_eq!((b_rule["pid"].as_u64(), b_rule["lease"].as_bool()), (None, Some(false)), "{b_rule}");
    let a2_rule = of(&own.1).expect("A2's rule");
    assert_eq!(a2_rule["pid"].as_u64(), Some(s.b.opener_pid as u64), "{a2_rule}");
    // A2 exits: its rule goes with it, B's stays.
    s.a2.exit();
    common::wait_until(Duration::from_secs(10), || of(&own.1).is_none());
    assert!(of(&own.1).is_none(), "A2's rule is reclaimed");
    assert!(of(&flow.1).is_some(), "B's rule was never A2's");
}
