//! The serving daemon's side: answer a successor let in by `admit` (one it
//! started, or a proven peer of the handover socket) — pause, hand
//! everything over, and either hand over for good (exit) or serve on. The session runs as a task of its own, so the daemon's main
//! loop answers signals, NIC failures and the shutdown file meanwhile; a
//! reason to stop aborts the session first.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::handover::{self, verdict, Commit, Hello, Offer, Process, Serving, Verdict, VERSION};
use crate::server::socket_dir::SocketDir;
use crate::server::ServerState;

use super::admit::{Candidate, Peer, Via};
use super::fault::{self, Side, Step};
use super::handout::{Context, Giver, Handout};
use super::paused::Paused;

/// How long a new daemon that answered `failed` may take to exit by itself
/// (and a successor this daemon started, refused, to end).
const FAILED_EXIT: Duration = Duration::from_secs(2);

/// How a session ended.
pub(in crate::daemon) enum Outcome {
    /// Handed over to this pid: the gate is committed; exit now.
    HandedOver(u32),
    /// This daemon serves on. `paused`, if the pause had begun: the new
    /// daemon is gone; the pause ends when it is dropped (see [`settle`]).
    ServesOn { paused: Option<Paused>, pid: Option<u32>, why: String },
}

/// One takeover, running as its own task.
pub(in crate::daemon) struct Session {
    task: JoinHandle<Outcome>,
    abort: watch::Sender<bool>,
    /// The connection, to cut a blocking read or write short on abort.
    conn: Option<OwnedFd>,
}

impl Session {
    /// Starts answering the takeover `successor` asks for.
    pub fn start(successor: Candidate, g: &Giver<'_>) -> Session {
        let dup = successor.conn.as_fd().try_clone_to_owned().ok();
        let (abort, aborted) = watch::channel(false);
        let task = tokio::spawn(run(successor, g.context(), g.handout(), g.node.state.clone(), aborted));
        Session { task, abort, conn: dup }
    }

    /// Ends the session as soon as it can. Unless the new daemon already
    /// answered `serving`, this daemon serves on (and the new one is gone).
    pub fn abort(&self) {
        let _ = self.abort.send(true);
        if let Some(c) = &self.conn {
            let _ = nix::sys::socket::shutdown(c.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }

    /// How it ended (cancel-safe).
    pub async fn finished(&mut self) -> Outcome {
        match (&mut self.task).await {
            Ok(o) => o,
            // A panic unwound the session: its pause ended as it was dropped.
            Err(e) => Outcome::ServesOn { paused: None, pid: None, why: format!("the session failed: {e}") },
        }
    }
}

/// Acts on how a session ended; `Some(pid)`: handed over, exit now.
/// Serving on after a pause: the lock file and the listeners name this
/// daemon again (the new one wrote its pid into the lock when it adopted
/// it), then the pause ends.
pub(in crate::daemon) fn settle(outcome: Outcome, dir: &mut SocketDir, busy: &AtomicBool) -> Option<u32> {
    let handed = match outcome {
        Outcome::HandedOver(pid) => Some(pid),
        Outcome::ServesOn { paused, pid, why } => {
            if let Err(e) = dir.record_holder() {
                tracing::warn!(error = %e, "could not name this daemon in the socket folder's lock file again");
            }
            if paused.is_some() {
                drop(paused);
                let pid = pid.map_or("unknown".to_string(), |p| p.to_string());
                tracing::warn!(pid = %pid, reason = %why, "takeover failed; serving on");
            }
            None
        }
    };
    busy.store(false, Ordering::Release);
    handed
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Resolves once an abort is asked.
async fn aborted(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|&a| a).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Refuses before anything was handed over: the peer reads `to_peer`, the
/// log says `why` (which may name this daemon's settings) and who asked. A
/// successor this daemon started is gone before this returns.
async fn refused(conn: UnixStream, to_peer: String, why: String, who: Who<'_>) -> Outcome {
    tracing::warn!(peer = %who.peer, reason = %why, "takeover refused");
    let refusal = Offer { answer: Some(handover::offer::Answer::Refused(to_peer)) };
    blocking(move || {
        let mut conn = conn;
        let _ = handover::set_timeouts(&conn, Duration::from_secs(2));
        let _ = handover::send(&mut conn, "refusing", &refusal);
    })
    .await;
    who.end_child().await;
    Outcome::ServesOn { paused: None, pid: who.peer.pid, why }
}

/// The successor before anything was handed to it.
#[derive(Clone, Copy)]
struct Who<'a> {
    process: &'a Process,
    peer: &'a Peer,
    via: Via,
}

impl Who<'_> {
    /// A successor this daemon started that is not taking over is not left
    /// behind: refused, it exits by itself; one that does not is stopped
    /// (else, once this daemon stopped, it would start in its place).
    async fn end_child(self) {
        if self.via != Via::Child {
            return;
        }
        let dup = self.process.dup();
        let pid = self.peer.pid;
        blocking(move || {
            if let Ok(p) = dup {
                if !p.wait_exit(FAILED_EXIT) && p.kill(FAILED_EXIT) {
                    tracing::warn!(
                        pid,
                        "stopped the successor this daemon started (SIGKILL): it did not take over"
                    );
                }
            }
        })
        .await;
    }
}

/// What a proven peer is told of a fingerprint that differs: the setting,
/// never this daemon's value.
fn differs_to_peer(key: &str) -> String {
    format!(
        "the running daemon serves with another {}; start this one with the same settings",
        super::setting(key)
    )
}

async fn run(
    successor: Candidate,
    ctx: Context,
    handout: std::io::Result<Handout>,
    state: Option<Arc<ServerState>>,
    mut abort: watch::Receiver<bool>,
) -> Outcome {
    let Candidate { conn, process, hello, via, peer } = successor;
    let who = Who { process: &process, peer: &peer, via };
    let (conn, hello) = match greeted(conn, hello, &ctx, who).await {
        Ok(v) => v,
        Err(outcome) => return outcome,
    };
    fault::at(Side::Old, Step::Hello);
    // Its pid as this daemon (and the service manager beside it) sees it.
    let pid = process.pid_here().or(peer.pid).unwrap_or(hello.pid);
    if hello.version != VERSION {
        let why = format!("protocol version {} asked, this daemon speaks {VERSION}", hello.version);
        let to_peer = handover::OTHER_PROTOCOL.to_string();
        return refused(conn, to_peer, why, who).await;
    }
    if let Some(d) = handover::fingerprint_differs(&ctx.fingerprint, &hello.fingerprint) {
        return refused(conn, differs_to_peer(&d.key), d.to_string(), who).await;
    }
    let (handout, state) = match (handout, state) {
        (Ok(h), Some(s)) => (h, s),
        (Err(e), _) => {
            let why = format!("collecting the state: {e}");
            return refused(conn, why.clone(), why, who).await;
        }
        (_, None) => {
            let why = "this daemon is not serving yet".to_string();
            return refused(conn, why.clone(), why, who).await;
        }
    };
    tracing::info!(pid, via = %via, "takeover asked: pausing");
    let mut frozen = match freeze(handout, &state, &ctx, &mut abort).await {
        Ok(f) => f,
        Err(why) => return refused(conn, why.clone(), why, who).await,
    };
    // From here the new daemon holds a copy of everything: this one serves
    // again only once it is gone.
    frozen.paused.handing_to(process, pid);
    hand_over(conn, frozen, pid).await
}

/// The successor's hello: read by the session for a successor this daemon
/// started (which may first wait for its NICs and open its GPUs; nothing is
/// paused meanwhile), else read already while it proved itself.
async fn greeted(
    conn: UnixStream,
    hello: Option<Hello>,
    ctx: &Context,
    who: Who<'_>,
) -> Result<(UnixStream, Hello), Outcome> {
    let (conn, hello) = match hello {
        Some(h) => (conn, Ok(h)),
        None => {
            let _ = handover::set_timeouts(&conn, ctx.child_wait);
            let read = blocking(move || {
                let mut conn = conn;
                let h = handover::recv::<Hello>(&mut conn, "reading hello");
                (conn, h)
            })
            .await;
            read.ok_or_else(|| Outcome::ServesOn {
                paused: None,
                pid: who.peer.pid,
                why: "the session failed".into(),
            })?
        }
    };
    let _ = handover::set_timeouts(&conn, ctx.timeout);
    match hello {
        Ok(h) => Ok((conn, h)),
        Err(e) => {
            tracing::warn!(peer = %who.peer, error = %e, "takeover attempt ended before it began");
            let pid = who.peer.pid;
            who.end_child().await;
            Err(Outcome::ServesOn { paused: None, pid, why: e.to_string() })
        }
    }
}

/// The state to hand over, taken while every connection is parked and
/// every NIC thread holds its table.
struct Frozen {
    paused: Paused,
    state: crate::wire::handover::State,
    fds: crate::handover::FdList,
    started: Instant,
    /// When the connections were parked, the tables frozen, the state built.
    quiesced_ms: f64,
    frozen_ms: f64,
    built_ms: f64,
}

/// Pauses the daemon (connections parked, NIC tables frozen) and builds
/// the state; why not, undone, where it cannot.
async fn freeze(
    handout: Handout,
    state: &Arc<ServerState>,
    ctx: &Context,
    abort: &mut watch::Receiver<bool>,
) -> Result<Frozen, String> {
    let (t, timeout) = (Instant::now(), ctx.timeout);
    let mut paused = Paused::start(state.shared.gate.clone());
    let parked = tokio::select! {
        p = paused.gate().quiesced(timeout) => p.ok_or_else(|| format!("connections still busy after {}", crate::types::secs(timeout))),
        _ = aborted(abort) => Err("this daemon is stopping".to_string()),
    }?;
    let quiesced_ms = super::super::ms(t);
    // Every NIC thread writes its table at once.
    let asked: Vec<_> = state.rules.nics.iter().map(|n| n.freeze()).collect();
    let mut tables = Vec::with_capacity(asked.len());
    for a in asked {
        let (table, hold) = a.ok_or("a NIC thread is gone")?;
        paused.hold(hold);
        tables.push(tokio::select! {
            t = table => t.map_err(|_| "a NIC thread is gone".to_string()),
            _ = aborted(abort) => Err("this daemon is stopping".to_string()),
        }?);
    }
    let frozen_ms = super::super::ms(t);
    let (st, fds) = handout
        .finish(state, parked, tables, ctx.sim.as_deref())
        .map_err(|e| format!("collecting the state: {e}"))?;
    let built_ms = super::super::ms(t);
    Ok(Frozen { paused, state: st, fds, started: t, quiesced_ms, frozen_ms, built_ms })
}

/// Sends the state, and once the new daemon adopted it, commits; done when
/// it says it serves. Any failure after the state left: the new daemon is
/// fenced off and this one serves on.
async fn hand_over(conn: UnixStream, frozen: Frozen, pid: u32) -> Outcome {
    let Frozen { paused, state: st, fds, started: t, quiesced_ms, frozen_ms, built_ms } = frozen;
    let rules = st.tables.iter().map(|t| t.rules.len() / crate::wire::handover::RECORD).sum::<usize>();
    let conns = st.connections.len();
    let Some((mut conn, verdict)) = blocking(move || {
        let mut conn = conn;
        let v = handover::send_state(&mut conn, st, &fds)
            .and_then(|()| handover::recv::<Verdict>(&mut conn, "waiting for the verdict"));
        drop(fds);
        (conn, v)
    })
    .await
    else {
        return fenced(paused, pid, "the handover task failed".into(), Duration::ZERO).await;
    };
    let why = match verdict {
        Ok(Verdict { answer: Some(verdict::Answer::Adopted(true)) }) => None,
        // It exits by itself; stopped if it does not.
        Ok(Verdict { answer: Some(verdict::Answer::Failed(why)) }) => {
            return fenced(paused, pid, why, FAILED_EXIT).await
        }
        Ok(_) => Some("an empty verdict".to_string()),
        Err(e) => Some(e.to_string()),
    };
    if let Some(why) = why {
        return fenced(paused, pid, why, Duration::ZERO).await;
    }
    fault::at(Side::Old, Step::Adopted);
    // The commit binds this daemon only once the new one answers `serving`,
    // which it does once it serves. Until then nothing changes here: it
    // stays paused, so the two never serve at once.
    let Some((mut conn, sent)) = blocking(move || {
        let sent = handover::send(&mut conn, "committing", &Commit { pid: std::process::id() });
        (conn, sent)
    })
    .await
    else {
        return fenced(paused, pid, "the handover task failed".into(), Duration::ZERO).await;
    };
    fault::at(Side::Old, Step::Commit);
    let answer = match sent {
        Ok(()) => blocking(move || {
            let a = handover::recv::<Serving>(&mut conn, "waiting for the new daemon to serve");
            (conn, a)
        })
        .await
        .map(|(c, a)| (Some(c), a)),
        Err(e) => Some((None, Err(e))),
    };
    match answer {
        // An answer left in the socket by a process that died since is no answer.
        Some((_, Ok(_))) if paused.successor_exited() => {
            fenced(paused, pid, "the new daemon answered, then ended".into(), Duration::ZERO).await
        }
        Some((conn, Ok(_))) => {
            // The service manager follows the successor from now on; said
            // before letting go of the connection, which the successor
            // waits for before it says READY=1.
            super::super::notify::send(&format!("MAINPID={pid}"));
            drop(conn);
            paused.declare();
            tracing::info!(
                pid,
                rules,
                connections = conns,
                quiesced_ms,
                frozen_ms,
                built_ms,
                elapsed_ms = super::super::ms(t),
                "handed over to pid {pid}"
            );
            Outcome::HandedOver(pid)
        }
        Some((_, Err(e))) => {
            fenced(paused, pid, format!("the commit was not answered ({e})"), Duration::ZERO).await
        }
        None => fenced(paused, pid, "the handover task failed".into(), Duration::ZERO).await,
    }
}

/// Serving on after the state was sent: the new daemon is stopped first
/// if it still runs after `grace` (it may hold the commit, or wake up later
/// holding everything).
async fn fenced(paused: Paused, pid: u32, why: String, grace: Duration) -> Outcome {
    let paused = blocking(move || {
        let mut paused = paused;
        paused.fence(grace);
        paused
    })
    .await;
    Outcome::ServesOn { paused, pid: Some(pid), why }
}
