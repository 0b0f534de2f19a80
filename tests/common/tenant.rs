//! Tenants for the integration tests: cgroup v2 groups of the test's own
//! and client processes ([`Agent`]) in them, each in a mount namespace of
//! its own (and, optionally, a network namespace), driven over stdin.
//! Root only.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use prost::Message;
use tcpx_rxdm::wire::client::{self, status_code};
use tcpx_rxdm::wire::proto::UnixSocketProto;

use super::encoded;

/// A cgroup v2 group of the test's own, removed at the end (with any made
/// below it).
pub struct Cgroup {
    pub path: PathBuf,
    /// Where cgroup2 is mounted.
    root: PathBuf,
}

impl Cgroup {
    pub fn new(name: &str) -> Cgroup {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let root = mounts
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
            })
            .expect("a cgroup2 mount");
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = PathBuf::from(root);
        let path = root.join(format!("tcpx-test-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir(&path).unwrap();
        Cgroup { path, root }
    }

    /// The path as `/proc/<pid>/cgroup` shows it (relative to the cgroup2 root).
    pub fn name(&self) -> String {
        format!("/{}", self.path.strip_prefix(&self.root).unwrap().display())
    }

    /// A cgroup at `rel` below this one (each missing level made), as a
    /// container runtime or Slurm nests them. Dropping a cgroup removes
    /// everything below it too, deepest first, so the levels in between go
    /// with the one it was made below.
    pub fn below(&self, rel: &str) -> Cgroup {
        let path = self.path.join(rel);
        std::fs::create_dir_all(&path).unwrap();
        Cgroup { path, root: self.root.clone() }
    }
}

/// Removes `path` and the cgroups below it, deepest first.
fn remove_tree(path: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    std::fs::remove_dir(path).is_ok()
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if remove_tree(&self.path) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A client process driven over its stdin: `conn 4|6` opens a loopback TCP
/// connection to itself and prints the accepted socket's ends; `listen ADDR
/// [PORT]` listens on an IPv6 address (prints `port N`), `accept` takes the next
/// connection (prints its ends like `conn`), `dial ADDR PORT [FROM_PORT
/// [FROM_ADDR]]` connects to one (prints `dialed PORT`, its own port); `syn ADDR PORT
/// FROM_ADDR FROM_PORT` starts a connect it does not wait for (prints `syn`);
/// `req PATH HEX` sends one request on a new connection and prints the reply
/// (`fd` when a file descriptor came); `reqs PATH HEX...` opens a connection
/// per request, sends them all, then reads each reply (prints `replies HEX...`,
/// `-` for a connection closed without one).
///
/// At start it opens for reading and writing and keeps open each path in
/// `$HOLD`, as a CUDA process holds its GPUs' device nodes from `cuInit` on;
/// one it cannot open is left out. `open PATH [rw|ro|wo|path]` (`O_RDWR`,
/// the default, `O_RDONLY`, `O_WRONLY`, `O_PATH`) and `close PATH` do the
/// same later and print `opened`, `error N` or `closed`; `pid` prints its
/// pid as it sees it; `epoll PATH` adds the file held at `PATH` to a new
/// epoll instance from a thread of its own, which stays in `epoll_ctl` for
/// as long as the file's `poll` takes, and prints `epoll` at once; `exit`
/// ends it.
const AGENT_PY: &str = r#"
import os, resource, socket, sys
# Room for a thousand connections and their requests at once.
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(_hard, 65536), _hard))
held = []
files = {}
MODES = {"rw": os.O_RDWR, "ro": os.O_RDONLY, "wo": os.O_WRONLY, "path": os.O_PATH}
def out(s):
    sys.stdout.write(s + "\n"); sys.stdout.flush()
def hold(path, mode="rw"):
    try:
        files[path] = os.open(path, MODES[mode])
        return "opened"
    except OSError as e:
        return "error %d" % e.errno
for path in os.environ.get("HOLD", "").split():
    hold(path)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "open":
        out(hold(*cmd[1:3]))
    elif cmd[0] == "pid":
        out("pid %d" % os.getpid())
    elif cmd[0] == "exit":
        os._exit(0)
    elif cmd[0] == "epoll":
        import select, threading
        ep = select.epoll(); held.append(ep)
        threading.Thread(target=ep.register, args=(files[cmd[1]], select.EPOLLIN), daemon=True).start()
        out("epoll")
    elif cmd[0] == "close":
        os.close(files.pop(cmd[1])); out("closed")
    elif cmd[0] == "conn":
        six = cmd[1] == "6"
        fam, host = (socket.AF_INET6, "::1") if six else (socket.AF_INET, "127.0.0.1")
        l = socket.socket(fam); l.bind((host, 0)); l.listen(4)
        c = socket.socket(fam); c.connect(l.getsockname()[:2])
        s, peer = l.accept()
        held += [l, c, s]
        loc = s.getsockname()
        out("conn %s %d %s %d" % (loc[0], loc[1], peer[0], peer[1]))
    elif cmd[0] == "listen":
        l = socket.socket(socket.AF_INET6); l.bind((cmd[1], int(cmd[2]) if len(cmd) > 2 else 0)); l.listen(8)
        held.append(l); listener = l
        out("port %d" % l.getsockname()[1])
    elif cmd[0] == "accept":
        s, peer = listener.accept()
        held.append(s)
        loc = s.getsockname()
        out("conn %s %d %s %d" % (loc[0], loc[1], peer[0], peer[1]))
    elif cmd[0] == "dial":
        c = socket.socket(socket.AF_INET6)
        if len(cmd) > 3:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            c.bind((cmd[4] if len(cmd) > 4 else "::", int(cmd[3])))
        c.connect((cmd[1], int(cmd[2])))
        held.append(c)
        out("dialed %d" % c.getsockname()[1])
    elif cmd[0] == "syn":
        c = socket.socket(socket.AF_INET6); c.setblocking(False)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); c.bind((cmd[3], int(cmd[4])))
        c.connect_ex((cmd[1], int(cmd[2])))
        held.append(c)
        out("syn")
    elif cmd[0] in ("reqs", "keep"):
        us = []
        for h in cmd[2:]:
            u = socket.socket(socket.AF_UNIX); u.connect(cmd[1]); us.append((u, bytes.fromhex(h)))
        for u, b in us:
            # A connection refused at once may be closed before its request.
            try: u.sendall(b)
            except OSError: pass
        got = []
        for u, b in us:
            msg = b""
            while len(msg) < 2 or len(msg) < 2 + int.from_bytes(msg[:2], "big"):
                try: more = u.recv(4096)
                except OSError: more = b""
                if not more: break
                msg += more
            got.append(msg.hex() or "-")
            if cmd[0] == "keep": held.append(u)
            else: u.close()
        out("replies " + " ".join(got))
    elif cmd[0] == "req":
        u = socket.socket(socket.AF_UNIX); u.connect(cmd[1]); u.sendall(bytes.fromhex(cmd[2]))
        msg, anc, flags, addr = u.recvmsg(4096, socket.CMSG_SPACE(4))
        if anc:
            held.append(anc); out("fd")
        else:
            while len(msg) < 2 or len(msg) < 2 + int.from_bytes(msg[:2], "big"):
                more = u.recv(4096)
                if not more: break
                msg += more
            out("reply " + msg.hex())
        u.close()
"#;

/// The Python interpreter itself (not a wrapper script that would look
/// around the client's filesystem before starting it).
pub fn python() -> &'static str {
    static PY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let out = super::python3().args(["-c", "import sys; print(sys.executable)"]).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

/// A Python interpreter that user `uid` may run (the test's own may sit in
/// root's home): the test's, else the system's.
pub fn python_for(uid: u32) -> String {
    let runs = |py: &str| {
        Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "--",
                py,
                "-c",
                "",
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    [python(), "/usr/local/bin/python3", "/usr/bin/python3"]
        .into_iter()
        .find(|py| runs(py))
        .unwrap_or_else(|| panic!("this test needs a python3 that user {uid} may run (setpriv, python3)"))
        .to_string()
}

/// Setup that gives a client an empty `/dev` of its own.
pub const FRESH_DEV: &str = "mount -t tmpfs tmpfs /dev";

pub struct Agent {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

pub enum Reply {
    Fd,
    Message(UnixSocketProto),
}

impl Reply {
    /// A client script's answer line: `fd`, or `reply HEX` (the whole frame).
    pub fn parse(line: &str) -> Reply {
        if line == "fd" {
            return Reply::Fd;
        }
        let hex = line.strip_prefix("reply ").unwrap_or_else(|| panic!("reply line: {line:?}"));
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        Reply::Message(UnixSocketProto::decode(&bytes[2..]).unwrap())
    }

    pub fn code(&self) -> i32 {
        match self {
            Reply::Fd => 0,
            Reply::Message(m) => status_code(m),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Reply::Fd => "fd".into(),
            Reply::Message(m) => m.status.as_ref().map(|s| s.message.clone()).unwrap_or_default(),
        }
    }
}

impl Agent {
    /// A client in cgroup `cg` whose `/dev` holds only `/dev/nvidia<minor>`,
    /// which it holds open.
    pub fn start(cg: &Cgroup, minor: u32) -> Agent {
        let node = format!("/dev/nvidia{minor}");
        Agent::planted(cg, &format!("{FRESH_DEV} && : > {node}"), &[&node])
    }

    /// A client in cgroup `cg` and a mount namespace of its own, where
    /// `setup` (shell, run as root there; [`FRESH_DEV`] gives it a `/dev` of
    /// its own) planted what it wants, holding `hold` open.
    pub fn planted(cg: &Cgroup, setup: &str, hold: &[&str]) -> Agent {
        Agent::spawn(cg, setup, hold, None, &[], None)
    }

    /// [`Agent::planted`], the client itself running as user and group
    /// `uid` (after `setup`, which runs as root): a process of another user
    /// than the daemon's, whose `/proc/<pid>/fd` only its owner (or a
    /// holder of `CAP_DAC_READ_SEARCH`) may list.
    pub fn planted_as(cg: &Cgroup, setup: &str, hold: &[&str], uid: u32) -> Agent {
        Agent::spawn(cg, setup, hold, None, &[], Some(uid))
    }

    /// [`Agent::start`] in network namespace `netns` (a name under `/run/netns`).
    pub fn start_in(cg: &Cgroup, minor: u32, netns: &str) -> Agent {
        let node = format!("/dev/nvidia{minor}");
        Agent::spawn(cg, &format!("{FRESH_DEV} && : > {node}"), &[&node], Some(netns), &[], None)
    }

    /// [`Agent::start`] started through `prefix` (a command that runs the
    /// rest of its arguments: see `common::pidns`).
    pub fn start_under(cg: &Cgroup, minor: u32, prefix: &[String]) -> Agent {
        let node = format!("/dev/nvidia{minor}");
        Agent::spawn(cg, &format!("{FRESH_DEV} && : > {node}"), &[&node], None, prefix, None)
    }

    fn spawn(
        cg: &Cgroup,
        setup: &str,
        hold: &[&str],
        netns: Option<&str>,
        prefix: &[String],
        uid: Option<u32>,
    ) -> Agent {
        super::require_python3();
        // The cgroup is joined first: `ip netns exec` mounts a /sys of its own.
        let script = r#"echo $$ > "$CG/cgroup.procs" && exec $NETNS_EXEC unshare -m --propagation private sh -c 'eval "$SETUP" && exec $AS_USER "$PY" -u -c "$AGENT_PY"'"#;
        let (as_user, py) = match uid {
            Some(uid) => (format!("setpriv --reuid={uid} --regid={uid} --clear-groups --"), python_for(uid)),
            None => (String::new(), python().to_string()),
        };
        let netns_exec = netns.map(|ns| format!("ip netns exec {ns}")).unwrap_or_default();
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg("sh");
                c
            }
            None => Command::new("sh"),
        };
        let mut child = cmd
            .env("NETNS_EXEC", netns_exec)
            .arg("-c")
            .arg(script)
            .env("CG", &cg.path)
            .env("SETUP", setup)
            .env("PY", py)
            .env("AS_USER", as_user)
            .env("HOLD", hold.join(" "))
            .env("AGENT_PY", AGENT_PY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Agent { child, stdin, stdout }
    }

    /// Its pid as it sees it (in its own pid namespace).
    pub fn pid(&mut self) -> u32 {
        let a = self.ask("pid");
        a.strip_prefix("pid ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("pid: {a}"))
    }

    /// Ends it (its own process, not only the command that started it) and
    /// waits for that command.
    pub fn exit(&mut self) {
        writeln!(self.stdin, "exit").unwrap();
        self.child.wait().unwrap();
    }

    pub fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        let mut out = String::new();
        assert!(self.stdout.read_line(&mut out).unwrap() > 0, "agent ended on {line:?}");
        out.trim().to_string()
    }

    /// A loopback TCP connection of this client: (local end, remote end) of
    /// the accepted socket, as a steering rule sees the flow.
    pub fn conn(&mut self, v6: bool) -> (SocketAddr, SocketAddr) {
        let a = self.ask(if v6 { "conn 6" } else { "conn 4" });
        ends(&a)
    }

    /// Listens on IPv6 address `ip`: the port.
    pub fn listen(&mut self, ip: &str) -> u16 {
        self.listen_on(ip, 0)
    }

    /// Listens on IPv6 address `ip`, port `port` (0: any): the port.
    pub fn listen_on(&mut self, ip: &str, port: u16) -> u16 {
        let a = self.ask(&format!("listen {ip} {port}"));
        a.strip_prefix("port ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("listen: {a}"))
    }

    /// The next connection to the listener: (local end, remote end).
    pub fn accept(&mut self) -> (SocketAddr, SocketAddr) {
        let a = self.ask("accept");
        ends(&a)
    }

    /// Connects to `[ip]:port`, from `from` where given: its own port.
    /// Connects to `[ip]:port` from `[from_ip]:from_port`.
    pub fn dial_from(&mut self, ip: &str, port: u16, from_ip: &str, from_port: u16) {
        let a = self.ask(&format!("dial {ip} {port} {from_port} {from_ip}"));
        assert_eq!(a, format!("dialed {from_port}"));
    }

    pub fn dial(&mut self, ip: &str, port: u16, from: Option<u16>) -> u16 {
        let from = from.map(|p| format!(" {p}")).unwrap_or_default();
        let a = self.ask(&format!("dial {ip} {port}{from}"));
        a.strip_prefix("dialed ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("dial: {a}"))
    }

    /// Starts a connect from `[from]:from_port` to `[ip]:port` and leaves
    /// it as it is (`SYN-SENT` where nobody answers).
    pub fn syn(&mut self, ip: &str, port: u16, from: &str, from_port: u16) {
        let a = self.ask(&format!("syn {ip} {port} {from} {from_port}"));
        assert_eq!(a, "syn");
    }

    /// [`Agent::reqs`], keeping every connection open afterwards (until the agent exits).
    pub fn keep(&mut self, path: &Path, msgs: &[UnixSocketProto]) -> Vec<Option<Reply>> {
        self.send_all("keep", path, msgs)
    }

    /// Sends every request of `msgs` at once, each on a connection of its
    /// own, then reads the replies (`None`: closed without one).
    pub fn reqs(&mut self, path: &Path, msgs: &[UnixSocketProto]) -> Vec<Option<Reply>> {
        self.send_all("reqs", path, msgs)
    }

    fn send_all(&mut self, verb: &str, path: &Path, msgs: &[UnixSocketProto]) -> Vec<Option<Reply>> {
        let hex = |m: &UnixSocketProto| encoded(m).iter().map(|b| format!("{b:02x}")).collect::<String>();
        let all: Vec<String> = msgs.iter().map(hex).collect();
        let a = self.ask(&format!("{verb} {} {}", path.display(), all.join(" ")));
        let got: Vec<Option<Reply>> = a
            .strip_prefix("replies ")
            .unwrap_or_else(|| panic!("reqs: {a}"))
            .split(' ')
            .map(|h| (h != "-").then(|| Reply::parse(&format!("reply {h}"))))
            .collect();
        assert_eq!(got.len(), msgs.len());
        got
    }

    pub fn req(&mut self, path: &Path, msg: &UnixSocketProto) -> Reply {
        let hex: String = encoded(msg).iter().map(|b| format!("{b:02x}")).collect();
        Reply::parse(&self.ask(&format!("req {} {hex}", path.display())))
    }
}

/// The two ends in a `conn LOCAL LPORT REMOTE RPORT` line.
fn ends(line: &str) -> (SocketAddr, SocketAddr) {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert!(f.len() == 5 && f[0] == "conn", "a connection line: {line}");
    let addr = |ip: &str, port: &str| SocketAddr::new(ip.parse().unwrap(), port.parse().unwrap());
    (addr(f[1], f[2]), addr(f[3], f[4]))
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The rule request for the flow whose local end is `local` (the packet's
/// destination) and remote end `remote`.
pub fn rule(local: SocketAddr, remote: SocketAddr, gpu: &str) -> UnixSocketProto {
    let flow_type = if local.is_ipv6() { 5 } else { 1 };
    let (src, dst) =
        ((remote.ip().to_string(), remote.port() as i32), (local.ip().to_string(), local.port() as i32));
    client::rule_request(flow_type, (&src.0, src.1), (&dst.0, dst.1), Some(gpu), None)
}

pub fn refused(metrics: &str, endpoint: &str, reason: &str, mode: &str) -> f64 {
    let series = format!(
        "tcpx_rxdm_requests_refused_total{{endpoint=\"{endpoint}\",mode=\"{mode}\",reason=\"{reason}\"}}"
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing"))
}
