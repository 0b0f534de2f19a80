//! Benchmarks for the SPEC §9 targets, against the built daemon binary on
//! simulated NICs with host pools. Prints numbers; asserts nothing.
//!
//! cargo build --release && cargo run --release --example bench -- [--bin target/release/tcpx-rxdm]
//!     [--clients 64] [--rules 100000] [--startups 20]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_rxdm::wire::client::{self, raw_bytes, Client};
use tcpx_rxdm::wire::frame;

const READY: &str = "Buffer manager initialization completed.";

struct Args {
    bin: String,
    clients: usize,
    rules: usize,
    startups: usize,
}

fn args() -> Args {
    let mut a = Args { bin: "target/release/tcpx-rxdm".into(), clients: 64, rules: 100_000, startups: 20 };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        match argv[i].as_str() {
            "--bin" => a.bin = v,
            "--clients" => a.clients = v.parse().expect("--clients N"),
            "--rules" => a.rules = v.parse().expect("--rules N"),
            "--startups" => a.startups = v.parse().expect("--startups N"),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

/// Starts the daemon and returns it with the time from spawn to the ready line.
fn start(bin: &str, dir: &std::path::Path, extra: &[&str]) -> (Child, Duration) {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .args([
            "--gpu_nic_preset=sim",
            "--metrics_address=",
            "--nomonitor_shutdown",
            "--log_level=warn,tcpx_rxdm::daemon=info",
        ])
        .arg(format!("--uds_path={}", dir.display()))
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn daemon");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines.next().expect("daemon exited before ready").unwrap();
        if line.contains(READY) {
            break;
        }
    }
    let elapsed = t.elapsed();
    // Keep draining stderr so the daemon never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    (child, elapsed)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let a = args();
    println!(
        "# tcpx-rxdm benchmark ({} cores)",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );

    // 1. Startup to ready.
    let mut startups: Vec<Duration> = (0..a.startups)
        .map(|_| {
            let dir = tempfile::tempdir().unwrap();
            let (child, t) = start(&a.bin, dir.path(), &[]);
            stop(child);
            t
        })
        .collect();
    startups.sort();
    println!(
        "startup_to_ready_ms: p50 {:.2} min {:.2} max {:.2} (n={}, sim 4 NICs, 8 GPUs, host pools, includes process spawn)",
        us(pct(&startups, 0.5)) / 1e3,
        us(startups[0]) / 1e3,
        us(*startups.last().unwrap()) / 1e3,
        startups.len()
    );

    // 2. Rule installs: a new connection per request, like the plugin.
    let dir = tempfile::tempdir().unwrap();
    let (child, _) = start(&a.bin, dir.path(), &[]);
    std::thread::sleep(Duration::from_millis(200));
    println!("rss_idle_kib: {}", rss_kib(child.id()));
    let sock = dir.path().join("rx_rule_manager");
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..a.clients)
        .map(|_| {
            let sock = sock.clone();
            let next = next.clone();
            let total = a.rules;
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(total / 32 + 1);
                let mut failures = 0usize;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    // Spread over the four sim NICs by destination address.
                    let nic = 1 + i % 4;
                    let src_ip = format!("10.{}.{}.{}", 1 + (i >> 16) % 250, (i >> 8) & 0xff, i & 0xff);
                    let req = client::rule_request(
                        1,
                        (&src_ip, 40000 + (i % 20000) as i32),
                        (&format!("192.168.{nic}.2"), 5000),
                        None,
                        None,
                    );
                    let bytes = frame::encode(&req).unwrap();
                    let t = Instant::now();
                    let mut c = Client::connect(&sock).expect("connect");
                    c.send_bytes(&bytes).unwrap();
                    let reply = c.recv().unwrap();
                    lat.push(t.elapsed());
                    if raw_bytes(&reply) != Some(&b"Ok."[..]) {
                        failures += 1;
                    }
                }
                (lat, failures)
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(a.rules);
    let mut failures = 0;
    for h in handles {
        let (l, f) = h.join().unwrap();
        lat.extend(l);
        failures += f;
    }
    let wall = started.elapsed();
    lat.sort();
    println!(
        "rule_install_us: p50 {:.1} p99 {:.1} max {:.1} (n={}, clients={}, connect per request)",
        us(pct(&lat, 0.5)),
        us(pct(&lat, 0.99)),
        us(*lat.last().unwrap()),
        lat.len(),
        a.clients
    );
    println!("rule_install_rate_per_s: {:.0} (failures {failures})", lat.len() as f64 / wall.as_secs_f64());
    println!("rss_with_{}_rules_kib: {}", a.rules - failures, rss_kib(child.id()));
    stop(child);
}
