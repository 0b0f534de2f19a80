//! A stop asked for while the daemon starts (SIGINT or SIGTERM before it is
//! ready) stops it before ready: no ready line, no health-check line, no
//! nccl.env, a clean exit with the node restored.

mod common;

use std::time::Duration;

use common::Daemon;
use nix::sys::signal::Signal;
use tcpx_rxdm::daemon::READY_LINE;

#[test]
fn a_signal_during_startup_stops_it_before_ready() {
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let health = tempfile::tempdir().unwrap();
        let health_file = health.path().join("health.log");
        // Priming each simulated NIC's RSS takes 400 ms: time to ask for the stop.
        let env = [("HEALTH_CHECK_LOG_FILE", health_file.to_str().unwrap())];
        let mut d = Daemon::spawn(&["--sim_delay=set_rss:400"], &env);
        d.wait_for_log("socket folder locked", Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{sig}: no startup; log:\n{}", d.log().join("\n")));
        d.signal(sig);
        let status = d.wait_exit(Duration::from_secs(30));
        let log = d.log().join("\n");
        assert_eq!(status.code(), Some(0), "{sig}: {log}");
        assert!(!log.contains(READY_LINE), "{sig}: ready after the stop was asked:\n{log}");
        assert!(log.contains("shutting down") && log.contains(&format!("received {sig}")), "{sig}: {log}");
        assert!(!health_file.exists(), "{sig}: the health line was written");
        assert!(!d.dir.path().join("nccl.env").exists(), "{sig}: nccl.env left behind");
    }
}
