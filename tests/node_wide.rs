//! A node-wide daemon (`--node_wide`, as the systemd unit and the DaemonSet
//! run it) cannot be ended by a client: the sidecar's shutdown file and
//! SIGHUP leave it serving; SIGTERM still stops it cleanly. The same daemon
//! without `--node_wide` ends on both, which shows what the flag changes.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use tcpx_rxdm::daemon::HUP_IGNORED;

#[test]
fn shutdown_file_and_sighup_do_not_end_a_node_wide_daemon() {
    let mut d = Daemon::start(&["--node_wide"]);
    let terminated = d.dir.path().join("terminated");
    std::fs::write(&terminated, b"").unwrap();
    d.signal(Signal::SIGHUP);
    d.wait_for_log(HUP_IGNORED, Duration::from_secs(30)).expect("the ignored SIGHUP is logged");
    // A second SIGHUP more than a second later would force the exit of a stopping daemon.
    std::thread::sleep(Duration::from_millis(1200));
    d.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert!(d.child.try_wait().unwrap().is_none(), "exited:\n{}", d.log().join("\n"));
    assert_eq!(d.http_get("/readyz").0, 200);
    assert!(d.files().contains(&"rx_rule_manager".to_string()));
    assert_eq!(d.log().iter().filter(|l| l.contains(HUP_IGNORED)).count(), 2);
    assert!(!d.log().iter().any(|l| l.contains("shutting down")), "{}", d.log().join("\n"));

    d.signal(Signal::SIGTERM);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
}

#[test]
fn without_node_wide_both_end_the_daemon() {
    let mut d = Daemon::start(&["--nomonitor_shutdown"]);
    std::fs::write(d.dir.path().join("terminated"), b"").unwrap();
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(0));

    let mut d = Daemon::start(&["--nomonitor_shutdown"]);
    d.signal(Signal::SIGHUP);
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(0));
    assert!(d.log().iter().any(|l| l.contains("received SIGHUP")), "{}", d.log().join("\n"));
}
