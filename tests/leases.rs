//! Leases: rules of a client process that dies go away by themselves, and
//! deletes the NIC refuses are finished by the daemon.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{
    encoded, install_frame, install_rule, metric, raw_exchange, require_root, wait_until, ClientProcess,
    Daemon, GPU0, GPU_ETH2, OK_FRAME,
};
use tcpx_rxdm::wire::client;
use tcpx_rxdm::wire::frame;

fn install_v6(sport: i32, gpu: &str) -> Vec<u8> {
    encoded(&client::rule_request(5, ("fd00::2", sport), ("fd00:0:0:2::2", 5000), Some(gpu), None))
}

/// Every booked rule, flattened over the NICs. The booked rules and the NIC's own
/// table are read one after the other, so a reclaim may land in between: read
/// again until they agree (they must, once nothing is in flight).
fn rules(d: &Daemon) -> Vec<serde_json::Value> {
    let agree = |flows: &serde_json::Value| {
        flows["nics"].as_array().unwrap().iter().all(|n| {
            let locs = |key: &str| {
                let mut v: Vec<u64> =
                    n[key].as_array().unwrap().iter().map(|r| r["loc"].as_u64().unwrap()).collect();
                v.sort();
                v
            };
            locs("rules") == locs("nic_rules")
        })
    };
    let mut flows = serde_json::Value::Null;
    // A guard against a hang, not a timing: they agree once nothing is in flight.
    wait_until(Duration::from_secs(60), || {
        flows = d.flows();
        agree(&flows)
    });
    flows["nics"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["rules"].as_array().unwrap().iter().cloned())
        .collect()
}

fn client_requests(d: &Daemon) -> Vec<(PathBuf, Vec<u8>)> {
    vec![
        (d.sock("rx_rule_manager"), install_frame(41000, GPU0)),
        (d.sock("rx_rule_manager"), install_frame(41001, GPU0)),
        (d.sock("rx_rule_manager"), install_v6(41002, GPU_ETH2)),
    ]
}

/// Kills a client that installed three rules and waits until they are gone
/// (how soon is `cargo run --release --example bench`'s to measure).
/// `pid_visible`: whether the daemon sees the client's pid.
fn kill_and_see_reclaim(d: &Daemon, pid_visible: bool) {
    // A rule of this test process, which stays alive: it must survive.
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &install_frame(40000, GPU0)), OK_FRAME);
    let mut c = ClientProcess::run(&client_requests(d), Duration::from_secs(60));
    assert!(c.replies.iter().all(|r| *r == OK_FRAME), "{:?}", c.replies);
    let all = rules(d);
    assert_eq!(all.len(), 4);
    let theirs: Vec<_> = all.iter().filter(|r| r["src"] != "10.1.0.2:40000").collect();
    for r in &theirs {
        assert_eq!(r["lease"], true, "{r}");
        match pid_visible {
            true => assert_eq!(r["pid"].as_u64(), Some(u64::from(c.pid())), "{r}"),
            false => assert!(r["pid"].is_null(), "pid not visible to the daemon: {r}"),
        }
    }
    c.kill();
    // The minute only bounds a hang.
    wait_until(Duration::from_secs(60), || rules(d).len() == 1);
    let left = rules(d);
    assert_eq!(left[0]["src"], "10.1.0.2:40000");
    let (_, m) = d.http_get("/metrics");
    assert_eq!(metric(&m, "tcpx_rxdm_lease_rules_reclaimed_total"), Some(3.0));
}

#[test]
fn a_killed_clients_rules_disappear_and_no_one_elses() {
    let d = Daemon::start(&[]);
    kill_and_see_reclaim(&d, true);
}

#[test]
#[ignore = "needs root: unshare --pid"]
fn reclaim_works_when_the_client_pid_is_invisible_to_the_daemon() {
    require_root("unshare --pid");
    // The daemon in a pid namespace of its own, with that namespace's /proc,
    // sees this test's processes as pid 0, as a sidecar does its workload's:
    // only SO_PEERPIDFD identifies them.
    let prefix = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"];
    let d = Daemon::spawn_under(&prefix, &[], &[]).ready();
    kill_and_see_reclaim(&d, false);
}

/// A daemon in a pid namespace of its own whose `/proc` is another's (the
/// host's): pids read there are not the connections' (`SO_PEERCRED`), so no
/// client is named by one; each is named by its opener's pidfd, and a killed
/// client's rules still go.
#[test]
#[ignore = "needs root: unshare --pid"]
fn a_proc_of_another_pid_namespace_names_no_client_by_pid() {
    require_root("unshare --pid");
    let prefix = ["unshare", "--pid", "--fork", "--kill-child"];
    let d = Daemon::spawn_under(&prefix, &[], &[]).ready();
    assert!(
        d.log().iter().any(|l| l.contains("/proc shows another pid namespace's pids")),
        "{}",
        d.log().join("\n")
    );
    // The pid shown is the one the host's /proc gives: this test's own namespace's.
    kill_and_see_reclaim(&d, true);
    // And with its own /proc, the pid path stays open: no such line.
    let own = Daemon::spawn_under(&["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"], &[], &[])
        .ready();
    assert!(!own.log().iter().any(|l| l.contains("/proc shows another pid namespace's pids")));
}

#[test]
fn without_leases_a_dead_clients_rules_stay() {
    // No identification at all (tenant checks would find the pid): as the reference.
    let d = Daemon::start(&["--noleases", "--tenant_isolation=off"]);
    let mut c = ClientProcess::run(&client_requests(&d), Duration::from_secs(60));
    assert!(rules(&d).iter().all(|r| r["lease"] == false && r["pid"].is_null()));
    c.kill();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rules(&d).len(), 3);
}

#[test]
fn refused_deletes_are_retried_until_everything_is_gone() {
    // 30 % of NIC deletes fail: clients see some errors, the daemon finishes the job.
    let d = Daemon::start(&["--sim_fault=del_rule:EIO:0.3"]);
    let n = 100i32;
    for i in 0..n {
        assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &install_frame(30000 + i, GPU0)), OK_FRAME);
    }
    let mut refused = 0;
    for i in 0..n {
        let reply =
            raw_exchange(&d.sock("rx_rule_uninstall"), &encoded(&install_rule(30000 + i, Some(GPU0))));
        if reply != OK_FRAME {
            let msg = frame::parse(&reply).unwrap().unwrap().0;
            assert_eq!(client::status_code(&msg), 13, "EIO maps to INTERNAL");
            refused += 1;
        }
    }
    assert!(refused > 0, "with 30 % failing deletes some uninstall must have been refused");
    // And a killed client's rules, under the same faults.
    let mut c = ClientProcess::run(&client_requests(&d), Duration::from_secs(60));
    c.kill();
    let took = wait_until(Duration::from_secs(60), || rules(&d).is_empty());
    println!(
        "{refused} of {n} uninstalls refused by the NIC; all rules gone {took:?} after the client was killed"
    );
    let (_, m) = d.http_get("/metrics");
    assert_eq!(metric(&m, "tcpx_rxdm_rule_deletes_pending{nic=\"eth1\"}"), Some(0.0));
    assert!(
        m.lines().any(|l| l.starts_with("tcpx_rxdm_rule_delete_retries_total") && !l.ends_with(" 0")),
        "retries counted"
    );
}
