//! Clients whose files sit on a FUSE mount whose server takes every request
//! and answers only what opening a file needs: never `FLUSH` (sent at every
//! `close` of a descriptor of the file, a copy's included) nor `POLL`. The
//! daemon runs with the node-wide capabilities, as the DaemonSet does, or
//! without `CAP_DAC_READ_SEARCH`, so that it may trace every client but
//! list the open files of root's processes only.
//!
//! Eight clients of another user, two in each of four cgroups, hold a file
//! there and the stand-in of a simulated GPU, and install a rule for a
//! connection of their own: served, or refused saying why. Then a new
//! client (root, in a fifth cgroup), which holds a file there too and has a
//! thread stuck in `epoll_ctl` on it (holding the epoll's lock), installs a
//! rule and is answered `Ok.`; no thread of the daemon waits on FUSE; no
//! request from the daemon reached a server; SIGTERM ends the daemon with 0.
//!
//! Root only: cgroups, mount namespaces, FUSE, setpriv.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::tenant::{rule, Agent, Cgroup, Reply, FRESH_DEV};
use common::{require_root, wait_until, Daemon};

/// The sim topology's first GPU: `/dev/nvidia0`.
const GPU0: &str = "0000:04:00.0";
/// The other user the eight clients run as.
const OTHER_USER: u32 = 64_321;
const PERMISSION_DENIED: i32 = 7;

/// A FUSE server on `/dev/fuse`, mounted at `argv[1]` (`allow_other`): it
/// answers `INIT`, `LOOKUP` of `held`, `GETATTR` and `OPEN`, takes `FLUSH`,
/// `POLL`, `RELEASE` and `INTERRUPT` and never answers them, and answers
/// anything else `ENOSYS`. Each request is logged to `argv[2]` as `OPCODE
/// PID` (the pid of the thread that made it), and `mounted` is printed once
/// the mount is in place.
const FUSE_PY: &str = r#"
import ctypes, os, struct, sys
mnt, log = sys.argv[1], sys.argv[2]
dev = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other" % dev
if libc.mount(b"hung", mnt.encode(), b"fuse", 0, opts.encode()) != 0:
    sys.exit("mount: errno %d" % ctypes.get_errno())
print("mounted", flush=True)
LOOKUP, GETATTR, OPEN, INIT = 1, 3, 14, 26
NEVER = {2, 18, 25, 36, 40, 42}  # FORGET RELEASE FLUSH INTERRUPT POLL BATCH_FORGET
LONG = 3600
def attr(ino):
    mode = 0o40755 if ino == 1 else 0o100666
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 0, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)
def reply(unique, err=0, body=b""):
    os.write(dev, struct.pack("<IiQ", 16 + len(body), -err, unique) + body)
out = open(log, "a", buffering=1)
while True:
    req = os.read(dev, 1 << 20)
    _, op, unique, node, _, _, pid = struct.unpack_from("<IIQQIII", req)
    out.write("%d %d\n" % (op, pid))
    if op in NEVER:
        continue
    if op == INIT:
        reply(unique, 0, struct.pack("<IIIIHHIIHHIIH22x", 7, 31, 0, 0, 16, 12, 4096, 1, 0, 0, 0, 0, 0))
    elif op == LOOKUP and node == 1 and req[40:].split(b"\0")[0] == b"held":
        reply(unique, 0, struct.pack("<QQQQII", 2, 0, LONG, LONG, 0, 0) + attr(2))
    elif op == LOOKUP:
        reply(unique, 2)
    elif op == GETATTR:
        reply(unique, 0, struct.pack("<QII", LONG, 0, 0) + attr(node))
    elif op == OPEN:
        reply(unique, 0, struct.pack("<QIi", 1, 0, 0))
    else:
        reply(unique, 38)
"#;

/// Where the clients' mounts and the servers' logs go.
struct Place {
    dir: tempfile::TempDir,
}

impl Place {
    fn new() -> Place {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        std::fs::write(dir.path().join("fuse.py"), FUSE_PY).unwrap();
        Place { dir }
    }

    fn held(&self) -> String {
        format!("{}/mnt/held", self.dir.path().display())
    }

    fn log(&self, client: usize) -> PathBuf {
        self.dir.path().join(format!("log-{client}"))
    }

    /// A client's setup, as root in its own mount namespace: a server of
    /// its own mounted (before `/dev` is replaced: it opens `/dev/fuse`),
    /// then a `/dev` holding only the stand-in of GPU 0, which anyone may
    /// open for reading and writing.
    fn setup(&self, client: usize) -> String {
        let (dir, log) = (self.dir.path().display(), self.log(client));
        let log = log.display();
        format!(
            "{{ \"$PY\" {dir}/fuse.py {dir}/mnt {log} > {log}.up 2>&1 & }} && \
             for i in $(seq 400); do grep -qs mounted {log}.up && break; sleep 0.05; done && \
             {FRESH_DEV} && : > /dev/nvidia0 && chmod 666 /dev/nvidia0"
        )
    }

    /// The requests a client's server took: (opcode, pid).
    fn requests(&self, client: usize) -> Vec<(u32, u32)> {
        let text = std::fs::read_to_string(self.log(client)).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let (op, pid) = l.split_once(' ')?;
                Some((op.parse().ok()?, pid.parse().ok()?))
            })
            .collect()
    }
}

/// Ends every process of the cgroups (servers first of all, so that what
/// waits on them ends too) when the test ends, however it ends.
struct KillAll(Vec<PathBuf>);

impl Drop for KillAll {
    fn drop(&mut self) {
        for cg in &self.0 {
            let _ = std::fs::write(cg.join("cgroup.kill"), "1");
        }
        // Not `wait_until`: a panic here, while a failed test unwinds, would abort.
        let until = Instant::now() + Duration::from_secs(10);
        for cg in &self.0 {
            let procs = cg.join("cgroup.procs");
            while std::fs::read_to_string(&procs).is_ok_and(|t| !t.trim().is_empty())
                && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The daemon's threads now: (tid, name, wchan, kernel stack).
fn threads(pid: u32) -> Vec<(u32, String, String, String)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let read = |p: &Path, f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default().trim().to_string();
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| {
            let tid = t.file_name().to_str()?.parse().ok()?;
            let p = t.path();
            Some((tid, read(&p, "comm"), read(&p, "wchan"), read(&p, "stack")))
        })
        .collect()
}

fn code_and_text(r: &Reply) -> (i32, String) {
    (r.code(), r.text())
}

/// What the scene below came to.
struct Seen {
    /// The eight clients of another user: code and text.
    others: Vec<(i32, String)>,
    /// The new client: code and text.
    new: (i32, String),
    /// `TID NAME WCHAN` of each daemon thread waiting on FUSE.
    on_fuse: Vec<String>,
    /// (opcode, thread) of each request a daemon thread sent a server.
    from_daemon: Vec<(u32, u32)>,
}

/// The scene, with the daemon's bounding set `caps` (setpriv's form).
/// Ends the daemon with SIGTERM and asserts that it exits 0, after
/// `check` has looked at what was seen.
fn scene(caps: &str, check: impl FnOnce(&Seen)) {
    require_root("cgroups, mount namespaces, FUSE, setpriv");
    assert!(Path::new("/dev/fuse").exists(), "this test needs /dev/fuse (the fuse module)");
    let place = Place::new();
    let sockets = tempfile::tempdir().unwrap();
    std::fs::set_permissions(sockets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let uds = format!("--uds_path={}", sockets.path().display());
    let bounding = format!("--bounding-set={caps}");
    let under = ["setpriv", &bounding, "--inh-caps=-all", "--no-new-privs"];
    let flags = ["--tenant_isolation=enforce", "--leases", "--node_wide", "--socket_mode=0666", &uds];
    let mut d = Daemon::spawn_under(&under, &flags, &[]).ready();
    let rules = sockets.path().join("rx_rule_manager");
    let cgroups: Vec<Cgroup> = (0..5).map(|i| Cgroup::new(&format!("hung{i}"))).collect();
    let held = place.held();
    let mut others: Vec<Agent> = (0..8)
        .map(|i| Agent::planted_as(&cgroups[i / 2], &place.setup(i), &["/dev/nvidia0", &held], OTHER_USER))
        .collect();
    let mut new = Agent::planted(&cgroups[4], &place.setup(8), &["/dev/nvidia0", &held]);
    let _kill = KillAll(cgroups.iter().map(|c| c.path.clone()).collect());
    // Each answers once it has opened what it holds.
    for a in others.iter_mut().chain([&mut new]) {
        a.pid();
    }
    for i in 0..9 {
        let opened = place.requests(i).iter().any(|(op, _)| *op == 14);
        assert!(opened, "client {i} does not hold its file on FUSE: {:?}", place.requests(i));
    }

    // The eight install at once.
    let answers = install_at_once(&mut others, &rules);

    // The new client: a thread of it in epoll_ctl on its file, waiting on
    // the server's answer to POLL with the epoll's lock held.
    assert_eq!(new.ask(&format!("epoll {held}")), "epoll");
    wait_until(Duration::from_secs(10), || place.requests(8).iter().any(|(op, _)| *op == 40));
    let (local, remote) = new.conn(false);
    let answer = code_and_text(&new.req(&rules, &rule(local, remote, GPU0)));

    let tasks = threads(d.child.id());
    let on_fuse = tasks
        .iter()
        .filter(|(_, _, wchan, stack)| format!("{wchan}\n{stack}").contains("fuse"))
        .map(|(tid, name, wchan, _)| format!("{tid} {name} {wchan}"))
        .collect();
    let tids: BTreeSet<u32> = tasks.iter().map(|t| t.0).collect();
    let from_daemon =
        (0..9).flat_map(|i| place.requests(i).into_iter().filter(|(_, pid)| tids.contains(pid))).collect();
    check(&Seen { others: answers, new: answer, on_fuse, from_daemon });

    d.signal(nix::sys::signal::Signal::SIGTERM);
    let st = d.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
}

/// What every scene must show: the new client served, nothing of the
/// daemon's on FUSE.
fn nobody_held(seen: &Seen) -> String {
    let s = format!(
        "the eight: {:?}\nthe new client: {:?}\ndaemon threads waiting on FUSE: {:?}\n\
         requests from the daemon: {:?}",
        seen.others, seen.new, seen.on_fuse, seen.from_daemon
    );
    assert_eq!(seen.new.0, 0, "the new client is served: {s}");
    assert!(seen.on_fuse.is_empty() && seen.from_daemon.is_empty(), "{s}");
    s
}

/// The node-wide set: the eight are read through their `/proc/<pid>/fd`
/// (another user's: listed with `CAP_DAC_READ_SEARCH`) and served.
#[test]
#[ignore = "needs root: cgroups, mount namespaces, FUSE, setpriv"]
fn clients_of_another_user_whose_files_hang_are_read_without_waiting_and_served() {
    scene("-all,+net_admin,+chown,+sys_ptrace,+dac_read_search", |seen| {
        let s = nobody_held(seen);
        assert!(seen.others.iter().all(|(code, _)| *code == 0), "{s}");
    });
}

/// Without `CAP_DAC_READ_SEARCH` (the node-wide set before it was added):
/// the eight cannot be listed and are refused at once, saying why. This is
/// the set with which the daemon used to copy their descriptors out and
/// jam: eight readers in `fuse_flush`, `UNAVAILABLE` for everyone, a zombie
/// after SIGTERM.
#[test]
#[ignore = "needs root: cgroups, mount namespaces, FUSE, setpriv"]
fn clients_whose_files_hang_hold_no_reader_and_sigterm_still_ends_the_daemon() {
    scene("-all,+net_admin,+chown,+sys_ptrace", |seen| {
        let s = nobody_held(seen);
        for (code, text) in &seen.others {
            assert_eq!(*code, PERMISSION_DENIED, "{s}");
            assert!(
                text.contains("open files were not read") && text.contains("CAP_DAC_READ_SEARCH"),
                "{text}"
            );
        }
    });
}

/// Reads that run long give their readers up: eight clients in four
/// cgroups, whose tenant reads the daemon holds (debug builds:
/// `TCPX_RXDM_TEST_HOLD_TENANT_READS`), take all eight readers and are
/// answered UNAVAILABLE once their 2 s have passed, each read counted once;
/// a client of a fifth cgroup then gets a reader of its own (a ninth
/// thread), and once the reads end the surplus thread goes. Order is
/// asserted, not time: the minutes bound a hang.
#[test]
#[ignore = "needs root: cgroups, mount namespaces"]
fn reads_that_run_long_give_their_readers_to_others() {
    require_root("cgroups, mount namespaces");
    let hold_dir = tempfile::tempdir().unwrap();
    let hold = hold_dir.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let env = [("TCPX_RXDM_TEST_HOLD_TENANT_READS", hold.to_str().unwrap())];
    let d = Daemon::spawn(&["--tenant_isolation=enforce"], &env).ready();
    let rules = d.sock("rx_rule_manager");
    let cgroups: Vec<Cgroup> = (0..5).map(|i| Cgroup::new(&format!("long{i}"))).collect();
    let mut held: Vec<Agent> = (0..8).map(|i| Agent::start(&cgroups[i / 2], 0)).collect();
    let readers = || threads(d.child.id()).into_iter().filter(|t| t.1.starts_with("tenant-read")).count();
    let answers = install_at_once(&mut held, &rules);
    for (code, text) in &answers {
        assert_eq!(*code, 14, "UNAVAILABLE: {text}");
        assert!(text.contains("within 2 s") && text.contains("try again"), "{text}");
    }
    assert_eq!(readers(), 8, "every reader holds a read");
    let (_, m) = d.http_get("/metrics");
    assert_eq!(common::metric(&m, "tcpx_rxdm_tenant_reads_slow_total"), Some(8.0), "each read once");

    let mut new = Agent::start(&cgroups[4], 0);
    let (local, remote) = new.conn(false);
    std::thread::scope(|s| {
        let asked = s.spawn(|| new.req(&rules, &rule(local, remote, GPU0)).code());
        wait_until(Duration::from_secs(30), || readers() == 9);
        std::fs::remove_file(&hold).unwrap();
        asked.join().unwrap();
    });
    // Asked again, after every read ended: all served; and the ninth reader is gone.
    for a in held.iter_mut().chain([&mut new]) {
        let (local, remote) = a.conn(false);
        let r = a.req(&rules, &rule(local, remote, GPU0));
        assert_eq!(r.code(), 0, "{}", r.text());
    }
    wait_until(Duration::from_secs(60), || readers() <= 8);
}

/// Each agent installs a rule for a connection of its own, all at once;
/// the answers (code, text) in the agents' order.
fn install_at_once(agents: &mut [Agent], rules: &std::path::Path) -> Vec<(i32, String)> {
    std::thread::scope(|s| {
        let asks: Vec<_> = agents
            .iter_mut()
            .map(|a| {
                let (local, remote) = a.conn(false);
                s.spawn(move || code_and_text(&a.req(rules, &rule(local, remote, GPU0))))
            })
            .collect();
        asks.into_iter().map(|a| a.join().unwrap()).collect()
    })
}
