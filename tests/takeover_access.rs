//! Who can take a daemon over. A peer of the handover socket that does not
//! prove it could take the daemon's descriptors (`pidfd_getfd`) gets one
//! fixed sentence and nothing else: no descriptor, no value of the daemon's
//! configuration, no pause; as root tests, a root workload with a
//! container's capabilities in a cgroup and mount namespace of its own, the
//! folder mounted read-only, tries with the real binary and by hand. Silent
//! peers hold up no one, and a successor started on SIGUSR2 whose
//! predecessor died starts fresh (before the state) or adopts (after).

mod common;

use std::io::{IoSliceMut, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::procs::{alive, leased_daemon as daemon, lock_pid, status_pid};
use common::{install_frame, raw_exchange, run_bin, wait_until, Daemon, GPU0, OK_FRAME};
use nix::sys::signal::Signal;
use prost::Message;
use tcpx_rxdm::handover::{self, offer::Answer, proof, Hello, Offer};

const FAULT: &str = "TCPX_RXDM_TEST_TAKEOVER_FAULT";

/// What the status socket's daemon reports, if it answers ready.
fn status(folder: &Path) -> Option<serde_json::Value> {
    let (code, out, _) = run_bin(&["status", "--json", &format!("--uds_path={}", folder.display())]);
    (code == 0).then(|| serde_json::from_str(&out).ok()).flatten()
}

/// A frame as the handover speaks it: 4-byte big-endian length, then the message.
fn frame<M: Message>(m: &M) -> Vec<u8> {
    let body = m.encode_to_vec();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

/// The whole answer to an unproven peer, as bytes.
fn unproven_frame() -> Vec<u8> {
    frame(&Offer { answer: Some(Answer::Refused(handover::UNPROVEN.into())) })
}

/// Everything that arrives on `s` until the daemon closes it: the bytes
/// and how many descriptors came with them.
fn read_all(s: &UnixStream) -> (Vec<u8>, usize) {
    let (mut bytes, mut fds) = (Vec::new(), 0);
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 253]);
    loop {
        let mut buf = [0u8; 4096];
        let n = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = nix::sys::socket::recvmsg::<()>(
                s.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .expect("the daemon closes the connection within the timeout");
            for c in msg.cmsgs().unwrap() {
                if let nix::sys::socket::ControlMessageOwned::ScmRights(got) = c {
                    fds += got.len();
                    got.into_iter().for_each(|fd| drop(unsafe_owned(fd)));
                }
            }
            msg.bytes
        };
        if n == 0 {
            return (bytes, fds);
        }
        bytes.extend_from_slice(&buf[..n]);
    }
}

fn unsafe_owned(fd: std::os::fd::RawFd) -> std::os::fd::OwnedFd {
    // SAFETY: a descriptor the kernel just installed for this process; nothing else owns it.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }
}

/// The challenge a daemon opens with: its frame's length and the descriptor number.
fn challenge(bytes: &[u8]) -> (usize, u32) {
    let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
    let c = handover::Challenge::decode(&bytes[4..4 + len]).unwrap();
    (4 + len, c.fd)
}

#[test]
fn a_peer_that_does_not_prove_itself_gets_one_sentence_and_the_daemon_never_pauses() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let d = daemon(&folder, &["--tenant_isolation=audit"], &[]).ready();
    assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(5100, GPU0)), OK_FRAME);
    // This test's process could prove itself; each try answers otherwise,
    // with fingerprints right and wrong.
    let right = |k: &str, v: &str| [(k.to_string(), v.to_string())].into_iter().collect();
    let tries: Vec<(Vec<u8>, std::collections::HashMap<String, String>)> = vec![
        (Vec::new(), Default::default()),
        (vec![0; proof::SECRET_LEN], right("tenant_isolation", "off")),
        (vec![7; proof::SECRET_LEN], right("tenant_isolation", "audit")),
        (b"a guess".to_vec(), right("uds_path", &folder.display().to_string())),
    ];
    for (i, (guess, fingerprint)) in tries.into_iter().enumerate() {
        let mut s = UnixStream::connect(folder.join(handover::SOCKET)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let hello = Hello { version: handover::VERSION, pid: 1, fingerprint, proof: guess };
        // The hello goes out before the challenge is read: the daemon reads it after sending its own.
        s.write_all(&frame(&hello)).unwrap();
        let (bytes, fds) = read_all(&s);
        assert_eq!(fds, 0, "try {i}: a descriptor came");
        let (head, _) = challenge(&bytes);
        assert_eq!(&bytes[head..], unproven_frame().as_slice(), "try {i}: more than the one sentence");
        for value in ["audit", "sim", "host", &folder.display().to_string()] {
            assert!(!String::from_utf8_lossy(&bytes).contains(value), "try {i}: {value} was quoted");
        }
    }
    let log = d.log().join("\n");
    assert!(!log.contains("takeover asked: pausing"), "{log}");
    let refused = d.wait_for_log("did not prove", Duration::from_secs(2)).unwrap();
    assert!(refused.contains(&format!("uid {}", nix::unistd::geteuid())), "{refused}");
    // It serves on, rule and all.
    assert_eq!(lock_pid(&folder).unwrap(), d.child.id());
    assert_eq!(raw_exchange(&folder.join("rx_rule_uninstall"), &install_frame(5100, GPU0)), OK_FRAME);
}

#[test]
#[cfg_attr(
    sibling_ptrace_blocked,
    ignore = "Yama ptrace_scope 1 or more: a daemon started beside another may take it over only with CAP_SYS_PTRACE (run as root)"
)]
fn silent_peers_hold_up_no_real_takeover() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let mut old = daemon(&folder, &[], &[]).ready();
    // More silent peers than proofs run at once, and one that sends garbage.
    let silent: Vec<UnixStream> =
        (0..40).map(|_| UnixStream::connect(folder.join(handover::SOCKET)).unwrap()).collect();
    let mut garbage = UnixStream::connect(folder.join(handover::SOCKET)).unwrap();
    garbage.write_all(&[0xff; 64]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // A real successor, while every one of them is still connected.
    let new = daemon(&folder, &["--takeover"], &[]).ready();
    assert!(old.wait_exit(Duration::from_secs(20)).success(), "{}", old.log().join("\n"));
    assert_eq!(lock_pid(&folder).unwrap(), new.child.id());
    assert_eq!(status_pid(&folder), Some(new.child.id()));
    assert!(new.wait_for_log("took over from pid", Duration::from_secs(5)).is_some());
    drop((silent, garbage));
}

#[test]
fn a_successor_started_on_sigusr2_starts_fresh_or_adopts_when_its_predecessor_dies() {
    use std::os::unix::process::ExitStatusExt;
    // Dead after reading the hello (nothing handed over): fresh, rules gone.
    // Dead after reading `adopted` (the state handed over): adopted, rules kept.
    for (fault, said, rules) in [
        ("old:hello:kill", "ended before it handed over; starting normally", 0),
        ("old:adopted:kill", "ended without committing; serving", 1),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let folder = tmp.path().join("uds");
        let mut old = daemon(&folder, &[], &[(FAULT, fault)]).ready();
        assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(5200, GPU0)), OK_FRAME);
        old.signal(Signal::SIGUSR2);
        let line = old.wait_for_log("started a successor", Duration::from_secs(10)).unwrap();
        if fault == "old:adopted:kill" {
            // Over the channel made for it, not the handover socket.
            let asked = old.wait_for_log("takeover asked: pausing", Duration::from_secs(10)).unwrap();
            assert!(asked.contains("via=the channel to a successor it started"), "{asked}");
        }
        let pid: u32 = line.split("pid=").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(old.wait_exit(Duration::from_secs(20)).signal(), Some(9), "{fault}");
        // The successor writes to the same stderr.
        assert!(
            old.wait_for_log(said, Duration::from_secs(10)).is_some(),
            "{fault}:\n{}",
            old.log().join("\n")
        );
        // Ready: the status socket names it (its lock file too).
        wait_until(Duration::from_secs(20), || status_pid(&folder) == Some(pid));
        assert_eq!(lock_pid(&folder).unwrap(), pid, "{fault}");
        let nics = status(&folder).unwrap()["nics"].as_array().unwrap().clone();
        let booked: u64 = nics.iter().map(|n| n["rules"].as_u64().unwrap()).sum();
        assert_eq!(booked, rules, "{fault}");
        assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(5201, GPU0)), OK_FRAME);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(cmdline.ends_with(b"--takeover=auto\0"), "{:?}", String::from_utf8_lossy(&cmdline));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
        wait_until(Duration::from_secs(20), || !alive(pid));
    }
}

/// The capabilities a container runtime grants by default (Docker's list).
const CONTAINER_CAPS: &str = "-all,+chown,+dac_override,+fsetid,+fowner,+mknod,+net_raw,+setgid,+setuid,\
                              +setfcap,+setpcap,+net_bind_service,+sys_chroot,+kill,+audit_write";

/// Runs "$@" in cgroup `$CG` and a mount namespace of its own; with `$RO`
/// set, `$D` is mounted read-only there; with `$CAPS` set, only those
/// capabilities are left (bounding, inheritable and ambient sets).
const JAIL: &str = r#"echo $$ > "$CG/cgroup.procs" && exec unshare -m --propagation private sh -c '
  if [ -n "$RO" ]; then mount --bind "$D" "$D" && mount -o remount,bind,ro "$D" || exit 90; fi
  if [ -n "$CAPS" ]; then exec setpriv --bounding-set="$CAPS" --inh-caps=-all --ambient-caps=-all -- "$@"; fi
  exec "$@"' sh "$@""#;

/// By hand: for each hello (hex), connect, read the challenge, try to take
/// the descriptor it names, send the hello, read until the daemon closes;
/// one line per try with the descriptors that came, the errno of
/// `pidfd_getfd` and every byte received.
const BY_HAND_PY: &str = r#"
import ctypes, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def take(s, got, fds):
    msg, anc, flags, addr = s.recvmsg(65536, socket.CMSG_SPACE(4 * 253))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += len(data) // 4
    return got + msg, fds, len(msg)
for i, hx in enumerate(sys.argv[2:]):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1]); s.settimeout(10)
    got, fds = b'', 0
    while len(got) < 4 or len(got) < 4 + int.from_bytes(got[:4], 'big'):
        got, fds, n = take(s, got, fds)
        if n == 0: break
    num, shift, k = 0, 0, 5
    while k < len(got):
        num |= (got[k] & 0x7f) << shift; shift += 7
        if got[k] < 0x80: break
        k += 1
    pidfd = s.getsockopt(socket.SOL_SOCKET, 77)
    r = libc.syscall(438, pidfd, num, 0)
    err = ctypes.get_errno() if r < 0 else 0
    s.sendall(bytes.fromhex(hx))
    while True:
        got, fds, n = take(s, got, fds)
        if n == 0: break
    print('try %d fds=%d getfd_errno=%d bytes=%s' % (i, fds, err, got.hex()), flush=True)
"#;

#[test]
#[ignore = "needs root: cgroups, mount namespaces, capability sets"]
fn a_root_workload_with_a_containers_capabilities_cannot_take_the_daemon_over() {
    use common::tenant::Cgroup;
    common::require_root("cgroups, mount namespaces, capability sets");
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("uds");
    let uds = format!("--uds_path={}", folder.display());
    let mut d = daemon(&folder, &["--tenant_isolation=audit"], &[]).ready();
    let pid = d.child.id();
    // A client whose requests keep being answered throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let client = {
        let (stop, answered, folder) = (stop.clone(), answered.clone(), folder.clone());
        std::thread::spawn(move || {
            let mut port = 6000;
            while !stop.load(Ordering::Relaxed) {
                for (socket, req) in [("rx_rule_manager", port), ("rx_rule_uninstall", port)] {
                    assert_eq!(raw_exchange(&folder.join(socket), &install_frame(req, GPU0)), OK_FRAME);
                }
                answered.fetch_add(1, Ordering::Relaxed);
                port = 6000 + (port - 5999) % 1000;
            }
        })
    };
    let cg = Cgroup::new("attacker");
    let d_path = folder.display().to_string();
    let jail = ["sh", "-c", JAIL, "sh"];
    let env =
        [("CG", cg.path.to_str().unwrap()), ("D", d_path.as_str()), ("RO", "1"), ("CAPS", CONTAINER_CAPS)];

    // (a) The real binary, asking to take over (with another isolation mode: it learns of no difference).
    let mut a = Daemon::spawn_under(&jail, &[&uds, "--takeover", "--tenant_isolation=enforce"], &env);
    assert_eq!(a.wait_exit(Duration::from_secs(20)).code(), Some(1), "{}", a.log().join("\n"));
    let why = a.wait_for_log("takeover failed", Duration::from_secs(2)).unwrap();
    assert!(why.contains("could not prove") && why.contains("EPERM"), "{why}");
    assert!(why.ends_with(&format!("the running daemon refused: {}", handover::UNPROVEN)), "{why}");
    assert!(!why.contains("tenant_isolation") && !a.log().iter().any(|l| l.contains("took over")));

    // (b) By hand, with fingerprints and proofs of its choosing.
    let fingerprints: [&[(&str, &str)]; 4] = [
        &[],
        &[("tenant_isolation", "enforce")],
        &[
            ("tenant_isolation", "audit"),
            ("uds_path", &d_path),
            ("nic_backend", "sim"),
            ("pool_backend", "host"),
        ],
        &[("uds_path", "/elsewhere")],
    ];
    let hellos: Vec<String> = fingerprints
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let fingerprint = f.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let proof = if i % 2 == 0 { Vec::new() } else { vec![i as u8; proof::SECRET_LEN] };
            frame(&Hello { version: handover::VERSION, pid: 1, fingerprint, proof })
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .collect();
    let out = std::process::Command::new("sh")
        .args(["-c", JAIL, "sh", common::tenant::python(), "-c", BY_HAND_PY])
        .arg(folder.join(handover::SOCKET))
        .args(&hellos)
        .envs(env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), hellos.len(), "{text}");
    for line in lines {
        assert!(line.contains(" fds=0 "), "a descriptor came: {line}");
        assert!(line.contains(" getfd_errno=1 "), "pidfd_getfd was not refused (EPERM): {line}");
        let hex = line.split("bytes=").nth(1).unwrap();
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let (head, _) = challenge(&bytes);
        assert_eq!(&bytes[head..], unproven_frame().as_slice(), "more than the one sentence: {line}");
    }

    // Never paused, served throughout, and the refusals name the peer.
    let before = answered.load(Ordering::Relaxed);
    wait_until(Duration::from_secs(10), || answered.load(Ordering::Relaxed) > before + 5);
    stop.store(true, Ordering::Relaxed);
    client.join().expect("every request was answered OK");
    let log = d.log().join("\n");
    assert!(!log.contains("takeover asked: pausing"), "{log}");
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("did not prove")).collect();
    assert!(!refused.is_empty(), "{log}");
    for l in &refused {
        assert!(l.contains("uid 0") && l.contains(&format!("cgroup {}", cg.name())), "{l}");
    }
    assert!(alive(pid) && lock_pid(&folder) == Some(pid) && status_pid(&folder) == Some(pid));

    // The same jail with the daemon's capabilities and the folder writable:
    // the kernel lets it take the descriptors, and it takes over.
    let env = [("CG", cg.path.to_str().unwrap()), ("D", d_path.as_str()), ("RO", ""), ("CAPS", "")];
    let new = Daemon::spawn_under(&jail, &[&uds, "--takeover"], &env).ready();
    assert!(d.wait_exit(Duration::from_secs(20)).success(), "{}", d.log().join("\n"));
    let took = new.wait_for_log("took over from pid", Duration::from_secs(5)).unwrap();
    assert!(took.contains(&format!("took over from pid {pid}")), "{took}");
    let new_pid = status_pid(&folder).unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(raw_exchange(&folder.join("rx_rule_manager"), &install_frame(5300, GPU0)), OK_FRAME);
    drop(new);
}
