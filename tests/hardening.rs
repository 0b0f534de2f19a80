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
