//! A NIC operation that does not return must stall nothing else: other
//! NICs, queries, HTTP probes, signal handling. eth1's inserts are held
//! until the test lets them go (`--sim_delay=add_rule:until=FILE:eth1`), so
//! what is asserted is order, whatever the machine's load: every other
//! request is answered, and SIGTERM acted on, while eth1's are still held.
//! How long each takes is measured by `cargo run --release --example bench`
//! (docs/PERFORMANCE.md, *Nothing waits for a slow NIC*).

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{encoded, http_get, install_frame, raw_exchange, read_frame, Daemon, GPU0, GPU_ETH2, OK_FRAME};
use nix::sys::signal::Signal;
use nix::sys::socket::MsgFlags;
use tcpx_rxdm::wire::{client, frame};

/// Bounds only a hang; nothing asserted depends on it.
const HANG: Duration = Duration::from_secs(60);

/// Whether a reply has come on `s` (without waiting for one).
fn replied(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    match nix::sys::socket::recv(s.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(n) => n > 0,
        Err(nix::errno::Errno::EAGAIN) => false,
        Err(e) => panic!("{e}"),
    }
}

/// The status code of a reply frame (0 for `Ok.`).
fn code(reply: &[u8]) -> i32 {
    if reply == OK_FRAME {
        return 0;
    }
    client::status_code(&frame::parse(reply).unwrap().unwrap().0)
}

#[test]
fn a_nic_op_that_does_not_return_stalls_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let go = tmp.path().join("go");
    let mut d = Daemon::start(&[&format!("--sim_delay=add_rule:until={}:eth1", go.display())]);
    let http = d.http();
    // Six clients waiting on eth1, a request each.
    let mut held: Vec<UnixStream> = (0..6)
        .map(|i| {
            let mut s = UnixStream::connect(d.sock("rx_rule_manager")).unwrap();
            s.write_all(&install_frame(20_000 + i, GPU0)).unwrap();
            s
        })
        .collect();

    // Meanwhile everything else is answered.
    for _ in 0..30 {
        let (status, body) = http_get(http, "/healthz");
        assert_eq!(status, 200, "{body}");
    }
    let mut q = d.client("queue_ids_by_gpu");
    for _ in 0..200 {
        assert_eq!(client::status_code(&q.request(&client::queue_query(GPU0)).unwrap()), 0);
    }
    for i in 0..100 {
        let req =
            client::rule_request(1, ("10.2.0.2", 30000 + i), ("192.168.2.2", 5000), Some(GPU_ETH2), None);
        assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&req)), OK_FRAME, "eth2 install {i}");
    }
    // ...before any of eth1's requests: they are still held.
    for (i, s) in held.iter_mut().enumerate() {
        assert!(!replied(s), "eth1 request {i} was answered before its insert was let go");
    }

    // SIGTERM is acted on while eth1's insert is held: logged, and the
    // daemon waits for that insert (a reply before every close).
    d.signal(Signal::SIGTERM);
    d.wait_for_log("shutting down", HANG).expect("shutdown logged");
    assert!(d.child.try_wait().unwrap().is_none(), "exited with a NIC call in flight");
    std::fs::write(&go, b"").unwrap();
    let st = d.wait_exit(HANG);
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    // Every held request got its answer: the real result for the one at the
    // NIC, UNAVAILABLE for those that had not started when shutdown began.
    let codes: Vec<i32> = held
        .iter_mut()
        .map(|s| {
            s.set_read_timeout(Some(HANG)).unwrap();
            code(&read_frame(s).expect("a reply, not a bare close"))
        })
        .collect();
    assert!(codes.iter().all(|c| [0, 14].contains(c)), "{codes:?}");
    assert!(codes.contains(&0), "the insert at the NIC finished with its result: {codes:?}");
    let mut rest = Vec::new();
    for s in &mut held {
        assert_eq!(s.read_to_end(&mut rest).unwrap(), 0, "then the close");
    }
}
