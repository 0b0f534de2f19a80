//! Nothing of a client outlives it: once a client process exits, the
//! daemon lets go of its pidfd, the handles on its network namespace and
//! what its rule threads remembered of it, driven by the exit it watches
//! (not by a cache filling up). Root only: clients in cgroups and network
//! namespaces of their own.

mod common;

use std::process::Command;
use std::time::Duration;

use common::netns::Netns;
use common::tenant::{rule, Agent, Cgroup};
use common::{metric, wait_until, Daemon};

const GPU_A: &str = "0000:04:00.0";
const GPU_B: &str = "0000:0a:00.0";

/// Hang guard for every wait here; far above anything expected.
const HANG: Duration = Duration::from_secs(60);

/// Resident memory of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok()).unwrap()
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// Waits until no client process is watched and no rule is left.
fn settled(d: &Daemon) {
    wait_until(HANG, || {
        let (_, m) = d.http_get("/metrics");
        metric(&m, "tcpx_rxdm_lease_clients") == Some(0.0)
            && d.flows()["nics"].as_array().unwrap().iter().all(|n| n["rules"].as_array().unwrap().is_empty())
    });
}

/// `n` client processes, in turn of the two tenants, that each install a
/// rule for their own connection and exit.
fn clients(d: &Daemon, tenants: &[(Cgroup, u32, &str)], n: usize) {
    for i in 0..n {
        let (cg, minor, gpu) = &tenants[i % tenants.len()];
        let mut a = Agent::start(cg, *minor);
        let (local, remote) = a.conn(false);
        let r = a.req(&d.sock("rx_rule_manager"), &rule(local, remote, gpu));
        assert_eq!(r.code(), 0, "client {i}: {}", r.text());
        a.exit();
    }
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces for the client processes"]
fn exited_clients_leave_no_descriptors_behind() {
    for mode in ["audit", "enforce"] {
        let d = Daemon::start(&["--leases", &format!("--tenant_isolation={mode}")]);
        let pid = d.child.id();
        let tenants = [(Cgroup::new("life-a"), 0, GPU_A), (Cgroup::new("life-b"), 2, GPU_B)];
        clients(&d, &tenants, 5);
        settled(&d);
        let after_5 = fds(pid);
        clients(&d, &tenants, 30);
        settled(&d);
        let after_35 = fds(pid);
        eprintln!("{mode}: {after_5} descriptors after 5 clients, {after_35} after 30 more");
        assert!(after_35 <= after_5 + 4, "{mode}: 30 exited clients left {} descriptors", after_35 - after_5);
        if mode == "audit" {
            // 120 more: descriptors back within 4 of where they were, memory within 4 MiB.
            let (fds_before, rss_before) = (fds(pid), rss_kib(pid));
            clients(&d, &tenants, 120);
            settled(&d);
            let (fds_after, rss_after) = (fds(pid), rss_kib(pid));
            eprintln!(
                "120 clients: descriptors {fds_before} -> {fds_after}, RSS {rss_before} -> {rss_after} KiB"
            );
            assert!(fds_after <= fds_before + 4, "{fds_before} -> {fds_after}");
            assert!(rss_after <= rss_before + 4096, "RSS {rss_before} -> {rss_after} KiB");
        }
    }
}

#[test]
#[ignore = "needs root: network namespaces, veth, cgroups"]
fn a_deleted_client_network_namespace_is_not_kept_alive() {
    let d = Daemon::start(&["--leases", "--tenant_isolation=audit"]);
    let ns = Netns::new("life");
    // One end of a veth pair in the client's namespace: the other end goes
    // when the kernel destroys that namespace, and only then.
    let host_end = format!("lt{}", std::process::id() % 100_000);
    common::netns::ip(&[
        "link",
        "add",
        &host_end,
        "type",
        "veth",
        "peer",
        "name",
        "ltpeer",
        "netns",
        ns.name(),
    ]);
    let cg = Cgroup::new("life-ns");
    let mut a = Agent::start_in(&cg, 0, ns.name());
    let (local, remote) = a.conn(false);
    let r = a.req(&d.sock("rx_rule_manager"), &rule(local, remote, GPU_A));
    assert_eq!(r.code(), 0, "{}", r.text());
    a.exit();
    settled(&d);
    common::netns::ip(&["netns", "del", ns.name()]);
    let gone = || !Command::new("ip").args(["link", "show", &host_end]).output().unwrap().status.success();
    let waited = wait_until(HANG, gone);
    eprintln!("the client's namespace was destroyed {} ms after it was deleted", waited.as_millis());
    assert!(gone());
}
