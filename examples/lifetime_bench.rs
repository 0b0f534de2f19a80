//! What short-lived clients leave in the daemon: its descriptors and RSS
//! while thousands of client processes each install a rule and exit, and how
//! many such clients it serves a second; for one build, or two side by side.
//! Prints numbers; asserts nothing.
//!
//! cargo build --release && cargo run --release --example lifetime_bench -- [--bin target/release/tcpx-rxdm]
//!     [--old-bin PATH] [--clients 10000] [--parallel 8] [--isolation audit|enforce|off]
//!
//! Each client is this program run again (`client UDS SPORT`): it connects to
//! the rule socket, installs a rule and exits; with `--leases` its exit ends
//! its lease, which removes the rule.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::wire::client::{self, raw_bytes, Client};

struct Args {
    bin: String,
    old_bin: Option<String>,
    clients: usize,
    parallel: usize,
    isolation: String,
}

fn args() -> Args {
    let mut a = Args {
        bin: "target/release/tcpx-rxdm".into(),
        old_bin: None,
        clients: 10_000,
        parallel: 8,
        isolation: "audit".into(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        match argv[i].as_str() {
            "--bin" => a.bin = v,
            "--old-bin" => a.old_bin = Some(v),
            "--clients" => a.clients = v.parse().expect("--clients N"),
            "--parallel" => a.parallel = v.parse().expect("--parallel N"),
            "--isolation" => a.isolation = v,
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

/// The client: one install on its own rule connection, then exit.
fn client(uds: &Path, sport: i32) {
    let mut c = Client::connect(uds.join("rx_rule_manager")).expect("connect");
    let src = format!("10.{}.{}.9", sport / 250 % 250, sport % 250);
    let req =
        client::rule_request(1, (src.as_str(), sport % 60_000 + 1024), ("192.168.1.2", 5000), None, None);
    let reply = c.request(&req).expect("reply");
    assert_eq!(raw_bytes(&reply), Some(&b"Ok."[..]), "{reply:?}");
}

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(bin: &str, isolation: &str, tag: &str) -> Daemon {
    let dir = std::env::temp_dir().join(format!("rxdm-lbench-{}-{tag}", std::process::id()));
    let mut child = Command::new(bin)
        .args(["--gpu_nic_preset=sim", "--metrics_address=", "--nomonitor_shutdown", "--leases"])
        .arg(format!("--tenant_isolation={isolation}"))
        .arg(format!("--uds_path={}", dir.display()))
        .env("RUST_LOG", "warn,tcpx_rxdm::daemon=info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("the daemon starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        if line.expect("log").contains(READY_LINE) {
            break;
        }
    }
    // Keep reading, so that the daemon never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Daemon { child, dir }
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Rules still booked, from the status socket.
fn rules(uds: &Path) -> u64 {
    let v = tcpx_rxdm::server::status::ask(uds, "status").unwrap_or_default();
    v["nics"].as_array().map(|n| n.iter().filter_map(|x| x["rules"].as_u64()).sum()).unwrap_or(0)
}

/// One build: returns (clients a second, per checkpoint: clients, fds, RSS MiB).
fn run(bin: &str, a: &Args, tag: &str) -> (f64, Vec<(usize, usize, f64)>) {
    let d = start(bin, &a.isolation, tag);
    let pid = d.child.id();
    let me = std::env::current_exe().unwrap();
    let mut points = vec![(0, fds(pid), rss_mib(pid))];
    let step = (a.clients / 10).max(1);
    let t = Instant::now();
    let mut running: Vec<Child> = Vec::new();
    for i in 0..a.clients {
        if running.len() >= a.parallel {
            let mut c = running.remove(0);
            assert!(c.wait().unwrap().success(), "a client failed");
        }
        let c = Command::new(&me).arg("client").arg(&d.dir).arg(i.to_string()).spawn().unwrap();
        running.push(c);
        if (i + 1) % step == 0 {
            points.push((i + 1, fds(pid), rss_mib(pid)));
        }
    }
    for mut c in running {
        assert!(c.wait().unwrap().success(), "a client failed");
    }
    let rate = a.clients as f64 / t.elapsed().as_secs_f64();
    // Settled: every exited client's rule removed.
    let until = Instant::now() + Duration::from_secs(60);
    while rules(&d.dir) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    points.push((a.clients, fds(pid), rss_mib(pid)));
    (rate, points)
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("client") {
        client(Path::new(&argv[2]), argv[3].parse().unwrap());
        return;
    }
    let a = args();
    let mut builds = vec![("this build", a.bin.clone())];
    if let Some(old) = &a.old_bin {
        builds.insert(0, ("build before", old.clone()));
    }
    println!(
        "{} short-lived clients, {} at a time, --tenant_isolation={} --leases, {} cores",
        a.clients,
        a.parallel,
        a.isolation,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for (i, (name, bin)) in builds.iter().enumerate() {
        let (rate, points) = run(bin, &a, &i.to_string());
        println!("\n{name} ({bin}): {rate:.0} clients/s");
        println!("  {:>8} {:>6} {:>9}", "clients", "fds", "RSS MiB");
        for (n, f, r) in &points {
            println!("  {n:>8} {f:>6} {r:>9.1}");
        }
        let (first, last) = (points[0], points[points.len() - 1]);
        println!("  settled: {:+} fds, {:+.1} MiB RSS", last.1 as i64 - first.1 as i64, last.2 - first.2);
    }
}
