//! Tenants on one node (`--tenant_isolation`): two client processes, each in
//! a cgroup v2 group of its own and a mount namespace of its own whose `/dev`
//! holds only its own `/dev/nvidia<N>`, which it holds open as CUDA does
//! (regular files stand for the sim GPUs), each with real TCP connections on
//! loopback; and clients that plant device nodes they do not hold (links,
//! files, `mknod`). No kernel check is faked.
//!
//! The tenant tests need root (cgroups, mount namespaces); the unidentified
//! client does not.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::tenant::{refused, rule, Agent, Cgroup, Reply, FRESH_DEV};
use common::{encoded, require_root, Daemon};
use tcpx_rxdm::wire::proto::UnixSocketProto;

/// Tenant A's GPU (first in the sim topology: `/dev/nvidia0`) and B's (third: `/dev/nvidia2`).
const GPU_A: &str = "0000:04:00.0";
const GPU_B: &str = "0000:0a:00.0";
const PERMISSION_DENIED: i32 = 7;
const RESOURCE_EXHAUSTED: i32 = 8;

fn pool(gpu: &str) -> UnixSocketProto {
    UnixSocketProto {
        payload: Some(tcpx_rxdm::wire::proto::unix_socket_proto::Payload::RawBytes(gpu.as_bytes().to_vec())),
        status: None,
    }
}

/// The bytes of a reply, as the client got them.
fn reply_bytes(r: &Reply) -> Vec<u8> {
    match r {
        Reply::Fd => Vec::new(),
        Reply::Message(m) => encoded(m),
    }
}

/// Source ports of the booked rules.
fn booked(d: &Daemon) -> Vec<String> {
    d.flows_of_all_nics("rules").iter().map(|r| r["src"].as_str().unwrap().to_string()).collect()
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn each_tenant_gets_only_its_own_gpus_and_flows() {
    require_root("cgroups and mount namespaces");
    let d = Daemon::start(&["--tenant_isolation=enforce", "--max_rules_per_tenant=3"]);
    let (cga, cgb) = (Cgroup::new("a"), Cgroup::new("b"));
    let (mut a, mut b) = (Agent::start(&cga, 0), Agent::start(&cgb, 2));
    let rm = d.sock("rx_rule_manager");
    let un = d.sock("rx_rule_uninstall");

    // Pools: A gets its own, not B's.
    assert!(matches!(a.req(&d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
    let r = a.req(&d.sock(&format!("get_gpu_fd_{GPU_B}")), &pool(GPU_B));
    assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
    assert!(r.text().contains(GPU_B), "names the GPU: {}", r.text());
    let r = a.req(&d.sock(&format!("get_gpu_metadata_{GPU_B}")), &pool(GPU_B));
    assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
    assert!(matches!(b.req(&d.sock(&format!("get_gpu_fd_{GPU_B}")), &pool(GPU_B)), Reply::Fd));

    // The NCCL plugin's sequence: accept, then install for that connection,
    // from the same process; IPv4 and IPv6.
    let (la, ra) = a.conn(false);
    let r = a.req(&rm, &rule(la, ra, GPU_A));
    assert_eq!(r.code(), 0, "{}", r.text());
    let (la6, ra6) = a.conn(true);
    let r = a.req(&rm, &rule(la6, ra6, GPU_A));
    assert_eq!(r.code(), 0, "IPv6: {}", r.text());

    // A's rule for B's connection is refused; B's own for it works.
    let (lb, rb) = b.conn(false);
    let r = a.req(&rm, &rule(lb, rb, GPU_A));
    assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
    assert!(r.text().contains(&rb.to_string()), "names the flow as sent: {}", r.text());
    assert!(!reply_bytes(&r).windows(cgb.name().len()).any(|w| w == cgb.name().as_bytes()), "{}", r.text());
    let r = b.req(&rm, &rule(lb, rb, GPU_B));
    assert_eq!(r.code(), 0, "{}", r.text());
    // Nor may A steer its own connection to B's GPU.
    let (la2, ra2) = a.conn(false);
    let r = a.req(&rm, &rule(la2, ra2, GPU_B));
    assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
    assert!(r.text().contains(GPU_B), "{}", r.text());

    // B cannot remove A's rule, and is not told whose it is; A can.
    let r = b.req(&un, &rule(la, ra, GPU_A));
    assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
    assert!(r.text().contains("another tenant"), "{}", r.text());
    assert!(!reply_bytes(&r).windows(cga.name().len()).any(|w| w == cga.name().as_bytes()), "{}", r.text());
    assert!(booked(&d).contains(&ra.to_string()), "A's rule stays");
    let r = a.req(&un, &rule(la, ra, GPU_A));
    assert_eq!(r.code(), 0, "{}", r.text());
    assert!(!booked(&d).contains(&ra.to_string()), "A's rule is gone");

    // Quota: A holds one rule (IPv6); two more fit, the third does not.
    for _ in 0..2 {
        let (l, r2) = a.conn(false);
        let r = a.req(&rm, &rule(l, r2, GPU_A));
        assert_eq!(r.code(), 0, "{}", r.text());
    }
    let (l, r2) = a.conn(false);
    let r = a.req(&rm, &rule(l, r2, GPU_A));
    assert_eq!(r.code(), RESOURCE_EXHAUSTED, "{}", r.text());
    assert!(r.text().contains("--max_rules_per_tenant=3"), "{}", r.text());
    // B's share is its own.
    let (l, r2) = b.conn(false);
    assert_eq!(b.req(&rm, &rule(l, r2, GPU_B)).code(), 0);

    // Counted and logged.
    let (_, m) = d.http_get("/metrics");
    assert_eq!(refused(&m, "gpu_fd", "gpu", "enforce"), 1.0);
    assert_eq!(refused(&m, "gpu_metadata", "gpu", "enforce"), 1.0);
    assert_eq!(refused(&m, "rule_manager", "flow", "enforce"), 1.0);
    assert_eq!(refused(&m, "rule_manager", "gpu", "enforce"), 1.0);
    assert_eq!(refused(&m, "rule_uninstall", "owner", "enforce"), 1.0);
    assert_eq!(refused(&m, "rule_manager", "quota", "enforce"), 1.0);
    let line =
        d.wait_for_log("reason=\"owner\"", Duration::from_secs(30)).expect("an owner refusal is logged");
    assert!(
        line.contains(&cgb.name()) && line.contains(&b.child.id().to_string()),
        "names pid and cgroup: {line}"
    );

    // status groups the rules by tenant.
    let (code, out, _) = common::run_bin(&["status", "--json", &d.uds_arg()]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let tenants = v["tenants"].as_array().unwrap();
    let of = |cg: &Cgroup| {
        tenants
            .iter()
            .find(|t| t["tenant"] == cg.name())
            .unwrap_or_else(|| panic!("{cg:?}: {v}", cg = cg.name()))
            .clone()
    };
    assert_eq!(of(&cga)["rules"], 3);
    assert_eq!(of(&cgb)["rules"], 2);
    assert_eq!(of(&cga)["pids"][0], a.child.id());
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn audit_serves_what_enforce_would_refuse_and_counts_it() {
    require_root("cgroups and mount namespaces");
    let d = Daemon::start(&["--tenant_isolation=audit"]);
    let (cga, cgb) = (Cgroup::new("a"), Cgroup::new("b"));
    let (mut a, mut b) = (Agent::start(&cga, 0), Agent::start(&cgb, 2));
    assert!(matches!(a.req(&d.sock(&format!("get_gpu_fd_{GPU_B}")), &pool(GPU_B)), Reply::Fd));
    let (lb, rb) = b.conn(false);
    assert_eq!(a.req(&d.sock("rx_rule_manager"), &rule(lb, rb, GPU_A)).code(), 0);
    // An IPv4 flow is checked right after the reply, off the request's path.
    let flow_refused = || refused(&d.http_get("/metrics").1, "rule_manager", "flow", "audit");
    common::wait_until(Duration::from_secs(5), || flow_refused() == 1.0);
    let (_, m) = d.http_get("/metrics");
    assert_eq!(refused(&m, "gpu_fd", "gpu", "audit"), 1.0);
    assert_eq!(refused(&m, "rule_manager", "flow", "audit"), 1.0);
    assert!(d.wait_for_log("would refuse (tenant_isolation=audit)", Duration::from_secs(30)).is_some());
}

/// What audit counts does not depend on the order of a tenant's requests:
/// a thousand checks of its own flows first do not hide the flows of
/// another tenant's connections sent right after.
#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn audit_cannot_be_blinded_by_a_tenants_own_flows_first() {
    require_root("cgroups and mount namespaces");
    let d = Daemon::start(&["--tenant_isolation=audit"]);
    let (cga, cgb) = (Cgroup::new("a"), Cgroup::new("b"));
    let (mut a, mut b) = (Agent::start(&cga, 0), Agent::start(&cgb, 2));
    let own: Vec<_> = (0..1000).map(|_| a.conn(false)).map(|(l, r)| rule(l, r, GPU_A)).collect();
    let forged: Vec<_> = (0..60).map(|_| b.conn(false)).map(|(l, r)| rule(l, r, GPU_A)).collect();
    // Its own flows first, all answered; then the other tenant's, at once.
    for msgs in [own, forged] {
        let replies = a.reqs(&d.sock("rx_rule_manager"), &msgs);
        assert!(replies.iter().all(|r| r.as_ref().is_some_and(|r| r.code() == 0)), "audit serves them all");
    }
    let flow_refused = || refused(&d.http_get("/metrics").1, "rule_manager", "flow", "audit");
    // Counted once the audit thread has looked at all of them (a hang guard only).
    let skipped = || common::metric(&d.http_get("/metrics").1, "tcpx_rxdm_audit_flow_checks_skipped_total");
    common::wait_until(Duration::from_secs(60), || flow_refused() + skipped().unwrap_or(0.0) >= 60.0);
    let counted = flow_refused();
    eprintln!("{counted} of 60 forged flows counted, {} checks skipped", skipped().unwrap_or(0.0));
    assert!(counted >= 54.0, "only {counted} of the 60 forged flows were counted");
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn off_checks_nothing() {
    require_root("cgroups and mount namespaces");
    let d = Daemon::start(&["--tenant_isolation=off"]);
    let (cga, cgb) = (Cgroup::new("a"), Cgroup::new("b"));
    let (mut a, mut b) = (Agent::start(&cga, 0), Agent::start(&cgb, 2));
    assert!(matches!(a.req(&d.sock(&format!("get_gpu_fd_{GPU_B}")), &pool(GPU_B)), Reply::Fd));
    let (lb, rb) = b.conn(false);
    assert_eq!(a.req(&d.sock("rx_rule_manager"), &rule(lb, rb, GPU_A)).code(), 0);
    assert_eq!(b.req(&d.sock("rx_rule_uninstall"), &rule(lb, rb, GPU_A)).code(), 0);
    let (_, m) = d.http_get("/metrics");
    assert!(!m.contains("tcpx_rxdm_requests_refused_total{"), "no series when off");
}

/// What a client gets for GPU B's pool fd.
fn fetch_b(d: &Daemon, agent: &mut Agent) -> Reply {
    agent.req(&d.sock(&format!("get_gpu_fd_{GPU_B}")), &pool(GPU_B))
}

fn assert_refused(r: Reply, case: &str) {
    assert_eq!(r.code(), PERMISSION_DENIED, "{case}: {}", r.text());
    assert!(r.text().contains(GPU_B) && r.text().contains("/dev/nvidia2"), "{case}: {}", r.text());
}

#[test]
#[ignore = "needs root: cgroups, mount namespaces, mknod"]
fn a_gpu_is_a_clients_only_while_it_holds_the_device_node_open_for_reading_and_writing() {
    require_root("cgroups, mount namespaces, mknod");
    let d = Daemon::start(&["--tenant_isolation=enforce"]);
    let cg = Cgroup::new("planted");
    // A file the daemon can reach by an absolute path, hidden from the client.
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("nvidia2"), b"").unwrap();
    let hidden = host.path().display().to_string();

    // An absolute link: inside the client it leads nowhere; followed from the
    // daemon's root it would reach the daemon's own file.
    let mut a = Agent::planted(
        &cg,
        &format!(
            "{FRESH_DEV} && : > /dev/nvidia0 && mount -t tmpfs tmpfs {hidden} && ln -s {hidden}/nvidia2 /dev/nvidia2"
        ),
        &["/dev/nvidia0", "/dev/nvidia2"],
    );
    assert!(matches!(a.req(&d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
    assert_refused(fetch_b(&d, &mut a), "absolute link");

    // A relative link to the node it does hold, opened through the link too.
    let mut a = Agent::planted(
        &cg,
        &format!("{FRESH_DEV} && : > /dev/nvidia0 && ln -s nvidia0 /dev/nvidia2"),
        &["/dev/nvidia0", "/dev/nvidia2"],
    );
    assert!(matches!(a.req(&d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
    assert_refused(fetch_b(&d, &mut a), "relative link");

    // A file merely created.
    let mut a = Agent::planted(&cg, &format!("{FRESH_DEV} && : > /dev/nvidia2"), &[]);
    assert_refused(fetch_b(&d, &mut a), "created, not held");

    // A node made with mknod: without the device's driver it cannot be opened.
    let mut a = Agent::planted(&cg, &format!("{FRESH_DEV} && mknod /dev/nvidia2 c 195 2"), &["/dev/nvidia2"]);
    assert!(a.ask("open /dev/nvidia2").starts_with("error"), "no driver for 195:2 here");
    assert_refused(fetch_b(&d, &mut a), "mknod, not openable");

    // Held, then closed before the first request.
    let mut a = Agent::planted(&cg, &format!("{FRESH_DEV} && : > /dev/nvidia2"), &["/dev/nvidia2"]);
    assert_eq!(a.ask("close /dev/nvidia2"), "closed");
    assert_refused(fetch_b(&d, &mut a), "held and closed");

    // Held only by path, or open one way: no GPU. Each is a new process, read once.
    for mode in ["path", "ro", "wo"] {
        let mut a = Agent::planted(&cg, &format!("{FRESH_DEV} && : > /dev/nvidia2"), &[]);
        assert_eq!(a.ask(&format!("open /dev/nvidia2 {mode}")), "opened");
        let r = fetch_b(&d, &mut a);
        assert!(
            r.text().contains("open for reading and writing"),
            "{mode}: says how it must be open: {}",
            r.text()
        );
        assert_refused(r, mode);
    }

    // Held open for reading and writing: the pool is its.
    let mut a = Agent::planted(&cg, &format!("{FRESH_DEV} && : > /dev/nvidia2"), &["/dev/nvidia2"]);
    assert!(matches!(fetch_b(&d, &mut a), Reply::Fd), "held open");

    let (_, m) = d.http_get("/metrics");
    assert_eq!(refused(&m, "gpu_fd", "gpu", "enforce"), 8.0);
}

/// Descriptors the process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

#[test]
#[ignore = "needs root: cgroups, mount namespaces, FUSE"]
fn a_client_whose_dev_hangs_gets_an_answer_and_holds_up_nobody() {
    require_root("cgroups, mount namespaces, FUSE");
    let d = Daemon::start(&["--tenant_isolation=enforce"]);
    let cg = Cgroup::new("hung");
    let mut good = Agent::start(&cg, 0);
    assert!(matches!(good.req(&d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
    let baseline = open_fds(d.child.id());
    // Clients whose /dev is a FUSE mount that nobody serves: every lookup
    // there that reaches the file system waits until the mount's last
    // descriptor closes. Three of them: more than the daemon's async workers.
    let hung_dev = "exec 3<>/dev/fuse && mount -t fuse -o fd=3,rootmode=40000,user_id=0,group_id=0 hung /dev";
    // Each holds a regular file open, which might stand in for a simulated
    // GPU: so the daemon looks in its /dev, through cached names only.
    let held = tempfile::NamedTempFile::new().unwrap();
    let held = held.path().to_str().unwrap();
    let mut hung: Vec<Agent> = (0..3).map(|_| Agent::planted(&cg, hung_dev, &[held])).collect();
    let path = d.sock(&format!("get_gpu_fd_{GPU_A}"));
    std::thread::scope(|s| {
        let asks: Vec<_> = hung
            .iter_mut()
            .map(|h| {
                let path = path.clone();
                s.spawn(move || h.req(&path, &pool(GPU_A)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        // Meanwhile everybody else is served (the mounts go only below):
        // nobody waits for them. How soon is not asserted.
        for _ in 0..5 {
            let (code, _) = d.http_get("/healthz");
            let r = good.req(&d.sock(&format!("get_gpu_metadata_{GPU_A}")), &pool(GPU_A));
            assert_eq!((code, r.code()), (200, 0), "{}", r.text());
        }
        // And the hung clients are answered: no stand-in can be looked at
        // under their /dev without asking its server, so none holds a GPU.
        // (The daemon used to ask, and answered UNAVAILABLE after 2 s while
        // its reader waited on the mount.)
        for a in asks {
            let r = a.join().unwrap();
            assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
            assert!(r.text().contains("does not hold /dev/nvidia0"), "{}", r.text());
        }
    });
    // Nothing of theirs is left open once they exit.
    drop(hung);
    common::wait_until(Duration::from_secs(10), || open_fds(d.child.id()) <= baseline);
    assert!(good.req(&d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)).code() == 0);
}

/// A client whose tenant cannot be told: the process that connected has
/// exited (and was reaped) before its child, which inherited the socket,
/// sends the request; the connection is nobody's then.
const ORPHAN_PY: &str = r#"
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
if os.fork():
    os._exit(0)
time.sleep(0.5)
s.sendall(bytes.fromhex(sys.argv[2]))
msg, anc, flags, addr = s.recvmsg(4096, socket.CMSG_SPACE(4))
print("fd" if anc else "reply " + msg.hex(), flush=True)
"#;

fn orphan_request(path: &Path, msg: &UnixSocketProto) -> Reply {
    let hex: String = encoded(msg).iter().map(|b| format!("{b:02x}")).collect();
    let mut child =
        common::python3().args(["-c", ORPHAN_PY]).arg(path).arg(hex).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // The connecting process exits at once: reap it before its child asks.
    assert!(child.wait().unwrap().success());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    Reply::parse(line.trim())
}

#[test]
fn an_unidentified_client_is_refused_in_enforce_and_served_in_audit() {
    let d = Daemon::start(&["--tenant_isolation=enforce"]);
    let r = orphan_request(&d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A));
    assert_eq!(r.code(), PERMISSION_DENIED, "{}", r.text());
    assert!(
        r.text().contains("the process that opened this connection has exited")
            && r.text().contains("a live process, on a connection it opened itself"),
        "says why and what to do: {}",
        r.text()
    );
    let (_, m) = d.http_get("/metrics");
    assert_eq!(refused(&m, "gpu_fd", "unidentified", "enforce"), 1.0);

    let d = Daemon::start(&["--tenant_isolation=audit"]);
    assert!(matches!(orphan_request(&d.sock(&format!("get_gpu_fd_{GPU_A}")), &pool(GPU_A)), Reply::Fd));
    let (_, m) = d.http_get("/metrics");
    assert_eq!(refused(&m, "gpu_fd", "unidentified", "audit"), 1.0);
}
