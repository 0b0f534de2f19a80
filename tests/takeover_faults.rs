//! A takeover never leaves a folder without its daemon. The new daemon
//! exits, is killed, panics or stalls at each step of the sequence (in an
//! order drawn at random, the seed printed), serving already at the last,
//! and the old one dies at its own steps; afterwards exactly one daemon serves the folder (a client's
//! request is answered OK), the lock file names it, `tcpx-rxdm upgrade`
//! works again and nothing the serving daemon holds was undone (its rules
//! on the NIC, its socket files). A reason to stop that comes during a
//! takeover stops the old daemon at once instead of after the takeover.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{install_frame, raw_exchange, run_bin, wait_until, Daemon, GPU0, OK_FRAME};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const FAULT: &str = "TCPX_RXDM_TEST_TAKEOVER_FAULT";

fn daemon(folder: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
    let mut args = vec![format!("--uds_path={}", folder.display()), "--leases".to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::spawn(&args, env)
}

/// Whether `pid` runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.split_whitespace().next() != Some("Z")))
        .unwrap_or(false)
}

fn files(folder: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn count(d: &Daemon, needle: &str) -> usize {
    d.log().iter().filter(|l| l.contains(needle)).count()
}

/// Rules booked on the daemon that serves (its HTTP listener moves with the
/// folder), checked equal to the NIC's own table, NIC by NIC.
fn booked(d: &Daemon) -> usize {
    let flows = d.flows();
    let mut total = 0;
    for n in flows["nics"].as_array().unwrap() {
        let locs = |k: &str| {
            let mut v: Vec<u64> =
                n[k].as_array().expect("table readable").iter().map(|r| r["loc"].as_u64().unwrap()).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(locs("rules"), locs("nic_rules"), "{}: bookkeeping and NIC table differ", n["ifname"]);
        total += n["rules"].as_array().unwrap().len();
    }
    total
}

/// `pid` alone serves `folder`, as it did: the lock file and the status
/// socket name it, the socket files are all there, its `rules` are booked
/// and on the NIC, and a new rule is installed and removed.
fn serves_alone(pid: u32, d: &Daemon, folder: &Path, expected_files: &[String], rules: usize, sport: i32) {
    assert!(alive(pid), "pid {pid} is gone");
    let named: u32 = std::fs::read_to_string(folder.join(".rxdm.lock")).unwrap().trim().parse().unwrap();
    assert_eq!(named, pid, "the lock file names another process");
    let (code, out, err) = run_bin(&["status", "--json", &format!("--uds_path={}", folder.display())]);
    assert_eq!(code, 0, "{out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["pid"], pid, "{status}");
    assert_eq!(files(folder), expected_files, "a file of the folder changed");
    assert_eq!(booked(d), rules);
    assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(sport, GPU0)), OK_FRAME);
    assert_eq!(booked(d), rules + 1);
    assert_eq!(raw_exchange(&folder.join("rx_rule_uninstall"), &install_frame(sport, GPU0)), OK_FRAME);
    assert_eq!(booked(d), rules);
}

/// `tcpx-rxdm upgrade` hands the folder from `old` to a new process; the
/// rules stay. Returns the new pid.
fn upgrade_works(old: &mut Daemon, folder: &Path, rules: usize) -> u32 {
    let a = old.child.id();
    let (code, out, err) =
        run_bin(&["upgrade", &format!("--uds_path={}", folder.display()), "--timeout=20s"]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}\nlog:\n{}", old.log().join("\n"));
    let b: u32 = out.trim().strip_prefix(&format!("upgraded: pid {a} -> pid ")).unwrap().parse().unwrap();
    assert!(old.wait_exit(Duration::from_secs(10)).success());
    assert!(alive(b));
    assert_eq!(booked(old), rules, "the rules moved with the folder");
    b
}

/// Stops a daemon that is no child of ours; its exit restores and removes the sockets.
fn stop(pid: u32, folder: &Path) {
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
    wait_until(Duration::from_secs(20), || !alive(pid));
    assert!(!folder.join("rx_rule_manager").exists(), "the last daemon removes its sockets");
}

/// How a new daemon with `fault` must have ended.
fn check_end(fault: &str, st: std::process::ExitStatus, log: &str) {
    use std::os::unix::process::ExitStatusExt;
    match fault.rsplit(':').next().unwrap() {
        "exit" => assert_eq!(st.code(), Some(3), "{fault}: {st:?}\n{log}"),
        "kill" => assert_eq!(st.signal(), Some(9), "{fault}: {st:?}\n{log}"),
        // Not 101: the panic exits at once, without unwinding over what it holds.
        "panic" => {
            assert_eq!(st.code(), Some(1), "{fault}: {st:?}\n{log}");
            assert!(log.contains("a panic while taking over"), "{fault}:\n{log}");
        }
        // Stopped by the old daemon, which serves on.
        "stall" => assert_eq!(st.signal(), Some(9), "{fault}: {st:?}\n{log}"),
        a => panic!("{a}"),
    }
}

/// A shuffle good enough to vary the order from run to run (xorshift).
fn shuffle<T>(v: &mut [T], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

#[test]
fn a_new_daemon_that_fails_at_any_step_leaves_the_old_one_serving_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    // Each side waits 10 s for the other: a step of a loaded machine's new
    // daemon fits; the stalled one is stopped after it.
    let mut old = daemon(&folder, &["--takeover_timeout=10s"], &[]).ready();
    let pid = old.child.id();
    let holder = common::ClientProcess::run(
        &[(folder.join("rx_rule_manager"), install_frame(4000, GPU0))],
        Duration::from_secs(300),
    );
    assert_eq!(holder.replies, vec![OK_FRAME.to_vec()]);
    let expected = files(&folder);
    serves_alone(pid, &old, &folder, &expected, 1, 4001);

    let mut faults: Vec<String> = ["hello", "state", "adopted", "commit", "serving"]
        .iter()
        .flat_map(|s| ["exit", "kill", "panic"].map(|a| format!("{s}:{a}")))
        .collect();
    // Stalled with the commit in hand, before and after opening its gate:
    // stopped once the answer is overdue (the old daemon stays paused meanwhile).
    faults.push("commit:stall".into());
    faults.push("serving:stall".into());
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    shuffle(&mut faults, seed);
    eprintln!("faults in the order of seed {seed}: {faults:?}");
    for (i, fault) in faults.iter().enumerate() {
        let failed = count(&old, "takeover failed; serving on");
        let mut new = daemon(&folder, &["--takeover"], &[(FAULT, fault)]);
        let st = new.wait_exit(Duration::from_secs(20));
        assert_eq!(files(&folder), expected, "{fault}: the new daemon changed the folder");
        check_end(fault, st, &new.log().join("\n"));
        wait_until(Duration::from_secs(10), || count(&old, "takeover failed; serving on") > failed);
        assert!(
            !old.log().iter().any(|l| l.contains("handed over to pid")),
            "{fault}: the old daemon handed over to a daemon that never served"
        );
        serves_alone(pid, &old, &folder, &expected, 1, 4100 + i as i32);
    }
    // Nothing above took the folder from it: it can still be upgraded.
    let b = upgrade_works(&mut old, &folder, 1);
    stop(b, &folder);
    drop(holder);
}

#[test]
fn the_new_daemon_serves_when_the_old_one_dies_before_the_commit_is_answered() {
    for fault in ["old:adopted:kill", "old:commit:kill"] {
        let tmp = tempfile::tempdir().unwrap();
        let folder = tmp.path().join("uds");
        let mut old = daemon(&folder, &[], &[(FAULT, fault)]).ready();
        assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(4200, GPU0)), OK_FRAME);
        let expected = files(&folder);
        let mut new = daemon(&folder, &["--takeover"], &[]).ready();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(old.wait_exit(Duration::from_secs(10)).signal(), Some(9), "{fault}");
        // Without the commit it serves because the old daemon's process is gone.
        let line = match fault {
            "old:adopted:kill" => "ended without committing; serving",
            _ => "took over from pid",
        };
        assert!(
            new.wait_for_log(line, Duration::from_secs(30)).is_some(),
            "{fault}:\n{}",
            new.log().join("\n")
        );
        serves_alone(new.child.id(), &new, &folder, &expected, 1, 4201);
        let c = upgrade_works(&mut new, &folder, 1);
        stop(c, &folder);
    }
}

#[test]
#[ignore = "needs root: unshare --pid"]
fn the_old_daemon_is_judged_by_its_process_not_the_pid_it_reports_from_its_namespace() {
    common::require_root("unshare --pid");
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let uds = format!("--uds_path={}", folder.display());
    // The old daemon is pid 2 of its own namespace (a shell is its pid 1):
    // pid 2 here is kthreadd, which never exits.
    let prefix = ["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", "\"$@\" & wait $!", "sh"];
    let old = Daemon::spawn_under(&prefix, &[&uds, "--leases"], &[(FAULT, "old:adopted:kill")]).ready();
    let reported: u32 = std::fs::read_to_string(folder.join(".rxdm.lock")).unwrap().trim().parse().unwrap();
    assert_eq!(reported, 2, "the old daemon knows itself as pid 2");
    assert!(alive(2));
    assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(4300, GPU0)), OK_FRAME);
    let expected = files(&folder);
    let mut new = daemon(&folder, &["--takeover"], &[]).ready();
    assert!(
        new.wait_for_log("ended without committing; serving", Duration::from_secs(5)).is_some(),
        "{}",
        new.log().join("\n")
    );
    serves_alone(new.child.id(), &new, &folder, &expected, 1, 4301);
    drop(old);
    let c = upgrade_works(&mut new, &folder, 1);
    stop(c, &folder);
}

#[test]
fn a_reason_to_stop_during_a_takeover_ends_it_and_the_old_daemon_stops_at_once() {
    for trigger in ["SIGTERM", "shutdown file"] {
        let tmp = tempfile::tempdir().unwrap();
        let folder = tmp.path().join("uds");
        // A takeover that would keep the old daemon waiting an hour for a verdict:
        // that it stops at all shows it did not wait for one.
        let mut old = daemon(&folder, &["--takeover_timeout=1h"], &[]).ready();
        assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(4400, GPU0)), OK_FRAME);
        let mut stalled = daemon(&folder, &["--takeover"], &[(FAULT, "state:stall")]);
        wait_until(Duration::from_secs(20), || count(&old, "takeover asked: pausing") > 0);
        std::thread::sleep(Duration::from_millis(200)); // the state is on its way
        let t = Instant::now();
        match trigger {
            "SIGTERM" => old.signal(Signal::SIGTERM),
            _ => std::fs::write(folder.join("terminated"), b"").unwrap(),
        }
        let st = old.wait_exit(Duration::from_secs(60));
        let took = t.elapsed();
        let log = old.log().join("\n");
        assert!(st.success(), "{trigger}: {st:?}\n{log}");
        // It served on first (the new daemon stopped), then restored everything.
        assert!(log.contains("stopping: ending the takeover under way"), "{log}");
        assert!(log.contains("takeover failed; serving on") && log.contains("rules removed"), "{log}");
        assert!(log.contains("shutdown complete"), "{log}");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(stalled.wait_exit(Duration::from_secs(60)).signal(), Some(9), "{trigger}");
        assert!(!folder.join("rx_rule_manager").exists(), "{trigger}: the sockets were not removed");
        eprintln!("{trigger} during a takeover: the old daemon stopped in {took:?}");
    }
}

/// Every datagram the daemons sent the fake service manager so far.
fn notified(sock: &std::os::unix::net::UnixDatagram) -> Vec<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    got
}

#[test]
fn the_service_manager_hears_of_the_new_daemon_only_once_it_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let path = tmp.path().join("notify");
    let sm = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sm.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let env = [("NOTIFY_SOCKET", path.to_str().unwrap())];
    let mut old = daemon(&folder, &[], &env).ready();
    assert!(notified(&sm).iter().any(|m| m.contains("READY=1")));
    // A new daemon that dies with the commit in hand: the main process never changed.
    let fault = [env[0], (FAULT, "commit:kill")];
    let mut dies = daemon(&folder, &["--takeover"], &fault);
    let _ = dies.wait_exit(Duration::from_secs(20));
    assert!(old.wait_for_log("takeover failed; serving on", Duration::from_secs(10)).is_some());
    let said = notified(&sm);
    assert!(!said.iter().any(|m| m.contains("MAINPID=")), "{said:?}");
    // A good one: named as the main process before it says it is ready.
    let new = daemon(&folder, &["--takeover"], &env).ready();
    assert!(old.wait_exit(Duration::from_secs(10)).success());
    let said = notified(&sm);
    let mainpid = said.iter().position(|m| m == &format!("MAINPID={}", new.child.id()));
    let ready = said.iter().rposition(|m| m.contains("READY=1"));
    assert!(mainpid.is_some() && ready.is_some() && mainpid < ready, "{said:?}");
    drop(new);
}
