//! Takeover end to end on simulated NICs and host pools: 20 takeovers in a
//! row under load from 16 client processes without one failed request,
//! leases, registrations and pool memory that move with the daemon, and
//! every way a takeover can fail leaving the serving daemon as it was.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::procs::leased_daemon as daemon;
use common::{encoded, wait_until, Daemon};
use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::wire::{client, frame};

const GPU: &str = "0000:04:00.0";
const CLIENTS: usize = 16;
const TAKEOVERS: usize = 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn rule(sport: i32) -> Vec<u8> {
    encoded(&client::rule_request(1, ("10.1.0.2", sport), ("192.168.1.2", 5000), Some(GPU), None))
}

/// One load process: installs and removes its rules, each on a new
/// connection as the NCCL plugin does, until `stop` exists; waits while
/// `hold` exists (saying so with `held.<n>`). Any reply but OK, any refused
/// connect: prints FAIL and exits 1. At the end prints `done <requests>`.
const LOAD_PY: &str = r#"
import os, socket, sys, time
install, uninstall, folder, ok, n = sys.argv[1], sys.argv[2], sys.argv[3], bytes.fromhex(sys.argv[4]), sys.argv[5]
rules = [bytes.fromhex(h) for h in sys.argv[6:]]
stop, hold, held = os.path.join(folder, 'stop'), os.path.join(folder, 'hold'), os.path.join(folder, 'held.' + n)
def ask(path, req):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(req)
    got = b''
    while len(got) < 2 or len(got) < 2 + int.from_bytes(got[:2], 'big'):
        b = s.recv(64)
        if not b:
            break
        got += b
    s.close()
    if got != ok:
        print('FAIL ' + path + ' ' + got.hex(), flush=True)
        sys.exit(1)
count = 0
while not os.path.exists(stop):
    if os.path.exists(hold):
        open(held, 'w').close()
        while os.path.exists(hold):
            time.sleep(0.002)
        os.remove(held)
    for r in rules:
        ask(install, r)
        ask(uninstall, r)
        count += 2
print('done %d' % count, flush=True)
"#;

struct Load {
    procs: Vec<Child>,
    ctl: PathBuf,
}

impl Load {
    fn start(folder: &Path, ctl: &Path) -> Load {
        let procs = (0..CLIENTS)
            .map(|p| {
                let mut cmd = common::python3();
                cmd.arg("-c").arg(LOAD_PY);
                cmd.arg(folder.join("rx_rule_manager")).arg(folder.join("rx_rule_uninstall")).arg(ctl);
                cmd.arg(hex(frame::OK_FRAME)).arg(p.to_string());
                for i in 0..4 {
                    cmd.arg(hex(&rule(20_000 + (p * 10 + i) as i32)));
                }
                cmd.stdout(Stdio::piped()).spawn().expect("python3")
            })
            .collect();
        Load { procs, ctl: ctl.to_path_buf() }
    }

    /// Stops every process between two requests (none is in flight).
    fn hold(&self) {
        std::fs::write(self.ctl.join("hold"), b"").unwrap();
        wait_until(Duration::from_secs(20), || {
            (0..CLIENTS).all(|n| self.ctl.join(format!("held.{n}")).exists())
        });
    }

    fn release(&self) {
        std::fs::remove_file(self.ctl.join("hold")).unwrap();
    }

    /// Stops the load; the requests made, all answered OK.
    fn finish(self) -> u64 {
        std::fs::write(self.ctl.join("stop"), b"").unwrap();
        let mut total = 0;
        for mut p in self.procs {
            let mut out = String::new();
            p.stdout.take().unwrap().read_to_string(&mut out).unwrap();
            let st = p.wait().unwrap();
            assert!(st.success(), "a load process failed: {out}");
            total += out.trim().strip_prefix("done ").and_then(|n| n.parse::<u64>().ok()).expect("done line");
        }
        total
    }
}

/// Booked rules equal the NIC's table, NIC by NIC; the number booked.
fn check_tables(d: &Daemon) -> usize {
    let flows = d.flows();
    let mut total = 0;
    for n in flows["nics"].as_array().unwrap() {
        let mut booked: Vec<u64> =
            n["rules"].as_array().unwrap().iter().map(|r| r["loc"].as_u64().unwrap()).collect();
        let mut nic: Vec<u64> = n["nic_rules"]
            .as_array()
            .expect("NIC readable")
            .iter()
            .map(|r| r["loc"].as_u64().unwrap())
            .collect();
        booked.sort_unstable();
        nic.sort_unstable();
        assert_eq!(booked, nic, "{}: bookkeeping and NIC table differ", n["ifname"]);
        total += booked.len();
    }
    total
}

fn has_sport(d: &Daemon, sport: u16) -> bool {
    let needle = format!(":{sport}");
    d.flows()["nics"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["rules"].as_array().unwrap().iter().any(|r| r["src"].as_str().unwrap().ends_with(&needle)))
}

/// Writes `pattern` into the pool through the fd the daemon serves (or
/// reads it back when `pattern` is empty), from a process of its own.
fn pool_io(folder: &Path, pattern: &str) -> String {
    let py = r#"
import mmap, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(bytes.fromhex(sys.argv[2]))
msg, anc, flags, addr = s.recvmsg(1, socket.CMSG_SPACE(4))
fd = int.from_bytes(anc[0][2][:4], 'little')
m = mmap.mmap(fd, 4096)
if sys.argv[3]:
    m[:len(sys.argv[3])] = sys.argv[3].encode()
print(m[:32].rstrip(b'\0').decode(), flush=True)
"#;
    let req = encoded(&client::raw_request(GPU));
    let out = common::python3()
        .args(["-c", py])
        .arg(folder.join(format!("get_gpu_fd_{GPU}")))
        .arg(hex(&req))
        .arg(pattern)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
#[cfg_attr(
    sibling_ptrace_blocked,
    ignore = "Yama ptrace_scope 1 or more: a daemon started beside another may take it over only with CAP_SYS_PTRACE (run as root)"
)]
fn twenty_takeovers_under_load_lose_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (folder, ctl) = (tmp.path().join("uds"), tmp.path().join("ctl"));
    std::fs::create_dir_all(&ctl).unwrap();
    let mut current = daemon(&folder, &["--monitor_shutdown"], &[]).ready();
    let first_pid = current.child.id();
    // A registered application, a live client with a rule, and pool memory written.
    let mut reg = UnixStream::connect(folder.join("rxdm_application_registry")).unwrap();
    reg.write_all(&encoded(&client::register(true))).unwrap();
    common::read_frame(&mut reg).unwrap();
    let mut lingering =
        common::ClientProcess::run(&[(folder.join("rx_rule_manager"), rule(777))], Duration::from_secs(300));
    assert_eq!(lingering.replies, vec![frame::OK_FRAME.to_vec()]);
    assert_eq!(pool_io(&folder, "written before the takeovers"), "written before the takeovers");
    let load = Load::start(&folder, &ctl);
    std::thread::sleep(Duration::from_millis(300));
    let mut slowest = Duration::ZERO;
    for i in 0..TAKEOVERS {
        let t = Instant::now();
        let next = daemon(&folder, &["--monitor_shutdown", "--takeover"], &[]).ready();
        let took = t.elapsed();
        slowest = slowest.max(took);
        let st = current.wait_exit(Duration::from_secs(20));
        assert!(st.success(), "takeover {i}: the old daemon exited {st:?}");
        let pid = next.child.id();
        let line = current.wait_for_log("handed over to pid", Duration::from_secs(30)).unwrap();
        assert!(line.contains(&format!("handed over to pid {pid}")), "{line}");
        let log = current.log().join("\n");
        assert!(
            !log.contains("rules removed") && !log.contains("shutdown complete"),
            "takeover {i}: the old daemon restored something:\n{log}"
        );
        let took_line = next.wait_for_log("took over from pid", Duration::from_secs(30)).unwrap();
        assert!(took_line.contains(&format!("took over from pid {}", current.child.id())), "{took_line}");
        load.hold();
        let booked = check_tables(&next);
        assert!(booked >= 1, "takeover {i}: the lingering client's rule is gone");
        load.release();
        current = next;
    }
    let requests = load.finish();
    assert!(requests > 1000, "too little load to mean anything: {requests} requests");
    assert_eq!(check_tables(&current), 1, "only the lingering client's rule is left");
    // What moved with the daemon: the pool's memory, the lease, the registration.
    assert_eq!(pool_io(&folder, ""), "written before the takeovers");
    assert!(has_sport(&current, 777));
    lingering.kill();
    wait_until(Duration::from_secs(10), || !has_sport(&current, 777));
    assert_eq!(check_tables(&current), 0);
    drop(reg);
    let st = current.wait_exit(Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
    assert!(
        current.log().iter().any(|l| l.contains("shutting down") && l.contains("application")),
        "{}",
        current.log().join("\n")
    );
    eprintln!(
        "{TAKEOVERS} takeovers from pid {first_pid}: {requests} requests from {CLIENTS} processes, none failed; \
         slowest takeover (start to ready) {slowest:?}"
    );
}

/// Speaks the handover protocol by hand as a peer allowed to take the
/// daemon's descriptors (this test's process): proves it, sends `hello`,
/// returns the offer.
fn ask_by_hand(
    folder: &Path,
    hello: &tcpx_rxdm::handover::Hello,
) -> Result<tcpx_rxdm::handover::Offer, String> {
    use tcpx_rxdm::handover::{self, proof, Challenge, Process};
    let mut s = UnixStream::connect(folder.join(handover::SOCKET)).map_err(|e| e.to_string())?;
    handover::set_timeouts(&s, Duration::from_secs(10)).unwrap();
    let challenge: Challenge = handover::recv(&mut s, "challenge").map_err(|e| e.to_string())?;
    let daemon = Process::of_peer(std::os::fd::AsFd::as_fd(&s)).map_err(|e| e.to_string())?;
    let hello = handover::Hello { proof: proof::answer(&daemon, challenge.fd).unwrap(), ..hello.clone() };
    handover::send(&mut s, "hello", &hello).map_err(|e| e.to_string())?;
    handover::recv(&mut s, "offer").map_err(|e| e.to_string())
}

/// The daemon still serves as before: an install and its removal answer OK,
/// and the rules it held are still booked and on the NIC.
fn still_serves(d: &Daemon, folder: &Path, sport: i32, rules_before: usize) {
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_manager"), &rule(sport)), frame::OK_FRAME);
    assert_eq!(check_tables(d), rules_before + 1);
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_uninstall"), &rule(sport)), frame::OK_FRAME);
    assert_eq!(check_tables(d), rules_before);
}

#[test]
#[cfg_attr(
    sibling_ptrace_blocked,
    ignore = "Yama ptrace_scope 1 or more: a daemon started beside another may take it over only with CAP_SYS_PTRACE (run as root)"
)]
fn a_failed_takeover_leaves_the_old_daemon_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let old = daemon(&folder, &["--takeover_timeout=1s"], &[]).ready();
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_manager"), &rule(100)), frame::OK_FRAME);
    assert_eq!(check_tables(&old), 1);

    // Another protocol version: refused before anything pauses, without the
    // daemon's own version; its log has both.
    let hello = tcpx_rxdm::handover::Hello { version: 99, pid: 1, ..Default::default() };
    let offer = ask_by_hand(&folder, &hello).unwrap();
    use tcpx_rxdm::handover::offer::Answer;
    let Some(Answer::Refused(why)) = offer.answer else { panic!("{offer:?}") };
    assert_eq!(why, "the running daemon speaks another version of the takeover protocol");
    let logged = old.wait_for_log("takeover refused", Duration::from_secs(2)).unwrap();
    assert!(logged.contains("protocol version 99 asked, this daemon speaks"), "{logged}");
    still_serves(&old, &folder, 101, 1);

    // Flags that change what is served: the new daemon exits 1 naming the
    // setting; only the serving daemon's log has its value.
    let mut other = daemon(&folder, &["--takeover", "--tenant_isolation=off"], &[]);
    let st = other.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1));
    let line = other.wait_for_log("another --tenant_isolation", Duration::from_secs(2));
    assert!(line.is_some(), "{}", other.log().join("\n"));
    assert!(!line.unwrap().contains("audit"), "the refusal quoted the daemon's value");
    assert!(
        old.wait_for_log(
            r#"tenant_isolation differs: this daemon has "audit", the other "off""#,
            Duration::from_secs(30)
        )
        .is_some(),
        "{}",
        old.log().join("\n")
    );
    still_serves(&old, &folder, 102, 1);

    // The new process dies holding the state: the old one serves on.
    let mut dies = daemon(&folder, &["--takeover"], &[("TCPX_RXDM_TEST_TAKEOVER_FAULT", "exit")]);
    assert_eq!(dies.wait_exit(Duration::from_secs(20)).code(), Some(3));
    assert!(old.wait_for_log("takeover failed; serving on", Duration::from_secs(5)).is_some());
    still_serves(&old, &folder, 103, 1);

    // It never answers: after --takeover_timeout the old one serves on; a
    // second takeover meanwhile is refused at once.
    let count = |d: &Daemon, needle: &str| d.log().iter().filter(|l| l.contains(needle)).count();
    let asked = count(&old, "takeover asked: pausing");
    // A connection open before the pause whose request arrives during it:
    // answered once the old daemon serves on.
    let mut early = UnixStream::connect(folder.join("rx_rule_manager")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut stalls = daemon(&folder, &["--takeover"], &[("TCPX_RXDM_TEST_TAKEOVER_FAULT", "stall")]);
    wait_until(Duration::from_secs(20), || count(&old, "takeover asked: pausing") > asked);
    std::thread::sleep(Duration::from_millis(100)); // the state is on its way
    early.write_all(&rule(105)).unwrap();
    let mut second = daemon(&folder, &["--takeover"], &[]);
    assert_eq!(second.wait_exit(Duration::from_secs(20)).code(), Some(1));
    assert!(
        second.wait_for_log("another takeover is under way", Duration::from_secs(30)).is_some(),
        "{}",
        second.log().join("\n")
    );
    let resumed = count(&old, "takeover failed; serving on");
    wait_until(Duration::from_secs(10), || count(&old, "takeover failed; serving on") > resumed);
    early.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(common::read_frame(&mut early).unwrap(), frame::OK_FRAME, "the request sent during the pause");
    drop(early);
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_uninstall"), &rule(105)), frame::OK_FRAME);
    still_serves(&old, &folder, 104, 1);
    stalls.child.kill().unwrap();
    let _ = stalls.wait_exit(Duration::from_secs(5));

    // With nothing wrong the same folder is taken over, rules and all, and a
    // connection open across it is served by the successor.
    let mut across = UnixStream::connect(folder.join("rx_rule_manager")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let new = daemon(&folder, &["--takeover"], &[]).ready();
    let mut old = old;
    assert!(old.wait_exit(Duration::from_secs(20)).success());
    assert!(old.log().iter().any(|l| l.contains("via=the handover socket, proven")));
    across.write_all(&rule(106)).unwrap();
    across.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(common::read_frame(&mut across).unwrap(), frame::OK_FRAME);
    drop(across);
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_uninstall"), &rule(106)), frame::OK_FRAME);
    assert_eq!(check_tables(&new), 1);
    assert!(new.log().iter().any(|l| l.contains(READY_LINE)));
}

#[test]
#[cfg_attr(
    sibling_ptrace_blocked,
    ignore = "Yama ptrace_scope 1 or more: a daemon started beside another may take it over only with CAP_SYS_PTRACE (run as root)"
)]
fn takeover_auto_starts_normally_when_nobody_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let mut none = daemon(&folder, &["--takeover"], &[]);
    assert_eq!(none.wait_exit(Duration::from_secs(20)).code(), Some(1));
    assert!(
        none.wait_for_log("no daemon serves", Duration::from_secs(30)).is_some(),
        "{}",
        none.log().join("\n")
    );
    let first = daemon(&folder, &["--takeover=auto"], &[]).ready();
    assert!(first.wait_for_log("no daemon to take over from", Duration::from_secs(30)).is_some());
    let second = daemon(&folder, &["--takeover=auto"], &[]).ready();
    assert!(second.wait_for_log("took over from pid", Duration::from_secs(30)).is_some());
}

#[test]
fn sigusr2_starts_a_successor_and_wait_mode_exits_on_sigterm_only() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let mut old =
        daemon(&folder, &["--after_handover=wait", "--client_idle_timeout=1", "--nomonitor_shutdown"], &[])
            .ready();
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_manager"), &rule(300)), frame::OK_FRAME);
    // Connections open across the takeover: an idle rule connection and a registration.
    let mut idle = UnixStream::connect(folder.join("rx_rule_manager")).unwrap();
    let mut reg = UnixStream::connect(folder.join("rxdm_application_registry")).unwrap();
    reg.write_all(&encoded(&client::register(true))).unwrap();
    assert_eq!(common::read_frame(&mut reg).unwrap(), frame::OK_FRAME);
    std::thread::sleep(Duration::from_millis(50));
    old.signal(Signal::SIGUSR2);
    let line = old.wait_for_log("handed over to pid", Duration::from_secs(20)).expect("handed over");
    let asked = old.wait_for_log("takeover asked: pausing", Duration::from_secs(1)).unwrap();
    assert!(asked.contains("via=the channel to a successor it started"), "{asked}");
    let pid: i32 =
        line.split("handed over to pid ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(old.wait_for_log("waiting for SIGTERM", Duration::from_secs(30)).is_some());
    // The successor's close of an idle connection reaches the client although
    // the old daemon still runs: it let go of its copy.
    idle.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(idle.read(&mut buf).expect("EOF, not a timeout"), 0);
    // The registration moved: the successor answers on it.
    reg.write_all(&encoded(&client::register(false))).unwrap();
    reg.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(common::read_frame(&mut reg).unwrap(), frame::OK_FRAME);
    std::thread::sleep(Duration::from_millis(200));
    assert!(old.child.try_wait().unwrap().is_none(), "--after_handover=wait: still up");
    // The successor serves the same folder, rule and all; the old one only waits.
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_manager"), &rule(301)), frame::OK_FRAME);
    // A readiness probe in this cgroup sees its daemon serving.
    let (code, out, err) = common::run_bin(&["status", "mine", &format!("--uds_path={}", folder.display())]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("pid {pid}")), "{out}");
    old.signal(Signal::SIGTERM);
    assert!(old.wait_exit(Duration::from_secs(10)).success());
    assert!(!old.log().iter().any(|l| l.contains("rules removed")), "the old daemon restored nothing");
    // Its exit shut nothing the successor serves.
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_uninstall"), &rule(301)), frame::OK_FRAME);
    assert!(folder.join("rx_rule_manager").exists());
    // The successor is no child of ours: stop it by pid; its exit restores and cleans up.
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    wait_until(Duration::from_secs(20), || kill(Pid::from_raw(pid), None).is_err());
    assert!(!folder.join("rx_rule_manager").exists(), "the last daemon removes the sockets");
    // And the folder the first one made, as the first would have.
    assert!(!folder.exists(), "the successor left the socket folder the first daemon made");
}

#[test]
#[ignore = "needs root: switches user and group"]
fn only_the_daemons_own_user_reaches_the_handover_socket() {
    use std::os::unix::fs::PermissionsExt;
    common::require_root("switches user and group");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let folder = tmp.path().join("uds");
    // Sockets every user may use, in a folder every user may search.
    let d = daemon(&folder, &["--socket_mode=0666"], &[]).ready();
    let handover = folder.join(tcpx_rxdm::handover::SOCKET);
    assert_eq!(std::fs::metadata(&handover).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(common::connect_as(65534, 65534, &folder.join("rx_rule_manager"), &[]), Ok(()));
    assert_eq!(common::connect_as(65534, 65534, &handover, &[]), Err(nix::errno::Errno::EACCES));
    // Nothing happened to the daemon.
    assert!(!d.log().iter().any(|l| l.contains("takeover")), "{}", d.log().join("\n"));
    assert_eq!(common::raw_exchange(&folder.join("rx_rule_manager"), &rule(400)), frame::OK_FRAME);
}

/// The count of `endpoint`'s connections being served.
fn served(d: &Daemon, endpoint: &str) -> f64 {
    let (_, body) = d.http_get("/metrics");
    common::metric(&body, &format!("tcpx_rxdm_connections{{endpoint=\"{endpoint}\"}}")).unwrap_or(0.0)
}

#[test]
#[cfg_attr(
    sibling_ptrace_blocked,
    ignore = "Yama ptrace_scope 1 or more: a daemon started beside another may take it over only with CAP_SYS_PTRACE (run as root)"
)]
fn a_connection_accepted_at_the_connection_limit_moves_with_a_takeover() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    // Workloads are not told apart (one workload may not hold all four).
    let flags = ["--max_connections=4", "--tenant_isolation=off"];
    let old = daemon(&folder, &flags, &[]).ready();
    // Four permits, one kept for registry and pool endpoints: three registry
    // connections take it and two shared ones, a queue connection the last.
    let _registry: Vec<UnixStream> =
        (0..3).map(|_| UnixStream::connect(folder.join("rxdm_application_registry")).unwrap()).collect();
    let _queue = UnixStream::connect(folder.join("queue_ids_by_gpu")).unwrap();
    wait_until(Duration::from_secs(10), || {
        served(&old, "registry") == 3.0 && served(&old, "queue_ids") == 1.0
    });
    // The metadata endpoint's accept loop passed its budget check before the
    // budget filled: it accepts this one and waits for a permit.
    let pool = tcpx_rxdm::wire::proto::UnixSocketProto {
        payload: Some(tcpx_rxdm::wire::proto::unix_socket_proto::Payload::RawBytes(GPU.as_bytes().to_vec())),
        status: None,
    };
    let mut late = UnixStream::connect(folder.join(format!("get_gpu_metadata_{GPU}"))).unwrap();
    late.write_all(&encoded(&pool)).unwrap();
    late.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    assert!(common::read_frame(&mut late).is_err(), "no permit: not served yet");
    assert_eq!(served(&old, "gpu_metadata"), 0.0);
    // A takeover meanwhile hands it on: the successor answers it.
    let new = daemon(&folder, &[&flags[..], &["--takeover"]].concat(), &[]).ready();
    let mut old = old;
    assert!(old.wait_exit(Duration::from_secs(20)).success());
    late.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let reply = common::read_frame(&mut late).expect("answered by the successor, not dropped");
    let msg = frame::parse(&reply).unwrap().unwrap().0;
    assert_eq!(tcpx_rxdm::wire::client::status_code(&msg), 0, "{msg:?}");
    assert_eq!(served(&new, "gpu_metadata"), 1.0);
}
