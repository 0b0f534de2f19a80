//! The serving daemon's side: answer a takeover on the handover socket —
//! pause, hand everything over, and either commit (exit) or serve on.

use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::mpsc;

use crate::handover::{self, offer, verdict, Commit, FdList, Hello, Offer, State, Verdict, VERSION};
use crate::nic::NicClaim;
use crate::wire::handover as wire;

use super::super::teardown::Node;
use super::super::{Backends, Config};
use super::fingerprint;

/// Accepts on the handover socket: one takeover at a time reaches the
/// daemon; one that comes while another runs is refused at once.
pub(in crate::daemon) fn accept(listener: UnixListener, busy: Arc<AtomicBool>) -> mpsc::Receiver<UnixStream> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
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
    rx
}

fn refuse(mut s: UnixStream, why: &str) {
    let _ = handover::set_timeouts(&s, Duration::from_secs(2));
    let who = handover::peer_pid(&s);
    tracing::warn!(pid = ?who, reason = why, "takeover refused");
    let _ =
        handover::send(&mut s, "refusing", &Offer { answer: Some(offer::Answer::Refused(why.to_string())) });
}

/// What the session hands over from.
pub(in crate::daemon) struct Giver<'a> {
    pub config: &'a Config,
    pub backends: &'a Backends,
    pub node: &'a Node,
    pub claims: &'a [NicClaim],
    pub http: Option<BorrowedFd<'a>>,
    pub takeovers: u32,
}

/// Runs one takeover; `Some(pid)`: handed over to that process (the gate
/// is committed: exit now); `None`: this daemon serves on.
pub(in crate::daemon) async fn session(conn: UnixStream, g: &Giver<'_>, busy: &AtomicBool) -> Option<u32> {
    let r = run(conn, g).await;
    busy.store(false, Ordering::Release);
    r
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

async fn run(mut conn: UnixStream, g: &Giver<'_>) -> Option<u32> {
    let timeout = g.config.flags.takeover_timeout;
    let peer = handover::peer_pid(&conn);
    if let Err(e) = handover::check_peer(&conn) {
        blocking(move || refuse(conn, &e.to_string())).await;
        return None;
    }
    let _ = handover::set_timeouts(&conn, timeout);
    let (conn2, hello) = blocking(move || {
        let h = handover::recv::<Hello>(&mut conn, "reading hello");
        (conn, h)
    })
    .await?;
    conn = conn2;
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(pid = ?peer, error = %e, "takeover attempt ended before it began");
            return None;
        }
    };
    let pid = hello.pid;
    let mismatch = if hello.version != VERSION {
        Some(format!("protocol version {} asked, this daemon speaks {VERSION}", hello.version))
    } else {
        handover::fingerprint_differs(&fingerprint(g.config, g.backends), &hello.fingerprint)
    };
    if let Some(why) = mismatch {
        blocking(move || refuse(conn, &why)).await;
        return None;
    }
    let t = Instant::now();
    let state = g.node.state.clone()?;
    tracing::info!(pid, "takeover asked: pausing");
    state.gate.pause();
    let Some(parked) = state.gate.quiesced(timeout).await else {
        state.gate.resume();
        let why = format!("connections still busy after {timeout:?}");
        blocking(move || refuse(conn, &why)).await;
        return None;
    };
    let quiesced_ms = t.elapsed().as_secs_f64() * 1e3;
    // Every NIC thread writes its table at once.
    let asked: Vec<_> = state.rules.nics.iter().map(|n| n.freeze()).collect();
    let mut holds = Vec::with_capacity(asked.len());
    let mut tables = Vec::with_capacity(asked.len());
    for a in asked {
        let got = match a {
            Some((table, hold)) => table.await.ok().map(|t| (t, hold)),
            None => None,
        };
        let Some((table, hold)) = got else {
            drop(holds);
            state.gate.resume();
            blocking(move || refuse(conn, "a NIC thread is gone")).await;
            return None;
        };
        tables.push(table);
        holds.push(hold);
    }
    let frozen_ms = t.elapsed().as_secs_f64() * 1e3;
    let built = build(g, &state, parked, tables);
    let built_ms = t.elapsed().as_secs_f64() * 1e3;
    let (st, fds) = match built {
        Ok(v) => v,
        Err(e) => {
            drop(holds);
            state.gate.resume();
            let why = format!("collecting the state: {e}");
            blocking(move || refuse(conn, &why)).await;
            return None;
        }
    };
    let rules = st.tables.iter().map(|t| t.rules.len() / crate::wire::handover::RECORD).sum::<usize>();
    let conns = st.connections.len();
    let outcome = blocking(move || {
        handover::send_state(&mut conn, st, &fds)?;
        drop(fds);
        let v = handover::recv::<Verdict>(&mut conn, "waiting for the verdict")?;
        Ok::<_, handover::HandoverError>((conn, v))
    })
    .await;
    let why = match outcome {
        Some(Ok((mut conn, Verdict { answer: Some(verdict::Answer::Adopted(true)) }))) => {
            state.gate.commit();
            // The service manager follows the successor from now on; said
            // before the commit, so that its READY=1 is never dropped.
            super::super::notify::send(&format!("MAINPID={pid}"));
            let _ = handover::send(&mut conn, "committing", &Commit { pid: std::process::id() });
            tracing::info!(
                pid,
                rules,
                connections = conns,
                quiesced_ms,
                frozen_ms,
                built_ms,
                elapsed_ms = t.elapsed().as_secs_f64() * 1e3,
                "handed over to pid {pid}"
            );
            std::mem::forget(holds);
            return Some(pid);
        }
        Some(Ok((_, Verdict { answer: Some(verdict::Answer::Failed(why)) }))) => why,
        Some(Ok(_)) => "an empty verdict".to_string(),
        Some(Err(e)) => e.to_string(),
        None => "the handover task failed".to_string(),
    };
    drop(holds);
    state.gate.resume();
    tracing::warn!(pid, reason = %why, "takeover failed; serving on");
    None
}

/// The message and its fds.
fn build(
    g: &Giver<'_>,
    state: &crate::server::ServerState,
    parked: Vec<crate::endpoint::pause::Parked>,
    tables: Vec<wire::RuleTable>,
) -> std::io::Result<(State, FdList)> {
    let mut fds = FdList::default();
    let node = g.node;
    let (lock, listeners) = node.dir.handover();
    let lock_fd = fds.push(lock.ok_or_else(|| std::io::Error::other("the folder is not locked"))?)?;
    let mut ls = Vec::new();
    for (name, fd) in listeners {
        ls.push(wire::Listener { name: name.to_string(), fd: fds.push(fd)? });
    }
    if let Some(h) = g.http {
        ls.push(wire::Listener { name: String::new(), fd: fds.push(h)? });
    }
    let mut claims = Vec::new();
    for c in g.claims {
        claims.push(wire::Claim { ifname: c.ifname.clone(), fd: fds.push(c.socket())? });
    }
    let mut pools = Vec::new();
    for (gpu, p) in &node.pools {
        pools.push(wire::Pool {
            gpu: gpu.to_string(),
            size: p.size(),
            alignment: p.alignment(),
            share_fd: p.share_fd().map(|f| fds.push(f)).transpose()?,
            dmabuf_fd: p.dmabuf_fd().map(|f| fds.push(f)).transpose()?,
        });
    }
    let mut bindings = Vec::new();
    for b in &node.bindings {
        let held = b.handover_fds().into_iter().map(|f| fds.push(f)).collect::<std::io::Result<Vec<_>>>()?;
        bindings.push(wire::Binding { fds: held, description: b.describe(), dmabuf_id: b.dmabuf_id() });
    }
    let mut connections = Vec::new();
    for p in parked {
        connections.push(wire::Connection {
            endpoint: p.endpoint.socket_name(),
            registered: p.registered,
            input: p.input,
            peeked: p.peeked as u32,
            fd: fds.push_owned(p.fd),
        });
    }
    let (leases, next_lease) = state.clients.handover(&mut fds)?;
    let st = State {
        version: VERSION,
        pid: std::process::id(),
        fd_count: fds.len(),
        lock_fd,
        listeners: ls,
        claims,
        pools,
        bindings,
        connections,
        leases,
        next_lease,
        tables,
        primed: node.primed.iter().map(|p| p.to_json()).collect(),
        tuning: node.tuning.as_ref().map(|t| t.to_json()).unwrap_or_default(),
        sim: g.backends.nic.handover_state(),
        takeovers: g.takeovers + 1,
    };
    Ok((st, fds))
}
