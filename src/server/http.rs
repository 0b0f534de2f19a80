//! A deliberately small HTTP/1.1 responder for `/metrics`, `/healthz`,
//! `/readyz` and `/debug/*`: GET only, one request per connection.
//!
//! It faces whatever can reach the port (by default every address of a
//! host-network pod), so it is bounded everywhere:
//! - at most `max_connections` connections at once; one more is accepted
//!   only to be told `503` and closed, so idle connections cannot pile up fds;
//! - the request head must arrive within `header_timeout` and be at most
//!   8 KiB; each piece of the response must be taken by the peer within
//!   `write_timeout`;
//! - large bodies are streamed in chunks through a small channel, so a peer
//!   that does not read holds at most a couple of chunks, not the whole body;
//! - when the process is out of file descriptors, a spare one is given up to
//!   answer `/healthz` (and `503` to anything else), and accepting backs off.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::endpoint::accept_backoff::{is_fd_exhaustion, AcceptBackoff, ReserveFd};

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
    fn get(&self, req: &Request) -> impl Future<Output = Response> + Send;
}

/// Bounds on what the HTTP port can cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub write_timeout: Duration,
}

impl Limits {
    pub fn new(max_connections: usize) -> Self {
        Limits {
            max_connections,
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
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Over the cap: say so and close at once; never queue it. What the
            // peer already sent is read first, so that the close is a FIN and
            // not a reset that would discard the 503.
            let mut sink = [0u8; 1024];
            while matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {}
            let _ = stream.try_write(&head(503, "text/plain; charset=utf-8", Some(0)));
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _ = handle(stream, peer, handler, limits).await;
            drop(permit);
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

async fn handle<H: Handler>(
    mut stream: TcpStream,
    peer: SocketAddr,
    handler: Arc<H>,
    limits: Limits,
) -> std::io::Result<()> {
    let Some((method, target)) = read_head(&mut stream, limits).await? else {
        return Ok(());
    };
    let resp = if method != "GET" {
        Response::text(405, "only GET is supported\n")
    } else {
        handler.get(&Request::new(&target, peer)).await
    };
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
mod tests {
    use super::*;

    #[test]
    fn debug_access_by_peer() {
        let lo: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let lo6: SocketAddr = "[::1]:5".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.2]:5".parse().unwrap();
        let remote: SocketAddr = "10.0.0.3:5".parse().unwrap();
        for p in [lo, lo6, mapped] {
            assert!(DebugAccess::Local.allows(p), "{p}");
        }
        assert!(!DebugAccess::Local.allows(remote));
        assert!(DebugAccess::All.allows(remote));
        assert!(!DebugAccess::Off.allows(lo));
    }

    #[test]
    fn query_params() {
        let peer = "127.0.0.1:1".parse().unwrap();
        let r = Request::new("/debug/flows?a=1&nic=eth2&b&nic=eth3", peer);
        assert_eq!(r.path, "/debug/flows");
        assert_eq!(r.param("nic").as_deref(), Some("eth2"));
        assert_eq!(r.param("b").as_deref(), Some(""));
        assert_eq!(r.param("c"), None);
        // Escapes decode, in names and values; a broken one stays as sent.
        let r = Request::new("/debug/flows?n%69c=eth%2D1%zz%4", peer);
        assert_eq!(r.param("nic").as_deref(), Some("eth-1%zz%4"));
        assert_eq!(Request::new("/debug/flows?nic=%FF", peer).param("nic").as_deref(), Some("\u{FFFD}"));
        assert_eq!(Request::new("/metrics", peer).query, "");
    }

    #[test]
    fn the_request_line_gives_method_and_target() {
        assert_eq!(request_line(b"GET /a?b HTTP/1.1\r\nHost: x\r\n\r\n"), ("GET".into(), "/a?b".into()));
        assert_eq!(request_line(b"POST /x\r\n\r\n"), ("POST".into(), "/x".into()));
        assert_eq!(request_line(b"\r\n\r\n"), (String::new(), String::new()));
    }
}
