//! Workloads (`--tenant_isolation`): the cgroups of one workload share its
//! budget of rules (`--max_rules_per_tenant`). A Kubernetes Pod's
//! containers, as the systemd and the cgroupfs drivers nest them, a Slurm
//! job's steps as slurmstepd nests them, a systemd service's cgroups, and
//! cgroups grouped by `--workload_cgroup_depth`: each laid out below a
//! test cgroup of the test's own, with a client process in each of 4
//! cgroups. Each NIC holds 40 rules here: were the budget per cgroup, the 4
//! cgroups of one workload would take all 40, and the next workload would
//! find the NIC full.
//!
//! Root only: cgroups and mount namespaces.

mod common;

use common::tenant::{rule, Agent, Cgroup, Reply};
use common::{require_root, Daemon};

const GPU: &str = "0000:04:00.0";
const RESOURCE_EXHAUSTED: i32 = 8;
const FLAGS: [&str; 3] = ["--tenant_isolation=enforce", "--max_rules_per_tenant=10", "--max_rx_rules=40"];

/// A Pod's uid as the API server gives it, and as the systemd driver writes
/// it in a slice's name.
const POD: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const POD_SYSTEMD: &str = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0";

/// Each client asks for `n` rules, one for each of `n` connections of its
/// own, one client after the other: the replies.
fn install_each(d: &Daemon, clients: &mut [Agent], n: usize) -> Vec<Reply> {
    let rm = d.sock("rx_rule_manager");
    let mut out = Vec::new();
    for c in clients {
        let reqs: Vec<_> = (0..n).map(|_| c.conn(false)).map(|(l, r)| rule(l, r, GPU)).collect();
        out.extend(c.reqs(&rm, &reqs).into_iter().map(|r| r.expect("a reply")));
    }
    out
}

/// The workload whose 4 cgroups are `members` (below a test cgroup `top`)
/// holds 10 rules in all, and its refusals and `status` name it
/// `name(top)`; a client in `other` (another workload) still installs.
fn shares_one_budget(extra: &[&str], members: [&str; 4], name: &dyn Fn(&Cgroup) -> String, other: &str) {
    require_root("cgroups and mount namespaces");
    let flags: Vec<&str> = FLAGS.iter().chain(extra).copied().collect();
    let d = Daemon::start(&flags);
    let top = Cgroup::new("workload");
    let name = &name(&top);
    let cgroups: Vec<Cgroup> = members.iter().map(|m| top.below(m)).collect();
    let other = top.below(other);
    let mut clients: Vec<Agent> = cgroups.iter().map(|cg| Agent::start(cg, 0)).collect();

    // 3 each: the first three clients get theirs, the fourth one of its 3;
    // then 7 each: the workload's budget is spent, whichever cgroup asks.
    let first = install_each(&d, &mut clients, 3);
    let second = install_each(&d, &mut clients, 7);
    // Another workload: a budget of its own, and room on the NIC.
    let mut o = Agent::start(&other, 0);
    let (l, r) = o.conn(false);
    let theirs = o.req(&d.sock("rx_rule_manager"), &rule(l, r, GPU));

    let served = |rs: &[Reply]| rs.iter().filter(|r| r.code() == 0).count();
    let (a, b) = (served(&first), served(&second));
    let said = format!("served {a} + {b} of 40; another workload's install: {}", theirs.code());
    assert_eq!((a, b, theirs.code()), (10, 0, 0), "one budget for the workload: {said}");
    for r in first.iter().chain(&second).filter(|r| r.code() != 0) {
        assert_eq!(r.code(), RESOURCE_EXHAUSTED, "{}", r.text());
        assert!(
            r.text().contains(&format!("workload {name} holds 10 rules")),
            "names the workload: {}",
            r.text()
        );
        assert!(r.text().contains("--max_rules_per_tenant=10"), "names the limit: {}", r.text());
    }

    // status: one tenant, the workload, with its 10 rules and 4 processes.
    let (code, out, _) = common::run_bin(&["status", "--json", &d.uds_arg()]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mine: Vec<&serde_json::Value> =
        v["tenants"].as_array().unwrap().iter().filter(|t| t["tenant"] == *name).collect();
    assert_eq!(mine.len(), 1, "{v}");
    assert_eq!(mine[0]["rules"], 10, "{v}");
    assert_eq!(mine[0]["pids"].as_array().unwrap().len(), 4, "{v}");
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn a_pods_containers_share_one_budget_under_the_systemd_driver() {
    let pod = format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SYSTEMD}.slice");
    let c = |id: &str| format!("{pod}/cri-containerd-{id}.scope");
    let (a, b, s, e) = (c("aa01"), c("bb02"), c("cc03"), c("dd04"));
    // Another Pod: a guaranteed one, directly under kubepods.slice.
    let other =
        "kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-ee05.scope";
    shares_one_budget(&[], [&a, &b, &s, &e], &|_| format!("pod {POD}"), other);
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn a_pods_containers_share_one_budget_under_the_cgroupfs_driver() {
    let c = |id: &str| format!("kubepods/besteffort/pod{POD}/{id}");
    let (a, b, s, e) = (c("aa01"), c("bb02"), c("cc03"), c("dd04"));
    let other = "kubepods/pod11111111-2222-3333-4444-555555555555/ee05";
    shares_one_budget(&[], [&a, &b, &s, &e], &|_| format!("pod {POD}"), other);
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn a_slurm_jobs_steps_share_one_budget() {
    let step = |s: &str| format!("system.slice/slurmstepd.scope/job_42/step_{s}/user/task_0");
    let (a, b, s, e) = (step("batch"), step("0"), step("1"), step("2"));
    let other = "system.slice/slurmstepd.scope/job_43/step_0/user/task_0";
    shares_one_budget(&[], [&a, &b, &s, &e], &|_| "slurm job 42".into(), other);
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn a_services_cgroups_share_one_budget() {
    let w = |n: &str| format!("system.slice/trainer.service/worker-{n}");
    let (a, b, s, e) = (w("1"), w("2"), w("3"), w("4"));
    shares_one_budget(&[], [&a, &b, &s, &e], &|_| "trainer.service".into(), "system.slice/other.service");
}

#[test]
#[ignore = "needs root: cgroups and mount namespaces"]
fn workload_cgroup_depth_groups_cgroups_by_their_first_levels() {
    // The test's own cgroup is level 1; level 2 names the team.
    let w = |n: &str| format!("team-a/job-{n}/main");
    let (a, b, s, e) = (w("1"), w("2"), w("3"), w("4"));
    let team = |top: &Cgroup| format!("{}/team-a", top.name());
    shares_one_budget(&["--workload_cgroup_depth=2"], [&a, &b, &s, &e], &team, "team-b/job-1/main");
}

/// The rules `status` counts for workload `name`, through the socket folder.
fn rules_of(folder: &std::path::Path, name: &str) -> u64 {
    let (code, out, _) = common::run_bin(&["status", "--json", &format!("--uds_path={}", folder.display())]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = v["tenants"].as_array().unwrap().iter().find(|t| t["tenant"] == name).cloned();
    t.map_or(0, |t| t["rules"].as_u64().unwrap())
}

#[test]
#[ignore = "needs root: cgroups, mount namespaces, a takeover's pidfd_getfd"]
fn a_takeover_keeps_a_workloads_rules_its_own_and_counted() {
    use common::procs::leased_daemon as daemon;
    use std::time::Duration;
    require_root("cgroups, mount namespaces, a takeover's pidfd_getfd");
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let old = daemon(&folder, &FLAGS, &[]).ready();
    let top = Cgroup::new("takeover");
    let (cga, cgb) =
        (top.below(&format!("kubepods/pod{POD}/aa01")), top.below(&format!("kubepods/pod{POD}/bb02")));
    let (mut a, mut b) = (Agent::start(&cga, 0), Agent::start(&cgb, 0));
    let (rm, un) = (folder.join("rx_rule_manager"), folder.join("rx_rule_uninstall"));
    let conns: Vec<_> = (0..6).map(|_| a.conn(false)).collect();
    let mine: Vec<_> = conns.iter().map(|&(l, r)| rule(l, r, GPU)).collect();
    assert!(a.reqs(&rm, &mine).iter().all(|r| r.as_ref().is_some_and(|r| r.code() == 0)));
    let pod = format!("pod {POD}");
    assert_eq!(rules_of(&folder, &pod), 6);

    // A successor that tells workloads otherwise cannot take over.
    let flags: Vec<&str> = FLAGS.iter().copied().chain(["--takeover", "--workload_cgroup_depth=2"]).collect();
    let mut other = daemon(&folder, &flags, &[]);
    assert_eq!(other.wait_exit(Duration::from_secs(20)).code(), Some(1));
    assert!(other.wait_for_log("another --workload_cgroup_depth", Duration::from_secs(2)).is_some());

    let flags: Vec<&str> = FLAGS.iter().copied().chain(["--takeover"]).collect();
    let new = daemon(&folder, &flags, &[]).ready();
    assert!(new.wait_for_log("took over from pid", Duration::from_secs(30)).is_some());
    drop(old);
    // Another container of the Pod removes a rule of the first: the Pod's own.
    let r = b.req(&un, &mine[0]);
    assert_eq!(r.code(), 0, "{}", r.text());
    assert_eq!(rules_of(&folder, &pod), 5);
    // The Pod's budget still counts the rules installed before: 5 more, not 10.
    let theirs: Vec<_> = (0..6).map(|_| b.conn(false)).map(|(l, r)| rule(l, r, GPU)).collect();
    // Sent on six connections at once, served by whichever thread is free:
    // which one is refused is not decided, how many are.
    let mut codes: Vec<i32> =
        b.reqs(&rm, &theirs).iter().map(|r| r.as_ref().map_or(-1, Reply::code)).collect();
    codes.sort_unstable();
    assert_eq!(codes, [0, 0, 0, 0, 0, RESOURCE_EXHAUSTED]);
    assert_eq!(rules_of(&folder, &pod), 10);
}

/// One workload's connections, registrations held open included, stop at
/// three quarters of --max_connections; another workload's pool fetch and
/// install are answered at once (they waited for a free connection before).
#[test]
#[ignore = "needs root: cgroups and mount namespaces for the client processes"]
fn a_workload_that_holds_connections_leaves_room_for_the_others() {
    require_root("cgroups");
    let d = Daemon::start(&["--tenant_isolation=audit", "--max_connections=16"]);
    let (cga, cgb) = (Cgroup::new("conn-a"), Cgroup::new("conn-b"));
    let (mut a, mut b) = (Agent::start(&cga, 0), Agent::start(&cgb, 2));
    let register = tcpx_rxdm::wire::client::register(true);
    let held = a.keep(&d.sock("rxdm_application_registry"), &vec![register; 16]);
    let served = held.iter().filter(|r| r.as_ref().is_some_and(|r| r.code() == 0)).count();
    let refused: Vec<String> = held.iter().flatten().filter(|r| r.code() == 8).map(|r| r.text()).collect();
    assert_eq!((served, refused.len()), (12, 4), "{refused:?}");
    assert!(
        refused[0].contains("holds 12 registry and pool connections")
            && refused[0].contains("--max_connections"),
        "{}",
        refused[0]
    );
    // The other workload: a pool and a rule, answered.
    let pool =
        b.req(&d.sock("get_gpu_fd_0000:0a:00.0"), &tcpx_rxdm::wire::client::raw_request("0000:0a:00.0"));
    assert!(matches!(pool, Reply::Fd), "{}", pool.text());
    let (l, r) = b.conn(false);
    assert_eq!(b.req(&d.sock("rx_rule_manager"), &rule(l, r, "0000:0a:00.0")).code(), 0);
    let (_, m) = d.http_get("/metrics");
    assert_eq!(common::metric(&m, "tcpx_rxdm_connections_over_share_total"), Some(4.0));
}

/// One workload's rule connections, held open after their answers, stop at
/// three quarters of the part of --max_connections rule and queue
/// connections may use; the next is refused saying why, and another
/// workload's rule connection is served at once (it waited in the backlog
/// for as long as the first held them, before).
#[test]
#[ignore = "needs root: cgroups and mount namespaces for the client processes"]
fn a_workload_that_holds_rule_connections_leaves_room_for_the_others() {
    require_root("cgroups");
    // 16 in all: 12 for rule and queue connections, 9 of them one workload's.
    let d = Daemon::start(&["--tenant_isolation=audit", "--max_connections=16"]);
    let cga = Cgroup::new("rconn-a");
    let mut a = Agent::start(&cga, 0);
    let reqs: Vec<_> = (0..12).map(|_| a.conn(false)).map(|(l, r)| rule(l, r, GPU)).collect();
    let held = a.keep(&d.sock("rx_rule_manager"), &reqs);
    let served = held.iter().filter(|r| r.as_ref().is_some_and(|r| r.code() == 0)).count();
    let refused: Vec<String> =
        held.iter().flatten().filter(|r| r.code() == RESOURCE_EXHAUSTED).map(|r| r.text()).collect();
    assert_eq!((served, refused.len()), (9, 3), "{refused:?}");
    assert!(refused[0].contains("holds 9 rule and queue connections"), "{}", refused[0]);
    // Another workload (this test's own cgroup): an uninstall, answered.
    let mut other = tcpx_rxdm::wire::client::Client::connect(d.sock("rx_rule_uninstall")).unwrap();
    other.stream().set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    let flow = tcpx_rxdm::wire::client::rule_request(1, ("10.1.0.2", 1), ("192.168.1.2", 2), Some(GPU), None);
    let reply = other.request(&flow).expect("answered while the first workload holds its share");
    assert_eq!(tcpx_rxdm::wire::client::status_code(&reply), 0, "{reply:?}");
    let (_, m) = d.http_get("/metrics");
    assert_eq!(common::metric(&m, "tcpx_rxdm_connections_over_share_total"), Some(3.0));
}
