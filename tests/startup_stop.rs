//! A stop asked for while the daemon starts (SIGINT or SIGTERM before it is
//! ready) stops it before ready: no ready line, no health-check line, no
//! nccl.env, a clean exit with the node restored. While it waits for late
//! NICs (`--wait_for_nics`) it says so (status, one log line) and a signal
//! ends the wait at once.

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

/// A daemon whose topology names `eth7`, which the fabricated sysfs lacks,
/// started with `--wait_for_nics=1h`.
fn waiting_daemon() -> (Daemon, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("sys/class/net/lo")).unwrap();
    let preset = tmp.path().join("late.textproto");
    std::fs::write(
        &preset,
        "gpu_rxq_configs { ifname: \"eth7\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 8 } }\n",
    )
    .unwrap();
    let d = Daemon::spawn(
        &[
            &format!("--gpu_nic_preset={}", preset.display()),
            &format!("--sysfs_root={}", tmp.path().join("sys").display()),
            "--wait_for_nics=1h",
            "--metrics_address=",
        ],
        &[],
    );
    d.wait_for_log("waiting for them", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("not waiting; log:\n{}", d.log().join("\n")));
    (d, tmp)
}

#[test]
fn while_it_waits_for_nics_status_says_so_and_a_signal_ends_the_wait_at_once() {
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let (mut d, _tmp) = waiting_daemon();
        let (code, out, err) = common::run_bin(&["status", &d.uds_arg()]);
        assert_eq!(code, 1, "{sig}: not ready: {out}{err}");
        assert!(out.contains("starting, waiting for interface eth7 to appear under"), "{sig}: {out}{err}");
        assert!(out.contains("--wait_for_nics"), "{out}");
        let (code, _, err) = common::run_bin(&["status", "flows", &d.uds_arg()]);
        assert!(code == 1 && err.contains("starting") && err.contains("no rules yet"), "{sig}: {err}");
        // The wait is an hour: an exit at all is the signal's doing.
        d.signal(sig);
        let status = d.wait_exit(Duration::from_secs(30));
        let log = d.log().join("\n");
        assert_eq!(status.code(), Some(0), "{sig}: {log}");
        assert!(log.contains("stopped while waiting for the NICs; nothing was touched"), "{sig}: {log}");
        assert!(d.files().is_empty(), "{sig}: left in the socket folder: {:?}", d.files());
    }
}

#[test]
fn a_wait_for_nics_logs_the_topology_once_and_the_missing_nics_once() {
    let (mut d, _tmp) = waiting_daemon();
    // Many looks later (one every 250 ms; the status reply counts them as seconds go by).
    common::wait_until(Duration::from_secs(30), || {
        let (_, out, _) = common::run_bin(&["status", "--json", &d.uds_arg()]);
        serde_json::from_str::<serde_json::Value>(&out)
            .is_ok_and(|v| v["starting"]["waited_seconds"].as_u64() >= Some(2))
    });
    d.signal(Signal::SIGTERM);
    d.wait_exit(Duration::from_secs(30));
    let log = d.log();
    let count = |needle: &str| log.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("topology loaded"), 1, "{log:#?}");
    assert_eq!(count("waiting for them"), 1, "{log:#?}");
    let waiting = log.iter().find(|l| l.contains("waiting for them")).unwrap();
    assert!(
        waiting.contains("interface eth7 to appear under") && waiting.contains("wait_for_nics=3600s"),
        "{waiting}"
    );
    // Progress comes at most every 10 s: none in the first few seconds.
    assert!(count("still waiting") <= 1, "{log:#?}");
}
