//! A deliberately small HTTP/1.1 responder for `/metrics`, `/healthz`,
//! `/readyz` and `/debug/*`: GET only, one request per connection.
//!
//! It faces whatever can reach the port (by default every address of a
//! host-network pod), so it is bounded everywhere, and the liveness probe is
//! answered however the port is used: a restart of the daemon would remove
//! every steering rule of the node.
//! - A connection that has not sent its request head yet holds no request
//!   slot, only one of `max_waiting` places; when all are held, a newly
//!   accepted connection evicts the oldest holder, closed without a reply
//!   (`waiting.rs`). Idle connections thus cannot keep a probe out.
//! - `/healthz` and `/readyz` are answered as soon as their head is in,
//!   without a request slot. Other paths take one of `max_connections`
//!   slots; with none free they are told `503` at once, never queued.
//! - The request head must arrive within `header_timeout` and be at most
//!   8 KiB; each piece of the response must be taken by the peer within
//!   `write_timeout`.
//! - Large bodies are streamed in chunks through a small channel, so a peer
//!   that does not read holds at most a couple of chunks, not the whole body.
//! - When the process is out of file descriptors, a spare one is given up to
//!   answer `/healthz` (and `503` to anything else), and accepting backs off.
//!
//! So its connections hold at most `max_waiting + max_connections`
//! descriptors (an evicted one's is closed as soon as its task runs).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::endpoint::accept_backoff::{is_fd_exhaustion, AcceptBackoff, ReserveFd};
use waiting::{Place, Waiting};

mod waiting;

pub use crate::config::flags::DebugAccess;

/// A response body: all at once, or chunks produced while it is sent.
pub enum Body {
    Full(String),
    /// Chunks in order; the body ends when the sender is dropped. The
    /// channel's capacity bounds what waits for a slow reader.
    Stream(mpsc::Receiver<Vec<u8>>),
}

/// A response: status code, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Body,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Response { status, content_type: "text/plain; charset=utf-8", body: Body::Full(body.into()) }
    }

    pub fn json(body: String) -> Self {
        Response { status: 200, content_type: "application/json", body: Body::Full(body) }
    }

    pub fn json_stream(chunks: mpsc::Receiver<Vec<u8>>) -> Self {
        Response { status: 200, content_type: "application/json", body: Body::Stream(chunks) }
    }
}

/// One parsed request.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    /// The part after `?`, undecoded; empty when none.
    pub query: String,
    pub peer: SocketAddr,
}

impl Request {
    /// The request for `target` (`/path` or `/path?query`) from `peer`.
    pub fn new(target: &str, peer: SocketAddr) -> Request {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Request { path: path.to_string(), query: query.to_string(), peer }
    }

    /// Value of query parameter `name` (first occurrence), percent-decoded
    /// (`%2D` is `-`; an escape that is not one stays as it is, and bytes
    /// that are not UTF-8 become U+FFFD), if present.
    pub fn param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k) == name).then(|| percent_decode(v))
        })
    }
}

/// `%XX` escapes decoded; anything else kept.
fn percent_decode(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The method and the target of a request head (its first line).
pub(crate) fn request_line(head: &[u8]) -> (String, String) {
    let end = head.iter().position(|&b| b == b'\r' || b == b'\n').unwrap_or(head.len());
    let line = String::from_utf8_lossy(&head[..end]);
    let mut parts = line.split(' ');
    (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string())
}

/// Routes a GET request to a response.
pub trait Handler: Send + Sync + 'static {
    /// The answer to `req`. For the [`PROBES`] it must come at once: they
    /// are answered without a request slot.
    fn get(&self, req: &Request) -> impl Future<Output = Response> + Send;

    /// Told each time a connection is let go unserved (for a metric).
    fn turned_away(&self, _why: TurnedAway) {}
}

/// Paths answered without a request slot: cheap, small, and what a kubelet
/// asks whether to restart the daemon.
pub const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// Why a connection was let go unserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnedAway {
    /// Closed without a reply: it had sent no request head when a newer
    /// connection needed its place.
    Evicted,
    /// Told `503`: every request slot was taken.
    Busy,
}

impl TurnedAway {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            TurnedAway::Evicted => "evicted",
            TurnedAway::Busy => "busy",
        }
    }
}

/// Bounds on what the HTTP port can cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests served at once (request slots); probes need none.
    pub max_connections: usize,
    /// Connections waiting for their request head, or for a short answer.
    pub max_waiting: usize,
    pub header_timeout: Duration,
    pub write_timeout: Duration,
}

impl Limits {
    /// `max_connections` request slots and as many places to wait in.
    pub fn new(max_connections: usize) -> Self {
        Limits {
            max_connections,
            max_waiting: max_connections,
            header_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
        }
    }
}

const MAX_REQUEST: usize = 8192;

/// Serves until `shutdown` turns true.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let waiting = Waiting::new(limits.max_waiting);
    let mut backoff = AcceptBackoff::new("http");
    let mut reserve = ReserveFd::new();
    loop {
        let accepted = tokio::select! {
            _ = crate::endpoint::stopped(&mut shutdown) => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff.succeeded();
                reserve.refill();
                a
            }
            Err(e) => {
                if is_fd_exhaustion(&e) && reserve.release() {
                    answer_without_fds(&listener, limits).await;
                    reserve.refill();
                }
                let pause = backoff.failed(&e);
                tokio::select! {
                    _ = crate::endpoint::stopped(&mut shutdown) => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                continue;
            }
        };
        let (place, evicted) = waiting.enter();
        if evicted {
            handler.turned_away(TurnedAway::Evicted);
        }
        let (handler, slots) = (handler.clone(), slots.clone());
        tokio::spawn(async move {
            let _ = handle(stream, peer, handler, slots, place, limits).await;
        });
    }
}

/// With one fd freed: accept a pending connection, answer `/healthz`
/// (anything else gets 503), close it.
async fn answer_without_fds(listener: &TcpListener, limits: Limits) {
    let Ok(Ok((mut stream, _))) = tokio::time::timeout(Duration::from_millis(100), listener.accept()).await
    else {
        return;
    };
    let quick =
        Limits { header_timeout: Duration::from_secs(1), write_timeout: Duration::from_secs(1), ..limits };
    let resp = match read_head(&mut stream, quick).await {
        Ok(Some((ref method, ref target)))
            if method == "GET" && target.split('?').next() == Some("/healthz") =>
        {
            Response::text(200, "ok\n")
        }
        Ok(Some(_)) => Response::text(503, "out of file descriptors\n"),
        _ => return,
    };
    let _ = write(&mut stream, resp, quick).await;
}

/// Reads the request head within the time limit. `Ok(None)`: the peer went
/// away or sent too much (answered already).
async fn read_head(stream: &mut TcpStream, limits: Limits) -> std::io::Result<Option<(String, String)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let read_all = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(false);
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > MAX_REQUEST {
                return Ok(false);
            }
        }
        Ok::<_, std::io::Error>(true)
    };
    match tokio::time::timeout(limits.header_timeout, read_all).await {
        // Idle or half-sent for too long: dropped without a reply.
        Err(_) => return Ok(None),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(false)) => {
            if buf.len() > MAX_REQUEST {
                write(stream, Response::text(431, "request too large\n"), limits).await?;
            }
            return Ok(None);
        }
        Ok(Ok(true)) => {}
    }
    Ok(Some(request_line(&buf)))
}

/// One connection: while it holds its waiting place (until its head is in
/// and any answer without a request slot is written) a newer connection may
/// evict it, which closes it unanswered; then it is served in a slot.
async fn handle<H: Handler>(
    mut stream: TcpStream,
    peer: SocketAddr,
    handler: Arc<H>,
    slots: Arc<Semaphore>,
    mut place: Place,
    limits: Limits,
) -> std::io::Result<()> {
    let front = async {
        let Some((method, target)) = read_head(&mut stream, limits).await? else {
            return Ok(None);
        };
        if method != "GET" {
            write(&mut stream, Response::text(405, "only GET is supported\n"), limits).await?;
            return Ok(None);
        }
        let req = Request::new(&target, peer);
        if PROBES.contains(&req.path.as_str()) {
            let resp = handler.get(&req).await;
            write(&mut stream, resp, limits).await?;
            return Ok(None);
        }
        let Ok(slot) = slots.try_acquire_owned() else {
            handler.turned_away(TurnedAway::Busy);
            write(&mut stream, Response::text(503, "busy: too many HTTP requests at once; retry\n"), limits)
                .await?;
            return Ok(None);
        };
        Ok::<_, std::io::Error>(Some((req, slot)))
    };
    let (req, _slot) = tokio::select! {
        biased;
        served = front => match served? {
            Some(next) => next,
            None => return Ok(()),
        },
        // Dropping the stream closes it without a reply.
        () = place.evicted() => return Ok(()),
    };
    drop(place);
    let resp = handler.get(&req).await;
    write(&mut stream, resp, limits).await
}

fn head(status: u16, content_type: &str, len: Option<usize>) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    // A streamed body has no length: it ends when the connection closes.
    let length = len.map(|l| format!("Content-Length: {l}\r\n")).unwrap_or_default();
    format!("HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{length}Connection: close\r\n\r\n")
        .into_bytes()
}

/// Writes `bytes`, giving up when the peer takes nothing for `write_timeout`.
async fn send(stream: &mut TcpStream, bytes: &[u8], limits: Limits) -> std::io::Result<()> {
    tokio::time::timeout(limits.write_timeout, stream.write_all(bytes))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "peer does not read"))?
}

async fn write(stream: &mut TcpStream, r: Response, limits: Limits) -> std::io::Result<()> {
    match r.body {
        Body::Full(body) => {
            send(stream, &head(r.status, r.content_type, Some(body.len())), limits).await?;
            send(stream, body.as_bytes(), limits).await?;
        }
        Body::Stream(mut chunks) => {
            send(stream, &head(r.status, r.content_type, None), limits).await?;
            while let Some(chunk) = chunks.recv().await {
                send(stream, &chunk, limits).await?;
            }
        }
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests;
