//! The new daemon's side: ask the running daemon for its state, adopt it,
//! answer, and serve once it has committed.

use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::config::flags::Takeover;
use crate::handover::{self, verdict, Commit, Hello, Process, Serving, Verdict, VERSION};

use super::super::{Backends, Config, DaemonError};
use super::fault::{self, Side, Step};
use super::{fingerprint, guard, Handed};

/// How long the old daemon may take to end after its side of the
/// connection closed without a commit (a process's files close a moment
/// before it has exited); alive after that, it serves on.
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

fn failed(why: impl std::fmt::Display) -> DaemonError {
    DaemonError::Takeover(why.to_string())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, DaemonError> {
    tokio::task::spawn_blocking(f).await.map_err(failed)
}

/// Tells the old daemon why this one gives up; the error to exit with.
fn refuse(conn: &mut UnixStream, why: String) -> DaemonError {
    let _ = handover::send(conn, "verdict", &Verdict { answer: Some(verdict::Answer::Failed(why.clone())) });
    failed(why)
}

/// Asks the daemon serving the folder for its state. `None`: nobody serves
/// it and `--takeover=auto` starts normally.
pub(in crate::daemon) async fn fetch(
    config: &Config,
    backends: &Backends,
) -> Result<Option<(Taking, Handed)>, DaemonError> {
    let flags = &config.flags;
    let path = flags.uds_path.join(handover::SOCKET);
    let started = Instant::now();
    // What can be done before the running daemon pauses is done first: its
    // clients then wait only for the handover itself (opening a GPU's
    // context takes about 100 ms).
    let gpus: Vec<_> = config.topology.gpus().map(|(_, g)| g.pci).collect();
    backends.alloc.prepare(&gpus).map_err(|e| failed(format!("preparing the GPUs: {e}")))?;
    let conn = match UnixStream::connect(&path) {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
            if flags.takeover == Takeover::Auto {
                tracing::info!(path = %path.display(), "no daemon to take over from; starting normally");
                return Ok(None);
            }
            return Err(failed(format!(
                "no daemon serves {} to take over from ({e})",
                flags.uds_path.display()
            )));
        }
        Err(e) => return Err(failed(format!("connecting to {}: {e}", path.display()))),
    };
    // The serving daemon's process as the kernel names it: the one that
    // listens on the handover socket (each daemon listens anew at its commit).
    let old = Process::of_peer(conn.as_fd())
        .map_err(|e| failed(format!("holding the process that serves {}: {e}", path.display())))?;
    handover::check_peer(&conn).map_err(failed)?;
    handover::set_timeouts(&conn, flags.takeover_timeout).map_err(failed)?;
    // From here until the commit, a panic ends this process without unwinding.
    guard::arm();
    let hello =
        Hello { version: VERSION, pid: std::process::id(), fingerprint: fingerprint(config, backends) };
    let (conn, sent) = blocking(move || {
        let mut conn = conn;
        let sent = handover::send(&mut conn, "sending hello", &hello);
        (conn, sent)
    })
    .await?;
    fault::at(Side::New, Step::Hello);
    let (mut conn, offer) = blocking(move || {
        let mut conn = conn;
        let offer = handover::recv_offer(&mut conn);
        (conn, offer)
    })
    .await?;
    let (state, fds) = match (offer, sent) {
        // A refusal may already be waiting even if the hello could not be sent.
        (Err(e), Err(sent)) if !e.to_string().contains("refused") => return Err(failed(sent)),
        (offer, _) => offer.map_err(failed)?,
    };
    fault::at(Side::New, Step::State);
    if state.version != VERSION {
        let why = format!(
            "the running daemon sent version {} of the state, this one reads {VERSION}",
            state.version
        );
        return Err(refuse(&mut conn, why));
    }
    // The daemon that answered must be the process held: the socket's
    // listener could still name a daemon that handed over a moment ago.
    match old.own_pid() {
        Some(p) if p == state.pid => {}
        named => {
            let named = named.map_or("a process that has exited".to_string(), |p| format!("pid {p}"));
            let why = format!(
                "the handover socket's listener names {named}, but pid {} answered; try again",
                state.pid
            );
            return Err(refuse(&mut conn, why));
        }
    }
    tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "state received");
    match Handed::decode(state, fds) {
        Ok(handed) => Ok(Some((Taking { conn, from: handed.pid, old, started }, handed))),
        Err(why) => Err(refuse(&mut conn, why)),
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

    /// Answers `adopted`, waits for the old daemon's commit and answers
    /// `serving`: `Ok` means this daemon serves from now on. Without a
    /// commit it serves only if the old daemon's process is gone (nobody
    /// else would); alive, that daemon gave up and serves on.
    pub async fn commit(self) -> Result<u32, String> {
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
            return Ok(from);
        }
        fault::at(Side::New, Step::Commit);
        tokio::task::spawn_blocking(move || answer_serving(conn)).await.map_err(join)?;
        Ok(from)
    }
}

/// Answers `serving` and waits (briefly) for the old daemon to let go.
/// Whatever becomes of the answer, the commit binds the old daemon: it
/// serves again only once this process is gone.
fn answer_serving(mut conn: UnixStream) {
    let _ = handover::send(&mut conn, "answering serving", &Serving { pid: std::process::id() });
    let _ = conn.set_read_timeout(Some(RELEASE_WAIT));
    let _ = conn.read(&mut [0u8; 1]);
}
