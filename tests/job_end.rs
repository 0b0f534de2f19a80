//! Job end for sidecars (shutdown file, all clients gone) and a reply before
//! every close during shutdown.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{
    encoded, install_frame, metric, raw_exchange, read_frame, run_to_exit, wait_until, ClientProcess, Daemon,
    Hold, GPU0, GPU_ETH2, OK_FRAME,
};
use nix::sys::signal::Signal;
use tcpx_rxdm::wire::client;
use tcpx_rxdm::wire::frame;

#[test]
fn shutdown_file_ends_the_daemon_cleanly() {
    let mut d = Daemon::start(&[]);
    assert!(!d.dir.path().join("terminated").exists());
    std::fs::write(d.dir.path().join("terminated"), b"").unwrap();
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    assert!(d.log().iter().any(|l| l.contains("the shutdown file") && l.contains("appeared")));
    // Sockets and the lock are gone; the shutdown file itself stays for others to see.
    assert_eq!(d.files(), vec!["terminated".to_string()]);
}

#[test]
fn a_stale_shutdown_file_from_an_earlier_job_is_removed_at_startup() {
    let elsewhere = tempfile::tempdir().unwrap();
    let path = elsewhere.path().join("job-done");
    std::fs::write(&path, b"left by the last job").unwrap();
    let mut d = Daemon::start(&[&format!("--shutdown_file={}", path.display())]);
    assert!(d.log().iter().any(|l| l.contains("removed a stale shutdown file")), "{}", d.log().join("\n"));
    assert!(!path.exists());
    // Still serving: a stale file is not a reason to stop.
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &install_frame(40000, GPU0)), OK_FRAME);
    std::fs::write(&path, b"").unwrap();
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(0));
}

#[test]
fn shutdown_file_in_a_missing_folder_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = run_to_exit(&[
        "--gpu_nic_preset=sim",
        &format!("--uds_path={}", dir.path().display()),
        "--metrics_address=",
        "--shutdown_file=/nonexistent-folder/terminated",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--shutdown_file"), "{err}");
}

#[test]
fn a_process_holding_only_a_pool_fd_keeps_the_daemon_alive() {
    let mut d = Daemon::start(&[
        "--shutdown_when_all_clients_exited",
        "--wait_time_before_exit=1",
        "--nomonitor_shutdown",
    ]);
    let fd_sock = d.sock(&format!("get_gpu_fd_{GPU0}"));
    let req = encoded(&client::raw_request(GPU0));
    let c = ClientProcess::run(&[(fd_sock, req)], Duration::from_secs(3));
    // Well past the 1 s grace: the client still holds the pool.
    std::thread::sleep(Duration::from_millis(2000));
    assert!(d.child.try_wait().unwrap().is_none(), "exited while a client held the pool fd");
    let exited = Instant::now();
    drop(c); // killed: no client process left
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    assert!(exited.elapsed() >= Duration::from_millis(900), "waited the grace period");
    assert!(d.log().iter().any(|l| l.contains("no client process has been alive for 1s")));
}

#[test]
fn without_any_client_the_daemon_does_not_exit_on_its_own() {
    let d = Daemon::start(&["--shutdown_when_all_clients_exited", "--wait_time_before_exit=0"]);
    std::thread::sleep(Duration::from_millis(500));
    let mut d = d;
    assert!(d.child.try_wait().unwrap().is_none(), "no client was ever seen");
}

#[test]
fn sigterm_with_requests_in_flight_answers_every_request() {
    // eth1's inserts are held until the test lets them go: one is at the NIC
    // at SIGTERM, the others queued behind it, whatever the machine's load.
    let hold = Hold::new();
    let mut d = Daemon::start(&[&hold.flag("add_rule", None), "--monitor_shutdown"]);
    let mut reg = UnixStream::connect(d.sock("rxdm_application_registry")).unwrap();
    reg.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    reg.write_all(&encoded(&client::register(true))).unwrap();
    assert_eq!(read_frame(&mut reg).unwrap(), OK_FRAME);
    let path = d.sock("rx_rule_manager");
    let mut clients: Vec<UnixStream> = (0..12)
        .map(|i| {
            let mut s = UnixStream::connect(&path).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            s.write_all(&install_frame(42000 + i, GPU0)).unwrap();
            s
        })
        .collect();
    // A client halfway through sending its request.
    let mut partial = UnixStream::connect(&path).unwrap();
    partial.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    partial.write_all(&install_frame(43000, GPU0)[..5]).unwrap();
    // Every connection accepted, and an insert at the NIC.
    let open = || metric(&d.http_get("/metrics").1, r#"tcpx_rxdm_connections{endpoint="rule_manager"}"#);
    wait_until(Duration::from_secs(60), || open() == Some(13.0));
    hold.wait_held();
    d.signal(Signal::SIGTERM);
    // Half a request is answered UNAVAILABLE once shutdown has begun (from
    // then on, requests not yet started are refused), while the insert is held.
    let reply = read_frame(&mut partial).unwrap_or_else(|e| panic!("partial request got no reply: {e}"));
    assert_eq!(client::status_code(&frame::parse(&reply).unwrap().unwrap().0), 14);
    hold.release();
    let mut codes = Vec::new();
    for c in &mut clients {
        let reply = read_frame(c).unwrap_or_else(|e| panic!("bare close: {e}"));
        let msg = frame::parse(&reply).unwrap().unwrap().0;
        codes.push(client::status_code(&msg));
    }
    assert!(codes.iter().all(|&c| c == 0 || c == 14), "OK or UNAVAILABLE only: {codes:?}");
    assert!(codes.contains(&0), "the insert at the NIC finished: {codes:?}");
    assert!(codes.contains(&14), "queued installs were answered UNAVAILABLE: {codes:?}");
    // The registry still answers a deregistration during shutdown.
    reg.write_all(&encoded(&client::register(false))).unwrap();
    assert_eq!(read_frame(&mut reg).unwrap(), OK_FRAME);
    assert_eq!(d.wait_exit(Duration::from_secs(15)).code(), Some(0), "{}", d.log().join("\n"));
}

#[test]
fn installs_on_other_nics_do_not_wait_for_a_slow_one() {
    // eth1's inserts are held until the test lets them go; eth2's are all
    // answered meanwhile.
    let hold = Hold::new();
    let d = Daemon::start(&[&hold.flag("add_rule", Some("eth1"))]);
    let slow = {
        let path = d.sock("rx_rule_manager");
        std::thread::spawn(move || {
            for i in 0..3 {
                let r = raw_exchange(&path, &install_frame(44000 + i, GPU0));
                assert_eq!(r, OK_FRAME);
            }
        })
    };
    hold.wait_held();
    for i in 0..20 {
        assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &install_frame(45000 + i, GPU_ETH2)), OK_FRAME);
    }
    assert!(!slow.is_finished(), "eth1's installs finished while held");
    hold.release();
    slow.join().unwrap();
}
