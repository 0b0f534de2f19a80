//! One client connection: read frames, answer each in order, close on
//! malformed input. A truncated frame only ends its own connection.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use sendfd::SendWithFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::handlers::{self, ConnContext, Reply};
use super::{Endpoint, ServerState};
use crate::gpu::RxPool;
use crate::wire::frame::{self, Code};

/// The byte that carries an fd (SPEC §4.1: one arbitrary byte).
const FD_CARRIER: [u8; 1] = [0];

pub async fn serve(
    mut stream: UnixStream,
    endpoint: Endpoint,
    state: &ServerState,
    mut shutdown: watch::Receiver<bool>,
) {
    let gauge = state.metrics.connections.with_label_values(&[endpoint.kind()]);
    gauge.inc();
    state.metrics.connections_total.with_label_values(&[endpoint.kind()]).inc();
    // The peer's credentials cost a syscall: fetched only where they are used.
    let mut pid = None;
    if endpoint == Endpoint::Registry || tracing::enabled!(tracing::Level::DEBUG) {
        let cred = stream.peer_cred().ok();
        pid = cred.as_ref().and_then(|c| c.pid()).filter(|&p| p > 0).map(|p| p as u32);
        tracing::debug!(endpoint = endpoint.kind(), pid = ?pid, uid = ?cred.as_ref().map(|c| c.uid()), "client connected");
    }
    let mut ctx = ConnContext { pid, registered: false };
    if let Err(e) = run(&mut stream, endpoint, state, &mut ctx, &mut shutdown).await {
        tracing::debug!(endpoint = endpoint.kind(), error = %e, "connection ended with an error");
    }
    if ctx.registered {
        state.registry.unregister(&state.metrics);
    }
    gauge.dec();
}

async fn run(
    stream: &mut UnixStream,
    endpoint: Endpoint,
    state: &ServerState,
    ctx: &mut ConnContext,
    shutdown: &mut watch::Receiver<bool>,
) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(512);
    let idle_limit = state.conn_limit.idle_limit(endpoint);
    let mut last_request = tokio::time::Instant::now();
    loop {
        match frame::parse(&buf) {
            Ok(Some((msg, used))) => {
                buf.drain(..used);
                last_request = tokio::time::Instant::now();
                // A large frame grew the buffer: give the memory back.
                super::memory::shrink_buffer(&mut buf);
                let reply = handlers::handle(endpoint, msg, state, ctx).await;
                let close = matches!(reply, Reply::Close(_));
                write_reply(stream, reply).await?;
                if close {
                    return Ok(());
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                write_reply(stream, Reply::Close(frame::error(Code::InvalidArgument, e.to_string()))).await?;
                return Ok(());
            }
        }
        let n = tokio::select! {
            _ = crate::server::stopped(shutdown) => return Ok(()),
            _ = super::budget::idle_expired(idle_limit, last_request) => {
                // No request pending: nothing owed. Part of a frame: an error reply.
                if let (false, Some(limit)) = (buf.is_empty(), idle_limit) {
                    write_reply(stream, Reply::Close(super::budget::incomplete_reply(&buf, limit))).await?;
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

async fn write_reply(stream: &mut UnixStream, reply: Reply) -> io::Result<()> {
    match reply {
        Reply::Message(m) | Reply::Close(m) => {
            let bytes = frame::encode(&m).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
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
