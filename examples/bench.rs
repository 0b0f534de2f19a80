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
    /// Load an already running daemon's socket folder instead (for profiling).
    target: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        bin: "target/release/tcpx-rxdm".into(),
        clients: 64,
        rules: 100_000,
        startups: 20,
        target: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        match argv[i].as_str() {
            "--bin" => a.bin = v,
            "--clients" => a.clients = v.parse().expect("--clients N"),
            "--rules" => a.rules = v.parse().expect("--rules N"),
            "--startups" => a.startups = v.parse().expect("--startups N"),
            "--target" => a.target = Some(v),
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

/// utime + stime of a process, in seconds.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap().unwrap() as f64
}

/// Installs rules `range` from `clients` threads, a new connection per request.
/// Returns sorted latencies, failures and wall time.
fn install_run(
    sock: &std::path::Path,
    range: std::ops::Range<usize>,
    clients: usize,
) -> (Vec<Duration>, usize, Duration) {
    let next = Arc::new(AtomicUsize::new(range.start));
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let sock = sock.to_path_buf();
            let next = next.clone();
            let end = range.end;
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut failures = 0usize;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
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
                    // A bare stream, like the plugin's: no timeouts set per request.
                    let mut c =
                        Client::from_stream(std::os::unix::net::UnixStream::connect(&sock).expect("connect"));
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
    let mut lat = Vec::new();
    let mut failures = 0;
    for h in handles {
        let (l, f) = h.join().unwrap();
        lat.extend(l);
        failures += f;
    }
    let wall = started.elapsed();
    lat.sort();
    (lat, failures, wall)
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
    if let Some(dir) = &a.target {
        let (lat, failures, wall) =
            install_run(&std::path::Path::new(dir).join("rx_rule_manager"), 0..a.rules, a.clients);
        println!("rate {:.0}/s, failures {failures}", lat.len() as f64 / wall.as_secs_f64());
        return;
    }
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
    let pid = child.id();

    // Latency: one client at a time, so the numbers are service time, not queueing.
    let single = 5_000.min(a.rules / 2);
    let (lat, failures, _) = install_run(&sock, 0..single, 1);
    println!(
        "rule_install_us_1_client: p50 {:.1} p99 {:.1} max {:.1} (n={}, failures {failures}, connect per request)",
        us(pct(&lat, 0.5)),
        us(pct(&lat, 0.99)),
        us(*lat.last().unwrap()),
        lat.len()
    );

    // Throughput: many clients at once. Latency here is mostly queueing:
    // by Little's law p50 ≈ clients / rate.
    let cpu0 = cpu_s(pid);
    let (lat, failures, wall) = install_run(&sock, single..a.rules, a.clients);
    let cpu = cpu_s(pid) - cpu0;
    let rate = lat.len() as f64 / wall.as_secs_f64();
    println!(
        "rule_install_us_{}_clients: p50 {:.1} p99 {:.1} max {:.1} (n={}, failures {failures})",
        a.clients,
        us(pct(&lat, 0.5)),
        us(pct(&lat, 0.99)),
        us(*lat.last().unwrap()),
        lat.len()
    );
    println!("rule_install_rate_per_s: {rate:.0} ({} clients, {:.1} s)", a.clients, wall.as_secs_f64());
    println!(
        "daemon_cpu_per_rule_us: {:.1} (daemon used {:.2} of {} cores; the rest is the clients and the kernel)",
        cpu / lat.len() as f64 * 1e6,
        cpu / wall.as_secs_f64(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!("rss_with_{}_rules_kib: {}", a.rules, rss_kib(pid));
    stop(child);
}
