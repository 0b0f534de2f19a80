//! Who may ask the serving daemon for a takeover, and how each gets in.
//!
//! - A successor this daemon starts itself (SIGUSR2): the daemon made the
//!   process and the channel to it ([`start_child`]); nothing to prove.
//! - A process that connects to the handover socket ([`accept`]) must first
//!   prove that it could already take this daemon's descriptors (the
//!   challenge of `handover::proof`). Until it has, nothing is paused or
//!   revealed and the one takeover slot is not taken: proofs run side by
//!   side, each for at most [`PROOF_WAIT`], so a peer that connects and says
//!   nothing delays no one. A peer that fails gets the one fixed sentence
//!   (`handover::UNPROVEN`); the log names it.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};

use crate::handover::proof::Challenge;
use crate::handover::{self, channel, offer, Hello, Offer, Process};

/// How long a peer of the handover socket has to prove itself (an honest
/// successor needs a few system calls).
pub(super) const PROOF_WAIT: Duration = Duration::from_secs(5);
/// Proofs under way at once; past that the oldest is dropped (an honest
/// successor finishes long before many others could push it out).
const PROVING: usize = 32;
/// Refusals of unproven peers logged per second, the rest counted.
const REFUSALS_LOGGED: u32 = 5;

/// How a successor came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) enum Via {
    /// Started by this daemon on SIGUSR2, over the channel it made.
    Child,
    /// Connected to the handover socket and proved itself.
    Socket,
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Via::Child => "the channel to a successor it started",
            Via::Socket => "the handover socket, proven",
        })
    }
}

/// Who is at the other end, for the log: what the kernel says of it.
#[derive(Debug, Clone, Default)]
pub(in crate::daemon) struct Peer {
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub cgroup: Option<String>,
}

impl Peer {
    /// Its pid and uid; the cgroup is read only when it is named ([`Self::named`]).
    fn of(conn: &impl AsFd, process: Option<&Process>) -> Peer {
        let cred =
            nix::sys::socket::getsockopt(&conn.as_fd(), nix::sys::socket::sockopt::PeerCredentials).ok();
        let pid =
            process.and_then(Process::pid_here).or_else(|| cred.and_then(|c| u32::try_from(c.pid()).ok()));
        Peer { pid: pid.filter(|&p| p > 0), uid: cred.map(|c| c.uid()), cgroup: None }
    }

    /// With its cgroup, for a log line.
    fn named(mut self, process: Option<&Process>) -> Peer {
        self.cgroup = process.and_then(Process::cgroup);
        self
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_unknown = |v: Option<String>| v.unwrap_or_else(|| "unknown".to_string());
        write!(
            f,
            "pid {}, uid {}, cgroup {}",
            or_unknown(self.pid.map(|p| p.to_string())),
            or_unknown(self.uid.map(|u| u.to_string())),
            or_unknown(self.cgroup.clone())
        )
    }
}

/// A successor let in, holding the one takeover slot until its session ends.
pub(in crate::daemon) struct Candidate {
    pub conn: UnixStream,
    /// Its process, held since it connected (or was started).
    pub process: Process,
    /// Its hello, when read while it proved itself; a child's is read by the session.
    pub hello: Option<Hello>,
    pub via: Via,
    pub peer: Peer,
}

/// Successors let in through the handover socket, one at a time.
pub(in crate::daemon) struct Successors {
    rx: mpsc::Receiver<Candidate>,
    task: JoinHandle<()>,
}

impl Successors {
    pub async fn recv(&mut self) -> Option<Candidate> {
        self.rx.recv().await
    }

    /// Accepts no more (handed over: the successor answers from now on).
    pub fn stop(&mut self) {
        self.task.abort();
        self.rx.close();
    }
}

/// Accepts on the handover socket, each peer proving itself on a task of its
/// own; `busy` is the takeover slot, taken only by a proven peer.
pub(in crate::daemon) fn accept(listener: UnixListener, busy: Arc<AtomicBool>) -> Successors {
    let (tx, rx) = mpsc::channel(1);
    let refusals = Arc::new(RefusalLog::default());
    let task = tokio::spawn(async move {
        let mut backoff = crate::endpoint::accept_backoff::AcceptBackoff::new("handover");
        let mut proving: VecDeque<AbortHandle> = VecDeque::new();
        loop {
            let s = match listener.accept().await {
                Ok((s, _)) => {
                    backoff.succeeded();
                    s
                }
                Err(e) => {
                    // Out of descriptors, say: the socket stays served once they free up.
                    tokio::time::sleep(backoff.failed(&e)).await;
                    continue;
                }
            };
            proving.retain(|h| !h.is_finished());
            if proving.len() >= PROVING {
                if let Some(oldest) = proving.pop_front() {
                    oldest.abort();
                }
            }
            let (tx, busy, refusals) = (tx.clone(), busy.clone(), refusals.clone());
            proving.push_back(tokio::spawn(admit(s, tx, busy, refusals)).abort_handle());
        }
    });
    Successors { rx, task }
}

/// One peer of the handover socket: its proof, then the slot.
async fn admit(
    mut s: tokio::net::UnixStream,
    tx: mpsc::Sender<Candidate>,
    busy: Arc<AtomicBool>,
    refusals: Arc<RefusalLog>,
) {
    let process = Process::of_peer(s.as_fd()).ok();
    let peer = Peer::of(&s, process.as_ref());
    let hello = match tokio::time::timeout(PROOF_WAIT, prove(&mut s)).await {
        Ok(Ok(h)) => h,
        unproven => {
            let why = match unproven {
                Ok(Err(why)) => why,
                _ => format!("no proof within {}", crate::types::secs(PROOF_WAIT)),
            };
            refusals.note(peer, process.as_ref(), &why);
            let refusal = Offer { answer: Some(offer::Answer::Refused(handover::UNPROVEN.into())) };
            let _ = s.try_write(&frame(&refusal));
            return;
        }
    };
    let peer = peer.named(process.as_ref());
    let Some(process) = process else {
        tracing::warn!(peer = %peer, "takeover refused: the peer's process cannot be held by a pidfd");
        let why = "this daemon cannot hold your process by a pidfd: run where it can see your pid \
                   (the host's pid namespace), or on Linux 6.5 or later";
        let _ = s.write_all(&frame(&Offer { answer: Some(offer::Answer::Refused(why.into())) })).await;
        return;
    };
    if busy.swap(true, Ordering::AcqRel) {
        tracing::warn!(peer = %peer, "takeover refused: another takeover is under way");
        let why = "another takeover is under way";
        let _ = s.write_all(&frame(&Offer { answer: Some(offer::Answer::Refused(why.into())) })).await;
        return;
    }
    let conn = match s.into_std().and_then(|c| c.set_nonblocking(false).map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(peer = %peer, error = %e, "takeover attempt dropped: its connection could not be taken on");
            busy.store(false, Ordering::Release);
            return;
        }
    };
    let candidate = Candidate { conn, process, hello: Some(hello), via: Via::Socket, peer };
    if tx.send(candidate).await.is_err() {
        busy.store(false, Ordering::Release);
    }
}

/// The challenge and its answer: the peer's hello once its proof is right,
/// else why not (for the log; the peer learns nothing of it).
async fn prove(s: &mut tokio::net::UnixStream) -> Result<Hello, String> {
    let challenge = Challenge::new().map_err(|e| format!("could not make a challenge: {e}"))?;
    let asked = handover::Challenge { fd: challenge.fd() };
    s.write_all(&frame(&asked)).await.map_err(|e| format!("sending the challenge: {e}"))?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.map_err(|e| format!("reading its hello: {e}"))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > handover::MAX_HELLO {
        return Err(format!("a hello of {len} bytes"));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.map_err(|e| format!("reading its hello: {e}"))?;
    let hello = Hello::decode(body.as_slice()).map_err(|e| format!("a malformed hello: {e}"))?;
    if !challenge.answered_by(&hello.proof) {
        return Err(if hello.proof.is_empty() { "no proof" } else { "a wrong proof" }.to_string());
    }
    Ok(hello)
}

/// One message, framed.
fn frame<M: Message>(m: &M) -> Vec<u8> {
    let body = m.encode_to_vec();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Refusals of unproven peers: each named in the log, at most
/// [`REFUSALS_LOGGED`] a second (a flood of connections does not flood the log).
#[derive(Default)]
struct RefusalLog {
    window: Mutex<(Option<Instant>, u32, u64)>,
}

impl RefusalLog {
    fn note(&self, peer: Peer, process: Option<&Process>, why: &str) {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if w.0.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            *w = (Some(now), 0, w.2);
        }
        if w.1 >= REFUSALS_LOGGED {
            w.2 += 1;
            return;
        }
        w.1 += 1;
        let unlogged = std::mem::take(&mut w.2);
        drop(w);
        let peer = peer.named(process);
        tracing::warn!(
            peer = %peer,
            reason = why,
            unlogged_before = unlogged,
            "takeover refused: the peer did not prove it may take this daemon's descriptors"
        );
    }
}

/// SIGUSR2: starts the binary this daemon was started from (replaced on
/// disk by an upgrade) with the same arguments and `--takeover=auto`,
/// handing it one end of a channel made for it. Its exit status is logged
/// if it ends without taking over. `None` if it could not be started.
pub(in crate::daemon) fn start_child(exe: Option<&Path>) -> Option<Candidate> {
    let Some(exe) = exe else {
        tracing::error!(
            "SIGUSR2: the path of this daemon's binary is unknown; start the successor with --takeover"
        );
        return None;
    };
    let (ours, theirs) = match channel::pair() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "SIGUSR2: cannot make a channel to a successor");
            return None;
        }
    };
    let mut args: Vec<std::ffi::OsString> =
        std::env::args_os().skip(1).filter(|a| !is_takeover_flag(a)).collect();
    args.push("--takeover=auto".into());
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args).stdin(std::process::Stdio::null());
    channel::pass(&mut cmd, &theirs);
    let spawned = cmd.spawn();
    drop(theirs);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(exe = %exe.display(), error = %e, "SIGUSR2: cannot start a successor");
            return None;
        }
    };
    let pid = child.id();
    // Held before anything reaps it, so the pidfd names this child and no other.
    let process = match Process::of_pid(pid) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(pid, error = %e, "SIGUSR2: cannot hold the successor's process; stopping it");
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
    };
    tracing::info!(pid, exe = %exe.display(), "SIGUSR2: started a successor to take over");
    std::thread::spawn(move || match child.wait() {
        Ok(st) if !st.success() => {
            tracing::warn!(pid, status = %st, "the successor ended without taking over")
        }
        _ => {}
    });
    let peer = Peer { pid: Some(pid), uid: Some(nix::unistd::geteuid().as_raw()), cgroup: process.cgroup() };
    Some(Candidate { conn: ours, process, hello: None, via: Via::Child, peer })
}

/// `--takeover` in any form (`--takeover_timeout` is another flag).
fn is_takeover_flag(a: &OsStr) -> bool {
    a == "--takeover" || a.to_str().is_some_and(|s| s.starts_with("--takeover="))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_takeover_is_replaced_and_nothing_else() {
        for a in ["--takeover", "--takeover=on", "--takeover=auto", "--takeover=off"] {
            assert!(is_takeover_flag(OsStr::new(a)), "{a}");
        }
        for a in ["--takeover_timeout=3s", "--uds_path=/run/tcpx", "takeover", "--takeoverx"] {
            assert!(!is_takeover_flag(OsStr::new(a)), "{a}");
        }
    }

    #[test]
    fn a_peer_is_named_by_what_the_kernel_says() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = Process::own().unwrap();
        let p = Peer::of(&a, Some(&me)).named(Some(&me));
        assert_eq!(p.pid, Some(std::process::id()));
        assert_eq!(p.cgroup, me.cgroup());
        assert_eq!(p.uid, Some(nix::unistd::geteuid().as_raw()));
        assert!(p.to_string().starts_with(&format!("pid {}, uid ", std::process::id())), "{p}");
        assert!(Peer::default().to_string().contains("pid unknown"));
    }
}
