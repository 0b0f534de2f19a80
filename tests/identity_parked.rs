//! A rule I/O thread never waits for a client's tenant to be read: a
//! connection whose process is new waits, parked, while the thread serves
//! everyone else. The daemon runs one rule I/O thread, so that a thread
//! held by one client could serve nobody else; the read of the new
//! client's tenant is held for as long as the test wants (debug builds:
//! `TCPX_RXDM_TEST_HOLD_TENANT_READS`). Nothing here is timed: the test
//! asserts what was answered before what.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{encoded, install_rule, raw_exchange, wait_until, Daemon, OK_FRAME};

/// A new client process: connects, sends `HEX` as one request, prints
/// `sent`, then prints `reply HEX` once the reply came, and waits for its
/// stdin to close (its rules go when it exits).
const NEW_CLIENT_PY: &str = r#"
import socket, sys
u = socket.socket(socket.AF_UNIX); u.connect(sys.argv[1]); u.sendall(bytes.fromhex(sys.argv[2]))
print("sent", flush=True)
msg = b""
while len(msg) < 2 or len(msg) < 2 + int.from_bytes(msg[:2], "big"):
    more = u.recv(4096)
    if not more: break
    msg += more
print("reply " + msg.hex(), flush=True)
sys.stdin.read()
"#;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_client_whose_tenant_is_being_read_holds_up_no_other_client() {
    let hold_dir = tempfile::tempdir().unwrap();
    let hold = hold_dir.path().join("hold");
    let held = hold_dir.path().join("hold.held");
    let d = Daemon::spawn(
        &["--tenant_isolation=audit", "--rule_io_threads=1"],
        &[("TCPX_RXDM_TEST_HOLD_TENANT_READS", hold.to_str().unwrap())],
    )
    .ready();
    let rules = d.sock("rx_rule_manager");
    // This process becomes a known client (its tenant is read, nothing held).
    assert_eq!(raw_exchange(&rules, &encoded(&install_rule(41000, None))), OK_FRAME);
    // From now on every tenant read waits: a new process's request is parked.
    std::fs::write(&hold, b"").unwrap();
    let mut newcomer = common::python3()
        .args(["-c", NEW_CLIENT_PY])
        .arg(&rules)
        .arg(hex(&encoded(&install_rule(41001, None))))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(newcomer.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "sent");
    // Its tenant read has started (and waits).
    wait_until(Duration::from_secs(20), || held.exists());
    // The one I/O thread serves a known client meanwhile, on new connections, again and again.
    for port in 41002..41012 {
        assert_eq!(raw_exchange(&rules, &encoded(&install_rule(port, None))), OK_FRAME, "port {port}");
    }
    // ...while the new client's request still waits for its tenant: the
    // daemon booked every rule of the known client and not yet its.
    let booked: Vec<String> =
        d.flows_of_all_nics("rules").iter().map(|r| r["src"].as_str().unwrap().to_string()).collect();
    for port in 41002..41012 {
        assert!(booked.contains(&format!("10.1.0.2:{port}")), "{booked:?}");
    }
    assert!(!booked.contains(&"10.1.0.2:41001".to_string()), "served before its tenant was read: {booked:?}");
    // Released, the read ends and the parked request is served.
    std::fs::remove_file(&hold).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("reply {}", hex(OK_FRAME)));
    let booked: Vec<String> =
        d.flows_of_all_nics("rules").iter().map(|r| r["src"].as_str().unwrap().to_string()).collect();
    assert!(booked.contains(&"10.1.0.2:41001".to_string()), "{booked:?}");
    drop(newcomer.stdin.take());
    assert!(newcomer.wait().unwrap().success());
}
