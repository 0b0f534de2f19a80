//! `tcpx-rxdm upgrade` against daemons on simulated NICs: the serving pid
//! changes, rules and clients stay, the old daemon exits 0 (or, with
//! `--after_handover=wait`, waits for SIGTERM); a successor that fails
//! leaves the old daemon serving and the command exits 1 pointing at the log.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{install_frame, raw_exchange, run_bin, wait_until, ClientProcess, Daemon, GPU0, OK_FRAME};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Whether `pid` runs (a zombie does not: the successor's parent may be gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.split_whitespace().next() != Some("Z")))
        .unwrap_or(false)
}

fn lock_pid(folder: &Path) -> u32 {
    std::fs::read_to_string(folder.join(".rxdm.lock")).unwrap().trim().parse().unwrap()
}

/// Runs `upgrade` on the folder; (exit code, stdout, stderr).
fn upgrade(folder: &Path, timeout: &str) -> (i32, String, String) {
    run_bin(&["upgrade", &format!("--uds_path={}", folder.display()), &format!("--timeout={timeout}")])
}

/// The new pid from `upgraded: pid A -> pid B`, checked to name `old` as A.
fn new_pid(stdout: &str, old: u32) -> u32 {
    let rest = stdout
        .trim()
        .strip_prefix(&format!("upgraded: pid {old} -> pid "))
        .unwrap_or_else(|| panic!("{stdout}"));
    rest.parse().unwrap_or_else(|e| panic!("{stdout}: {e}"))
}

/// Rules booked on the daemon that serves the folder (its HTTP listener moved with it).
fn booked(d: &Daemon) -> usize {
    d.flows()["nics"].as_array().unwrap().iter().map(|n| n["rules"].as_array().unwrap().len()).sum()
}

/// Stops a successor (no child of ours) by pid and waits until it is gone;
/// its exit restores and removes the sockets.
fn stop(pid: u32, folder: &Path, log: &Daemon) {
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
    wait_until(Duration::from_secs(20), || !alive(pid));
    assert!(
        log.wait_for_log("shutdown complete", Duration::from_secs(30)).is_some(),
        "{}",
        log.log().join("\n")
    );
    assert!(
        !folder.join("rx_rule_manager").exists(),
        "the last daemon removes its sockets: {:?}",
        std::fs::read_dir(folder).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>()
    );
}

#[test]
fn upgrade_hands_the_folder_to_a_new_process_and_the_old_one_exits() {
    let mut old = Daemon::start(&["--leases"]);
    let folder = old.dir.path().to_path_buf();
    let a = old.child.id();
    // A client holding a rule, and a registered application, across the upgrade.
    let holder = ClientProcess::run(
        &[(folder.join("rx_rule_manager"), install_frame(4242, GPU0))],
        Duration::from_secs(120),
    );
    assert_eq!(holder.replies, vec![OK_FRAME.to_vec()]);
    let mut reg = std::os::unix::net::UnixStream::connect(folder.join("rxdm_application_registry")).unwrap();
    std::io::Write::write_all(&mut reg, &common::encoded(&tcpx_rxdm::wire::client::register(true))).unwrap();
    common::read_frame(&mut reg).unwrap();
    assert_eq!(booked(&old), 1);

    let (code, out, err) = upgrade(&folder, "20s");
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}\nlog:\n{}", old.log().join("\n"));
    let b = new_pid(&out, a);
    assert_ne!(a, b);
    // The old daemon exited 0 without restoring; the new one holds the folder.
    let st = old.wait_exit(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
    assert!(old.wait_for_log(&format!("handed over to pid {b}"), Duration::from_secs(30)).is_some());
    // The successor writes to the same stderr.
    assert!(old.wait_for_log(&format!("took over from pid {a}"), Duration::from_secs(30)).is_some());
    assert!(!old.log().iter().any(|l| l.contains("rules removed")), "{}", old.log().join("\n"));
    assert!(alive(b));
    assert_eq!(lock_pid(&folder), b);
    // Its sockets name it to whoever connects: it listened on them again (the
    // kernel names whoever called listen() last, else the old daemon, gone).
    let s = std::os::unix::net::UnixStream::connect(folder.join("rxdm_status")).unwrap();
    let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials).unwrap();
    assert_eq!(cred.pid(), b as i32);
    drop(s);
    // The rule is still booked and the folder serves a new request.
    assert_eq!(booked(&old), 1);
    assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(4243, GPU0)), OK_FRAME);
    assert_eq!(booked(&old), 2);
    // The registered application is still connected: the new daemon counts it.
    let (_, status, _) = run_bin(&["status", "--json", &format!("--uds_path={}", folder.display())]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["pid"], b);
    assert_eq!(status["registered_applications"], 1, "{status}");
    // Stopped while the application is registered (its leaving would end it:
    // the harness runs the reference's default, --monitor_shutdown).
    stop(b, &folder, &old);
    drop((reg, holder));
}

#[test]
fn with_after_handover_wait_it_is_done_when_the_new_daemon_answers() {
    let mut old = Daemon::start(&["--leases", "--after_handover=wait"]);
    let folder = old.dir.path().to_path_buf();
    let a = old.child.id();
    let (code, out, err) = upgrade(&folder, "20s");
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}\nlog:\n{}", old.log().join("\n"));
    let b = new_pid(&out, a);
    // The old one waits for SIGTERM; the new one serves.
    assert!(old.child.try_wait().unwrap().is_none(), "the old daemon should still wait");
    assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(5000, GPU0)), OK_FRAME);
    old.signal(Signal::SIGTERM);
    assert!(old.wait_exit(Duration::from_secs(10)).success());
    assert!(alive(b));
    stop(b, &folder, &old);
}

#[test]
fn a_failed_successor_leaves_the_old_daemon_serving_and_exits_1() {
    // The successor inherits the environment: it dies holding the state.
    let old = Daemon::spawn(&["--leases"], &[("TCPX_RXDM_TEST_TAKEOVER_FAULT", "exit")]).ready();
    let folder = old.dir.path().to_path_buf();
    let a = old.child.id();
    // Exit 1 at once if it sees the successor end, else after --timeout.
    let (code, out, err) = upgrade(&folder, "3s");
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains(&format!("pid {a} still serves")) && err.contains("daemon's log"), "{err}");
    // It says why in its own log, and serves on.
    assert!(old.wait_for_log("takeover failed; serving on", Duration::from_secs(10)).is_some());
    assert!(old.child.id() == a && alive(a));
    assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(6000, GPU0)), OK_FRAME);
}

#[test]
fn no_daemon_and_bad_flags_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, _, err) = upgrade(tmp.path(), "1s");
    assert_eq!(code, 1);
    assert!(err.contains("no daemon serves"), "{err}");
    let (code, _, err) = run_bin(&["upgrade", "--timeout=later"]);
    assert_eq!(code, 2);
    assert!(err.contains("--timeout"), "{err}");
    let (code, _, err) = run_bin(&["upgrade", "--uds_pth=/run/tcpx"]);
    assert_eq!(code, 2);
    assert!(err.contains("--uds_pth"), "{err}");
    let (code, out, _) = run_bin(&["upgrade", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Usage: tcpx-rxdm upgrade"), "{out}");
}
