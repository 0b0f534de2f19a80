//! Harness for black-box tests: starts the built daemon on a temp socket
//! folder and a free HTTP port, waits for the ready line, and cleans up.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tcpx_rxdm::wire::client::Client;

pub const BIN: &str = env!("CARGO_BIN_EXE_tcpx-rxdm");
pub const READY: &str = "Buffer manager initialization completed.";

pub struct Daemon {
    pub child: Child,
    pub dir: tempfile::TempDir,
    log: Arc<(Mutex<Vec<String>>, Condvar)>,
}

impl Daemon {
    /// Starts `--gpu_nic_preset=sim` plus `extra` flags and waits until ready.
    pub fn start(extra: &[&str]) -> Daemon {
        let d = Daemon::spawn(extra, &[]);
        d.wait_for_log(READY, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!("daemon not ready; log:\n{}", d.log().join("\n"));
        });
        d
    }

    /// Starts with soft and hard RLIMIT_NOFILE set to `nofile`, and waits until ready.
    pub fn start_with_nofile(extra: &[&str], nofile: u64) -> Daemon {
        let d = Daemon::spawn_inner(&[], extra, &[], Some(nofile));
        d.wait_for_log(READY, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!("daemon not ready; log:\n{}", d.log().join("\n"));
        });
        d
    }

    /// Starts without waiting; `env` adds environment variables.
    pub fn spawn(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_inner(&[], extra, env, None)
    }

    /// Starts the daemon through `prefix` (e.g. `unshare --pid --fork`).
    pub fn spawn_under(prefix: &[&str], extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_inner(prefix, extra, env, None)
    }

    fn spawn_inner(prefix: &[&str], extra: &[&str], env: &[(&str, &str)], nofile: Option<u64>) -> Daemon {
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
        cmd.args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
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
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.0.lock().unwrap().push(line);
                sink.1.notify_all();
            }
        });
        Daemon { child, dir, log }
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
        let mut s = TcpStream::connect(self.http()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status = resp[9..12].parse().unwrap();
        let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    pub fn flows(&self) -> serde_json::Value {
        let (status, body) = self.http_get("/debug/flows");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits for exit (panics after `timeout`).
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Let the reader thread drain the last lines.
                std::thread::sleep(Duration::from_millis(50));
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

/// Runs the binary to completion with `args`; returns (exit code, stderr).
pub fn run_to_exit(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).stdin(Stdio::null()).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The exact reply bytes of one request over a raw socket.
pub fn raw_exchange(path: &std::path::Path, request: &[u8]) -> Vec<u8> {
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut head = [0u8; 2];
    s.read_exact(&mut head).unwrap();
    let mut body = vec![0u8; u16::from_be_bytes(head) as usize];
    s.read_exact(&mut body).unwrap();
    [head.to_vec(), body].concat()
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
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(CLIENT_PY).arg(linger.as_secs_f64().to_string());
        for (path, req) in requests {
            let hex: String = req.iter().map(|b| format!("{b:02x}")).collect();
            cmd.arg(path).arg(hex);
        }
        let mut child = cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn().expect("python3");
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
