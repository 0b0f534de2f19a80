//! The serving daemon's side: answer a takeover on the handover socket —
//! pause, hand everything over, and either hand over for good (exit) or
//! serve on. The session runs as a task of its own, so the daemon's main
//! loop answers signals, NIC failures and the shutdown file meanwhile; a
//! reason to stop aborts the session first.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::handover::{self, verdict, Commit, Hello, Offer, Process, Serving, Verdict, VERSION};
use crate::server::socket_dir::SocketDir;
use crate::server::ServerState;

use super::fault::{self, Side, Step};
use super::handout::{Context, Giver, Handout};
use super::paused::Paused;

/// How long a new daemon that answered `failed` may take to exit by itself.
const FAILED_EXIT: Duration = Duration::from_secs(2);

/// Takeovers asked on the handover socket: one at a time reaches the
/// daemon; one that comes while another runs is refused at once.
pub(in crate::daemon) struct Successors {
    rx: mpsc::Receiver<UnixStream>,
    task: JoinHandle<()>,
}

impl Successors {
    pub async fn recv(&mut self) -> Option<UnixStream> {
        self.rx.recv().await
    }

    /// Accepts no more (handed over: the successor answers from now on).
    pub fn stop(&mut self) {
        self.task.abort();
        self.rx.close();
    }
}

/// Accepts on the handover socket; `busy` is set while a takeover runs.
pub(in crate::daemon) fn accept(listener: UnixListener, busy: Arc<AtomicBool>) -> Successors {
    let (tx, rx) = mpsc::channel(1);
    let task = tokio::spawn(async move {
        let mut backoff = crate::endpoint::accept_backoff::AcceptBackoff::new("handover");
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
            let Ok(s) = s.into_std() else { continue };
            if s.set_nonblocking(false).is_err() {
                continue;
            }
            if busy.swap(true, Ordering::AcqRel) {
                tokio::task::spawn_blocking(move || {
                    // Its hello first, so that it reads the refusal rather than a broken pipe.
                    let mut s = s;
                    let _ = handover::set_timeouts(&s, Duration::from_secs(2));
                    let _ = handover::recv::<Hello>(&mut s, "reading hello");
                    refuse(s, "another takeover is under way")
                });
                continue;
            }
            if tx.send(s).await.is_err() {
                return;
            }
        }
    });
    Successors { rx, task }
}

fn refuse(mut s: UnixStream, why: &str) {
    let _ = handover::set_timeouts(&s, Duration::from_secs(2));
    let who = handover::peer_pid(&s);
    let pid = who.map_or_else(|| "unknown".to_string(), |p| p.to_string());
    tracing::warn!(%pid, reason = why, "takeover refused");
    let _ = handover::send(
        &mut s,
        "refusing",
        &Offer { answer: Some(handover::offer::Answer::Refused(why.to_string())) },
    );
}

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
    /// Starts answering the takeover asked on `conn`.
    pub fn start(conn: UnixStream, g: &Giver<'_>) -> Session {
        let dup = conn.as_fd().try_clone_to_owned().ok();
        let (abort, aborted) = watch::channel(false);
        let task = tokio::spawn(run(conn, g.context(), g.handout(), g.node.state.clone(), aborted));
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

/// Refuses before anything was handed over.
async fn refused(conn: UnixStream, why: String) -> Outcome {
    let w = why.clone();
    blocking(move || refuse(conn, &w)).await;
    Outcome::ServesOn { paused: None, pid: None, why }
}

async fn run(
    mut conn: UnixStream,
    ctx: Context,
    handout: std::io::Result<Handout>,
    state: Option<Arc<ServerState>>,
    mut abort: watch::Receiver<bool>,
) -> Outcome {
    let timeout = ctx.timeout;
    if let Err(e) = handover::check_peer(&conn) {
        return refused(conn, e.to_string()).await;
    }
    // The new daemon's process as the kernel recorded it when it connected.
    let successor = match Process::of_peer(conn.as_fd()) {
        Ok(p) => p,
        Err(e) => return refused(conn, format!("cannot hold the new daemon's process: {e}")).await,
    };
    let _ = handover::set_timeouts(&conn, timeout);
    let Some((conn2, hello)) = blocking(move || {
        let h = handover::recv::<Hello>(&mut conn, "reading hello");
        (conn, h)
    })
    .await
    else {
        return Outcome::ServesOn { paused: None, pid: None, why: "the session failed".into() };
    };
    conn = conn2;
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            let pid = successor.pid_here();
            match pid {
                Some(pid) => tracing::warn!(pid, error = %e, "takeover attempt ended before it began"),
                None => tracing::warn!(error = %e, "takeover attempt ended before it began"),
            }
            return Outcome::ServesOn { paused: None, pid, why: e.to_string() };
        }
    };
    // Its pid as this daemon (and the service manager beside it) sees it.
    let pid = successor.pid_here().unwrap_or(hello.pid);
    let mismatch = if hello.version != VERSION {
        Some(format!("protocol version {} asked, this daemon speaks {VERSION}", hello.version))
    } else {
        handover::fingerprint_differs(&ctx.fingerprint, &hello.fingerprint)
    };
    if let Some(why) = mismatch {
        return refused(conn, why).await;
    }
    let (handout, state) = match (handout, state) {
        (Ok(h), Some(s)) => (h, s),
        (Err(e), _) => return refused(conn, format!("collecting the state: {e}")).await,
        (_, None) => return refused(conn, "this daemon is not serving yet".into()).await,
    };
    let t = Instant::now();
    tracing::info!(pid, "takeover asked: pausing");
    let mut paused = Paused::start(state.gate.clone());
    let parked = tokio::select! {
        p = paused.gate().quiesced(timeout) => p.ok_or_else(|| format!("connections still busy after {}", crate::types::secs(timeout))),
        _ = aborted(&mut abort) => Err("this daemon is stopping".to_string()),
    };
    let parked = match parked {
        Ok(p) => p,
        Err(why) => {
            drop(paused);
            return refused(conn, why).await;
        }
    };
    let quiesced_ms = super::super::ms(t);
    // Every NIC thread writes its table at once.
    let asked: Vec<_> = state.rules.nics.iter().map(|n| n.freeze()).collect();
    let mut tables = Vec::with_capacity(asked.len());
    for a in asked {
        let got = match a {
            Some((table, hold)) => {
                paused.hold(hold);
                tokio::select! {
                    t = table => t.map_err(|_| "a NIC thread is gone".to_string()),
                    _ = aborted(&mut abort) => Err("this daemon is stopping".to_string()),
                }
            }
            None => Err("a NIC thread is gone".to_string()),
        };
        match got {
            Ok(table) => tables.push(table),
            Err(why) => {
                drop(paused);
                return refused(conn, why).await;
            }
        }
    }
    let frozen_ms = super::super::ms(t);
    let (st, fds) = match handout.finish(&state, parked, tables, ctx.nic.as_ref()) {
        Ok(v) => v,
        Err(e) => {
            drop(paused);
            return refused(conn, format!("collecting the state: {e}")).await;
        }
    };
    let built_ms = super::super::ms(t);
    let rules = st.tables.iter().map(|t| t.rules.len() / crate::wire::handover::RECORD).sum::<usize>();
    let conns = st.connections.len();
    // From here the new daemon holds a copy of everything: this one serves
    // again only once it is gone.
    paused.handing_to(successor, pid);
    let Some((mut conn, verdict)) = blocking(move || {
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
    // The commit is declared only once its delivery is known: the new
    // daemon answers `serving`. Until then nothing changes here.
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
