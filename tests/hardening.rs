//! Black-box tests against hostile clients, scarce resources and careless
//! settings: the real binary on simulated NICs.

mod common;

use std::io::Read;
use std::time::Duration;

use common::*;
use tcpx_rxdm::wire::client::{self, status_code};
use tcpx_rxdm::wire::frame;

const GPU0: &str = "0000:04:00.0";
const OK_FRAME: [u8; 7] = [0, 5, 0x0a, 3, b'O', b'k', b'.'];

fn encoded(m: &tcpx_rxdm::wire::proto::UnixSocketProto) -> Vec<u8> {
    frame::encode(m).unwrap()
}

/// Over-long fields still get INVALID_ARGUMENT (the echoed text is cut so
/// the reply fits a frame), then the connection closes.
#[test]
fn over_long_fields_get_invalid_argument() {
    let d = Daemon::start(&[]);
    let long = "9".repeat(40_000);
    let requests = [
        client::rule_request(1, (long.as_str(), 1), ("192.168.1.2", 2), Some(GPU0), None),
        client::rule_request(1, ("10.1.0.2", 1), ("192.168.1.2", 2), Some(long.as_str()), None),
    ];
    for req in &requests {
        for sock in ["rx_rule_manager", "rx_rule_uninstall"] {
            let mut c = d.client(sock);
            c.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.send(req).unwrap();
            let r = c.recv().unwrap_or_else(|e| panic!("{sock}: no reply: {e}"));
            assert_eq!(status_code(&r), 3, "{sock}");
            let text = r.status.as_ref().unwrap().message.clone();
            assert!(text.len() <= frame::MAX_ERROR_MESSAGE, "{}", text.len());
            assert!(text.contains("bytes cut"), "{text}");
            let mut rest = Vec::new();
            assert_eq!(c.stream().try_clone().unwrap().read_to_end(&mut rest).unwrap(), 0, "closed");
        }
    }
    let q = client::queue_query(&long);
    let mut c = d.client("queue_ids_by_gpu");
    assert_eq!(status_code(&c.request(&q).unwrap()), 3);
    // The daemon still serves.
    let ok = client::rule_request(1, ("10.1.0.2", 1), ("192.168.1.2", 2), Some(GPU0), None);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&ok)), OK_FRAME);
}

/// SIGHUP is an orderly shutdown: rules removed, files removed, exit 0; a
/// second SIGHUP well into a slow shutdown forces the exit (code 1).
#[test]
fn sighup_is_an_orderly_shutdown_and_a_second_one_forces() {
    use nix::sys::signal::Signal;
    let mut d = Daemon::start(&[]);
    let mut c = d.client("rx_rule_manager");
    let r = c.request(&client::rule_request(1, ("10.0.0.9", 1), ("192.168.2.2", 2), None, None)).unwrap();
    assert_eq!(client::raw_bytes(&r), Some(&b"Ok."[..]));
    d.signal(Signal::SIGHUP);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    assert_eq!(d.files(), Vec::<String>::new(), "files left behind");
    let log = d.log();
    assert!(log.iter().any(|l| l.contains("received SIGHUP")), "{}", log.join("\n"));
    assert!(log.iter().any(|l| l.contains("rules removed")));
    assert!(log.iter().any(|l| l.contains("shutdown complete")));

    // 30 rules at 100 ms per removal: a 3 s shutdown, interrupted by a second SIGHUP.
    let mut d = Daemon::start(&["--sim_delay=del_rule:100"]);
    for p in 0..30 {
        let mut c = d.client("rx_rule_manager");
        let r = c.request(&client::rule_request(1, ("10.0.0.9", p), ("192.168.1.2", 2), None, None)).unwrap();
        assert_eq!(client::raw_bytes(&r), Some(&b"Ok."[..]));
    }
    d.signal(Signal::SIGHUP);
    d.wait_for_log("shutting down", Duration::from_secs(10)).expect("shutdown started");
    std::thread::sleep(Duration::from_millis(1500));
    d.signal(Signal::SIGHUP);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(1), "{}", d.log().join("\n"));
    assert!(d.log().iter().any(|l| l.contains("exiting now without finishing restore")));
}
