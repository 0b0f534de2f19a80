//! The new daemon's side: ask the running daemon for its state (over the
//! channel it was started with, or through the handover socket after the
//! proof), adopt it, answer, and serve once the old daemon has committed —
//! before telling it so.

use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::config::flags::{Flags, Takeover};
use crate::handover::channel::{self, Inherited};
use crate::handover::{
    self, proof, verdict, Commit, HandoverError, Hello, Process, Serving, State, Verdict, VERSION,
};
use crate::server::socket_dir::{SocketDir, SocketDirError};
use nix::unistd::Gid;

use super::super::{Backends, Config, DaemonError};
use super::fault::{self, Side, Step};
use super::{fingerprint, guard, Handed, TakeoverError};

/// How long the old daemon may take to end after its side of the
/// connection closed (a process's files close a moment before it has
/// exited); alive after that, it serves on.
const GONE_GRACE: Duration = Duration::from_secs(2);
/// How long to wait, after answering `serving`, for the old daemon to let
/// go: it names this process to the service manager first, so that what
/// this one sends the service manager afterwards is accepted.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// A takeover under way: the connection to the running daemon and what it handed over.
pub(in crate::daemon) struct Taking {
    conn: UnixStream,
    /// The daemon taken over from, as it knows itself (for the log).
    pub from: u32,
    /// Its process, held since this one connected: whether it still runs
    /// is asked of this, never of a pid.
    old: Process,
    pub started: Instant,
}

/// The commit is here (or the old daemon is gone): this daemon serves now,
/// then says so with [`Committed::serving`].
pub(in crate::daemon) struct Committed {
    /// `None`: the old daemon ended without committing; nobody to answer.
    conn: Option<UnixStream>,
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, DaemonError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| TakeoverError::Step(e.to_string()).into())
}

/// Tells the old daemon why this one gives up; the error to exit with.
fn refuse(conn: &mut UnixStream, why: String) -> DaemonError {
    let _ = handover::send(conn, "verdict", &Verdict { answer: Some(verdict::Answer::Failed(why.clone())) });
    TakeoverError::Unfit(why).into()
}

/// How this daemon reached the one it takes over from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The channel of the daemon that started this one.
    Parent,
    /// The handover socket.
    Socket,
}

/// The connection to the daemon to take over from and its process; `None`:
/// nobody serves the folder.
fn reach(config: &Config) -> Result<Option<(UnixStream, Process, Via)>, DaemonError> {
    let flags = &config.flags;
    match channel::take() {
        Inherited::Channel { conn, parent } => return Ok(Some((conn, parent, Via::Parent))),
        Inherited::Unusable(why) => tracing::warn!(
            reason = %why,
            "not a channel from the daemon that started this one; asking on the handover socket"
        ),
        Inherited::None => {}
    }
    let path = flags.uds_path.join(handover::SOCKET);
    let conn = match UnixStream::connect(&path) {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
            if flags.takeover == Takeover::Auto {
                tracing::info!(path = %path.display(), "no daemon to take over from; starting normally");
                return Ok(None);
            }
            return Err(TakeoverError::NoDaemon { dir: flags.uds_path.clone(), source: e }.into());
        }
        Err(e) => return Err(TakeoverError::Connect { path, source: e }.into()),
    };
    // The serving daemon's process as the kernel names it: the one that
    // listens on the handover socket (each daemon listens anew when it serves).
    let old = Process::of_peer(conn.as_fd()).map_err(|source| TakeoverError::HoldPeer { path, source })?;
    Ok(Some((conn, old, Via::Socket)))
}

/// Why the proof could not be made, and what to do, for the log.
fn unproven(pid: Option<u32>, e: nix::errno::Errno) -> String {
    let what = match e {
        nix::errno::Errno::EPERM => {
            "the kernel does not let this process take its descriptors: run it as the daemon's user with \
             the daemon's capabilities, or with CAP_SYS_PTRACE (in a container, also a seccomp profile \
             that allows pidfd_getfd), or upgrade with SIGUSR2 (`tcpx-rxdm upgrade`)"
        }
        nix::errno::Errno::ENOSYS => {
            "pidfd_getfd needs Linux 5.6 or later; upgrade with SIGUSR2 (`tcpx-rxdm upgrade`)"
        }
        _ => "taking its descriptor failed",
    };
    let who = pid.map_or("the running daemon".to_string(), |p| format!("the running daemon (pid {p})"));
    let yama = match (e, yama_scope()) {
        (nix::errno::Errno::EPERM, Some(n)) if n > 0 => format!(
            "; this kernel's Yama ptrace_scope is {n} (/proc/sys/kernel/yama/ptrace_scope), which lets \
             only {} take another process's descriptors",
            if n == 1 {
                "an ancestor of that process or a holder of CAP_SYS_PTRACE"
            } else {
                "a holder of CAP_SYS_PTRACE"
            }
        ),
        _ => String::new(),
    };
    format!("could not prove to {who} that this process may take it over ({e}): {what}{yama}")
}

/// Yama's ptrace restriction, where the kernel has Yama.
fn yama_scope() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?.trim().parse().ok()
}

/// No challenge within the timeout: most likely a daemon of an older
/// version, which waits for a hello without asking for a proof.
fn no_challenge(e: HandoverError) -> HandoverError {
    match &e {
        HandoverError::Io { source, .. }
            if matches!(source.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
        {
            HandoverError::Protocol(format!(
                "{e}: no challenge came; a daemon of an older version asks for none and cannot be taken \
                 over by this one: restart it once instead (on a drained node)"
            ))
        }
        _ => e,
    }
}

/// Asks the daemon serving the folder for its state. `None`: nobody serves
/// it (or, with `--takeover=auto`, it ended before handing anything over)
/// and this daemon starts normally.
pub(in crate::daemon) async fn fetch(
    config: &Config,
    backends: &Backends,
) -> Result<Option<(Taking, Handed)>, DaemonError> {
    let flags = &config.flags;
    let started = Instant::now();
    // What can be done before the running daemon pauses is done first: its
    // clients then wait only for the handover itself (opening a GPU's
    // context takes about 100 ms).
    let gpus: Vec<_> = config.topology.gpus().map(|(_, g)| g.pci).collect();
    backends.alloc.prepare(&gpus).map_err(TakeoverError::PrepareGpus)?;
    let Some((conn, old, via)) = reach(config)? else { return Ok(None) };
    handover::set_timeouts(&conn, flags.takeover_timeout).map_err(TakeoverError::Channel)?;
    // From here until the commit, a panic ends this process without unwinding.
    guard::arm();
    let hello = Hello {
        version: VERSION,
        pid: std::process::id(),
        fingerprint: fingerprint(config, backends),
        proof: Vec::new(),
    };
    let (conn, old, cannot, offer) = blocking(move || {
        let mut conn = conn;
        let mut hello = hello;
        let mut cannot = None;
        let offer = (|| {
            if via == Via::Socket {
                // The proof first: the secret behind the descriptor it names.
                let c = handover::recv::<handover::Challenge>(&mut conn, "reading the challenge")
                    .map_err(no_challenge)?;
                match proof::answer(&old, c.fd) {
                    Ok(secret) => hello.proof = secret,
                    Err(e) => cannot = Some(unproven(old.own_pid(), e)),
                }
            }
            let sent = handover::send(&mut conn, "sending hello", &hello);
            fault::at(Side::New, Step::Hello);
            match (handover::recv_offer(&mut conn), sent) {
                // A refusal may already be waiting even if the hello could not be sent.
                (Err(e), Err(sent)) if !e.is_refusal() => Err(sent),
                (offer, _) => offer,
            }
        })();
        (conn, old, cannot, offer)
    })
    .await?;
    let (state, fds) = match offer {
        Ok(v) => v,
        Err(e) if e.is_refusal() => return Err(refused(e, cannot).into()),
        Err(e) => return ended_before_the_state(config, &old, e.to_string()).await,
    };
    fault::at(Side::New, Step::State);
    let mut conn = conn;
    check_state(&state, &old).map_err(|why| refuse(&mut conn, why))?;
    tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "state received");
    match Handed::decode(state, fds) {
        Ok(handed) => Ok(Some((Taking { conn, from: handed.pid, old, started }, handed))),
        Err(why) => Err(refuse(&mut conn, why)),
    }
}

/// The connection ended before any state came: a daemon that is gone now
/// handed nothing over, so with `--takeover=auto` this one starts normally
/// (the folder's lock is free once its process has exited); alive, it
/// serves on and this one gives up.
async fn ended_before_the_state(
    config: &Config,
    old: &Process,
    error: String,
) -> Result<Option<(Taking, Handed)>, DaemonError> {
    let pid = old.own_pid();
    let dup =
        old.dup().map_err(|e| TakeoverError::Step(format!("holding the running daemon's process: {e}")))?;
    let gone = blocking(move || dup.wait_exit(GONE_GRACE)).await?;
    let who = pid.map_or("the running daemon".to_string(), |p| format!("pid {p}"));
    if !gone {
        return Err(TakeoverError::NotHandedOver { who, error }.into());
    }
    if config.flags.takeover != Takeover::Auto {
        return Err(TakeoverError::EndedBefore { who, error }.into());
    }
    tracing::warn!(error = %error, "{who} ended before it handed over; starting normally");
    guard::disarm();
    Ok(None)
}

/// The state is the one this daemon can read, from the process it holds.
fn check_state(state: &State, old: &Process) -> Result<(), String> {
    if state.version != VERSION {
        return Err(format!(
            "the running daemon sent version {} of the state, this one reads {VERSION}",
            state.version
        ));
    }
    // The daemon that answered must be the process held: the socket's
    // listener could still name a daemon that handed over a moment ago.
    match old.own_pid() {
        Some(p) if p == state.pid => Ok(()),
        named => {
            let named = named.map_or("a process that has exited".to_string(), |p| format!("pid {p}"));
            Err(format!(
                "the handover socket's listener names {named}, but pid {} answered; try again",
                state.pid
            ))
        }
    }
}

/// Locks the socket folder for a daemon that starts normally. With
/// `--takeover=auto` the daemon found gone may still be letting go of the
/// lock (a process's files close one by one as it exits): waited for, briefly.
pub(in crate::daemon) fn lock_fresh(flags: &Flags, gid: Option<Gid>) -> Result<SocketDir, SocketDirError> {
    let until = Instant::now() + GONE_GRACE;
    loop {
        match SocketDir::lock(&flags.uds_path, flags.socket_mode, gid) {
            Err(SocketDirError::Locked { .. })
                if flags.takeover == Takeover::Auto && Instant::now() < until =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            done => return done,
        }
    }
}

impl Taking {
    /// Tells the old daemon why this one gives up (it then serves on).
    pub fn fail(&self, why: &str) {
        let v = Verdict { answer: Some(verdict::Answer::Failed(why.to_string())) };
        if let Ok(mut c) = self.conn.try_clone() {
            let _ = handover::send(&mut c, "verdict", &v);
        }
    }

    /// Answers `adopted` and waits for the old daemon's commit. `Ok`: serve
    /// now, then answer with [`Committed::serving`]. Without a commit this
    /// daemon serves only if the old daemon's process is gone (nobody else
    /// would); alive, that daemon gave up and serves on.
    pub async fn await_commit(self) -> Result<Committed, String> {
        let Taking { conn, from, old, .. } = self;
        let join = |e: tokio::task::JoinError| e.to_string();
        let (conn, sent) = tokio::task::spawn_blocking(move || {
            let mut conn = conn;
            let v = Verdict { answer: Some(verdict::Answer::Adopted(true)) };
            let sent = handover::send(&mut conn, "answering adopted", &v);
            (conn, sent)
        })
        .await
        .map_err(join)?;
        fault::at(Side::New, Step::Adopted);
        let (conn, commit) = tokio::task::spawn_blocking(move || {
            let mut conn = conn;
            let commit = sent.and_then(|()| handover::recv::<Commit>(&mut conn, "waiting for the commit"));
            (conn, commit)
        })
        .await
        .map_err(join)?;
        if let Err(e) = commit {
            let gone = tokio::task::spawn_blocking(move || old.wait_exit(GONE_GRACE)).await.map_err(join)?;
            if !gone {
                return Err(format!("pid {from} did not commit ({e}); it serves on"));
            }
            tracing::warn!(pid = from, error = %e, "the daemon taken over from ended without committing; serving");
            return Ok(Committed { conn: None });
        }
        fault::at(Side::New, Step::Commit);
        Ok(Committed { conn: Some(conn) })
    }
}

impl Committed {
    /// Answers `serving` (this daemon serves already) and waits, briefly,
    /// for the old daemon to let go. Whatever becomes of the answer, the
    /// commit binds the old daemon: it serves again only once this process
    /// is gone.
    pub async fn serving(self) {
        if let Some(conn) = self.conn {
            fault::at(Side::New, Step::Serving);
            let _ = tokio::task::spawn_blocking(move || {
                let mut conn = conn;
                let _ = handover::send(&mut conn, "answering serving", &Serving { pid: std::process::id() });
                let _ = conn.set_read_timeout(Some(RELEASE_WAIT));
                let _ = conn.read(&mut [0u8; 1]);
            })
            .await;
        }
        // The old daemon lets go from here: panics unwind again.
        guard::disarm();
    }
}

/// The running daemon's refusal, with what this one knows about it: another
/// protocol version means another kind of upgrade.
fn refused(refusal: HandoverError, cannot: Option<String>) -> TakeoverError {
    match &refusal {
        HandoverError::Refused(why) if why == handover::OTHER_PROTOCOL => {
            TakeoverError::OtherProtocol(refusal)
        }
        _ => TakeoverError::Refused { cannot, refusal },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_protocol_version_says_the_upgrade_needs_a_restart() {
        let e = refused(HandoverError::Refused(handover::OTHER_PROTOCOL.into()), None);
        let said = e.to_string();
        assert!(matches!(e, TakeoverError::OtherProtocol(_)), "{said}");
        assert!(
            said.starts_with("the running daemon refused: the running daemon speaks another version"),
            "{said}"
        );
        assert!(said.contains("this upgrade needs a restart") && said.ends_with("serves on"), "{said}");
        // Any other refusal keeps its words and why this one could not prove itself.
        let e = refused(HandoverError::Refused("busy".into()), Some("no CAP_SYS_PTRACE".into()));
        assert_eq!(e.to_string(), "no CAP_SYS_PTRACE; the running daemon refused: busy");
    }
}
