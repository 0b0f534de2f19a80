//! The hostile section (`--hostile_only`, or after the rest): what one
//! tenant's load costs another, for each daemon build side by side (`--bin`
//! and every `--also`), a fresh daemon per run, in `--hostile_mode`:
//!
//! - **a flood of garbled IPv6 installs**: a tenant (a cgroup and a network
//!   namespace of its own) sends installs named with half their address
//!   bytes that fit no connection, from `--hostile_connections` connections
//!   at once, while a victim (this process) runs IPv4 install + uninstall
//!   pairs on real loopback connections for `--hostile_seconds`: the
//!   victim's pairs and p99 against its run without the flood, and the
//!   daemon's threads and RSS growth (the most seen, sampled every 50 ms);
//! - **a lone client's IPv6 installs** (the NCCL plugin's garbled requests,
//!   a new connection each, in a namespace of its own) without and with
//!   `--hostile_sockets` sockets held in an unrelated namespace: its p50.
//!
//! Needs root (cgroups, network namespaces, the GPU stand-ins); skipped with
//! the reason otherwise.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::hostile_roles::{LONE_A, LONE_B};
use crate::load::one;
use crate::stats::{percentile, us};
use crate::tenants::{Pool, StandIns};
use crate::{start_daemon_http, Args, Server, SIM_GPUS};

/// A network namespace of the section's own, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("bench-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("iproute2's ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A cgroup v2 group of the section's own, removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(tag: &str) -> Option<Cgroup> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        let root = tcpx_rxdm::identity::tenant::cgroup2_mount(&mounts)?;
        let path = root.join(format!("tcpx-bench-{}-{tag}", std::process::id()));
        std::fs::create_dir(&path).ok()?;
        Some(Cgroup(path))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// This benchmark again, as one of `hostile_roles`; returns once it printed its first line.
fn role(
    role: &str,
    sock: &Path,
    netns: &str,
    cgroup: Option<&Path>,
    n: usize,
) -> (Child, ChildStdin, String) {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args(["--hostile-role", role, "--hostile-netns", netns, "--hostile-n", &n.to_string()])
        .arg("--hostile-sock")
        .arg(sock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(cg) = cgroup {
        cmd.arg("--hostile-cgroup").arg(cg);
    }
    let mut child = cmd.spawn().expect("a role process");
    let stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).expect("its first line");
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
    });
    (child, stdin, line.trim().to_string())
}

/// This process's hard limit of open files (a holder raises its own to it).
fn hard_nofile() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit for getrlimit to write.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    usize::try_from(r.rlim_max).unwrap_or(usize::MAX).min(1 << 20)
}

/// The daemon's threads and RSS (KiB) now.
fn threads_rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

/// A metric's value in the daemon's `/metrics` (`None`: the build has no such series).
fn metric(server: &Server, series: &str) -> Option<f64> {
    use crate::stall::Daemon as _;
    let mut s = std::net::TcpStream::connect(server.http()).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// What the victim saw in one run, and the daemon's peaks.
struct Victim {
    pairs: usize,
    p99: Duration,
    errors: usize,
    threads: u64,
    rss_growth_kib: u64,
}

/// IPv4 install + uninstall pairs on `pool`'s connections for `secs`.
fn victim(server: &Server, pool: &Pool, secs: Duration) -> Victim {
    let dir = server.dir.path();
    let (rm, un) = (dir.join("rx_rule_manager"), dir.join("rx_rule_uninstall"));
    let ok = tcpx_rxdm::wire::frame::encode(&tcpx_rxdm::wire::frame::ok()).unwrap();
    let (t0, r0) = threads_rss(server.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let peaks = Arc::new(Mutex::new((t0, r0)));
    let sampler = {
        let (stop, peaks, pid) = (stop.clone(), peaks.clone(), server.pid());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (t, r) = threads_rss(pid);
                let mut p = peaks.lock().unwrap();
                *p = (p.0.max(t), p.1.max(r));
                drop(p);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let (mut lat, mut pairs, mut errors) = (Vec::new(), 0, 0);
    let end = Instant::now() + secs;
    for f in pool.frames.iter().cycle() {
        if Instant::now() >= end {
            break;
        }
        let mut pair_ok = true;
        for sock in [&rm, &un] {
            let t = Instant::now();
            match one(sock, f, &ok) {
                Ok(()) => lat.push(t.elapsed()),
                Err(_) => pair_ok = false,
            }
        }
        match pair_ok {
            true => pairs += 1,
            false => errors += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    lat.sort_unstable();
    let (threads, rss) = *peaks.lock().unwrap();
    let p99 = percentile(&lat, 0.99).unwrap_or_default();
    Victim { pairs, p99, errors, threads, rss_growth_kib: rss.saturating_sub(r0) }
}

/// Why the section cannot run here, if it cannot.
fn unable(stand_ins: &StandIns) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root (cgroups and network namespaces)".into());
    }
    if let Some(why) = &stand_ins.missing {
        return Some(format!("GPU stand-ins not held: {why}"));
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` (iproute2)".into());
    }
    None
}

/// Runs the section; false if a victim's request failed.
pub fn run(a: &Args, stand_ins: &StandIns) -> bool {
    println!("\nhostile tenants: --tenant_isolation={}, {} s per run", a.hostile_mode, a.hostile_seconds);
    if let Some(why) = unable(stand_ins) {
        println!("hostile tenants: skipped: {why}");
        return true;
    }
    let mut bins = vec![a.bin.clone()];
    bins.extend(a.also.iter().cloned());
    let name = |i: usize| if i == 0 { "--bin".to_string() } else { format!("--also {}", bins[i].display()) };
    let secs = Duration::from_secs(a.hostile_seconds);
    let extra = [format!("--tenant_isolation={}", a.hostile_mode)];
    let mut all_ok = true;

    // (a) The flood, against the victim's baseline.
    let flood_ns = Netns::new("flood");
    let flood_cg = Cgroup::new("flood");
    let l = TcpListener::bind("127.0.0.1:0").expect("a listener on 127.0.0.1");
    let pool = Pool::open(&l, 256, &SIM_GPUS).expect("the victim's loopback connections");
    let mut rows = Vec::new();
    for &n in std::iter::once(&0).chain(&a.hostile_connections) {
        for (i, bin) in bins.iter().enumerate() {
            let (server, _) = start_daemon_http(bin, &extra, "127.0.0.1:0");
            victim(&server, &pool, Duration::from_millis(500));
            let flood = (n > 0).then(|| {
                let cg = flood_cg.as_ref().map(|c| c.0.as_path());
                let f = role("flood", &server.sock, &flood_ns.0, cg, n);
                std::thread::sleep(Duration::from_secs(1));
                f
            });
            let v = victim(&server, &pool, secs);
            let counts = ["exact", "dump", "missing", "busy"]
                .map(|o| metric(&server, &format!("tcpx_rxdm_ipv6_repair_lookups_total{{outcome=\"{o}\"}}")));
            let dumps = metric(&server, "tcpx_rxdm_ipv6_repair_dumps_total");
            if let Some((mut child, stdin, _)) = flood {
                drop(stdin);
                let _ = child.wait();
            }
            all_ok &= v.errors == 0;
            println!(
                "{} flood {n:>4}: victim {} pairs, p99 {:.2} ms, {} errors; daemon threads {} , RSS +{:.1} MiB; lookups {:?}, dumps {:?}",
                name(i),
                v.pairs,
                us(v.p99) / 1e3,
                v.errors,
                v.threads,
                v.rss_growth_kib as f64 / 1024.0,
                counts,
                dumps
            );
            rows.push((i, n, v));
        }
    }
    println!(
        "\nhostile tenants: a flood of garbled IPv6 installs against a victim's IPv4 pairs ({} s):\n",
        a.hostile_seconds
    );
    println!("| build | flood connections | victim pairs | ÷ no flood | victim p99 ms | ÷ no flood | daemon threads | RSS growth MiB |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (i, n, v) in &rows {
        let base = rows.iter().find(|(j, m, _)| j == i && *m == 0).map(|r| &r.2).expect("a baseline");
        println!(
            "| {} | {n} | {} | {:.2} | {:.2} | {:.2} | {} | {:.1} |",
            name(*i),
            v.pairs,
            v.pairs as f64 / base.pairs.max(1) as f64,
            us(v.p99) / 1e3,
            us(v.p99) / us(base.p99).max(1e-3),
            v.threads,
            v.rss_growth_kib as f64 / 1024.0
        );
    }
    drop(pool);

    // (b) A lone client's IPv6 installs, without and with sockets held elsewhere.
    let lone_ns = Netns::new("lone");
    for addr in [LONE_A, LONE_B] {
        ip(&["-n", &lone_ns.0, "addr", "add", &format!("{addr}/64"), "dev", "lo", "nodad"]);
    }
    let other = Netns::new("other");
    let mut lone_rows = Vec::new();
    // Each holder process holds what its descriptor limit allows.
    let per = (hard_nofile().saturating_sub(1000) / 2 * 2).clamp(2, a.hostile_sockets.max(2));
    for held in [false, true] {
        let holders: Vec<_> = match held {
            false => Vec::new(),
            true => (0..a.hostile_sockets.div_ceil(per))
                .map(|i| role("hold", Path::new("/"), &other.0, None, per.min(a.hostile_sockets - i * per)))
                .collect(),
        };
        if held {
            let lines: Vec<&str> = holders.iter().map(|h| h.2.as_str()).collect();
            println!("unrelated namespace: {}", lines.join(", "));
        }
        for (i, bin) in bins.iter().enumerate() {
            let (server, _) = start_daemon_http(bin, &extra, "127.0.0.1:0");
            let (mut child, _stdin, line) = role("lone", &server.sock, &lone_ns.0, None, a.hostile_lone);
            let _ = child.wait();
            let dumps = metric(&server, "tcpx_rxdm_ipv6_repair_dumps_total");
            println!(
                "{} lone client, {} sockets elsewhere: {line} (p50 µs, p99 µs, errors); dumps {dumps:?}",
                name(i),
                if held { a.hostile_sockets } else { 0 }
            );
            lone_rows.push((i, held, line));
        }
        for (mut child, stdin, _) in holders {
            drop(stdin);
            let _ = child.wait();
        }
    }
    let p50 =
        |line: &str| line.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    println!("\nhostile tenants: a lone client's garbled IPv6 install ({} installs):\n", a.hostile_lone);
    println!(
        "| build | p50 µs, no other sockets | p50 µs, {} sockets in another namespace | ratio |",
        a.hostile_sockets
    );
    println!("|---|---:|---:|---:|");
    for i in 0..bins.len() {
        let get =
            |h: bool| lone_rows.iter().find(|r| r.0 == i && r.1 == h).map(|r| p50(&r.2)).unwrap_or(f64::NAN);
        let (without, with) = (get(false), get(true));
        println!("| {} | {without:.0} | {with:.0} | {:.2} |", name(i), with / without);
    }
    all_ok
}
