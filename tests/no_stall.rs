//! A NIC operation that takes a second must not stall anything else: other
//! NICs, queries, HTTP probes, signal handling. Bounds here are generous (the
//! machines that run tests are noisy); the measured numbers are printed.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{encoded, http_get, raw_exchange, Daemon, GPU0, GPU_ETH2, OK_FRAME};
use nix::sys::signal::Signal;
use tcpx_rxdm::wire::client;

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

fn healthz(addr: std::net::SocketAddr) -> Duration {
    let t = Instant::now();
    let (status, body) = http_get(addr, "/healthz");
    assert_eq!(status, 200, "{body}");
    t.elapsed()
}

#[test]
fn a_one_second_nic_op_stalls_nothing_else() {
    let mut d = Daemon::start(&["--sim_delay=add_rule:1000:eth1"]);
    let http = d.http();
    let stop = Arc::new(AtomicBool::new(false));
    // Clients hammering the slow NIC.
    let hammer: Vec<_> = (0..6)
        .map(|i| {
            let path = d.sock("rx_rule_manager");
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let req = client::rule_request(
                        1,
                        ("10.1.0.2", 20000 + i * 1000 + n),
                        ("192.168.1.2", 5000),
                        Some(GPU0),
                        None,
                    );
                    // Refused once the daemon has closed its sockets.
                    let Ok(mut s) = std::os::unix::net::UnixStream::connect(&path) else { break };
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    s.write_all(&encoded(&req)).unwrap();
                    let mut head = [0u8; 2];
                    // Every request gets a reply, even the ones cut short by shutdown.
                    s.read_exact(&mut head).expect("a reply, not a bare close");
                    n += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));

    let health: Vec<Duration> = (0..30).map(|_| healthz(http)).collect();
    let mut q = d.client("queue_ids_by_gpu");
    let queries: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            let r = q.request(&client::queue_query(GPU0)).unwrap();
            assert_eq!(client::status_code(&r), 0);
            t.elapsed()
        })
        .collect();
    let other_nic: Vec<Duration> = (0..100)
        .map(|i| {
            let t = Instant::now();
            let req =
                client::rule_request(1, ("10.2.0.2", 30000 + i), ("192.168.2.2", 5000), Some(GPU_ETH2), None);
            let r = raw_exchange(&d.sock("rx_rule_manager"), &encoded(&req));
            assert_eq!(r, OK_FRAME);
            t.elapsed()
        })
        .collect();
    let (h, qi, o) = (p99(health), p99(queries), p99(other_nic));
    println!(
        "with a 1 s NIC op on eth1: /healthz p99 {h:?}, queue_ids_by_gpu p99 {qi:?}, eth2 install p99 {o:?}"
    );
    assert!(h <= Duration::from_millis(50), "/healthz p99 {h:?}");
    assert!(qi <= Duration::from_millis(5), "queue_ids_by_gpu p99 {qi:?}");
    assert!(o <= Duration::from_millis(50), "eth2 installs p99 {o:?}");

    let sent = Instant::now();
    d.signal(Signal::SIGTERM);
    d.wait_for_log("shutting down", Duration::from_secs(5)).expect("shutdown logged");
    let noticed = sent.elapsed();
    let st = d.wait_exit(Duration::from_secs(10));
    let done = sent.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in hammer {
        h.join().unwrap();
    }
    println!("SIGTERM logged after {noticed:?}; exit after {done:?} (one 1 s NIC op was in flight)");
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    assert!(noticed <= Duration::from_millis(100), "SIGTERM noticed after {noticed:?}");
    assert!(done <= Duration::from_secs(5), "shutdown took {done:?}");
}
