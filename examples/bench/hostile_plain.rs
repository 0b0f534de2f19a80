//! Hostile cases of the rule intake: one tenant trying to slow another with
//! plain requests or with many open files (part of the hostile section,
//! after `hostile.rs`'s; `--flood_seconds 0` skips them). Each daemon build
//! (`--bin`, every `--also`) gets a fresh daemon per round, the builds
//! interleaved.
//!
//! - flood: a victim (this process, one thread) installs and removes IPv4
//!   rules in pairs, a new connection per request, first alone, then while
//!   another tenant (a child process in a cgroup of its own) keeps
//!   `--flood_conns` connections busy with plain IPv4 installs. The victim's
//!   pairs per second and p99 during the flood against its own alone.
//! - new clients with many open files: the victim installs in a loop while
//!   `--fat_clients` new processes, each holding `--fat_fds` descriptors,
//!   send their first request at once (their tenant is read then). The
//!   victim's worst install in that window against its worst alone.

use std::io::{BufRead, BufReader, Write as _};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use tcpx_rxdm::wire::client::rule_request;
use tcpx_rxdm::wire::frame;

use crate::load::one;
use crate::stats::{percentile, us};
use crate::{start_daemon, Args, Server};

/// A cgroup v2 folder made for a child process, removed when dropped.
pub struct Cgroup(PathBuf);

impl Cgroup {
    /// `<cgroup2 mount>/tcpx-bench-<pid>-<name>`; needs root and cgroup v2.
    pub fn make(name: &str) -> Result<Cgroup, String> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").map_err(|e| e.to_string())?;
        let root = tcpx_rxdm::identity::tenant::cgroup2_mount(&mounts).ok_or("no cgroup2 mount")?;
        let dir = root.join(format!("tcpx-bench-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Cgroup(dir))
    }

    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once its processes are gone (reaped by then).
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn install_frame(flow: usize) -> Vec<u8> {
    let src = format!("10.{}.{}.{}", 200 + (flow >> 16) % 50, (flow >> 8) & 0xff, flow & 0xff);
    let dst = format!("192.168.{}.2", 1 + flow % 4);
    let req = rule_request(1, (&src, 40000 + (flow % 20000) as i32), (&dst, 5000), None, None);
    frame::encode(&req).expect("a rule request fits a frame")
}

/// A child of this benchmark (`--flood` or `--fat_client`), killed when dropped.
struct Helper {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Helper {
    fn start(args: &[String]) -> Helper {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a helper process");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Helper { stdin: child.stdin.take(), child, lines }
    }

    fn expect(&self, prefix: &str, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Some(l),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    fn go(&mut self) {
        let _ = self.stdin.as_mut().map(|s| s.write_all(b"go\n"));
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Child: `--flood DIR`. Opens `conns` connections to DIR's rule socket and,
/// on `threads` threads, keeps each one busy: an install of its own flow,
/// its reply, the next. Prints `flooding` once every connection had a reply.
pub fn flood(dir: &Path, conns: usize, threads: usize) -> ! {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..threads.max(1))
        .map(|t| {
            let (sock, started) = (dir.join("rx_rule_manager"), started.clone());
            let mine: Vec<usize> = (t..conns).step_by(threads.max(1)).collect();
            std::thread::spawn(move || flood_thread(&sock, &mine, &started))
        })
        .collect();
    while started.load(Ordering::Relaxed) < conns {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("flooding");
    for h in handles {
        let _ = h.join();
    }
    std::process::exit(0)
}

fn flood_thread(sock: &Path, flows: &[usize], started: &std::sync::atomic::AtomicUsize) {
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
    let mut conns: Vec<(UnixStream, Vec<u8>, Vec<u8>, bool)> = Vec::new();
    for (i, &flow) in flows.iter().enumerate() {
        let s = UnixStream::connect(sock).expect("a flood connection");
        s.set_nonblocking(true).unwrap();
        ep.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64)).unwrap();
        let req = install_frame(1_000_000 + flow);
        send_all(&s, &req);
        conns.push((s, req, Vec::new(), false));
    }
    let mut events = vec![EpollEvent::empty(); 256];
    let mut buf = [0u8; 4096];
    loop {
        let n = ep.wait(&mut events, 1000u16).unwrap_or(0);
        for ev in &events[..n] {
            let (s, req, got, seen) = &mut conns[ev.data() as usize];
            match nix::unistd::read(s.as_fd(), &mut buf) {
                Ok(0) => return,
                Ok(k) => got.extend_from_slice(&buf[..k]),
                Err(_) => continue,
            }
            while let Some(end) =
                frame::body_len(got).map(|b| frame::HEADER_LEN + b).filter(|&e| got.len() >= e)
            {
                got.drain(..end);
                if !*seen {
                    *seen = true;
                    started.fetch_add(1, Ordering::Relaxed);
                }
                send_all(s, req);
            }
        }
    }
}

fn send_all(s: &UnixStream, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match nix::unistd::write(s.as_fd(), bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EAGAIN) => std::thread::yield_now(),
            Err(_) => return,
        }
    }
}

/// Child: `--fat_client DIR`. Holds `fds` descriptors (dups of /dev/null),
/// prints `ready`, waits for a line, sends one install to DIR's rule socket
/// (its first request: the daemon reads its tenant now) and prints
/// `took MICROSECONDS ok|<what came>`; then waits for stdin to close.
pub fn fat_client(dir: &Path, fds: usize, flow: usize) -> ! {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit for getrlimit to write, then for setrlimit to read.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    let mut held = 0;
    while held < fds {
        // SAFETY: dup of a descriptor we own; the copies stay open until exit.
        if unsafe { libc::dup(null.as_raw_fd()) } < 0 {
            break;
        }
        held += 1;
    }
    println!("ready {held}");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let ok = frame::encode(&frame::ok()).unwrap();
    let t = Instant::now();
    let got = one(&dir.join("rx_rule_manager"), &install_frame(2_000_000 + flow), &ok);
    println!("took {:.0} {}", us(t.elapsed()), got.err().unwrap_or_else(|| "ok".into()));
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(0)
}

/// A victim run: its requests' start times and latencies, and its errors.
#[derive(Default)]
struct Victim {
    samples: Vec<(Instant, Duration)>,
    errors: usize,
}

impl Victim {
    /// Requests (`pairs`: install then uninstall of each flow) from one
    /// thread until `stop`, flows from `first` on.
    fn run(dir: &Path, first: usize, pairs: bool, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Victim> {
        let dir = dir.to_path_buf();
        std::thread::spawn(move || {
            let ok = frame::encode(&frame::ok()).unwrap();
            let (install, uninstall) = (dir.join("rx_rule_manager"), dir.join("rx_rule_uninstall"));
            let mut v = Victim::default();
            let mut flow = first;
            while !stop.load(Ordering::Relaxed) {
                let req = install_frame(flow);
                flow += 1;
                let socks: &[&PathBuf] = if pairs { &[&install, &uninstall] } else { &[&install] };
                for sock in socks {
                    let t = Instant::now();
                    match one(sock, &req, &ok) {
                        Ok(()) => v.samples.push((t, t.elapsed())),
                        Err(_) => v.errors += 1,
                    }
                }
            }
            v
        })
    }

    /// Latencies of the requests started in `[from, to)`, sorted.
    fn within(&self, from: Instant, to: Instant) -> Vec<Duration> {
        let mut l: Vec<Duration> =
            self.samples.iter().filter(|(t, _)| *t >= from && *t < to).map(|(_, d)| *d).collect();
        l.sort_unstable();
        l
    }
}

/// One build's figures in one round.
#[derive(Debug, Clone, Default)]
pub struct Round {
    /// Victim pairs per second, alone and under the flood.
    pub pairs_alone: f64,
    pub pairs_flood: f64,
    pub p99_alone: Duration,
    pub p99_flood: Duration,
    /// The control: victim pairs per second and p99 while the same flood
    /// goes to a second daemon of the same build (what the machine's cores,
    /// shared with the flood, leave the victim whatever the daemon does).
    pub pairs_elsewhere: f64,
    pub p99_elsewhere: Duration,
    /// Daemon threads and RSS growth (KiB) under the flood.
    pub threads: u64,
    pub rss_growth_kib: i64,
    /// The victim's worst install alone and while the new clients came.
    pub worst_alone: Duration,
    pub worst_fat: Duration,
    /// The new clients' own first requests, slowest.
    pub fat_slowest: Duration,
    pub errors: usize,
}

fn status_field(pid: u32, name: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A flooder (`--flood`) against `dir`, in `cgroup`, once every connection had an answer.
fn start_flooder(a: &Args, dir: &Path, cgroup: Option<&Cgroup>) -> Option<Helper> {
    let mut flooder = Helper::start(&[
        "--flood".into(),
        dir.display().to_string(),
        format!("--flood_conns={}", a.flood_conns),
        format!("--flood_threads={}", a.flood_threads),
    ]);
    if let Some(cg) = cgroup {
        cg.add(flooder.child.id()).expect("move the flooder into its cgroup");
    }
    flooder.go();
    if flooder.expect("flooding", Duration::from_secs(30)).is_none() {
        println!("flood: the flooder did not get going in 30 s");
        return None;
    }
    Some(flooder)
}

/// The flood case against `daemon`; `cgroup`: where the flooder goes;
/// `elsewhere`: a second daemon of the same build, flooded for the control.
fn flood_case(a: &Args, daemon: &Server, elsewhere: &Server, cgroup: Option<&Cgroup>, r: &mut Round) {
    let dir = daemon.dir.path();
    let secs = Duration::from_secs_f64(a.flood_seconds);
    let pairs = |first, span| {
        let stop = Arc::new(AtomicBool::new(false));
        let h = Victim::run(dir, first, true, stop.clone());
        std::thread::sleep(span);
        stop.store(true, Ordering::Relaxed);
        h.join().expect("victim")
    };
    let alone = pairs(0, secs);
    let rss0 = status_field(daemon.pid(), "VmRSS:") as i64;
    let Some(flooder) = start_flooder(a, dir, cgroup) else {
        r.errors += 1;
        return;
    };
    let under = pairs(100_000, secs);
    r.threads = status_field(daemon.pid(), "Threads:");
    r.rss_growth_kib = status_field(daemon.pid(), "VmRSS:") as i64 - rss0;
    drop(flooder);
    let Some(flooder) = start_flooder(a, elsewhere.dir.path(), cgroup) else {
        r.errors += 1;
        return;
    };
    let control = pairs(300_000, secs);
    drop(flooder);
    let rate = |v: &Victim, s: Duration| v.samples.len() as f64 / 2.0 / s.as_secs_f64();
    let p99 = |v: &Victim| {
        let mut l: Vec<Duration> = v.samples.iter().map(|s| s.1).collect();
        l.sort_unstable();
        percentile(&l, 0.99).unwrap_or_default()
    };
    (r.pairs_alone, r.pairs_flood, r.pairs_elsewhere) =
        (rate(&alone, secs), rate(&under, secs), rate(&control, secs));
    (r.p99_alone, r.p99_flood, r.p99_elsewhere) = (p99(&alone), p99(&under), p99(&control));
    r.errors += alone.errors + under.errors + control.errors;
}

/// The new-clients case against `daemon`; `cgroup`: where the new clients go
/// (another tenant than the victim's).
fn fat_case(a: &Args, daemon: &Server, cgroup: Option<&Cgroup>, r: &mut Round) {
    let dir = daemon.dir.path();
    let stop = Arc::new(AtomicBool::new(false));
    let victim = Victim::run(dir, 200_000, false, stop.clone());
    let t0 = Instant::now();
    let mut fat: Vec<Helper> = (0..a.fat_clients)
        .map(|i| {
            Helper::start(&[
                "--fat_client".into(),
                dir.display().to_string(),
                format!("--fat_fds={}", a.fat_fds),
                format!("--fat_flow={i}"),
            ])
        })
        .collect();
    for h in &fat {
        if h.expect("ready", Duration::from_secs(30)).is_none() {
            r.errors += 1;
        }
        // Not connected yet: it becomes a client of that tenant.
        if let Some(cg) = cgroup {
            cg.add(h.child.id()).expect("move a new client into its cgroup");
        }
    }
    // The victim alone for a while before the new clients go.
    let until = t0 + Duration::from_secs_f64(a.flood_seconds / 3.0);
    if let Some(d) = until.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
    let go = Instant::now();
    for h in &mut fat {
        h.go();
    }
    for h in &fat {
        match h.expect("took", Duration::from_secs(30)) {
            Some(l) => {
                let took: f64 = l.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
                r.fat_slowest = r.fat_slowest.max(Duration::from_micros(took as u64));
                if !l.ends_with(" ok") {
                    println!("new client: {l}");
                    r.errors += 1;
                }
            }
            None => r.errors += 1,
        }
    }
    let end = Instant::now() + Duration::from_millis(50);
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let v = victim.join().expect("victim");
    drop(fat);
    r.worst_alone = v.within(t0, go).last().copied().unwrap_or_default();
    r.worst_fat = v.within(go, end).last().copied().unwrap_or_default();
    r.errors += v.errors;
}

/// Runs the section: every build, `--rounds` rounds, interleaved; false on errors.
pub fn run(a: &Args) -> bool {
    let mut builds = vec![a.bin.clone()];
    builds.extend(a.also.iter().cloned());
    let cgroup = match Cgroup::make("flood") {
        Ok(c) => Some(c),
        Err(e) => {
            println!(
                "hostile: no cgroup of its own for the flooder ({e}): the daemons run with \
                 --tenant_isolation=off, so that it is another client (turns by process)"
            );
            None
        }
    };
    // The new clients: a tenant of their own too, where the flooder has one.
    let fat_cgroup = cgroup.as_ref().and_then(|_| Cgroup::make("fat").ok());
    let extra: Vec<String> = match cgroup {
        Some(_) => Vec::new(),
        None => vec!["--tenant_isolation=off".into()],
    };
    println!(
        "\nhostile cases: flood from {} connections ({} threads), {} new clients with {} open files each; {} s per part",
        a.flood_conns, a.flood_threads, a.fat_clients, a.fat_fds, a.flood_seconds
    );
    let mut per: Vec<Vec<Round>> = vec![Vec::new(); builds.len()];
    for round in 0..a.rounds as usize {
        for k in 0..builds.len() {
            let i = (round + k) % builds.len();
            let (daemon, _) = start_daemon(&builds[i], &extra);
            let (elsewhere, _) = start_daemon(&builds[i], &extra);
            // The victim's process is known (its lease and tenant) before anything is timed.
            let stop = Arc::new(AtomicBool::new(false));
            let warm = Victim::run(daemon.dir.path(), 900_000, true, stop.clone());
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::Relaxed);
            let _ = warm.join();
            let mut r = Round::default();
            flood_case(a, &daemon, &elsewhere, cgroup.as_ref(), &mut r);
            drop(elsewhere);
            fat_case(a, &daemon, fat_cgroup.as_ref(), &mut r);
            println!(
                "round {}/{} {}: pairs/s {:.0} alone, {:.0} flooded ({:.2}), {:.0} with the flood on \
                 another daemon ({:.2}); p99 {:.2} / {:.2} / {:.2} ms; {} threads, RSS +{} KiB; \
                 worst install {:.2} ms alone, {:.2} ms with new clients (theirs {:.1} ms){}",
                round + 1,
                a.rounds,
                builds[i].display(),
                r.pairs_alone,
                r.pairs_flood,
                r.pairs_flood / r.pairs_alone,
                r.pairs_elsewhere,
                r.pairs_elsewhere / r.pairs_alone,
                ms(r.p99_alone),
                ms(r.p99_flood),
                ms(r.p99_elsewhere),
                r.threads,
                r.rss_growth_kib,
                ms(r.worst_alone),
                ms(r.worst_fat),
                ms(r.fat_slowest),
                crate::err_note(r.errors)
            );
            per[i].push(r);
        }
    }
    print!("{}", table(&builds, &per, a.rounds));
    per.iter().flatten().all(|r| r.errors == 0)
}

fn ms(d: Duration) -> f64 {
    us(d) / 1e3
}

/// The median of `v` (by `total_cmp`).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The summary: per build, the median over rounds of each ratio and figure.
pub fn table(builds: &[PathBuf], per: &[Vec<Round>], rounds: u32) -> String {
    use std::fmt::Write as _;
    let mut w = format!(
        "\nhostile cases, median of {rounds} interleaved rounds (each ratio taken within its round):\n\
         | build | victim pairs/s alone | flooded ÷ alone | flood on another daemon ÷ alone | \
         victim p99 alone / flooded / flood elsewhere ms | daemon threads | \
         worst install alone / with new clients ms | ÷ | new clients' first request ms |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (b, rs) in builds.iter().zip(per) {
        let m = |f: &dyn Fn(&Round) -> f64| median(rs.iter().map(f).collect());
        let _ = writeln!(
            w,
            "| `{}` | {:.0} | {:.2} | {:.2} | {:.2} / {:.2} / {:.2} | {:.0} | {:.2} / {:.2} | {:.1} | {:.1} |",
            b.display(),
            m(&|r| r.pairs_alone),
            m(&|r| r.pairs_flood / r.pairs_alone),
            m(&|r| r.pairs_elsewhere / r.pairs_alone),
            m(&|r| ms(r.p99_alone)),
            m(&|r| ms(r.p99_flood)),
            m(&|r| ms(r.p99_elsewhere)),
            m(&|r| r.threads as f64),
            m(&|r| ms(r.worst_alone)),
            m(&|r| ms(r.worst_fat)),
            m(&|r| ms(r.worst_fat) / ms(r.worst_alone)),
            m(&|r| ms(r.fat_slowest)),
        );
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_frames_are_distinct_ipv4_rules_routed_by_destination() {
        use tcpx_rxdm::wire::proto::unix_socket_proto::Payload;
        let frames: Vec<Vec<u8>> = (0..70_000).step_by(997).map(install_frame).collect();
        let distinct: std::collections::HashSet<_> = frames.iter().collect();
        assert_eq!(distinct.len(), frames.len());
        let (msg, used) = frame::parse(&frames[3]).unwrap().unwrap();
        assert_eq!(used, frames[3].len());
        let Some(Payload::FlowSteerRuleRequest(r)) = msg.payload else { panic!("not a rule request") };
        assert_eq!(r.gpu_pci_addr, None);
        let n = r.flow_steer_ntuple.unwrap();
        assert_eq!(n.flow_type, Some(1));
        assert!(n.dst.unwrap().ip_address.unwrap().starts_with("192.168."));
    }

    #[test]
    fn the_summary_takes_each_ratio_within_its_round() {
        let r = |alone: f64, flooded: f64| Round {
            pairs_alone: alone,
            pairs_flood: flooded,
            worst_alone: Duration::from_millis(2),
            worst_fat: Duration::from_millis(6),
            ..Round::default()
        };
        let t = table(&[PathBuf::from("a")], &[vec![r(100.0, 60.0), r(200.0, 100.0), r(50.0, 40.0)]], 3);
        assert!(t.contains("| `a` | 100 | 0.60 | 0.00 |"), "{t}");
        assert!(t.contains("| 2.00 / 6.00 | 3.0 |"), "{t}");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn a_victim_counts_only_the_requests_started_in_a_window() {
        let t0 = Instant::now();
        let v = Victim {
            samples: (0..10)
                .map(|i| (t0 + Duration::from_millis(i), Duration::from_micros(100 + i)))
                .collect(),
            errors: 0,
        };
        let w = v.within(t0 + Duration::from_millis(3), t0 + Duration::from_millis(6));
        assert_eq!(w, [103, 104, 105].map(Duration::from_micros));
    }
}
