//! systemd `Type=notify` over a real datagram socket: the daemon on sim NICs
//! with `NOTIFY_SOCKET` set to a socket the test binds.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use tcpx_rxdm::daemon::READY_LINE;

/// Receives datagrams until one contains `key`; returns every message seen.
fn recv_until(rx: &UnixDatagram, key: &str, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match rx.recv(&mut buf) {
            Ok(n) => {
                let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = m.lines().any(|l| l == key);
                seen.push(m);
                if done {
                    return seen;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    panic!("no {key} within {timeout:?}; got {seen:?}");
}

#[test]
fn ready_after_the_ready_line_and_stopping_after_sigterm() {
    let sockdir = tempfile::tempdir().unwrap();
    let path = sockdir.path().join("notify");
    let rx = UnixDatagram::bind(&path).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();

    let mut d = Daemon::spawn(&["--nomonitor_shutdown"], &[("NOTIFY_SOCKET", path.to_str().unwrap())]);
    let before = recv_until(&rx, "READY=1", Duration::from_secs(20));
    // READY=1 comes last, after startup status lines, and only once the daemon serves.
    let ready_msg = before.last().unwrap();
    assert!(ready_msg.lines().any(|l| l.starts_with("STATUS=serving on ")), "{ready_msg:?}");
    assert!(
        before[..before.len() - 1].iter().all(|m| !m.contains("READY=1") && m.starts_with("STATUS=")),
        "{before:?}"
    );
    assert!(before.iter().any(|m| m.contains("STATUS=priming NICs")), "{before:?}");
    // Already serving when READY=1 arrived: /readyz answers 200, the rule socket exists
    // and the ready line was logged before the datagram was sent.
    assert_eq!(d.http_get("/readyz").0, 200);
    assert!(d.files().contains(&"rx_rule_manager".to_string()));
    let log = d.log();
    if !log.iter().any(|l| l.contains(READY_LINE)) {
        // The log reader thread may lag the datagram by a moment; the line must still come.
        d.wait_for_log(READY_LINE, Duration::from_secs(30)).expect("ready line logged");
    }

    // Nothing more until asked to stop.
    let mut buf = [0u8; 256];
    assert!(rx.recv(&mut buf).is_err(), "unexpected message while serving");

    d.signal(Signal::SIGTERM);
    let after = recv_until(&rx, "STOPPING=1", Duration::from_secs(10));
    let stopping = after.last().unwrap();
    assert!(stopping.contains("STATUS=shutting down: received SIGTERM"), "{stopping:?}");
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
}

#[test]
fn abstract_notify_socket_and_failed_startup_status() {
    let name = format!("tcpx-rxdm-notify-test-{}", std::process::id());
    let addr = {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()
    };
    let rx = UnixDatagram::bind_addr(&addr).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let value = format!("@{name}");

    let d = Daemon::spawn(&["--nomonitor_shutdown"], &[("NOTIFY_SOCKET", value.as_str())]);
    recv_until(&rx, "READY=1", Duration::from_secs(20));
    drop(d);

    // A startup that fails says why in STATUS= and never sends READY=1.
    let mut d = Daemon::spawn(&["--sim_fault=set_rss:EOPNOTSUPP:1"], &[("NOTIFY_SOCKET", value.as_str())]);
    let st = d.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1));
    let mut msgs = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = rx.recv(&mut buf) {
        msgs.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(msgs.iter().all(|m| !m.contains("READY=1")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.starts_with("STATUS=startup failed: ") && m.contains("RSS")), "{msgs:?}");
}

/// Runs the daemon to its exit with `NOTIFY_SOCKET` set; returns the exit
/// code, its stderr and the datagrams it sent.
fn run_notified(args: &[&str]) -> (i32, String, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let rx = UnixDatagram::bind(&path).unwrap();
    rx.set_nonblocking(true).unwrap();
    let out = std::process::Command::new(BIN)
        .args(args)
        .env("NOTIFY_SOCKET", &path)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let mut msgs = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = rx.recv(&mut buf) {
        msgs.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned(), msgs)
}

#[test]
fn every_failed_start_says_why_in_status_and_logs_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let uds = format!("--uds_path={}", dir.path().join("s").display());
    let sysfs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(sysfs.path().join("class/net")).unwrap();
    let sysfs_arg = format!("--sysfs_root={}", sysfs.path().display());
    let cases: [(&[&str], i32, &str); 4] = [
        // A bad flag (clap): exit 2, the flag named.
        (&["--gpu_nic_preset=bogus"], 2, "--gpu_nic_preset"),
        // A configuration error found by the daemon: exit 2.
        (&["--gpu_nic_preset=a3vm", &sysfs_arg, "--metrics_address=", &uds], 2, "eth1"),
        // A NIC that never came up within --wait_for_nics: exit 2, the wait named.
        (
            &["--gpu_nic_preset=a3vm", &sysfs_arg, "--wait_for_nics=300ms", "--metrics_address=", &uds],
            2,
            "--wait_for_nics",
        ),
        // A startup step that fails: exit 1.
        (&["--gpu_nic_preset=sim", "--sim_fault=set_rss:EOPNOTSUPP:1", "--metrics_address=", &uds], 1, "RSS"),
    ];
    for (args, code, needle) in cases {
        let (got, stderr, msgs) = run_notified(args);
        assert_eq!(got, code, "{args:?}: {stderr}");
        let last = msgs.last().unwrap_or_else(|| panic!("{args:?}: no datagram; stderr: {stderr}"));
        assert!(last.starts_with(&format!("STATUS=failed (exit {code}): ")), "{args:?}: {msgs:?}");
        assert!(last.contains(needle), "{args:?}: {last:?}");
        assert!(msgs.iter().all(|m| !m.contains("READY=1")), "{args:?}: {msgs:?}");
        // The journal gets the error once, not a log line plus a second copy.
        let why = last.split_once("): ").unwrap().1;
        let copies = stderr.lines().filter(|l| l.contains(why)).count();
        assert_eq!(copies, 1, "{args:?}: {why:?} appears {copies} times in\n{stderr}");
    }
}
