//! Shared by the integration tests: the daemon harness (the built binary on a
//! temporary socket folder and a free HTTP port, ready line awaited, killed on
//! drop), raw-frame helpers, client processes, the root-only policy, and the
//! fabricated sysfs trees and network namespaces in the submodules.
//!
//! Each test binary includes it with `mod common;` and uses only part of it.
#![allow(dead_code)]

pub mod ipv6;
pub mod netns;
pub mod pidns;
pub mod procs;
pub mod sysfs;
pub mod tenant;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::wire::client::{self, Client};
use tcpx_rxdm::wire::frame;
use tcpx_rxdm::wire::proto::UnixSocketProto;

pub const BIN: &str = env!("CARGO_BIN_EXE_tcpx-rxdm");

/// The first GPU of the sim preset (on eth1), and the first one on eth2.
pub const GPU0: &str = "0000:04:00.0";
pub const GPU_ETH2: &str = "0000:0a:00.0";

/// The exact bytes of the success reply: length 5, field 1 (raw bytes) "Ok.".
pub const OK_FRAME: &[u8] = frame::OK_FRAME;

/// Root-only tests are `#[ignore = "needs root: …"]`, so a plain `cargo test`
/// lists them as ignored; CI runs them as root with `--include-ignored`. Run
/// without root they fail here, naming what they need, instead of passing.
pub fn require_root(why: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root ({why}): run it as root with `cargo test -- --include-ignored`"
    );
}

/// A message as one frame (big-endian u16 length, then the protobuf).
pub fn encoded(m: &UnixSocketProto) -> Vec<u8> {
    frame::encode(m).unwrap()
}

/// An IPv4 rule for 10.1.0.2:`sport` → 192.168.1.2:5000 (the sim eth1's
/// address), optionally naming the GPU.
pub fn install_rule(sport: i32, gpu: Option<&str>) -> UnixSocketProto {
    client::rule_request(1, ("10.1.0.2", sport), ("192.168.1.2", 5000), gpu, None)
}

/// `install_rule(sport, Some(gpu))`, framed.
pub fn install_frame(sport: i32, gpu: &str) -> Vec<u8> {
    encoded(&install_rule(sport, Some(gpu)))
}

/// Polls until `cond` holds; returns how long it took (panics after `limit`).
pub fn wait_until(limit: Duration, cond: impl FnMut() -> bool) -> Duration {
    wait_until_or(limit, cond, || format!("condition not met within {limit:?}"))
}

/// [`wait_until`], failing with `why()` (what the test saw) when `limit`,
/// a guard against a hang and never a measure, runs out.
pub fn wait_until_or(
    limit: Duration,
    mut cond: impl FnMut() -> bool,
    why: impl FnOnce() -> String,
) -> Duration {
    let t = Instant::now();
    while !cond() {
        if t.elapsed() >= limit {
            panic!("{}", why());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed()
}

/// A simulated NIC operation held until the test lets it go
/// (`--sim_delay=OP:until=FILE[:IFNAME]`): tests of "nothing waits for a
/// slow NIC" assert order, not time.
pub struct Hold {
    _dir: tempfile::TempDir,
    go: PathBuf,
}

impl Hold {
    pub fn new() -> Hold {
        let dir = tempfile::tempdir().unwrap();
        let go = dir.path().join("go");
        Hold { _dir: dir, go }
    }

    /// The daemon flag holding every call of `op` (on `ifname`, or every NIC).
    pub fn flag(&self, op: &str, ifname: Option<&str>) -> String {
        let on = ifname.map(|i| format!(":{i}")).unwrap_or_default();
        format!("--sim_delay={op}:until={}{on}", self.go.display())
    }

    /// Waits until a call is held (up to a minute, which only bounds a hang).
    pub fn wait_held(&self) {
        let marker = tcpx_rxdm::nic::sim::held_marker(&self.go);
        wait_until(Duration::from_secs(60), || marker.exists());
    }

    /// Lets every held call go, and those to come.
    pub fn release(&self) {
        std::fs::write(&self.go, b"").unwrap();
    }
}

pub struct Daemon {
    pub child: Child,
    pub dir: tempfile::TempDir,
    log: Arc<(Mutex<Vec<String>>, Condvar)>,
    /// Set once the daemon's stderr has ended (every line read).
    eof: Arc<std::sync::atomic::AtomicBool>,
}

impl Daemon {
    /// Starts `--gpu_nic_preset=sim` plus `extra` flags and waits until ready.
    pub fn start(extra: &[&str]) -> Daemon {
        Daemon::spawn(extra, &[]).ready()
    }

    /// Starts with soft and hard RLIMIT_NOFILE set to `nofile`, and waits until ready.
    pub fn start_with_nofile(extra: &[&str], nofile: u64) -> Daemon {
        Daemon::spawn_with_nofile(extra, nofile, nofile).ready()
    }

    /// Starts with RLIMIT_NOFILE `soft`/`hard`, without waiting.
    pub fn spawn_with_nofile(extra: &[&str], soft: u64, hard: u64) -> Daemon {
        Daemon::spawn_inner(&[], extra, &[], Some((soft, hard)))
    }

    /// Waits (up to 20 s) for the ready line; panics with the log otherwise.
    pub fn ready(self) -> Daemon {
        self.wait_for_log(READY_LINE, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!("daemon not ready; log:\n{}", self.log().join("\n"));
        });
        self
    }

    /// Starts without waiting; `env` adds environment variables.
    pub fn spawn(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_inner(&[], extra, env, None)
    }

    /// Starts the daemon through `prefix` (e.g. `unshare --pid --fork`).
    pub fn spawn_under(prefix: &[&str], extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_inner(prefix, extra, env, None)
    }

    fn spawn_inner(
        prefix: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
        nofile: Option<(u64, u64)>,
    ) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.arg("--gpu_nic_preset=sim");
        // A test may name its own socket folder (or HTTP address) in `extra`.
        if !extra.iter().any(|a| a.starts_with("--uds_path")) {
            cmd.arg(format!("--uds_path={}", dir.path().display()));
        }
        if !extra.iter().any(|a| a.starts_with("--metrics_address")) {
            cmd.arg("--metrics_address=127.0.0.1:0");
        }
        // The tests read the rule tables through /debug/flows (off by default).
        if !extra.iter().any(|a| a.starts_with("--debug_endpoints")) {
            cmd.arg("--debug_endpoints=local");
        }
        cmd.args(extra)
            .env("RUST_LOG", "info")
            // A panic's symbolized backtrace takes seconds in a debug build on a
            // busy machine: longer than some of the daemon's own timeouts (a
            // takeover's). The message alone is enough for a test's log.
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some((soft, hard)) = nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            // SAFETY: setrlimit is async-signal-safe and reads a struct copied into the closure.
            unsafe {
                cmd.pre_exec(move || match libc::setrlimit(libc::RLIMIT_NOFILE, &lim) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                });
            }
        }
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        let eof = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let at_end = eof.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.0.lock().unwrap().push(line);
                sink.1.notify_all();
            }
            at_end.store(true, std::sync::atomic::Ordering::Release);
        });
        Daemon { child, dir, log, eof }
    }

    pub fn log(&self) -> Vec<String> {
        self.log.0.lock().unwrap().clone()
    }

    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut lines = self.log.0.lock().unwrap();
        loop {
            if let Some(l) = lines.iter().find(|l| l.contains(needle)) {
                return Some(l.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            lines = self.log.1.wait_timeout(lines, left).unwrap().0;
        }
    }

    pub fn sock(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `--uds_path=` naming this daemon's socket folder (for `status`, `doctor`, a second daemon).
    pub fn uds_arg(&self) -> String {
        format!("--uds_path={}", self.dir.path().display())
    }

    pub fn client(&self, name: &str) -> Client {
        Client::connect(self.sock(name)).unwrap_or_else(|e| panic!("connect {name}: {e}"))
    }

    /// The HTTP address the daemon bound (it logs it; the harness asks for port 0).
    pub fn http(&self) -> SocketAddr {
        let line = self
            .wait_for_log("HTTP endpoints listening", Duration::from_secs(20))
            .expect("HTTP address logged");
        let addr =
            line.split("address=").nth(1).and_then(|r| r.split_whitespace().next()).expect("address= field");
        addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"))
    }

    /// GET over plain HTTP/1.1; returns (status, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        http_get(self.http(), path)
    }

    pub fn flows(&self) -> serde_json::Value {
        let (status, body) = self.http_get("/debug/flows");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Every NIC's `list` of `/debug/flows` (`rules`: the booked ones;
    /// `nic_rules`: what the NICs themselves hold), in one list.
    pub fn flows_of_all_nics(&self, list: &str) -> Vec<serde_json::Value> {
        let flows = self.flows();
        let nics = flows["nics"].as_array().expect("a nics list").clone();
        nics.iter().flat_map(|n| n[list].as_array().cloned().unwrap_or_default()).collect()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits for exit (panics after `timeout`).
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Every line read: the pipe's end. A successor the daemon
                // started (a takeover) keeps the pipe open: then 3 s at most.
                let until = Instant::now() + Duration::from_secs(3);
                while !self.eof.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return st;
            }
            assert!(Instant::now() < deadline, "daemon did not exit; log:\n{}", self.log().join("\n"));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Socket files and lock present in the folder.
    pub fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary to completion with `args`; returns (exit code, stdout, stderr).
pub fn run_bin(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).stdin(Stdio::null()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the binary to completion with `args`; returns (exit code, stderr).
pub fn run_to_exit(args: &[&str]) -> (i32, String) {
    let (code, _, stderr) = run_bin(args);
    (code, stderr)
}

/// GET `path` over plain HTTP/1.1; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get_on(TcpStream::connect(addr).unwrap(), path)
}

/// GET `path` on a connected stream; returns (status, body).
pub fn http_get_on(mut s: TcpStream, path: &str) -> (u16, String) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// Reads one reply frame, or says how the connection ended.
pub fn read_frame(s: &mut UnixStream) -> Result<Vec<u8>, String> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).map_err(|e| format!("no reply: {e}"))?;
    let mut body = vec![0u8; u16::from_be_bytes(head) as usize];
    s.read_exact(&mut body).map_err(|e| format!("short reply: {e}"))?;
    Ok([head.to_vec(), body].concat())
}

/// The exact reply bytes of one request over a raw socket.
pub fn raw_exchange(path: &Path, request: &[u8]) -> Vec<u8> {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    read_frame(&mut s).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Connects to the Unix socket `path` as `uid`/`gid` (no supplementary
/// groups) in a forked child and, if `request` is not empty, sends it and
/// reads a reply. `Err` holds the errno of the step that failed (a reply of
/// two bytes or fewer is `EPROTO`). Needs root to switch users.
pub fn connect_as(uid: u32, gid: u32, path: &Path, request: &[u8]) -> Result<(), Errno> {
    use std::os::unix::ffi::OsStrExt;
    // Everything the child needs is prepared here: after fork it makes only system calls.
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long: {}", path.display());
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: the child only makes raw system calls on memory prepared
    // before the fork, then _exits; the parent waits for it.
    match unsafe { nix::unistd::fork() }.unwrap() {
        // SAFETY: raw system calls on buffers that outlive the child; no
        // allocation, lock or Rust runtime code; _exit skips destructors.
        nix::unistd::ForkResult::Child => unsafe {
            let errno = || *libc::__errno_location();
            let code = (|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return errno();
                }
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                if fd < 0 {
                    return errno();
                }
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) != 0 {
                    return errno();
                }
                if request.is_empty() {
                    return 0;
                }
                if libc::write(fd, request.as_ptr().cast(), request.len()) != request.len() as isize {
                    return errno();
                }
                let mut reply = [0u8; 64];
                if libc::read(fd, reply.as_mut_ptr().cast(), reply.len()) <= 2 {
                    return libc::EPROTO;
                }
                0
            })();
            libc::_exit(code)
        },
        nix::unistd::ForkResult::Parent { child } => match nix::sys::wait::waitpid(child, None).unwrap() {
            nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
            nix::sys::wait::WaitStatus::Exited(_, e) => Err(Errno::from_raw(e)),
            other => panic!("client child: {other:?}"),
        },
    }
}

/// Fails the test, saying what to install, where `python3` is not on PATH:
/// the tests that need client processes of their own run them in Python.
pub fn require_python3() {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|dir| dir.join("python3").is_file()));
    assert!(
        on_path,
        "this test runs its clients as python3 processes, and python3 is not on PATH: \
         install it (Debian and Ubuntu: apt-get install python3)"
    );
}

/// `python3`, after `require_python3`.
pub fn python3() -> Command {
    require_python3();
    Command::new("python3")
}

/// A client in a process of its own (Python, as on every machine we test on):
/// it sends each request on a new connection, like the NCCL plugin, keeps any
/// pool fd it receives, prints `ready`, then sleeps until killed.
pub struct ClientProcess {
    pub child: Child,
    pub replies: Vec<Vec<u8>>,
}

const CLIENT_PY: &str = r#"
import socket, sys, time
held = []
for i in range(2, len(sys.argv), 2):
    path, req = sys.argv[i], bytes.fromhex(sys.argv[i + 1])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(req)
    if path.rsplit('/', 1)[-1].startswith('get_gpu_fd_'):
        msg, anc, flags, addr = s.recvmsg(1, socket.CMSG_SPACE(4))
        held.extend(anc)
        print('reply fd', flush=True)
    else:
        head = b''
        while len(head) < 2:
            head += s.recv(2 - len(head))
        n = int.from_bytes(head, 'big')
        body = b''
        while len(body) < n:
            body += s.recv(n - len(body))
        print('reply ' + (head + body).hex(), flush=True)
    s.close()
print('ready', flush=True)
time.sleep(float(sys.argv[1]))
"#;

impl ClientProcess {
    /// Runs the requests (socket path, framed request), then lives `linger` more.
    pub fn run(requests: &[(PathBuf, Vec<u8>)], linger: Duration) -> ClientProcess {
        let mut cmd = python3();
        cmd.arg("-c").arg(CLIENT_PY).arg(linger.as_secs_f64().to_string());
        for (path, req) in requests {
            let hex: String = req.iter().map(|b| format!("{b:02x}")).collect();
            cmd.arg(path).arg(hex);
        }
        let mut child = cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn().expect("python3 runs");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut replies = Vec::new();
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "client process ended early");
            let line = line.trim();
            if line == "ready" {
                break;
            }
            let hex = line.strip_prefix("reply ").expect("reply line");
            replies.push(
                (0..hex.len())
                    .step_by(2)
                    .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect(),
            );
        }
        ClientProcess { child, replies }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of an unlabelled metric in a `/metrics` body.
pub fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
