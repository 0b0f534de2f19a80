//! One connection of `inject serve`: its TLS handshake within
//! [`HANDSHAKE_TIMEOUT`], a place among the served, then HTTP/1.1 until it
//! ends or is closed to make room.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::time::Instant;
use tokio_rustls::rustls::{self, ServerConfig};

use super::{conns, handle, Shared, HANDSHAKE_TIMEOUT, READ_BUFFER};
use crate::inject::transport::WriteDeadline;

/// One client connection, holding its place until it ends or is closed to
/// make room.
pub(super) async fn serve(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: Arc<ServerConfig>,
    shared: Arc<Shared>,
    ticket: conns::Ticket,
) {
    let limit = shared.cfg.timeout;
    let start = Instant::now();
    let handshake = async {
        // The ClientHello first: once it is in, the client did its part.
        let tls_done = async {
            let hello =
                tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await?;
            ticket.said_hello();
            hello.into_stream(tls).await
        };
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT.min(limit), tls_done).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return None;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake not done in time");
                return None;
            }
        };
        let Ok(evicted) = tokio::time::timeout_at(start + limit, ticket.serve()).await else {
            tracing::warn!(%peer, "no connection place came free within the request timeout: closed");
            return None;
        };
        if evicted {
            shared.made_room("connections served");
        }
        Some(tls)
    };
    let tls = tokio::select! {
        biased;
        () = ticket.closed() => return tracing::debug!(%peer, "closed in its handshake to make room"),
        tls = handshake => match tls {
            Some(tls) => tls,
            None => return,
        },
    };
    let expired = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(WriteDeadline::new(tls, limit, expired.clone()));
    let track = ticket.track();
    let svc = hyper::service::service_fn(move |req| handle(req, shared.clone(), peer, track.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limit)
        .max_buf_size(READ_BUFFER)
        .serve_connection(io, svc);
    tokio::select! {
        biased;
        () = ticket.closed() => tracing::debug!(%peer, "closed while waiting on its client, to make room"),
        done = conn => if let Err(e) = done {
            if expired.load(Ordering::Relaxed) {
                tracing::warn!(%peer, "reply not taken within {:.1} s: connection closed", limit.as_secs_f64());
            } else {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        },
    }
}
