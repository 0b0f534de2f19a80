//! Numbers for the hardening work, against the built daemon binary on
//! simulated NICs. Prints numbers; asserts nothing.
//!
//! cargo build --release && cargo run --release --example hardening_bench -- [--bin target/release/tcpx-rxdm]
//!     [--rules 100000] [--section flows|http|memory|all]
//!
//! - `flows`: rule install latency while `/debug/flows` is read in a loop at
//!   `--rules` installed rules, and the RSS with 30 requests that never read.
//! - `http`: the daemon's fd count with 3000 idle HTTP connections.
//! - `memory`: RSS at idle, after 2000 connections with 64 KiB partial frames
//!   come and go, and after `--rules` rules are installed and uninstalled.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::wire::client::{self, raw_bytes, Client};

struct Args {
    bin: String,
    rules: u32,
    section: String,
}

fn args() -> Args {
    let mut a = Args { bin: "target/release/tcpx-rxdm".into(), rules: 100_000, section: "all".into() };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        match argv[i].as_str() {
            "--bin" => a.bin = v,
            "--rules" => a.rules = v.parse().expect("--rules N"),
            "--section" => a.section = v,
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

struct Daemon {
    child: Child,
    http: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Lines of the daemon's log that contain "held_us" (the /debug/flows copy).
static HELD: Mutex<Vec<u64>> = Mutex::new(Vec::new());

fn start(bin: &str, extra: &[&str]) -> Daemon {
    let dir = std::env::temp_dir().join(format!("rxdm-hbench-{}-{}", std::process::id(), rand_tag()));
    let mut child = Command::new(bin)
        .args([
            "--gpu_nic_preset=sim",
            "--metrics_address=127.0.0.1:0",
            "--debug_endpoints=local",
            "--nomonitor_shutdown",
        ])
        // Per-module filters are RUST_LOG's (--log_level takes one level).
        .env(
            "RUST_LOG",
            "warn,tcpx_rxdm::daemon=info,tcpx_rxdm::steering::apply=debug,tcpx_rxdm::endpoint::memory=debug",
        )
        .arg(format!("--uds_path={}", dir.display()))
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn daemon");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut http = None;
    loop {
        let line = lines.next().expect("daemon exited before ready").unwrap();
        if let Some(rest) = line.split("address=").nth(1) {
            http = rest.split_whitespace().next().and_then(|a| a.parse().ok());
        }
        if line.contains(READY_LINE) {
            break;
        }
    }
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if line.contains("malloc_trim") {
                println!("  daemon: {}", line.split("DEBUG").nth(1).unwrap_or(&line).trim());
            }
            if let Some(v) = line.split("held_us=").nth(1) {
                if let Some(us) = v.split_whitespace().next().and_then(|n| n.parse().ok()) {
                    HELD.lock().unwrap().push(us);
                }
            }
        }
    });
    Daemon { child, http: http.expect("HTTP address logged"), dir }
}

fn rand_tag() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn rule(i: u32, dst: &str) -> tcpx_rxdm::wire::proto::UnixSocketProto {
    let src = format!("10.{}.{}.{}", 1 + i / 65536 % 250, i / 256 % 256, i % 256);
    client::rule_request(1, (src.as_str(), 1000 + (i % 50_000) as i32), (dst, 5000), None, None)
}

/// Installs (or uninstalls) rules `from..to` toward `dst` with 8 clients in parallel.
fn bulk(d: &Daemon, sock: &str, dst: &str, from: u32, to: u32) {
    let per = (to - from).div_ceil(8);
    std::thread::scope(|s| {
        for t in 0..8 {
            let path = d.dir.join(sock);
            s.spawn(move || {
                let mut c = Client::connect(path).unwrap();
                for i in (from + t * per)..(from + (t + 1) * per).min(to) {
                    let r = c.request(&rule(i, dst)).unwrap();
                    assert_eq!(raw_bytes(&r), Some(&b"Ok."[..]), "{r:?}");
                }
            });
        }
    });
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let d = sorted[((sorted.len() - 1) as f64 * p) as usize];
    d.as_secs_f64() * 1e6
}

/// Install+uninstall pairs on `dst` for `dur`; returns the install latencies, sorted.
fn churn(d: &Daemon, dst: &str, base: u32, dur: Duration) -> Vec<Duration> {
    let mut ins = Client::connect(d.dir.join("rx_rule_manager")).unwrap();
    let mut del = Client::connect(d.dir.join("rx_rule_uninstall")).unwrap();
    let mut lat = Vec::new();
    let t0 = Instant::now();
    let mut i = 0;
    while t0.elapsed() < dur {
        let req = rule(base + i % 1000, dst);
        let t = Instant::now();
        let r = ins.request(&req).unwrap();
        lat.push(t.elapsed());
        assert_eq!(raw_bytes(&r), Some(&b"Ok."[..]), "{r:?}");
        del.request(&req).unwrap();
        i += 1;
    }
    lat.sort();
    lat
}

fn get(addr: SocketAddr, path: &str) -> (usize, Duration) {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut body = Vec::new();
    s.read_to_end(&mut body).unwrap();
    (body.len(), t.elapsed())
}

fn report(label: &str, lat: &[Duration]) {
    println!(
        "  {label:<44} n={:<6} p50={:>8.1} us  p99={:>8.1} us  max={:>9.1} us",
        lat.len(),
        pct(lat, 0.5),
        pct(lat, 0.99),
        pct(lat, 1.0)
    );
}

fn flows(a: &Args) {
    // The sim NIC has 100 000 slots: leave 1000 for the install/uninstall churn.
    let n = a.rules.min(99_000);
    println!("== /debug/flows at {n} rules on eth1 (+ churn in the free slots)");
    let d = start(&a.bin, &[]);
    let t = Instant::now();
    bulk(&d, "rx_rule_manager", "192.168.1.2", 0, n);
    println!("  installed {n} rules in {:.1} s", t.elapsed().as_secs_f64());
    let pid = d.child.id();
    println!("  RSS idle with the rules: {} KiB", rss_kib(pid));
    let quiet = churn(&d, "192.168.1.2", 2_000_000, Duration::from_secs(3));
    report("install latency, no /debug/flows", &quiet);

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let (stop, reads, addr) = (stop.clone(), reads.clone(), d.http);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                reads.lock().unwrap().push(get(addr, "/debug/flows"));
            }
        })
    };
    let busy = churn(&d, "192.168.1.2", 2_000_000, Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    report("install latency, /debug/flows read in a loop", &busy);
    // The copies of eth1's table (the other NICs are empty and take ~0 us).
    let mut held: Vec<u64> = HELD.lock().unwrap().iter().copied().filter(|&us| us > 100).collect();
    held.sort();
    if !held.is_empty() {
        println!(
            "  rule lock held for the eth1 copy: n={} min={} us median={} us max={} us",
            held.len(),
            held[0],
            held[held.len() / 2],
            held[held.len() - 1]
        );
    }
    let reads = reads.lock().unwrap();
    let (bytes, took) = reads.first().copied().unwrap_or_default();
    println!(
        "  /debug/flows: {} reads, {bytes} bytes, first took {:.0} ms",
        reads.len(),
        took.as_secs_f64() * 1e3
    );

    let before = rss_kib(pid);
    let mut stuck = Vec::new();
    for _ in 0..30 {
        let mut s = std::net::TcpStream::connect(d.http).unwrap();
        s.write_all(b"GET /debug/flows HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        stuck.push(s);
    }
    std::thread::sleep(Duration::from_secs(3));
    let during = churn(&d, "192.168.1.2", 2_000_000, Duration::from_secs(2));
    report("install latency, 30 unread /debug/flows", &during);
    println!("  RSS with 30 unread /debug/flows: {before} KiB -> {} KiB", rss_kib(pid));
    drop(stuck);
}

fn http(a: &Args) {
    println!("== HTTP idle flood (--max_http_connections 64)");
    let d = start(&a.bin, &[]);
    let pid = d.child.id();
    let base = fds(pid);
    let mut conns = Vec::new();
    for _ in 0..3000 {
        conns.push(std::net::TcpStream::connect(d.http).unwrap());
    }
    std::thread::sleep(Duration::from_millis(500));
    println!("  daemon fds: {base} idle, {} with 3000 idle HTTP connections", fds(pid));
    let t = Instant::now();
    let mut c = Client::connect(d.dir.join("queue_ids_by_gpu")).unwrap();
    c.request(&client::queue_query("0000:04:00.0")).unwrap();
    println!("  Unix-socket query meanwhile: {:.0} us", t.elapsed().as_secs_f64() * 1e6);
    drop(conns);
    std::thread::sleep(Duration::from_millis(500));
    println!("  daemon fds after they left: {}", fds(pid));
}

fn memory(a: &Args) {
    println!("== RSS after peaks");
    let d = start(&a.bin, &[]);
    let pid = d.child.id();
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss_kib(pid);
    println!("  idle: {idle} KiB");
    // 2000 connections, each with a 64 KiB frame announced and all but 1 byte sent.
    let mut conns = Vec::new();
    let payload = vec![0x0a_u8; 65_534];
    for _ in 0..2000 {
        let mut s = std::os::unix::net::UnixStream::connect(d.dir.join("rx_rule_manager")).unwrap();
        s.write_all(&[0xff, 0xff]).unwrap();
        s.write_all(&payload).unwrap();
        conns.push(s);
    }
    std::thread::sleep(Duration::from_secs(1));
    println!("  2000 connections with 64 KiB partial frames: {} KiB", rss_kib(pid));
    // Meanwhile the daemon goes on serving: what it allocates now (and keeps)
    // sits above the freed buffers in the heap.
    bulk(&d, "rx_rule_manager", "192.168.2.2", 0, 2000);
    drop(conns);
    // The daemon checks every 2 s whether to give memory back.
    std::thread::sleep(Duration::from_secs(3));
    println!("  after they left: {} KiB", rss_kib(pid));
    bulk(&d, "rx_rule_manager", "192.168.1.2", 0, a.rules);
    println!("  {} rules installed: {} KiB", a.rules, rss_kib(pid));
    bulk(&d, "rx_rule_uninstall", "192.168.1.2", 0, a.rules);
    std::thread::sleep(Duration::from_secs(3));
    println!("  after uninstalling them: {} KiB (idle was {idle} KiB)", rss_kib(pid));
}

fn main() {
    let a = args();
    let all = a.section == "all";
    if all || a.section == "flows" {
        flows(&a);
    }
    if all || a.section == "http" {
        http(&a);
    }
    if all || a.section == "memory" {
        memory(&a);
    }
}
