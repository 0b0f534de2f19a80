//! Rule-path benchmark against the built daemon binary on simulated NICs with
//! host pools, side by side with the protocol's floor. Prints numbers; asserts
//! nothing (the pieces it is built from are unit-tested: `cargo test --example bench`).
//!
//! ```text
//! cargo build --release && cargo run --release --example bench -- [--rounds 3]
//!     [--clients 1,8,64,256] [--requests 20000] [--write-doc docs/PERFORMANCE.md]
//!     [--tenants_only] [--tenant_modes off,audit,enforce] [--tenant_loads fake,loopback]
//!     [--tenant_clients 1,64] [--tenant_requests 8000]
//!     [--hostile_only] [--hostile_mode enforce] [--hostile_connections 64,512]
//!     [--hostile_seconds 14] [--hostile_sockets 40000] [--hostile_lone 300]
//!     [--flood_conns 512] [--flood_seconds 3] [--fat_clients 4] [--fat_fds 19000]
//! ```
//!
//! What it measures, in one run:
//! - startup to ready, RSS idle and with `--rules` rules installed;
//! - the rule path against the floor: the daemon's `rx_rule_manager` and a
//!   minimal epoll server doing only the socket work of one request (see
//!   `floor.rs`), driven by the same client code with a new connection per
//!   request, interleaved, `--rounds` rounds, best of the rounds reported;
//! - the reference daemon's per-rule cost model: one `ethtool -N` process per
//!   rule (through `sh -c`, as `system()` does) on a veth in a private network
//!   namespace (needs root and the ethtool CLI; skipped with the reason otherwise);
//! - NIC scaling: installs with `--sim_delay=add_rule:<delay>` spread over the
//!   GPUs of all four sim NICs, and over one NIC's GPUs only;
//! - no stall: with one NIC taking a second per insert and clients waiting on
//!   it, `/healthz`, `queue_ids_by_gpu` and installs on another NIC, SIGTERM
//!   to the shutdown log line and to the exit (`stall.rs`);
//! - builds side by side: `--also <other daemon binary>` (repeatable) adds
//!   daemons to the same interleaved rounds;
//! - tenant checks (`tenants.rs`): one daemon per `--tenant_isolation` mode
//!   (`--tenant_modes`) against each other and the floor, interleaved, in two
//!   loads (`--tenant_loads`): flows that do not exist, and real loopback TCP
//!   connections of the benchmark's own, with the simulated GPUs' device-node
//!   stand-ins (`/dev/nvidia<N>`) created and held open when run as root.
//!   `--tenants_only` runs only this section.
//! - hostile tenants (`hostile.rs`, `hostile_plain.rs`; root), for `--bin` and
//!   each `--also` build; `--hostile_only` runs only this section:
//!   - a tenant flooding garbled IPv6 installs from `--hostile_connections`
//!     connections against another's IPv4 pairs, and a lone client's IPv6
//!     installs with and without `--hostile_sockets` sockets held in an
//!     unrelated network namespace (`--hostile_seconds`, 0 skips these);
//!   - a victim's IPv4 pairs while another tenant floods plain requests from
//!     `--flood_conns` connections, and its worst install while
//!     `--fat_clients` new processes holding `--fat_fds` files each become
//!     clients (`--flood_seconds`, 0 skips these).

mod doc;
mod floor;
mod hostile;
mod hostile_plain;
mod hostile_roles;
mod load;
mod reclaim;
mod reference;
mod stall;
mod stats;
mod tenants;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::nic::sim::SimDelay;
use tcpx_rxdm::wire::frame;

use load::{drive, rule_frames, Run, Target};
use stats::{best, us, Measure};

const FLOOR_READY: &str = "floor ready";

/// GPUs of the sim preset and the address of the NIC serving them.
const SIM_GPUS: [(&str, &str); 8] = [
    ("0000:04:00.0", "192.168.1.2"),
    ("0000:05:00.0", "192.168.1.2"),
    ("0000:0a:00.0", "192.168.2.2"),
    ("0000:0b:00.0", "192.168.2.2"),
    ("0000:84:00.0", "192.168.3.2"),
    ("0000:85:00.0", "192.168.3.2"),
    ("0000:8a:00.0", "192.168.4.2"),
    ("0000:8b:00.0", "192.168.4.2"),
];

#[derive(Parser, Debug)]
#[command(name = "bench", about = "Rule-path benchmark of tcpx-rxdm against the protocol's floor")]
struct Args {
    /// Daemon binary.
    #[arg(long, default_value = "target/release/tcpx-rxdm")]
    bin: PathBuf,
    /// Rounds per configuration; the best round of each is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Client counts (comma-separated); each client opens a new connection per request.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 64, 256],
          value_parser = positive)]
    clients: Vec<usize>,
    /// Requests per round, per client count, per server.
    #[arg(long, default_value_t = 20_000, value_parser = positive)]
    requests: usize,
    /// Regenerate the marked section of this file (docs/PERFORMANCE.md) from the run.
    #[arg(long)]
    write_doc: Option<PathBuf>,
    /// Daemon starts timed for startup to ready (0 skips).
    #[arg(long, default_value_t = 20)]
    startups: usize,
    /// Rules installed for the memory figure (0 skips).
    #[arg(long, default_value_t = 100_000)]
    rules: usize,
    /// `ethtool -N` processes timed for the reference's cost model (0 skips).
    #[arg(long, default_value_t = 200)]
    ethtool_rules: usize,
    /// Simulated add_rule delay for the NIC-scaling runs, as `--sim_delay` takes it (e.g. 200us).
    #[arg(long, default_value = "200us", value_parser = parse_delay)]
    delay: Duration,
    /// Requests per NIC-scaling run (0 skips the scaling runs).
    #[arg(long, default_value_t = 2_000)]
    delay_requests: usize,
    /// Samples per figure of the no-stall run (one NIC a second per insert; 0 skips it).
    #[arg(long, default_value_t = 200)]
    stall_samples: usize,
    /// Clients in the NIC-scaling runs.
    #[arg(long, default_value_t = 64, value_parser = positive)]
    delay_clients: usize,
    /// Stop everything and exit 1 if the run takes longer than this (a hung server).
    #[arg(long, default_value_t = 900)]
    timeout_s: u64,
    /// Only load an already running daemon's socket folder (for profiling):
    /// `--requests` at the first `--clients` value.
    #[arg(long)]
    target: Option<PathBuf>,
    /// Another daemon build measured in the same rounds, interleaved with
    /// `--bin` and the floor (repeatable): to compare builds side by side.
    /// Printed, not written to the document.
    #[arg(long)]
    also: Vec<PathBuf>,
    /// Tenant checks: `--tenant_isolation` modes, one daemon each (comma-separated).
    #[arg(long = "tenant_modes", alias = "tenant-modes", value_delimiter = ',',
          default_values = ["off", "audit", "enforce"], value_parser = ["off", "audit", "enforce"])]
    tenant_modes: Vec<String>,
    /// Tenant checks: loads (comma-separated): flows that do not exist, real loopback connections.
    #[arg(long = "tenant_loads", alias = "tenant-loads", value_delimiter = ',',
          default_values = ["fake", "loopback"], value_parser = ["fake", "loopback"])]
    tenant_loads: Vec<String>,
    /// Tenant checks: client counts (comma-separated).
    #[arg(long = "tenant_clients", alias = "tenant-clients", value_delimiter = ',',
          default_values_t = [1usize, 64], value_parser = positive)]
    tenant_clients: Vec<usize>,
    /// Tenant checks: requests per round, per load, per client count, per server
    /// (loopback: at most (fd hard limit − 1000) / 2; 0 skips the section).
    #[arg(long = "tenant_requests", alias = "tenant-requests", default_value_t = 8_000)]
    tenant_requests: usize,
    /// Run only the tenant checks.
    #[arg(long = "tenants_only", alias = "tenants-only")]
    tenants_only: bool,
    /// Run only the hostile-tenant section.
    #[arg(long = "hostile_only", alias = "hostile-only")]
    hostile_only: bool,
    /// Hostile tenants: the daemons' `--tenant_isolation`.
    #[arg(long = "hostile_mode", alias = "hostile-mode", default_value = "enforce",
          value_parser = ["off", "audit", "enforce"])]
    hostile_mode: String,
    /// Hostile tenants: the flooding tenant's connections (comma-separated; 0 skips the flood runs).
    #[arg(long = "hostile_connections", alias = "hostile-connections", value_delimiter = ',',
          default_values_t = [64usize, 512])]
    hostile_connections: Vec<usize>,
    /// Hostile tenants: seconds the victim runs in each garbled-IPv6 flood run (0 skips those cases).
    #[arg(long = "hostile_seconds", alias = "hostile-seconds", default_value_t = 14)]
    hostile_seconds: u64,
    /// Hostile tenants: sockets held in an unrelated network namespace.
    #[arg(long = "hostile_sockets", alias = "hostile-sockets", default_value_t = 40_000, value_parser = positive)]
    hostile_sockets: usize,
    /// Hostile tenants: the lone client's timed installs per run.
    #[arg(long = "hostile_lone", alias = "hostile-lone", default_value_t = 300, value_parser = positive)]
    hostile_lone: usize,
    /// Hostile tenants: the plain flood's connections.
    #[arg(long = "flood_conns", default_value_t = 512, value_parser = positive)]
    flood_conns: usize,
    /// Hostile tenants: the plain flood's threads.
    #[arg(long = "flood_threads", default_value_t = 2, value_parser = positive)]
    flood_threads: usize,
    /// Hostile tenants: seconds the victim runs alone, and again under the plain flood (0 skips
    /// the plain flood and the new clients with many files).
    #[arg(long = "flood_seconds", default_value_t = 3.0)]
    flood_seconds: f64,
    /// Hostile tenants: new processes with many open files that become clients at once.
    #[arg(long = "fat_clients", default_value_t = 4, value_parser = positive)]
    fat_clients: usize,
    /// Hostile tenants: descriptors each of those processes holds.
    #[arg(long = "fat_fds", default_value_t = 19_000)]
    fat_fds: usize,
    /// Floor threads (0: as many as the daemon has rule I/O threads).
    #[arg(long = "floor_threads", default_value_t = 0)]
    floor_threads_wanted: usize,
    /// Internal: run as one of the hostile section's processes.
    #[arg(long = "hostile-role", hide = true)]
    hostile_role: Option<String>,
    #[arg(long = "hostile-sock", hide = true)]
    hostile_sock: Option<PathBuf>,
    #[arg(long = "hostile-netns", hide = true, default_value = "")]
    hostile_netns: String,
    #[arg(long = "hostile-cgroup", hide = true)]
    hostile_cgroup: Option<PathBuf>,
    #[arg(long = "hostile-n", hide = true, default_value_t = 1)]
    hostile_n: usize,
    /// Internal: serve the floor on this socket path (the benchmark starts itself so).
    #[arg(long, hide = true)]
    serve_floor: Option<PathBuf>,
    #[arg(long = "serve_threads", hide = true, default_value_t = 1)]
    serve_threads: usize,
    /// Internal: flood this socket folder (a hostile tenant).
    #[arg(long, hide = true)]
    flood: Option<PathBuf>,
    /// Internal: become a client of this socket folder holding many files.
    #[arg(long = "fat_client", hide = true)]
    fat_client: Option<PathBuf>,
    #[arg(long = "fat_flow", hide = true, default_value_t = 0)]
    fat_flow: usize,
    /// Internal: a lease client of the daemon serving this folder (`reclaim.rs`).
    #[arg(long, hide = true)]
    lease_client: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 40_000)]
    lease_port: i32,
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

fn parse_delay(s: &str) -> Result<Duration, String> {
    format!("add_rule:{s}").parse::<SimDelay>().map(|d| d.by).map_err(|e| e.1.to_string())
}

/// The daemon's rule I/O thread count (one per core): the floor gets as many threads.
fn daemon_workers() -> usize {
    tcpx_rxdm::steering::intake::io_threads(0)
}

fn clk_tck() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
}

/// Pids of the servers we started, for the watchdog.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn sigterm(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
}

/// Output lines of a server and when each arrived.
type Log = Arc<(Mutex<Vec<(Instant, String)>>, Condvar)>;

/// A server process we started: the daemon or the floor.
struct Server {
    child: Child,
    sock: PathBuf,
    dir: tempfile::TempDir,
    log: Log,
}

impl Server {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime of the process, in seconds.
    fn cpu_s(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("server stat");
        let after_comm = &stat[stat.rfind(')').expect("stat comm") + 2..];
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        ticks / clk_tck()
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("server status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl stall::Daemon for Server {
    fn sock(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn http(&self) -> std::net::SocketAddr {
        let line = self
            .logged_line("HTTP endpoints listening", Duration::from_secs(10))
            .expect("HTTP address logged");
        let addr =
            line.split_whitespace().find_map(|w| w.strip_prefix("address=")).expect("address= in the line");
        addr.trim_matches('"').parse().expect("a socket address")
    }

    fn logged(&self, needle: &str, limit: Duration) -> Option<Instant> {
        self.wait_log(needle, limit).map(|(t, _)| t)
    }

    fn sigterm(&self) {
        sigterm(self.pid());
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<Option<i32>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.code());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Server {
    fn wait_log(&self, needle: &str, limit: Duration) -> Option<(Instant, String)> {
        let deadline = Instant::now() + limit;
        let (lines, cv) = &*self.log;
        let mut lines = lines.lock().unwrap();
        loop {
            if let Some(l) = lines.iter().find(|(_, l)| l.contains(needle)) {
                return Some(l.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            lines = cv.wait_timeout(lines, left).unwrap().0;
        }
    }

    fn logged_line(&self, needle: &str, limit: Duration) -> Option<String> {
        self.wait_log(needle, limit).map(|(_, l)| l)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.pid();
        sigterm(pid);
        let _ = self.child.wait();
        CHILDREN.lock().unwrap().retain(|&p| p != pid);
    }
}

/// Spawns `cmd` with stderr or stdout piped and waits for a line containing `ready`;
/// the rest of the output is drained so the server never blocks on a full pipe.
fn spawn_until(
    mut cmd: Command,
    on_stderr: bool,
    ready: &str,
    dir: tempfile::TempDir,
    sock: PathBuf,
) -> Server {
    if on_stderr {
        cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    } else {
        cmd.stdout(Stdio::piped());
    }
    // SAFETY: the closure runs in the forked child before exec and only calls
    // prctl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // The server goes when the benchmark does, even if it is killed.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    CHILDREN.lock().unwrap().push(child.id());
    let out: Box<dyn std::io::Read + Send> = if on_stderr {
        Box::new(child.stderr.take().unwrap())
    } else {
        Box::new(child.stdout.take().unwrap())
    };
    let log: Log = Arc::default();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let (lines, cv) = &*log;
                lines.lock().unwrap().push((Instant::now(), line.clone()));
                cv.notify_all();
                let _ = tx.send(line);
            }
        });
    }
    let mut seen = Vec::new();
    loop {
        match rx.recv() {
            Ok(line) if line.contains(ready) => break,
            Ok(line) => seen.push(line),
            Err(_) => panic!("{cmd:?} exited before ready; its output:\n{}", seen.join("\n")),
        }
    }
    Server { child, sock, dir, log }
}

/// Starts the daemon on sim NICs; returns it and the time from spawn to its ready line.
fn start_daemon(bin: &Path, extra: &[String]) -> (Server, Duration) {
    start_daemon_http(bin, extra, "")
}

/// Like [`start_daemon`], with HTTP on `metrics` (empty: none).
fn start_daemon_http(bin: &Path, extra: &[String], metrics: &str) -> (Server, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(["--gpu_nic_preset=sim", &format!("--metrics_address={metrics}"), "--nomonitor_shutdown"])
        .arg(format!("--uds_path={}", dir.path().display()))
        .args(extra)
        // Per-module filters are RUST_LOG's (--log_level takes one level).
        .env("RUST_LOG", "warn,tcpx_rxdm::daemon=info");
    let sock = dir.path().join("rx_rule_manager");
    let t = Instant::now();
    let s = spawn_until(cmd, true, READY_LINE, dir, sock);
    (s, t.elapsed())
}

/// Clients for warming a server up: the most a run will use (at least 8).
fn warm_clients(clients: &[usize]) -> usize {
    clients.iter().copied().max().unwrap_or(0).max(8)
}

/// Threads the floor runs on: `--floor_threads`, else one per core (at least as
/// many as the daemon's rule I/O threads): the most the machine can do.
static FLOOR_THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn floor_threads() -> usize {
    *FLOOR_THREADS.get().unwrap_or(&cores().max(daemon_workers()))
}

/// Starts this benchmark again as the floor server, in its own process like the daemon.
fn start_floor() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("floor");
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.arg("--serve-floor").arg(&sock).arg(format!("--serve_threads={}", floor_threads()));
    spawn_until(cmd, false, FLOOR_READY, dir, sock)
}

fn serve_floor(sock: &Path, threads: usize) -> ! {
    let ok = frame::encode(&frame::ok()).expect("Ok frame");
    let f = floor::serve(sock, threads, ok).unwrap_or_else(|e| {
        eprintln!("bench: floor on {}: {e}", sock.display());
        std::process::exit(1)
    });
    println!("{FLOOR_READY}");
    std::io::stdout().flush().unwrap();
    // Runs until the benchmark's SIGTERM; the threads only return on an error.
    let e = f.join();
    eprintln!("bench: floor stopped: {e:?}");
    std::process::exit(1)
}

/// Times one run against `server` and records its CPU; merges errors into `errors`.
fn measure(server: &Server, clients: usize, reqs: &Arc<Vec<Vec<u8>>>, errors: &mut Errors) -> Measure {
    let ok = Arc::new(frame::encode(&frame::ok()).unwrap());
    let cpu0 = server.cpu_s();
    let Run { lat, errors: n_err, error_kinds, wall } = drive(&server.sock, clients, reqs, &ok);
    let cpu = server.cpu_s() - cpu0;
    for (k, v) in error_kinds {
        *errors.entry(k).or_default() += v;
    }
    Measure::new(lat, n_err, wall, Some(cpu))
}

type Errors = BTreeMap<String, usize>;

fn nic_targets() -> Vec<Target> {
    (1..=4).map(|n| Target { gpu: None, dst: format!("192.168.{n}.2") }).collect()
}

fn gpu_targets(gpus: &[(&str, &str)]) -> Vec<Target> {
    gpus.iter().map(|(g, d)| Target { gpu: Some(g.to_string()), dst: d.to_string() }).collect()
}

/// Hands out flow numbers a daemon has not seen yet.
struct Flows(usize);

impl Flows {
    fn frames(&mut self, n: usize, targets: &[Target]) -> Arc<Vec<Vec<u8>>> {
        let f = rule_frames(self.0, n, targets);
        self.0 += n;
        Arc::new(f)
    }
}

struct FloorRow {
    clients: usize,
    ours: Measure,
    floor: Measure,
    /// The `--also` builds, in their order.
    also: Vec<Measure>,
}

struct ScaleRow {
    label: &'static str,
    nics: usize,
    m: Measure,
}

struct Report {
    header: String,
    startup: Option<(Duration, Duration, Duration, usize)>,
    rss_idle_kib: Option<u64>,
    rss_rules: Option<(usize, u64, Measure)>,
    rows: Vec<FloorRow>,
    reference: Result<reference::Cost, String>,
    scale: Vec<ScaleRow>,
    stall: Option<Result<stall::Stall, String>>,
    ours_errors: Errors,
    floor_errors: Errors,
}

fn main() {
    let a = Args::parse();
    if let Some(sock) = &a.serve_floor {
        serve_floor(sock, a.serve_threads);
    }
    if let Some(dir) = &a.flood {
        hostile_plain::flood(dir, a.flood_conns, a.flood_threads);
    }
    if let Some(dir) = &a.fat_client {
        hostile_plain::fat_client(dir, a.fat_fds, a.fat_flow);
    }
    if a.floor_threads_wanted > 0 {
        let _ = FLOOR_THREADS.set(a.floor_threads_wanted);
    }
    if let Some(dir) = &a.lease_client {
        reclaim::client_main(dir, a.lease_port);
    }
    if let Some(role) = &a.hostile_role {
        let sock = a.hostile_sock.clone().unwrap_or_default();
        hostile_roles::run(
            role,
            &sock,
            &a.hostile_netns,
            a.hostile_cgroup.as_deref(),
            a.hostile_n,
            SIM_GPUS[0].0,
        );
    }
    if let Some(dir) = &a.target {
        let mut errors = Errors::new();
        let reqs = Flows(0).frames(a.requests, &nic_targets());
        let ok = Arc::new(frame::encode(&frame::ok()).unwrap());
        let run = drive(&dir.join("rx_rule_manager"), a.clients[0], &reqs, &ok);
        errors.extend(run.error_kinds.clone());
        let m = Measure::new(run.lat, run.errors, run.wall, None);
        println!(
            "rate {:.0}/s, p50 {:.1} µs, p99 {:.1} µs, errors {} {errors:?}",
            m.rate,
            us(m.p50),
            us(m.p99),
            m.errors
        );
        return;
    }
    if !a.bin.exists() {
        eprintln!("bench: --bin {}: no such file (cargo build --release first)", a.bin.display());
        std::process::exit(2);
    }
    watchdog(a.timeout_s);
    let started = Instant::now();
    let header = header(&a);
    println!("{header}");
    if a.tenants_only {
        std::process::exit(if tenants_section(&a) { 0 } else { 1 });
    }
    if a.hostile_only {
        std::process::exit(if hostile_section(&a) { 0 } else { 1 });
    }

    let mut r = Report {
        header,
        startup: None,
        rss_idle_kib: None,
        rss_rules: None,
        rows: Vec::new(),
        reference: Err("not run".into()),
        scale: Vec::new(),
        stall: None,
        ours_errors: Errors::new(),
        floor_errors: Errors::new(),
    };

    // 1. Startup to ready.
    if a.startups > 0 {
        let mut t: Vec<Duration> = (0..a.startups).map(|_| start_daemon(&a.bin, &[]).1).collect();
        t.sort();
        let p50 = stats::percentile(&t, 0.5).unwrap();
        println!("startup to ready: p50 {:.2} ms (n={})", us(p50) / 1e3, t.len());
        r.startup = Some((p50, t[0], *t.last().unwrap(), t.len()));
    }

    // 2. Ours against the floor (and any --also builds), interleaved, fresh
    // servers each round, the order rotating from one client count to the next.
    let n_servers = 2 + a.also.len();
    let mut per: BTreeMap<usize, Vec<Vec<Measure>>> = BTreeMap::new();
    let mut also_errors = Errors::new();
    for round in 0..a.rounds as usize {
        let mut servers = vec![start_daemon(&a.bin, &[]).0, start_floor()];
        servers.extend(a.also.iter().map(|b| start_daemon(b, &[]).0));
        let mut flows = Flows(0);
        // Warm them up (page faults, first connections) at the most clients
        // measured: a server's first burst of that many ran at half its rate
        // on 16 cores, the floor's most of all. Not counted.
        let warm = flows.frames(a.requests.clamp(1000, 4000), &nic_targets());
        for s in &servers {
            measure(s, warm_clients(&a.clients), &warm, &mut Errors::new());
        }
        for (ci, &c) in a.clients.iter().enumerate() {
            let reqs = flows.frames(a.requests, &nic_targets());
            let mut got: Vec<Option<Measure>> = vec![None; n_servers];
            for k in 0..n_servers {
                let i = (round + ci + k) % n_servers;
                let errors = match i {
                    0 => &mut r.ours_errors,
                    1 => &mut r.floor_errors,
                    _ => &mut also_errors,
                };
                got[i] = Some(measure(&servers[i], c, &reqs, errors));
            }
            let got: Vec<Measure> = got.into_iter().map(|m| m.expect("every server measured")).collect();
            let (ours, fl) = (&got[0], &got[1]);
            let also: String = got[2..]
                .iter()
                .enumerate()
                .map(|(j, m)| format!(", also{} {:>7.0}/s p50 {:>7.1} µs", j + 1, m.rate, us(m.p50)))
                .collect();
            println!(
                "round {}/{} {c:>3} clients: ours {:>7.0}/s p50 {:>7.1} µs, floor {:>7.0}/s p50 {:>7.1} µs{also}{}",
                round + 1,
                a.rounds,
                ours.rate,
                us(ours.p50),
                fl.rate,
                us(fl.p50),
                err_note(got.iter().map(|m| m.errors).sum())
            );
            let e = per.entry(c).or_insert_with(|| vec![Vec::new(); n_servers]);
            for (i, m) in got.into_iter().enumerate() {
                e[i].push(m);
            }
        }
    }
    for &c in &a.clients {
        let rounds = &per[&c];
        r.rows.push(FloorRow {
            clients: c,
            ours: best(&rounds[0]).unwrap(),
            floor: best(&rounds[1]).unwrap(),
            also: rounds[2..].iter().map(|m| best(m).unwrap()).collect(),
        });
    }
    if !a.also.is_empty() {
        print_also(&a, &r.rows);
        if !also_errors.is_empty() {
            println!("--also builds had errors: {also_errors:?}");
            std::process::exit(1);
        }
    }

    // 3. NIC scaling under a slow add_rule.
    if a.delay_requests > 0 {
        let delay = format!("--sim_delay=add_rule:{}us", a.delay.as_micros());
        let mut four = Vec::new();
        let mut one = Vec::new();
        for round in 0..a.rounds as usize {
            let (daemon, _) = start_daemon(&a.bin, std::slice::from_ref(&delay));
            let mut flows = Flows(0);
            let all = flows.frames(a.delay_requests, &gpu_targets(&SIM_GPUS));
            let nic1 = flows.frames(a.delay_requests, &gpu_targets(&SIM_GPUS[..2]));
            let runs =
                if round % 2 == 0 { [(&all, true), (&nic1, false)] } else { [(&nic1, false), (&all, true)] };
            for (reqs, is_all) in runs {
                let m = measure(&daemon, a.delay_clients, reqs, &mut r.ours_errors);
                println!(
                    "round {}/{} add_rule +{} µs, {} NIC(s): {:.0} rules/s{}",
                    round + 1,
                    a.rounds,
                    a.delay.as_micros(),
                    if is_all { 4 } else { 1 },
                    m.rate,
                    err_note(m.errors)
                );
                if is_all { &mut four } else { &mut one }.push(m);
            }
        }
        r.scale.push(ScaleRow { label: "4 NICs (8 GPUs)", nics: 4, m: best(&four).unwrap() });
        r.scale.push(ScaleRow { label: "1 NIC (its 2 GPUs)", nics: 1, m: best(&one).unwrap() });
    }

    // 3b. No stall: one NIC a second per insert, clients waiting on it.
    if a.stall_samples > 0 {
        let slow = format!("--sim_delay=add_rule:{}ms:eth1", stall::SLOW.as_millis());
        let (mut daemon, _) = start_daemon_http(&a.bin, &[slow], "127.0.0.1:0");
        let m = stall::measure(&mut daemon, a.stall_samples);
        match &m {
            Ok(st) => println!(
                "no stall (eth1 1 s per insert): /healthz p99 {:.2} ms, queue_ids p99 {:.2} ms, eth2 install p99 {:.2} ms (idle {:.2} ms), a killed client's rules removed p50 {:.2} ms, SIGTERM logged after {:.2} ms, exit {:?} after {:.0} ms",
                ms(st.healthz.1),
                ms(st.queue_ids.1),
                ms(st.other_nic_busy.1),
                ms(st.other_nic_idle.1),
                ms(st.reclaim.0),
                ms(st.sigterm_logged),
                st.exit_code,
                ms(st.exited)
            ),
            Err(e) => println!("no-stall run failed: {e}"),
        }
        r.stall = Some(m);
    }

    // 4. Memory: idle, then with `--rules` rules installed.
    {
        let (daemon, _) = start_daemon(&a.bin, &[]);
        std::thread::sleep(Duration::from_millis(200));
        r.rss_idle_kib = Some(daemon.rss_kib());
        if a.rules > 0 {
            let reqs = Flows(0).frames(a.rules, &nic_targets());
            let m = measure(&daemon, 64, &reqs, &mut r.ours_errors);
            println!("{} rules installed at 64 clients: {:.0}/s{}", a.rules, m.rate, err_note(m.errors));
            r.rss_rules = Some((a.rules, daemon.rss_kib(), m));
        }
    }

    // 5. The reference's per-rule cost model.
    r.reference = if a.ethtool_rules > 0 {
        reference::measure(a.ethtool_rules)
    } else {
        Err("skipped (--ethtool-rules 0)".into())
    };
    if let Err(why) = &r.reference {
        println!("reference cost model: {why}");
    }

    let md = render(&r, &a, started.elapsed());
    println!("\n{md}");
    if let Some(path) = &a.write_doc {
        let write = || -> Result<(), String> {
            let doc = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            let new = doc::replace_section(&doc, &md)?;
            std::fs::write(path, new).map_err(|e| e.to_string())
        };
        match write() {
            Ok(()) => println!("wrote the generated section of {}", path.display()),
            Err(e) => {
                eprintln!("bench: --write-doc {}: {e}", path.display());
                std::process::exit(1);
            }
        }
    }
    if a.tenant_requests > 0 && !tenants_section(&a) {
        std::process::exit(1);
    }
    if (a.hostile_seconds > 0 || a.flood_seconds > 0.0) && !hostile_section(&a) {
        std::process::exit(1);
    }
    if !r.ours_errors.is_empty() || !r.floor_errors.is_empty() || matches!(r.stall, Some(Err(_))) {
        std::process::exit(1);
    }
}

/// The tenant checks, with the simulated GPUs' stand-ins held open (and the
/// ones created removed) around them; false on errors.
fn tenants_section(a: &Args) -> bool {
    let stand_ins = tenants::StandIns::hold();
    tenants::run(a, &stand_ins)
}

/// The hostile tenants, with the GPU stand-ins held as for the tenant checks.
fn hostile_section(a: &Args) -> bool {
    let stand_ins = tenants::StandIns::hold();
    let garbled = a.hostile_seconds == 0 || hostile::run(a, &stand_ins);
    let plain = a.flood_seconds <= 0.0 || hostile_plain::run(a);
    garbled && plain
}

/// The rule-path targets against what this run measured.
fn render_targets(w: &mut String, rows: &[FloorRow], rounds: u32) {
    use std::fmt::Write as _;
    let at = |c: usize| rows.iter().find(|r| r.clients == c);
    let mut lines = Vec::new();
    if let Some(r) = at(64) {
        let ratio = r.ours.rate / r.floor.rate;
        lines.push((
            "rate at 64 clients ≥ 0.9 × the floor's".to_string(),
            format!("{ratio:.2} ×"),
            ratio >= 0.9,
        ));
        let spread = us(r.ours.p99) / us(r.ours.p50);
        lines.push(("p99 / p50 at 64 clients ≤ 3".to_string(), format!("{spread:.2}"), spread <= 3.0));
    }
    if let Some(r) = at(1) {
        let extra = us(r.ours.p50) - us(r.floor.p50);
        lines.push((
            "p50 at 1 client within 8 µs of the floor's".to_string(),
            format!("{extra:+.1} µs"),
            extra <= 8.0,
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(w, "\nTargets (2 cores, sim NICs, best of {rounds} interleaved rounds):\n");
    let _ = writeln!(w, "| target | measured | |");
    let _ = writeln!(w, "|---|---:|---|");
    for (what, got, met) in lines {
        let _ = writeln!(w, "| {what} | {got} | {} |", if met { "met" } else { "**missed**" });
    }
}

/// The `--also` comparison: each build's rate and p50 against the floor's and `--bin`'s.
fn print_also(a: &Args, rows: &[FloorRow]) {
    println!("\nbuilds side by side (best of {} interleaved rounds; ratio to the floor):", a.rounds);
    let mut names = vec![format!("--bin {}", a.bin.display())];
    names.extend(a.also.iter().enumerate().map(|(j, b)| format!("also{} {}", j + 1, b.display())));
    for row in rows {
        let all = std::iter::once(&row.ours).chain(&row.also);
        for (name, m) in names.iter().zip(all) {
            println!(
                "  {:>3} clients  {name}: {:>7.0}/s ({:.2}), p50 {:>7.1} µs ({:+.1} µs), p99 {:>7.1} µs, CPU {} µs/rule",
                row.clients,
                m.rate,
                m.rate / row.floor.rate,
                us(m.p50),
                us(m.p50) - us(row.floor.p50),
                us(m.p99),
                cpu(m.cpu_us)
            );
        }
    }
}

fn err_note(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!("  ({n} ERRORS)")
    }
}

fn watchdog(secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        eprintln!("bench: not finished after {secs} s (--timeout-s); a server may hang; stopping");
        for &pid in CHILDREN.lock().unwrap().iter() {
            sigterm(pid);
        }
        tenants::remove_stand_ins();
        std::process::exit(1);
    });
}

fn header(a: &Args) -> String {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load1 = load.split_whitespace().next().unwrap_or("?").to_string();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!(
        "Run of {}: {} cores ({cpu}), kernel {}, load average {load1} at the start; \
         daemon `{}` with {} rule I/O threads, floor with {} threads; \
         `bench {}`; {} round(s).",
        doc::utc_stamp(now),
        cores(),
        kernel.trim(),
        a.bin.display(),
        daemon_workers(),
        floor_threads(),
        args.join(" "),
        a.rounds
    )
}

fn render(r: &Report, a: &Args, took: Duration) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "_Generated by `cargo run --release --example bench -- --write-doc docs/PERFORMANCE.md`; \
         do not edit by hand._\n"
    );
    let _ = writeln!(w, "{}\n", r.header);
    if !r.ours_errors.is_empty() || !r.floor_errors.is_empty() {
        let _ = writeln!(
            w,
            "**ERRORS: some replies were not exactly the `Ok.` frame; the figures are not valid.**\n"
        );
        for (who, errs) in [("ours", &r.ours_errors), ("floor", &r.floor_errors)] {
            for (k, v) in errs {
                let _ = writeln!(w, "- {who}: {v} × {k}");
            }
        }
        let _ = writeln!(w);
    }

    let _ = writeln!(w, "### Rule path against the protocol's floor\n");
    let _ = writeln!(
        w,
        "A new connection per request, {} requests per client count per round, each a new \
         rule (distinct flows, routed by destination over the four sim NICs). The floor \
         accepts, reads one frame, writes the 7-byte `Ok.` frame, reads EOF and closes, \
         nothing else. Each figure is the best of {} rounds on its own (highest rate, \
         lowest latency and CPU); every reply of every round was checked to be exactly the \
         `Ok.` frame. CPU is the server process's user + system time per request, read \
         from /proc in clock ticks: one tick over one run is {:.1} µs per request.\n",
        a.requests,
        a.rounds,
        1e6 / clk_tck() / a.requests as f64
    );
    let _ = writeln!(
        w,
        "| clients | ours rules/s | floor req/s | ours / floor | ours p50 / p99 µs | floor p50 / p99 µs | ours CPU/rule µs | floor CPU/req µs |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &r.rows {
        let (o, f) = (&row.ours, &row.floor);
        let _ = writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {} |",
            row.clients,
            o.rate,
            f.rate,
            o.rate / f.rate,
            us(o.p50),
            us(o.p99),
            us(f.p50),
            us(f.p99),
            cpu(o.cpu_us),
            cpu(f.cpu_us)
        );
    }
    if let Some(row) = r.rows.iter().find(|r| r.clients == 1) {
        let _ = writeln!(
            w,
            "\nSingle client, p50: ours {:.1} µs, floor {:.1} µs: the daemon adds {:.1} µs per request.",
            us(row.ours.p50),
            us(row.floor.p50),
            us(row.ours.p50) - us(row.floor.p50)
        );
    }
    render_targets(w, &r.rows, a.rounds);

    let _ = writeln!(w, "\n### The reference's per-rule cost model\n");
    match &r.reference {
        Ok(c) => {
            let _ = writeln!(
                w,
                "One `sh -c \"ethtool -N eth1 flow-type tcp4 … loc N\"` process per rule, as \
                 `system()` runs it, on a veth in a private network namespace, n={}. veth has no \
                 ntuple support, so the driver refuses each insert; the runs ended with: {}. \
                 This times the mechanism (fork, exec of `sh` and `ethtool`, the ioctl), not a \
                 NIC's firmware.\n",
                c.n, c.outcomes
            );
            let _ = writeln!(w, "| per rule | wall p50 | wall p99 | CPU (sh + ethtool) | rules/s one at a time | rules/s on {} cores, CPU-bound |", cores());
            let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|");
            let _ = writeln!(
                w,
                "| reference model | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} | {:.0} |",
                us(c.p50),
                us(c.p99),
                c.cpu_us,
                1e6 / us(c.mean),
                cores() as f64 * 1e6 / c.cpu_us
            );
            if let Some(row) = r.rows.iter().max_by(|x, y| x.ours.rate.total_cmp(&y.ours.rate)) {
                if let Some(oc) = row.ours.cpu_us {
                    let _ = writeln!(
                        w,
                        "| ours (daemon, at {} clients) | | | {:.1} µs | | {:.0} |",
                        row.clients,
                        oc,
                        cores() as f64 * 1e6 / oc
                    );
                }
            }
        }
        Err(why) => {
            let _ = writeln!(w, "Not measured in this run: {why}.");
        }
    }

    if !r.scale.is_empty() {
        let _ = writeln!(w, "\n### Scaling with NICs under a slow NIC call\n");
        let d = us(a.delay);
        let _ = writeln!(
            w,
            "Every add_rule takes {d:.0} µs longer (`--sim_delay=add_rule:{d:.0}us`); {} \
             clients, {} requests per run, each naming a GPU (`gpu_pci_addr`); best of {} \
             rounds. The ceiling is one rule per delay per NIC, if each NIC's calls run \
             one at a time and NICs run in parallel.\n",
            a.delay_clients, a.delay_requests, a.rounds
        );
        let _ = writeln!(w, "| GPUs used | rules/s | ceiling rules/s | of ceiling | p50 / p99 µs |");
        let _ = writeln!(w, "|---|---:|---:|---:|---:|");
        for s in &r.scale {
            let ceiling = s.nics as f64 * 1e6 / d;
            let _ = writeln!(
                w,
                "| {} | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} |",
                s.label,
                s.m.rate,
                ceiling,
                s.m.rate / ceiling,
                us(s.m.p50),
                us(s.m.p99)
            );
        }
        if let [four, one] = &r.scale[..] {
            let _ = writeln!(
                w,
                "\nFour NICs against one: {:.2}× the rate (4× would be linear).",
                four.m.rate / one.m.rate
            );
        }
    }

    if let Some(st) = &r.stall {
        let _ = writeln!(w, "\n### Nothing waits for a slow NIC\n");
        match st {
            Ok(st) => {
                let _ = writeln!(
                    w,
                    "eth1 takes {} s per insert (`--sim_delay=add_rule:{}ms:eth1`) and {} clients keep \
                     it busy, each waiting for its answer; meanwhile, {} samples of each figure below. \
                     eth1 completed {} of those clients' inserts before the SIGTERM, about one a \
                     second. `tests/no_stall.rs` asserts the order, not these times: with eth1's insert \
                     held until the test lets it go, every other request is answered and SIGTERM \
                     logged first.\n",
                    stall::SLOW.as_secs(),
                    stall::SLOW.as_millis(),
                    stall::HAMMERS,
                    a.stall_samples,
                    st.slow_replies
                );
                let _ = writeln!(w, "| while eth1 is busy | p50 | p99 |");
                let _ = writeln!(w, "|---|---:|---:|");
                let row = |w: &mut String, what: &str, v: &stall::P50P99| {
                    let _ = writeln!(w, "| {what} | {:.2} ms | {:.2} ms |", ms(v.0), ms(v.1));
                };
                row(w, "`/healthz` (a new TCP connection each)", &st.healthz);
                row(w, "`queue_ids_by_gpu` (one connection)", &st.queue_ids);
                row(w, "install on eth2 (a new connection each)", &st.other_nic_busy);
                row(w, "the same before eth1 was made busy", &st.other_nic_idle);
                let what = format!(
                    "a killed client's {} rules on eth2 removed (SIGKILL → `/metrics` shows them reclaimed), {} clients",
                    reclaim::RULES,
                    a.stall_samples.clamp(1, 20)
                );
                row(w, &what, &st.reclaim);
                let _ =
                    writeln!(w, "| SIGTERM → `shutting down` logged | {:.2} ms | |", ms(st.sigterm_logged));
                let _ = writeln!(
                    w,
                    "| SIGTERM → exit (code {}), a {} s insert in flight | {:.0} ms | |",
                    st.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "none: killed".into()),
                    stall::SLOW.as_secs(),
                    ms(st.exited)
                );
            }
            Err(e) => {
                let _ = writeln!(w, "**The run failed: {e}.**");
            }
        }
    }

    let _ = writeln!(w, "\n### Startup and memory\n");
    let _ = writeln!(w, "| measure | result | target |");
    let _ = writeln!(w, "|---|---|---|");
    if let Some((p50, min, max, n)) = r.startup {
        let _ = writeln!(
            w,
            "| startup to ready (spawn → ready line), p50 of {n} | {:.1} ms (min {:.1}, max {:.1}) | ≤ 50 ms |",
            us(p50) / 1e3,
            us(min) / 1e3,
            us(max) / 1e3
        );
    }
    if let Some(k) = r.rss_idle_kib {
        let _ = writeln!(w, "| RSS idle | {:.1} MiB | ≤ 16 MiB |", k as f64 / 1024.0);
    }
    if let Some((n, k, m)) = &r.rss_rules {
        let _ = writeln!(
            w,
            "| RSS with {n} rules installed | {:.1} MiB | ≤ 32 MiB (100 000 rules) |",
            *k as f64 / 1024.0
        );
        let _ = writeln!(w, "| install rate while filling, 64 clients, one run | {:.0} rules/s | |", m.rate);
    }
    if let Some(row) = r.rows.iter().find(|r| r.clients == 1) {
        let _ = writeln!(
            w,
            "| install latency, 1 client, p50 / p99 (best of {}) | {:.1} µs / {:.1} µs | ≤ 50 µs / ≤ 250 µs |",
            a.rounds,
            us(row.ours.p50),
            us(row.ours.p99)
        );
    }
    if let Some(row) = r.rows.iter().find(|r| r.clients == 64) {
        let _ = writeln!(
            w,
            "| install rate, 64 clients (best of {}) | {:.0} rules/s | ≥ 50 000 rules/s |",
            a.rounds, row.ours.rate
        );
    }
    let _ = writeln!(w, "\nThe whole run took {:.0} s.", took.as_secs_f64());
    s
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn cpu(v: Option<f64>) -> String {
    v.map(|c| format!("{c:.1}")).unwrap_or_else(|| "-".into())
}
