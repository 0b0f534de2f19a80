//! A deliberately small HTTP/1.1 responder for `/metrics`, `/healthz`,
//! `/readyz` and `/debug/*`: GET only, one request per connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A response: status code, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Response { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }

    pub fn json(body: String) -> Self {
        Response { status: 200, content_type: "application/json", body }
    }
}

/// Routes a GET path to a response.
pub trait Handler: Send + Sync + 'static {
    fn get(&self, path: &str) -> impl Future<Output = Response> + Send;
}

const MAX_REQUEST: usize = 8192;

/// Serves until `shutdown` turns true.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = crate::server::stopped(&mut shutdown) => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(10), handle(stream, handler)).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

async fn handle<H: Handler>(mut stream: TcpStream, handler: Arc<H>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return write(&mut stream, Response::text(431, "request too large\n")).await;
        }
    }
    let line =
        String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == b'\r').unwrap_or(0)]).into_owned();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let resp = if method != "GET" {
        Response::text(405, "only GET is supported\n")
    } else {
        handler.get(path).await
    };
    write(&mut stream, resp).await
}

async fn write(stream: &mut TcpStream, r: Response) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(r.body.as_bytes()).await?;
    stream.shutdown().await
}
