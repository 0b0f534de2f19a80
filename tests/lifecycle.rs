//! Black-box lifecycle tests: exit codes, the single-instance lock, files
//! removed on exit, the application registry, the ready signal.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::wire::client::{self, raw_bytes, status_code};

#[test]
fn sigterm_and_sigint_exit_zero_and_remove_files() {
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let mut d = Daemon::start(&[]);
        // A rule in place, to be removed on the way out.
        let mut c = d.client("rx_rule_manager");
        let r = c.request(&client::rule_request(1, ("10.0.0.9", 1), ("192.168.2.2", 2), None, None)).unwrap();
        assert_eq!(raw_bytes(&r), Some(&b"Ok."[..]));
        assert!(d.files().len() > 10);
        d.signal(sig);
        let st = d.wait_exit(Duration::from_secs(10));
        assert_eq!(st.code(), Some(0), "{sig}: {}", d.log().join("\n"));
        assert_eq!(d.files(), Vec::<String>::new(), "{sig}: files left behind");
        assert!(d.log().iter().any(|l| l.contains("shutdown complete")));
    }
}

#[test]
fn second_instance_is_refused() {
    let d = Daemon::start(&[]);
    let (code, err) = run_to_exit(&[
        "--gpu_nic_preset=sim",
        &format!("--uds_path={}", d.dir.path().display()),
        "--metrics_address=",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("already serves"), "{err}");
    assert!(err.contains(&format!("pid {}", d.child.id())), "{err}");
    // The first daemon still serves and its files are intact.
    let mut c = d.client("queue_ids_by_gpu");
    assert_eq!(status_code(&c.request(&client::queue_query("0000:04:00.0")).unwrap()), 0);
}

#[test]
fn bad_flags_exit_two_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let uds = format!("--uds_path={}", dir.path().display());
    for (args, flag) in [
        (vec!["--gpu_nic_preset=a9000"], "--gpu_nic_preset"),
        (vec!["--frobnicate=1"], "--frobnicate"),
        (vec!["--gpu_nic_preset=sim", "--max_rx_rules=many"], "--max_rx_rules"),
        (vec!["--gpu_nic_preset=sim", "--nic_backend=quantum"], "--nic_backend"),
        (vec!["--gpu_nic_preset=sim", "--setup_param=--verbose x"], "--setup_param"),
        (vec!["--gpu_nic_preset=manual"], "--gpu_nic_topology"),
        (
            vec!["--gpu_nic_preset=manual", "--gpu_nic_topology=/nonexistent", "--gpu_nic_topology_proto=x"],
            "--gpu_nic_topology_proto",
        ),
        (
            vec!["--gpu_nic_preset=manual", "--gpu_nic_topology_proto=gpu_rxq_configs { ifname: \"eth1\" }"],
            "eth1",
        ),
        (vec!["--gpu_nic_preset=sim", "--gpu_shmem_type=file"], "--gpu_shmem_type"),
    ] {
        let mut all = args.clone();
        all.push(&uds);
        all.push("--metrics_address=");
        let (code, err) = run_to_exit(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing created on bad config");
}

#[test]
fn show_version_and_manifest_setup_param() {
    let (code, _) = run_to_exit(&["--show_version"]);
    assert_eq!(code, 0);
    let (_, stdout, _) = run_bin(&["-show_version"]);
    assert!(stdout.starts_with("tcpx-rxdm "));
    // The GKE manifest passes the value with literal backslashes and quotes.
    let d = Daemon::start(&[r#"--setup_param=\"--verbose 128 2 0 \""#, "--nomonitor_shutdown"]);
    assert!(d.files().contains(&"rx_rule_manager".to_string()));
}

#[test]
fn last_registered_application_leaving_shuts_down() {
    let mut d = Daemon::start(&[]);
    // An unregistered connection coming and going changes nothing.
    let mut probe = d.client("rxdm_application_registry");
    assert_eq!(raw_bytes(&probe.request(&client::register(false)).unwrap()), Some(&b"Ok."[..]));
    drop(probe);
    let mut a = d.client("rxdm_application_registry");
    let mut b = d.client("rxdm_application_registry");
    assert_eq!(raw_bytes(&a.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
    assert_eq!(raw_bytes(&b.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
    drop(a);
    std::thread::sleep(Duration::from_millis(200));
    assert!(d.child.try_wait().unwrap().is_none(), "exited with an application still registered");
    drop(b);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    assert_eq!(d.files(), Vec::<String>::new());
    assert!(d.log().iter().any(|l| l.contains("last registered application")));
}

#[test]
fn nomonitor_shutdown_keeps_running() {
    let d = Daemon::start(&["--nomonitor_shutdown"]);
    let mut a = d.client("rxdm_application_registry");
    assert_eq!(raw_bytes(&a.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
    drop(a);
    std::thread::sleep(Duration::from_millis(300));
    let mut c = d.client("queue_ids_by_gpu");
    assert_eq!(status_code(&c.request(&client::queue_query("0000:04:00.0")).unwrap()), 0);
}

#[test]
fn registry_rejects_wrong_payload() {
    let d = Daemon::start(&[]);
    let mut c = d.client("rxdm_application_registry");
    let r = c.request(&client::queue_query("0000:04:00.0")).unwrap();
    assert_eq!(status_code(&r), 3);
}

#[test]
fn health_check_file_gets_the_ready_line() {
    // Sidecar scripts, the Slurm prolog and the reference's users grep for
    // this exact text: it must not change.
    assert_eq!(READY_LINE, "Buffer manager initialization completed.");
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.log");
    let d = Daemon::spawn(&[], &[("HEALTH_CHECK_LOG_FILE", health.to_str().unwrap())]);
    d.wait_for_log(READY_LINE, Duration::from_secs(20)).expect("ready");
    let text = std::fs::read_to_string(&health).unwrap();
    assert_eq!(text, format!("{READY_LINE}\n"));
}

#[test]
fn stale_socket_files_are_replaced_under_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    // A stale socket file from a daemon that was SIGKILLed.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("rx_rule_manager")).unwrap());
    assert!(dir.path().join("rx_rule_manager").exists());
    let d = Daemon::spawn(&[&format!("--uds_path={}", dir.path().display()), "--metrics_address="], &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut served = false;
    while std::time::Instant::now() < deadline && !served {
        if let Ok(mut c) = client::Client::connect(dir.path().join("rx_rule_manager")) {
            let r = c.request(&client::rule_request(1, ("10.0.0.9", 1), ("192.168.1.2", 2), None, None));
            served = r.is_ok_and(|r| raw_bytes(&r) == Some(&b"Ok."[..]));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(d);
    assert!(served, "stale socket was not replaced");
}

#[test]
fn startup_failure_rolls_back_and_exits_one() {
    // Every RSS write fails: priming cannot finish on any NIC.
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = run_to_exit(&[
        "--gpu_nic_preset=sim",
        &format!("--uds_path={}", dir.path().display()),
        "--metrics_address=",
        "--sim_fault=set_rss:EOPNOTSUPP:1",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("set RSS equal") && err.contains("eth"), "{err}");
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "files left after failed start");
}

#[test]
fn duplicate_signal_is_not_a_forced_exit_but_a_later_one_is() {
    // Two SIGTERMs back to back (as wrappers deliver them): still a clean exit.
    let mut d = Daemon::start(&[]);
    d.signal(Signal::SIGTERM);
    d.signal(Signal::SIGTERM);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    assert!(d.log().iter().any(|l| l.contains("shutdown complete")));

    // A second signal well into a slow shutdown forces the exit (code 1).
    // Every rule removal takes 100 ms in the sim: 40 rules make a 4 s shutdown.
    let mut d = Daemon::start(&["--sim_delay=del_rule:100"]);
    for p in 0..40 {
        let mut c = d.client("rx_rule_manager");
        let r = c.request(&client::rule_request(1, ("10.0.0.9", p), ("192.168.1.2", 2), None, None)).unwrap();
        assert_eq!(raw_bytes(&r), Some(&b"Ok."[..]));
    }
    d.signal(Signal::SIGTERM);
    d.wait_for_log("shutting down", Duration::from_secs(10)).expect("shutdown started");
    std::thread::sleep(Duration::from_millis(1500));
    d.signal(Signal::SIGINT);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(1));
    assert!(d.log().iter().any(|l| l.contains("exiting now without finishing restore")));
}
