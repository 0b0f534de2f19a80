//! One client connection on the runtime (queue, registry and pool endpoints;
//! the rule endpoints have threads of their own, see `steering::intake`): read
//! frames, answer each in order, close on malformed input. A truncated frame
//! only ends its own connection.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use sendfd::SendWithFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use super::handlers::{self, ConnContext};
use super::ServerState;
use crate::config::flags::TenantIsolation;
use crate::endpoint::pause::{self, Parked};
use crate::endpoint::{budget, memory, shutting_down, Endpoint, Reply};
use crate::gpu::RxPool;
use crate::identity;
use crate::types::status::StatusCode;
use crate::wire::frame;

/// The byte that carries an fd (any single byte does).
const FD_CARRIER: [u8; 1] = [0];

/// Bytes read from a client after shutdown began, at most: enough for every
/// request a well-behaved client can have in flight.
const SHUTDOWN_READ_LIMIT: usize = 256 * 1024;

/// Where a connection starts: fresh, or taken over from another daemon
/// (registered there, with part of a request received).
#[derive(Debug, Default)]
pub struct Start {
    pub registered: bool,
    pub input: Vec<u8>,
}

pub async fn serve(
    mut stream: UnixStream,
    endpoint: Endpoint,
    state: &ServerState,
    mut shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
    start: Start,
) {
    let gauge = state.shared.metrics.connections.with_label_values(&[endpoint.kind()]);
    gauge.inc();
    state.shared.metrics.connections_total.with_label_values(&[endpoint.kind()]).inc();
    // The peer's credentials cost a syscall: fetched only where they are used.
    let mut pid = None;
    if endpoint == Endpoint::Registry || tracing::enabled!(tracing::Level::DEBUG) {
        let cred = identity::credentials(stream.as_fd());
        pid = cred.and_then(|c| c.pid).map(|p| p.get());
        tracing::debug!(endpoint = endpoint.kind(), pid, uid = cred.map(|c| c.uid), "client connected");
    }
    let mut ctx = ConnContext { pid, registered: start.registered, client: None };
    // Charged to its workload before anything is read: connections that
    // never ask for anything count as much as any other.
    let _share = match charge_workload(&stream, endpoint, state, &mut ctx).await {
        Ok(share) => share,
        Err(reply) => {
            let _ = write_reply(&mut stream, Reply::Close(reply)).await;
            gauge.dec();
            return;
        }
    };
    let mut done = Some(done);
    let r = run(&mut stream, endpoint, state, &mut ctx, &mut shutdown, &mut done, start.input).await;
    if let Err(e) = r {
        tracing::debug!(endpoint = endpoint.kind(), error = %e, "connection ended with an error");
    }
    if ctx.registered {
        state.registry.unregister(&state.shared.metrics);
    }
    gauge.dec();
}

/// The connection's share of its workload's (where tenants are read, so
/// that workloads are known); `Err`: the reply for a workload that holds its
/// most of the connection's kind already.
async fn charge_workload(
    stream: &UnixStream,
    endpoint: Endpoint,
    state: &ServerState,
    ctx: &mut ConnContext,
) -> Result<Option<budget::WorkloadShare>, crate::wire::proto::UnixSocketProto> {
    if !state.shared.tenants.checks() {
        return Ok(None);
    }
    // Its client, found now rather than at its first request; one that
    // cannot be told is charged with all such (`NOBODY_WORKLOAD`).
    let _ = identify(stream, endpoint, state, ctx).await;
    let tenant = ctx.client.as_ref().and_then(|c| c.tenant.clone());
    let key = tenant.as_ref().map_or(budget::NOBODY_WORKLOAD, |t| t.workload.id);
    match state.shared.conn_limit.charge_workload(key, endpoint) {
        Ok(share) => Ok(Some(share)),
        Err(over) => {
            state.shared.metrics.connections_over_share.inc();
            let name = tenant.map(|t| t.name());
            Err(frame::error(StatusCode::ResourceExhausted, over.message(name.as_deref())))
        }
    }
}

/// Whether requests on `endpoint` tie the connection to its client process
/// (`rx_rule_manager` does too, on its own threads).
fn tracks_client(endpoint: Endpoint) -> bool {
    matches!(endpoint, Endpoint::Registry | Endpoint::GpuFd(_) | Endpoint::GpuMetadata(_))
}

/// Finds the connection's client, once, where a request needs it. Its
/// tenant is read off the runtime's workers and waited for a bounded time
/// ([`IDENTIFY_TIMEOUT`](identity::leases::IDENTIFY_TIMEOUT)); past that a pool request under
/// `enforce` is not served (`Err`: the client is told so), anything else is
/// served as from an unidentified client; the next request asks again.
async fn identify(
    stream: &UnixStream,
    endpoint: Endpoint,
    state: &ServerState,
    ctx: &mut ConnContext,
) -> Result<(), identity::IdentifyError> {
    // A client is the process that opened the connection while it lives:
    // once it has exited, it is asked again (and is nobody, whoever sends).
    if ctx.client.as_ref().is_some_and(|c| c.process.as_ref().is_some_and(|l| !l.alive())) {
        ctx.client = None;
    }
    if ctx.client.is_some() || !(tracks_client(endpoint) || state.shared.tenants.checks()) {
        return Ok(());
    }
    match state.shared.clients.who_async(stream.as_fd()).await {
        Ok(c) => {
            ctx.client = Some(c);
            Ok(())
        }
        Err(e) => {
            tracing::debug!(endpoint = endpoint.kind(), pid = ctx.pid.unwrap_or(0), error = %e, "client not identified in time");
            let decides =
                matches!(endpoint, Endpoint::GpuFd(_) | Endpoint::GpuMetadata(_) | Endpoint::GpuIpcHandle);
            match decides && state.shared.tenants.mode == TenantIsolation::Enforce {
                true => Err(e),
                false => Ok(()),
            }
        }
    }
}

/// Serves requests in order. Every request read gets exactly one reply before
/// the connection closes: after shutdown begins, requests already received
/// (even partly) are answered UNAVAILABLE, except on the registry, which keeps
/// answering so that a client's deregistration at exit is never left hanging.
async fn run(
    stream: &mut UnixStream,
    endpoint: Endpoint,
    state: &ServerState,
    ctx: &mut ConnContext,
    shutdown: &mut watch::Receiver<bool>,
    done: &mut Option<mpsc::Sender<()>>,
    input: Vec<u8>,
) -> io::Result<()> {
    let mut buf: Vec<u8> = input;
    buf.reserve(512);
    let mut gate = state.shared.gate.subscribe();
    let mut stopping = false;
    // The registry serves on through shutdown; everything else stops reading.
    let serves_through_shutdown = endpoint == Endpoint::Registry;
    let idle_limit = state.shared.conn_limit.idle_limit(endpoint);
    let first_limit = state.shared.conn_limit.first_request_limit();
    // A registration handed over by a takeover asked long ago.
    let mut asked = ctx.registered;
    let mut last_request = tokio::time::Instant::now();
    loop {
        match frame::parse(&buf) {
            Ok(Some((msg, used))) => {
                buf.drain(..used);
                last_request = tokio::time::Instant::now();
                asked = true;
                // A large frame grew the buffer: give the memory back.
                memory::shrink_buffer(&mut buf);
                let reply = if stopping && !serves_through_shutdown {
                    Reply::Message(shutting_down())
                } else {
                    match identify(stream, endpoint, state, ctx).await {
                        Ok(()) => handlers::handle(endpoint, msg, state, ctx),
                        Err(e) => Reply::Message(frame::error(StatusCode::Unavailable, e.to_string())),
                    }
                };
                let close = matches!(reply, Reply::Close(_));
                write_reply(stream, reply).await?;
                if close {
                    return Ok(());
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                write_reply(stream, Reply::Close(frame::error(StatusCode::InvalidArgument, e.to_string())))
                    .await?;
                return Ok(());
            }
        }
        if stopping && !serves_through_shutdown {
            if !buf.is_empty() {
                // Part of a request arrived: answer it rather than leave the
                // client waiting on a closed socket.
                write_reply(stream, Reply::Message(shutting_down())).await?;
            }
            return Ok(());
        }
        let n = tokio::select! {
            _ = crate::endpoint::stopped(shutdown), if !stopping => {
                stopping = true;
                if serves_through_shutdown {
                    // Shutdown does not wait for registrations to end.
                    done.take();
                } else {
                    read_available(stream, &mut buf)?;
                }
                continue;
            }
            _ = pause::closing(&mut gate), if !stopping => {
                // A takeover: hand the connection on between two requests.
                park(stream, endpoint, state, ctx, &buf);
                if pause::settled(&mut gate).await {
                    continue;
                }
                // Handed over: the successor serves it. This copy closes
                // without a word and without unregistering.
                ctx.registered = false;
                return Ok(());
            }
            _ = budget::idle_expired(if asked { idle_limit } else { first_limit }, last_request) => {
                // No request pending: nothing owed. Part of a frame: an error reply.
                let limit = if asked { idle_limit } else { first_limit };
                if let (false, Some(limit)) = (buf.is_empty(), limit) {
                    write_reply(stream, Reply::Close(budget::incomplete_reply(&buf, limit))).await?;
                }
                return Ok(());
            }
            r = stream.read_buf(&mut buf) => r?,
        };
        if n == 0 {
            if !buf.is_empty() {
                tracing::debug!(endpoint = endpoint.kind(), pending = buf.len(), "client closed mid-frame");
            }
            return Ok(());
        }
    }
}

/// Parks the connection at the gate: a duplicate of its socket, whether it
/// registered, and the part of a request already read.
fn park(stream: &UnixStream, endpoint: Endpoint, state: &ServerState, ctx: &ConnContext, buf: &[u8]) {
    let parked = match stream.as_fd().try_clone_to_owned() {
        Ok(fd) => Some(Parked { fd, endpoint, registered: ctx.registered, input: buf.to_vec(), peeked: 0 }),
        Err(e) => {
            tracing::warn!(endpoint = endpoint.kind(), error = %e, "cannot duplicate a connection for the takeover: it stays here");
            None
        }
    };
    state.shared.gate.park_task(parked);
}

/// Reads what the client already sent, without waiting for more.
fn read_available(stream: &UnixStream, buf: &mut Vec<u8>) -> io::Result<()> {
    while buf.len() < SHUTDOWN_READ_LIMIT {
        match stream.try_read_buf(buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn write_reply(stream: &mut UnixStream, reply: Reply) -> io::Result<()> {
    match reply {
        Reply::Message(m) | Reply::Close(m) => {
            let bytes = match frame::encode(&m) {
                Ok(b) => b,
                // Still a reply: a client waits for one.
                Err(e) => frame::encode(&frame::error(StatusCode::Internal, format!("reply not sent: {e}")))
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
            };
            stream.write_all(&bytes).await
        }
        Reply::Fd(pool) => send_fd(stream, &pool).await,
    }
}

async fn send_fd(stream: &UnixStream, pool: &Arc<dyn RxPool>) -> io::Result<()> {
    let Some(fd) = pool.share_fd().map(|f| f.as_raw_fd()) else {
        return Err(io::Error::new(io::ErrorKind::NotFound, "pool has no shareable fd"));
    };
    loop {
        stream.writable().await?;
        match stream.send_with_fd(&FD_CARRIER, &[fd]) {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(io::Error::new(io::ErrorKind::WriteZero, "fd carrier byte not sent")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
