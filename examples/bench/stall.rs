//! The no-stall measurement: one NIC takes a second per insert
//! (`--sim_delay=add_rule:1000:eth1`) while clients keep it busy. Meanwhile:
//! how long HTTP probes, queue queries and installs on another NIC take, how
//! soon SIGTERM is noticed, and when the daemon exits; and, on the busy
//! daemon, how soon a killed client's rules go (`reclaim.rs`).
//! `tests/no_stall.rs` asserts the order of the same things (each answered
//! while a NIC call is held), not their times: the numbers are taken here.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_rxdm::wire::client::{self, Client};
use tcpx_rxdm::wire::frame;

use crate::stats::percentile;

/// GPUs of the sim preset behind eth1 (made slow) and eth2 (left alone).
const GPU_ETH1: &str = "0000:04:00.0";
const GPU_ETH2: &str = "0000:0a:00.0";
/// Clients kept waiting on the slow NIC.
pub const HAMMERS: usize = 6;
/// The slow NIC's insert time.
pub const SLOW: Duration = Duration::from_secs(1);

/// p50 and p99 of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct P50P99(pub Duration, pub Duration);

impl P50P99 {
    pub fn of(mut v: Vec<Duration>) -> P50P99 {
        v.sort_unstable();
        P50P99(percentile(&v, 0.5).unwrap_or_default(), percentile(&v, 0.99).unwrap_or_default())
    }
}

pub struct Stall {
    pub healthz: P50P99,
    pub queue_ids: P50P99,
    /// Installs on eth2, a new connection each, before eth1 was made busy and while it is.
    pub other_nic_idle: P50P99,
    pub other_nic_busy: P50P99,
    /// From a client's SIGKILL to its rules removed (on eth2, while eth1 is busy).
    pub reclaim: P50P99,
    /// Replies the hammering clients got on eth1 before SIGTERM (about one per second).
    pub slow_replies: usize,
    pub sigterm_logged: Duration,
    pub exited: Duration,
    pub exit_code: Option<i32>,
}

/// What the benchmark's daemon handle offers this measurement.
pub trait Daemon {
    fn sock(&self, name: &str) -> std::path::PathBuf;
    fn http(&self) -> SocketAddr;
    /// When a log line containing `needle` arrived, waiting up to `limit`.
    fn logged(&self, needle: &str, limit: Duration) -> Option<Instant>;
    fn sigterm(&self);
    /// Waits up to `limit` for the exit; the exit code if it came.
    fn wait_exit(&mut self, limit: Duration) -> Option<Option<i32>>;
}

fn healthz(addr: SocketAddr) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| format!("read: {e}"))?;
    if !resp.starts_with("HTTP/1.1 200") {
        return Err(format!("/healthz answered {:?}", resp.lines().next()));
    }
    Ok(t.elapsed())
}

fn install(sock: &Path, sport: i32, gpu: &str) -> Result<Duration, String> {
    let req = client::rule_request(1, ("10.2.0.2", sport), ("192.168.2.2", 5000), Some(gpu), None);
    let bytes = frame::encode(&req).expect("a request fits");
    let t = Instant::now();
    let mut s = UnixStream::connect(sock).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    s.write_all(&bytes).map_err(|e| e.to_string())?;
    let mut reply = [0u8; 7];
    s.read_exact(&mut reply).map_err(|e| format!("read: {e}"))?;
    if reply != frame::OK_FRAME {
        return Err(format!("install on {gpu} answered {reply:?}"));
    }
    Ok(t.elapsed())
}

/// Runs the measurement against a daemon started with the slow NIC; stops it.
pub fn measure(d: &mut impl Daemon, samples: usize) -> Result<Stall, String> {
    let rules = d.sock("rx_rule_manager");
    let other_nic_idle = P50P99::of(
        (0..samples).map(|i| install(&rules, 1000 + i as i32, GPU_ETH2)).collect::<Result<_, _>>()?,
    );

    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..HAMMERS)
        .map(|h| {
            let (rules, stop) = (rules.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut replies = 0;
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let req = client::rule_request(
                        1,
                        ("10.1.0.2", 20_000 + (h * 1000 + n) as i32),
                        ("192.168.1.2", 5000),
                        Some(GPU_ETH1),
                        None,
                    );
                    let Ok(mut c) = Client::connect(&rules) else { break };
                    let _ = c.stream().set_read_timeout(Some(Duration::from_secs(30)));
                    // At shutdown the answer may be UNAVAILABLE: still an answer.
                    if c.request(&req).is_err() {
                        break;
                    }
                    if !stop.load(Ordering::Relaxed) {
                        replies += 1;
                    }
                    n += 1;
                }
                replies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));

    let http = d.http();
    let healthz = P50P99::of((0..samples.min(100)).map(|_| healthz(http)).collect::<Result<_, _>>()?);
    let mut q = Client::connect(d.sock("queue_ids_by_gpu")).map_err(|e| format!("queue_ids_by_gpu: {e}"))?;
    let queue_ids = P50P99::of(
        (0..samples)
            .map(|_| {
                let t = Instant::now();
                let r = q.request(&client::queue_query(GPU_ETH1)).map_err(|e| e.to_string())?;
                match client::status_code(&r) {
                    0 => Ok(t.elapsed()),
                    c => Err(format!("queue_ids_by_gpu answered status {c}")),
                }
            })
            .collect::<Result<_, String>>()?,
    );
    let other_nic_busy = P50P99::of(
        (0..samples).map(|i| install(&rules, 5000 + i as i32, GPU_ETH2)).collect::<Result<_, _>>()?,
    );

    let reclaim = crate::reclaim::measure(d, samples.clamp(1, 20))?;

    let sent = Instant::now();
    d.sigterm();
    let sigterm_logged =
        d.logged("shutting down", Duration::from_secs(10)).ok_or("no 'shutting down' log line")? - sent;
    let exit_code = d.wait_exit(Duration::from_secs(30)).ok_or("no exit within 30 s")?;
    let exited = sent.elapsed();
    stop.store(true, Ordering::Relaxed);
    let slow_replies = hammers.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    Ok(Stall {
        healthz,
        queue_ids,
        other_nic_idle,
        other_nic_busy,
        reclaim,
        slow_replies,
        sigterm_logged,
        exited,
        exit_code,
    })
}
