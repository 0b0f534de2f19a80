//! The rule endpoints' connection threads at the edges the NCCL plugin never
//! reaches but a careless or hostile client can: half-closed connections,
//! clients that stop reading, the connection budget, idle partial frames,
//! shutdown with requests in flight, and the uninstall that asks every NIC.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{
    encoded, install_frame, install_rule, metric, raw_exchange, read_frame, wait_until, Daemon, Hold, GPU0,
    GPU_ETH2, OK_FRAME,
};
use nix::sys::signal::Signal;
use tcpx_rxdm::wire::client::{self, raw_bytes, status_code};
use tcpx_rxdm::wire::frame;

const UNKNOWN_GPU: &str = "0000:99:00.0";

fn connect(d: &Daemon, name: &str) -> UnixStream {
    let s = UnixStream::connect(d.sock(name)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn status_of(reply: &[u8]) -> i32 {
    status_code(&frame::parse(reply).unwrap().unwrap().0)
}

fn rules_on(d: &Daemon, nic: usize) -> usize {
    d.flows()["nics"][nic]["rules"].as_array().unwrap().len()
}

/// A client that sends its request and shuts its sending side gets the
/// answer and then the end of the stream (not a reset), on a slow NIC
/// (its EOF arrives while the request is with the NIC's thread) as on a
/// quick one.
#[test]
fn a_half_closed_client_gets_its_reply_then_eof() {
    let d = Daemon::start(&["--sim_delay=add_rule:200:eth1"]);
    for (sport, gpu) in [(1, GPU0), (2, GPU_ETH2), (3, GPU0), (4, GPU_ETH2)] {
        let mut s = connect(&d, "rx_rule_manager");
        s.write_all(&install_frame(sport, gpu)).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        assert_eq!(all, OK_FRAME, "request {sport} on {gpu}");
    }
    assert_eq!((rules_on(&d, 0), rules_on(&d, 1)), (2, 2));
}

/// Many clients at once, each sending two requests and shutting its sending
/// side before it reads anything: every one gets both answers in order and
/// then the end of the stream. (Under such a burst a connection's EOF is
/// often there by the end of the round that accepted it; its second
/// request is then read only at that point and must still be answered.)
#[test]
fn a_burst_of_half_closed_clients_with_two_requests_each_gets_every_answer() {
    let d = Daemon::start(&[]);
    let mut clients: Vec<UnixStream> = (0..48).map(|_| connect(&d, "rx_rule_manager")).collect();
    for (i, s) in clients.iter_mut().enumerate() {
        let sport = 100 + 2 * i as i32;
        let mut both = install_frame(sport, GPU0);
        both.extend(install_frame(sport + 1, GPU_ETH2));
        s.write_all(&both).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let ok_twice = [OK_FRAME, OK_FRAME].concat();
    for (i, s) in clients.iter_mut().enumerate() {
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        assert_eq!(all, ok_twice, "client {i}");
    }
    assert_eq!((rules_on(&d, 0), rules_on(&d, 1)), (48, 48));
}

/// A client that sends thousands of requests without reading fills the
/// daemon's side of the socket: the daemon waits for it (and serves others
/// meanwhile), then delivers every reply, in order, once it reads. Nearly
/// all are installs, answered by their NIC's thread, so that the socket
/// fills under such an answer; a few unknown GPUs mark the order.
#[test]
fn a_client_that_stops_reading_gets_every_reply_in_order_once_it_reads() {
    let d = Daemon::start(&[]);
    let n = 4000;
    let expect_ok = |i: usize| i % 397 != 396;
    let mut batch = Vec::new();
    for i in 0..n {
        let gpu = if expect_ok(i) { GPU0 } else { UNKNOWN_GPU };
        batch.extend(encoded(&install_rule(10_000 + i as i32, Some(gpu))));
    }
    let mut s = connect(&d, "rx_rule_manager");
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&batch));
    std::thread::sleep(Duration::from_millis(500));
    // Its replies pile up unread; other clients are not held up by it: this
    // one is answered before it reads a single reply.
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &install_frame(1, GPU_ETH2)), OK_FRAME);
    for i in 0..n {
        let reply = read_frame(&mut s).unwrap_or_else(|e| panic!("reply {i}: {e}"));
        if expect_ok(i) {
            assert_eq!(reply, OK_FRAME, "reply {i}");
        } else {
            assert_eq!(status_of(&reply), 5, "reply {i} is NOT_FOUND");
        }
    }
    writer.join().unwrap().unwrap();
    assert_eq!(rules_on(&d, 0), (0..n).filter(|&i| expect_ok(i)).count());
}

/// Rule connections beyond their share of --max_connections wait in the
/// kernel's backlog, registry clients still get in, and the waiting one is
/// served as soon as a slot frees. The connection gauges follow.
#[test]
fn rule_connections_beyond_the_budget_wait_in_the_backlog() {
    // 4 in all: 3 shared, 1 kept for registry and pool endpoints.
    let d = Daemon::start(&["--max_connections=4"]);
    let mut idle: Vec<UnixStream> = (0..3).map(|_| connect(&d, "rx_rule_manager")).collect();
    let open = || metric(&d.http_get("/metrics").1, r#"tcpx_rxdm_connections{endpoint="rule_manager"}"#);
    let deadline = Instant::now() + Duration::from_secs(5);
    while open() != Some(3.0) {
        assert!(Instant::now() < deadline, "gauge {:?}, expected 3 open", open());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut fourth = connect(&d, "rx_rule_uninstall");
    fourth.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
    fourth.write_all(&encoded(&install_rule(5, Some(GPU0)))).unwrap();
    let mut buf = [0u8; 16];
    let e = fourth.read(&mut buf).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "served beyond the budget: {e}");
    let mut registry = d.client("rxdm_application_registry");
    registry.stream().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(raw_bytes(&registry.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
    drop(idle.pop());
    fourth.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(read_frame(&mut fourth).unwrap(), OK_FRAME, "an uninstall of an unknown flow is Ok.");
    drop(idle);
    drop(fourth);
    let deadline = Instant::now() + Duration::from_secs(5);
    while open() != Some(0.0) {
        assert!(Instant::now() < deadline, "gauge {:?} after every rule client left", open());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Part of a frame and then silence past --client_idle_timeout: an
/// INVALID_ARGUMENT naming the bytes received, then the close.
#[test]
fn an_idle_partial_rule_frame_gets_invalid_argument() {
    let d = Daemon::start(&["--client_idle_timeout=1"]);
    let full = install_frame(7, GPU0);
    let mut s = connect(&d, "rx_rule_uninstall");
    s.write_all(&full[..4]).unwrap();
    let t = Instant::now();
    let reply = read_frame(&mut s).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(900), "closed early: {:?}", t.elapsed());
    let (msg, _) = frame::parse(&reply).unwrap().unwrap();
    assert_eq!(status_code(&msg), 3);
    let text = msg.status.unwrap().message;
    assert!(text.contains(&format!("4 of {} bytes", full.len())), "{text}");
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap(), 0);
}

/// At shutdown: half a frame is answered UNAVAILABLE at once, a request
/// whose NIC call is under way gets its answer, one queued behind it
/// UNAVAILABLE, a new connection is refused (not left waiting), and the
/// daemon exits 0 once the NIC call returned.
#[test]
fn shutdown_answers_what_was_sent_and_refuses_new_connections() {
    // eth1's inserts are held until the test lets them go.
    let hold = Hold::new();
    let mut d = Daemon::start(&[&hold.flag("add_rule", Some("eth1"))]);
    let mut running = connect(&d, "rx_rule_manager");
    running.write_all(&install_frame(1, GPU0)).unwrap();
    hold.wait_held();
    let mut queued = connect(&d, "rx_rule_manager");
    queued.write_all(&install_frame(2, GPU0)).unwrap();
    let mut partial = connect(&d, "rx_rule_uninstall");
    partial.write_all(&install_frame(3, GPU0)[..5]).unwrap();
    let open =
        |ep: &str| metric(&d.http_get("/metrics").1, &format!("tcpx_rxdm_connections{{endpoint=\"{ep}\"}}"));
    wait_until(Duration::from_secs(60), || {
        open("rule_manager") == Some(2.0) && open("rule_uninstall") == Some(1.0)
    });

    d.signal(Signal::SIGTERM);
    partial.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let reply = read_frame(&mut partial).unwrap();
    assert_eq!(status_of(&reply), 14, "half a frame at shutdown is UNAVAILABLE");
    assert!(!replied(&running), "answered without waiting for the NIC call, which is still held");
    d.wait_for_log("shutting down", Duration::from_secs(60)).expect("shutdown logged");
    std::thread::sleep(Duration::from_millis(50));
    match UnixStream::connect(d.sock("rx_rule_manager")) {
        Err(e) => assert!(matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound), "{e}"),
        Ok(mut late) => {
            // Only if it raced the stop: then it must still be answered or closed, not left hanging.
            late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = late.write_all(&install_frame(4, GPU0));
            let mut buf = Vec::new();
            let r = late.read_to_end(&mut buf);
            assert!(r.is_ok() || r.as_ref().is_err_and(|e| e.kind() == ErrorKind::ConnectionReset), "{r:?}");
        }
    }
    hold.release();
    running.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(read_frame(&mut running).unwrap(), OK_FRAME, "the call under way completes");
    assert_eq!(status_of(&read_frame(&mut queued).unwrap()), 14, "not started: UNAVAILABLE");
    let st = d.wait_exit(Duration::from_secs(60));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
}

/// Whether a reply has come on `s`, without waiting for one.
fn replied(s: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    let flags = nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT;
    match nix::sys::socket::recv(s.as_raw_fd(), &mut b, flags) {
        Ok(n) => n > 0,
        Err(nix::errno::Errno::EAGAIN) => false,
        Err(e) => panic!("{e}"),
    }
}

/// An uninstall that names no GPU and whose destination is no NIC's address
/// is tried on every NIC, and removes the rule wherever it is.
#[test]
fn an_uninstall_matching_no_nic_address_asks_every_nic() {
    let d = Daemon::start(&[]);
    let req = |gpu| client::rule_request(1, ("10.7.0.2", 4000), ("10.99.0.1", 5000), gpu, None);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&req(Some(GPU_ETH2)))), OK_FRAME);
    assert_eq!(rules_on(&d, 1), 1);
    assert_eq!(raw_exchange(&d.sock("rx_rule_uninstall"), &encoded(&req(None))), OK_FRAME);
    assert_eq!(rules_on(&d, 1), 0, "removed from eth2");
    // Nothing left to remove: still Ok.
    assert_eq!(raw_exchange(&d.sock("rx_rule_uninstall"), &encoded(&req(None))), OK_FRAME);
}
