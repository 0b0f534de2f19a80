//! A pid namespace of the test's own, where the daemon is the first process
//! and clients start at a pid of the test's choosing (`ns_last_pid`): how a
//! test makes a pid that named one tenant's process name another tenant's.
//! Root only.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use tcpx_rxdm::wire::proto::UnixSocketProto;

use super::tenant::{python, Cgroup, Reply};
use super::{encoded, Daemon};

/// Starts the rest of its arguments as a new process of the pid namespace
/// it runs in, at pid `argv[1]` (0: any): `ns_last_pid` is set to the one
/// before, then it forks; it waits for that process and exits as it did.
const AT_PID_PY: &str = r#"
import os, sys
want = int(sys.argv[1])
if want:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(want - 1))
child = os.fork()
if child == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status = os.waitpid(child, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"#;

/// A daemon as the first process of a new pid namespace (and a mount
/// namespace with that namespace's `/proc`), with `extra` flags.
pub fn daemon(extra: &[&str]) -> Daemon {
    let prefix = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"];
    Daemon::spawn_under(&prefix, extra, &[]).ready()
}

/// The pid (in the test's namespace) of the daemon `unshare` started.
fn daemon_pid(d: &Daemon) -> u32 {
    let unshare = d.child.id();
    let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
    children.split_whitespace().next().and_then(|p| p.parse().ok()).expect("unshare's child, the daemon")
}

/// The command prefix that runs a program as a new process of the daemon's
/// pid namespace, at pid `pid` there (0: any).
pub fn at_pid(d: &Daemon, pid: u32) -> Vec<String> {
    let target = daemon_pid(d).to_string();
    ["nsenter", "--target", &target, "--pid", "--", python(), "-c", AT_PID_PY, &pid.to_string()]
        .map(String::from)
        .to_vec()
}

/// Tenant B's trick: a child of its opens one connection to each socket,
/// passes them to its parent and exits; the parent reaps it and sends on
/// them. Prints the child's pid (`child N`), then per stdin line `I HEX`
/// sends request HEX on connection I and prints the reply as the agents do.
const PASSER_PY: &str = r#"
import os, socket, sys
paths = sys.argv[1:]
a, b = socket.socketpair()
child = os.fork()
if child == 0:
    conns = []
    for p in paths:
        s = socket.socket(socket.AF_UNIX); s.connect(p); conns.append(s)
    socket.send_fds(a, [b"x"], [s.fileno() for s in conns])
    os._exit(0)
msg, fds, flags, addr = socket.recv_fds(b, 16, len(paths))
os.waitpid(child, 0)
conns = [socket.socket(fileno=fd) for fd in fds]
print("child %d" % child, flush=True)
held = []
for line in sys.stdin:
    i, hexmsg = line.split()
    u = conns[int(i)]
    u.sendall(bytes.fromhex(hexmsg))
    msg, anc, flags, addr = u.recvmsg(4096, socket.CMSG_SPACE(4))
    if anc:
        held.append(anc); print("fd", flush=True)
        continue
    while len(msg) < 2 or len(msg) < 2 + int.from_bytes(msg[:2], "big"):
        more = u.recv(4096)
        if not more: break
        msg += more
    print("reply " + msg.hex(), flush=True)
"#;

/// A process of tenant `cg` holding connections to `paths` that its child,
/// since exited and reaped, opened.
pub struct Passer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The pid the child had (in the daemon's pid namespace), free again.
    pub opener_pid: u32,
}

impl Passer {
    pub fn start(d: &Daemon, cg: &Cgroup, paths: &[PathBuf]) -> Passer {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$CG/cgroup.procs" && exec "$@""#)
            .arg("sh")
            .args(at_pid(d, 0))
            .arg(python())
            .arg("-u")
            .arg("-c")
            .arg(PASSER_PY)
            .args(paths)
            .env("CG", &cg.path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let opener_pid = line.trim().strip_prefix("child ").and_then(|p| p.parse().ok());
        let opener_pid = opener_pid.unwrap_or_else(|| panic!("the passer's first line: {line:?}"));
        Passer { child, stdin, stdout, opener_pid }
    }

    /// Sends `msg` on passed connection `i`; the reply.
    pub fn send(&mut self, i: usize, msg: &UnixSocketProto) -> Reply {
        let hex: String = encoded(msg).iter().map(|b| format!("{b:02x}")).collect();
        writeln!(self.stdin, "{i} {hex}").unwrap();
        let mut line = String::new();
        assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the passer ended");
        Reply::parse(line.trim())
    }
}

impl Drop for Passer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
