//! The tenant-checks section: the daemon's `--tenant_isolation` modes against
//! each other and against the protocol's floor, in two loads:
//! - `fake`: flows that do not exist (made-up IPv4 addresses, a GPU named), as
//!   the other sections send. `audit` looks each flow up, finds nothing and
//!   counts a refusal; `enforce` refuses every one, so it is not measured.
//! - `loopback`: real TCP connections of the benchmark's own on 127.0.0.1,
//!   opened before the timed run ([`Pool`]). Every check passes, so every mode
//!   answers `Ok.`, and the difference between modes is what the checks cost.
//!
//! In `audit` and `enforce` the daemon also checks that the client holds the
//! named GPU's device node open for reading and writing; for simulated GPUs a regular file at
//! `/dev/nvidia<N>` of the client's root stands in for it ([`StandIns`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tcpx_rxdm::wire::client::rule_request;
use tcpx_rxdm::wire::frame;

use crate::stats::{best, us, Measure};
use crate::{err_note, gpu_targets, measure, start_daemon, start_floor, Args, Errors, Flows, SIM_GPUS};

const FAKE: &str = "fake";
const LOOPBACK: &str = "loopback";
const ENFORCE: &str = "enforce";
const OFF: &str = "off";

/// Stand-ins created and not removed yet (path, inode), for the watchdog's exit.
static CREATED: Mutex<Vec<(PathBuf, u64)>> = Mutex::new(Vec::new());

/// The simulated GPUs' device-node stand-ins (`/dev/nvidia<N>`, N the GPU's
/// place in `SIM_GPUS`), held open while this lives. Only files it creates
/// are used; an existing one is left alone. Those it created are removed
/// when it is dropped.
pub struct StandIns {
    /// Each file created, held open, with its path and inode.
    held: Vec<(File, (PathBuf, u64))>,
    /// Why not every GPU's stand-in is held, if so.
    pub missing: Option<String>,
}

impl StandIns {
    /// Creates and holds `/dev/nvidia0..7`, when running as root.
    pub fn hold() -> StandIns {
        if !nix::unistd::geteuid().is_root() {
            return StandIns { held: Vec::new(), missing: Some("not root".into()) };
        }
        StandIns::hold_in(Path::new("/dev"))
    }

    fn hold_in(dir: &Path) -> StandIns {
        let mut s = StandIns { held: Vec::new(), missing: None };
        for n in 0..SIM_GPUS.len() {
            let path = dir.join(format!("nvidia{n}"));
            // O_EXCL: an existing file (or link) of that name is never opened.
            // Held for reading and writing, as CUDA holds its device nodes.
            let opened =
                std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path);
            match opened.and_then(|f| Ok((f.metadata()?.ino(), f))) {
                Ok((ino, f)) => {
                    CREATED.lock().unwrap().push((path.clone(), ino));
                    s.held.push((f, (path, ino)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    s.missing.get_or_insert(format!("{} exists; left alone", path.display()));
                }
                Err(e) => _ = s.missing.get_or_insert(format!("cannot create {}: {e}", path.display())),
            }
        }
        s
    }

    /// Whether every simulated GPU's stand-in is held.
    pub fn held(&self) -> bool {
        self.missing.is_none()
    }
}

impl Drop for StandIns {
    fn drop(&mut self) {
        let mut all = CREATED.lock().unwrap();
        for (_, c) in self.held.drain(..) {
            remove_if_ours(&c);
            all.retain(|x| *x != c);
        }
    }
}

/// Removes the stand-ins created and still there (the watchdog's exit path).
pub fn remove_stand_ins() {
    for c in CREATED.lock().unwrap().drain(..) {
        remove_if_ours(&c);
    }
}

/// Removes `path` if it is still the file created (same inode).
fn remove_if_ours((path, ino): &(PathBuf, u64)) {
    if path.symlink_metadata().is_ok_and(|m| m.ino() == *ino && m.is_file()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Real TCP connections of this process on 127.0.0.1 and a rule request for
/// each one's flow: `src` the connecting end, `dst` the accepted end's local
/// address, a GPU of `gpus` round-robin. Open until dropped, then reset
/// (`SO_LINGER` {on, 0}): no TIME_WAIT, so rounds do not run out of ports.
pub struct Pool {
    /// (connecting end, accepted end).
    conns: Vec<(TcpStream, TcpStream)>,
    pub frames: Arc<Vec<Vec<u8>>>,
}

impl Pool {
    pub fn open(listener: &TcpListener, n: usize, gpus: &[(&str, &str)]) -> std::io::Result<Pool> {
        let to = listener.local_addr()?;
        // Built in place, so that what was opened is reset on an error too.
        let mut pool = Pool { conns: Vec::with_capacity(n), frames: Arc::default() };
        let mut frames = Vec::with_capacity(n);
        for i in 0..n {
            let client = TcpStream::connect(to)?;
            let (accepted, peer) = listener.accept()?;
            let local = accepted.local_addr()?;
            pool.conns.push((client, accepted));
            let [src, dst] = [peer, local].map(|a| (a.ip().to_string(), i32::from(a.port())));
            let req = rule_request(1, (&src.0, src.1), (&dst.0, dst.1), Some(gpus[i % gpus.len()].0), None);
            frames.push(frame::encode(&req).expect("a rule request fits a frame"));
        }
        pool.frames = Arc::new(frames);
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for (a, b) in self.conns.drain(..) {
            reset_on_close(&a);
            reset_on_close(&b);
        }
    }
}

/// `SO_LINGER` {on, 0}: closing sends an RST and leaves no TIME_WAIT.
fn reset_on_close(s: &TcpStream) {
    let zero = libc::linger { l_onoff: 1, l_linger: 0 };
    let _ = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::Linger, &zero);
}

/// Raises `RLIMIT_NOFILE`'s soft limit to the hard one; returns the limit in force.
fn raise_nofile() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit for getrlimit to write.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    let want = if r.rlim_max == libc::RLIM_INFINITY { 1 << 20 } else { r.rlim_max };
    if r.rlim_cur < want {
        let new = libc::rlimit { rlim_cur: want, rlim_max: r.rlim_max };
        // SAFETY: `new` is a valid rlimit for setrlimit to read.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            r.rlim_cur = want;
        }
    }
    r.rlim_cur
}

/// Connections a loopback pool may hold under `nofile` descriptors: two
/// each, 1000 left for everything else.
pub fn pool_cap(nofile: u64) -> usize {
    usize::try_from(nofile.saturating_sub(1000) / 2).unwrap_or(usize::MAX)
}

/// Why `mode` is not measured under `load`, if it is not.
pub fn skipped(mode: &str, load: &str, stand_ins_held: bool) -> Option<&'static str> {
    match mode {
        ENFORCE if load == FAKE => Some("every request is refused"),
        ENFORCE if !stand_ins_held => Some("GPU stand-ins not held"),
        _ => None,
    }
}

/// A mode's figures against the floor's and `off`'s (if `off` was measured).
#[derive(Debug, PartialEq)]
pub struct Versus {
    /// Rate ÷ the floor's rate.
    pub floor: f64,
    /// Rate ÷ `off`'s rate.
    pub off: Option<f64>,
    /// p50 − `off`'s p50, in µs.
    pub p50_off_us: Option<f64>,
}

pub fn versus(m: &Measure, floor: &Measure, off: Option<&Measure>) -> Versus {
    Versus {
        floor: m.rate / floor.rate,
        off: off.map(|o| m.rate / o.rate),
        p50_off_us: off.map(|o| us(m.p50) - us(o.p50)),
    }
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

/// The summary of one load and client count: a row per server (the floor first).
pub fn table(title: &str, names: &[String], got: &[Option<Measure>], why: &[Option<&str>]) -> String {
    use std::fmt::Write as _;
    let mut w = format!("\n{title}\n");
    w += "| server | req/s | p50 µs | p99 µs | ÷ floor | ÷ off | p50 − off µs | CPU/req µs | errors |\n";
    w += "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    let Some(floor) = got.first().and_then(Option::as_ref) else {
        return w + "(the floor was not measured)\n";
    };
    let off = names.iter().position(|n| n == OFF).and_then(|i| got[i].as_ref());
    for (i, name) in names.iter().enumerate() {
        let Some(m) = &got[i] else {
            let _ = writeln!(w, "| {name} | skipped: {} | | | | | | | |", why[i].unwrap_or("not measured"));
            continue;
        };
        let v = versus(m, floor, off);
        let _ = writeln!(
            w,
            "| {name} | {:.0} | {:.1} | {:.1} | {:.2} | {} | {} | {} | {} |",
            m.rate,
            us(m.p50),
            us(m.p99),
            v.floor,
            or_dash(v.off.map(|x| format!("{x:.2}"))),
            or_dash(v.p50_off_us.map(|x| format!("{x:+.1}"))),
            or_dash(m.cpu_us.map(|x| format!("{x:.1}"))),
            m.errors
        );
    }
    w
}

/// Runs the section; false if any reply of a measured run was not `Ok.`.
pub fn run(a: &Args, stand_ins: &StandIns) -> bool {
    let (modes, loads) = (a.tenant_modes.join(","), a.tenant_loads.join(","));
    println!(
        "\ntenant checks: --tenant_isolation {modes} against the floor; loads {loads}; clients {:?}",
        a.tenant_clients
    );
    if a.tenant_requests == 0 {
        println!("tenant checks: skipped (--tenant_requests 0)");
        return true;
    }
    let nofile = raise_nofile();
    let cap = pool_cap(nofile);
    let loads: Vec<(&str, usize)> = a
        .tenant_loads
        .iter()
        .map(|l| (l.as_str(), if l == LOOPBACK { a.tenant_requests.min(cap) } else { a.tenant_requests }))
        .collect();
    if loads.iter().any(|l| l.0 == LOOPBACK) && cap < a.tenant_requests {
        println!(
            "loopback: {cap} requests per run, not {}: (fd limit {nofile} − 1000) / 2 connections",
            a.tenant_requests
        );
    }
    match &stand_ins.missing {
        None => println!("GPU stand-ins: /dev/nvidia0..{} created and held open", SIM_GPUS.len() - 1),
        Some(why) => println!(
            "GPU stand-ins: not held ({why}): audit counts every request as a GPU refusal; enforce skipped"
        ),
    }
    if a.tenant_modes.iter().any(|m| m == ENFORCE) && loads.iter().any(|l| l.0 == FAKE) {
        println!("enforce: skipped for fake flows (every request is refused)");
    }
    let mut names = vec!["floor".to_string()];
    names.extend(a.tenant_modes.iter().cloned());
    let why: Vec<Vec<Option<&str>>> =
        loads.iter().map(|(l, _)| names.iter().map(|m| skipped(m, l, stand_ins.held())).collect()).collect();
    // (load, clients) → per server, the rounds; per load, per server, the errors.
    let mut per: BTreeMap<(usize, usize), Vec<Vec<Measure>>> = BTreeMap::new();
    let mut errors = vec![vec![Errors::new(); names.len()]; loads.len()];
    let gpus = gpu_targets(&SIM_GPUS);
    for round in 0..a.rounds as usize {
        let mut servers = vec![start_floor()];
        servers.extend(
            a.tenant_modes.iter().map(|m| start_daemon(&a.bin, &[format!("--tenant_isolation={m}")]).0),
        );
        let mut flows = Flows(0);
        // Warm them up (page faults, first connections, the client's tenant)
        // at the most clients measured; not counted.
        let warm = flows.frames(a.tenant_requests.clamp(1000, 4000), &gpus);
        for s in &servers {
            measure(s, crate::warm_clients(&a.tenant_clients), &warm, &mut Errors::new());
        }
        // Each pool's listener stays to the round's end: its port is the pool's
        // own, so no flow repeats for a daemon.
        let mut listeners = Vec::new();
        for (li, &(load, n)) in loads.iter().enumerate() {
            for (ci, &c) in a.tenant_clients.iter().enumerate() {
                let mut pool = None;
                let reqs = if load == LOOPBACK {
                    let l = TcpListener::bind("127.0.0.1:0").expect("a listener on 127.0.0.1");
                    let p = Pool::open(&l, n, &SIM_GPUS)
                        .unwrap_or_else(|e| panic!("{n} loopback connections: {e}"));
                    listeners.push(l);
                    pool.insert(p).frames.clone()
                } else {
                    flows.frames(n, &gpus)
                };
                let order: Vec<usize> = (0..names.len()).filter(|&i| why[li][i].is_none()).collect();
                let mut got: Vec<Option<Measure>> = vec![None; names.len()];
                for k in 0..order.len() {
                    let i = order[(round + li + ci + k) % order.len()];
                    got[i] = Some(measure(&servers[i], c, &reqs, &mut errors[li][i]));
                }
                drop(pool);
                let mut line = format!("round {}/{} {load:>8} {c:>3} clients:", round + 1, a.rounds);
                for (name, m) in names.iter().zip(&got).filter_map(|(n, m)| Some((n, m.as_ref()?))) {
                    line += &format!(" {name} {:>7.0}/s p50 {:>7.1} µs,", m.rate, us(m.p50));
                }
                let n_err = got.iter().flatten().map(|m| m.errors).sum();
                println!("{}{}", line.trim_end_matches(','), err_note(n_err));
                let e = per.entry((li, c)).or_insert_with(|| vec![Vec::new(); names.len()]);
                for (i, m) in got.into_iter().enumerate() {
                    e[i].extend(m);
                }
            }
        }
    }
    for (li, &(load, n)) in loads.iter().enumerate() {
        for &c in &a.tenant_clients {
            let got: Vec<Option<Measure>> = per[&(li, c)].iter().map(|r| best(r)).collect();
            let title = format!(
                "tenant checks, {load} flows, {c} client(s), {n} requests (best of {} interleaved rounds):",
                a.rounds
            );
            print!("{}", table(&title, &names, &got, &why[li]));
        }
    }
    let mut errs = Vec::new();
    for ((load, _), per_server) in loads.iter().zip(&errors) {
        for (name, e) in names.iter().zip(per_server) {
            errs.extend(e.iter().map(|(k, v)| format!("- {load} {name}: {v} × {k}")));
        }
    }
    if !errs.is_empty() {
        println!(
            "\ntenant checks: ERRORS: some replies were not exactly the `Ok.` frame:\n{}",
            errs.join("\n")
        );
    }
    errs.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tcpx_rxdm::wire::proto::unix_socket_proto::Payload;

    fn m(rate: f64, p50_us: u64) -> Measure {
        let p = Duration::from_micros(p50_us);
        Measure { ok: 1, errors: 0, rate, p50: p, p99: p * 2, cpu_us: Some(3.0) }
    }

    #[test]
    fn pool_frames_name_the_sockets_flows() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let gpus = &SIM_GPUS[..3];
        let pool = Pool::open(&l, 7, gpus).unwrap();
        assert_eq!((pool.conns.len(), pool.frames.len()), (7, 7));
        for (i, (f, (client, accepted))) in pool.frames.iter().zip(&pool.conns).enumerate() {
            let (msg, used) = frame::parse(f).unwrap().unwrap();
            assert_eq!(used, f.len());
            let Some(Payload::FlowSteerRuleRequest(r)) = msg.payload else { panic!("not a rule request") };
            assert_eq!(r.gpu_pci_addr.as_deref(), Some(gpus[i % 3].0));
            let n = r.flow_steer_ntuple.unwrap();
            assert_eq!(n.flow_type, Some(1));
            let addr = |a: Option<tcpx_rxdm::wire::proto::SocketAddress>| {
                let a = a.unwrap();
                format!("{}:{}", a.ip_address.unwrap(), a.port.unwrap())
            };
            assert_eq!(addr(n.src), client.local_addr().unwrap().to_string());
            assert_eq!(addr(n.dst), accepted.local_addr().unwrap().to_string());
            assert_eq!(accepted.local_addr().unwrap(), l.local_addr().unwrap());
        }
    }

    #[test]
    fn pool_connections_close_with_a_reset() {
        use std::io::Read as _;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut pool = Pool::open(&l, 1, &SIM_GPUS).unwrap();
        let (client, accepted) = pool.conns.pop().unwrap();
        reset_on_close(&client);
        let lin = nix::sys::socket::getsockopt(&client, nix::sys::socket::sockopt::Linger).unwrap();
        assert_eq!((lin.l_onoff, lin.l_linger), (1, 0));
        drop(client);
        let mut a = accepted;
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let e = a.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }

    #[test]
    fn ratios_against_the_floor_and_off() {
        let (floor, off, audit) = (m(100_000.0, 10), m(80_000.0, 14), m(60_000.0, 20));
        let v = versus(&audit, &floor, Some(&off));
        assert!((v.floor - 0.6).abs() < 1e-9 && (v.off.unwrap() - 0.75).abs() < 1e-9, "{v:?}");
        assert!((v.p50_off_us.unwrap() - 6.0).abs() < 1e-9, "{v:?}");
        assert_eq!(versus(&audit, &floor, None), Versus { floor: 0.6, off: None, p50_off_us: None });
    }

    #[test]
    fn table_rows_and_skips() {
        let names: Vec<String> = ["floor", "off", "audit", "enforce"].map(String::from).to_vec();
        let got = vec![Some(m(100_000.0, 10)), Some(m(50_000.0, 20)), Some(m(40_000.0, 25)), None];
        let why = [None, None, None, Some("every request is refused")];
        let t = table("t", &names, &got, &why);
        assert!(t.contains("| floor | 100000 | 10.0 | 20.0 | 1.00 | 2.00 | -10.0 | 3.0 | 0 |"), "{t}");
        assert!(t.contains("| off | 50000 | 20.0 | 40.0 | 0.50 | 1.00 | +0.0 |"), "{t}");
        assert!(t.contains("| audit | 40000 | 25.0 | 50.0 | 0.40 | 0.80 | +5.0 |"), "{t}");
        assert!(t.contains("| enforce | skipped: every request is refused |"), "{t}");
        let no_off = table("t", &names[..1], &got[..1], &why[..1]);
        assert!(no_off.contains("| floor | 100000 | 10.0 | 20.0 | 1.00 | - | - |"), "{no_off}");
    }

    #[test]
    fn enforce_is_skipped_where_every_request_would_be_refused_and_the_pool_fits() {
        assert_eq!(skipped("enforce", "fake", true), Some("every request is refused"));
        assert_eq!(skipped("enforce", "loopback", false), Some("GPU stand-ins not held"));
        assert_eq!(skipped("enforce", "loopback", true), None);
        assert_eq!(skipped("audit", "fake", false), None);
        assert_eq!(skipped("off", "loopback", false), None);
        assert_eq!(pool_cap(20_000), 9_500);
        assert_eq!(pool_cap(500), 0);
    }

    #[test]
    fn stand_ins_are_created_held_and_removed_but_existing_files_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia3"), b"theirs").unwrap();
        let s = StandIns::hold_in(dir.path());
        assert_eq!((s.held.len(), s.held()), (7, false));
        assert!(s.missing.as_deref().unwrap().contains("nvidia3 exists"), "{:?}", s.missing);
        assert!(dir.path().join("nvidia0").is_file() && dir.path().join("nvidia7").is_file());
        drop(s);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["nvidia3"]);
        assert_eq!(std::fs::read(dir.path().join("nvidia3")).unwrap(), b"theirs");
        let all = StandIns::hold_in(dir.path().join("sub").as_path());
        assert!(all.missing.as_deref().unwrap().contains("cannot create"), "{:?}", all.missing);
    }
}
