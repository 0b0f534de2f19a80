//! `tcpx-rxdm inject serve`: the mutating admission webhook over HTTPS.
//! hyper serves HTTP/1.1 over rustls; the certificate is read from files
//! and read again whenever they change (cert-manager rotates the Secret
//! behind them), each new handshake getting the current one.
//!
//! Whatever a client sends, the server's work and memory stay bounded:
//! - at most [`MAX_CONNECTIONS`] connections; past that, new ones wait in
//!   the listen backlog (accepting pauses) rather than being reset, which
//!   the API server would take as a failed call;
//! - the handshake, a request's headers and its body must each arrive
//!   within the request timeout, and a reply must be written within it;
//! - request bodies and replies together hold at most [`BUFFER_BYTES`] (or
//!   twice the body limit, if more) at once; a body that finds no room
//!   within the request timeout gets 503;
//! - reviews run off the async workers, [`REVIEWS_AT_ONCE`] at a time, so
//!   `/healthz` answers while they run; each review's document is bounded
//!   by [`webhook::MAX_VALUES`].
//!
//! Each review is logged (uid, Pod, operation, verdict, reason, time), as
//! is each refused or slow request.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::rustls::{self, ServerConfig};

use super::certs;
use super::transport::{held_bytes, read_body, BodyError, Budget, WriteDeadline};
use super::webhook::{self, OnError, Verdict};
use super::Options;

/// The server's settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub inject: Options,
    pub on_error: OnError,
    /// Largest request body accepted (bytes).
    pub max_body: usize,
    /// Time for a request's headers, and again for its body.
    pub timeout: Duration,
    /// How often the certificate files are compared with what is loaded.
    pub reload_every: Duration,
}

/// Connections open at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;
/// Reviews run at once (fewer on a machine of fewer cores). Each may hold
/// two documents of [`webhook::MAX_VALUES`] (about 17 MB at worst): two
/// fit the shipped 128 MiB limit with the buffers below, and a review
/// takes milliseconds, so more would add memory rather than speed.
pub const REVIEWS_AT_ONCE: usize = 2;
/// Bytes of request bodies and replies held at once: three bodies of the
/// default limit, or hundreds of Pods as they come.
pub const BUFFER_BYTES: usize = 12 << 20;
/// hyper's read buffer per connection (headers must fit in it).
const READ_BUFFER: usize = 64 << 10;
/// A request that takes longer is logged as slow.
const SLOW: Duration = Duration::from_secs(1);

/// What every connection shares.
struct Shared {
    cfg: ServeConfig,
    budget: Budget,
    reviews: Arc<Semaphore>,
}

/// glibc's allocator, set for a server whose large buffers come and go:
/// its mmap threshold otherwise rises to the largest buffer freed, after
/// which bodies and documents of megabytes come from the heap, fragment it
/// and are not given back; and fewer arenas keep less freed memory apart.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (param, value) in [(libc::M_MMAP_THRESHOLD, 128 << 10), (libc::M_ARENA_MAX, 2)] {
            // SAFETY: mallopt only sets allocator parameters; both are
            // valid for any value, and it returns 0 on failure, ignored
            // (the defaults then stay).
            unsafe { libc::mallopt(param, value) };
        }
    });
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

/// Binds and loads the certificate; the returned future serves until dropped.
pub async fn bind(cfg: ServeConfig) -> Result<(SocketAddr, impl std::future::Future<Output = ()>), String> {
    tune_allocator();
    let (resolver, reload) = certs::watched(cfg.cert.clone(), cfg.key.clone(), cfg.reload_every)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener =
        tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| format!("{}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shared = Arc::new(Shared {
        budget: Budget::new(BUFFER_BYTES.max(cfg.max_body.saturating_mul(2))),
        reviews: Arc::new(Semaphore::new(REVIEWS_AT_ONCE.min(cores))),
        cfg,
    });
    let serve = async move {
        tokio::spawn(reload);
        let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut said_full: Option<std::time::Instant> = None;
        loop {
            let slot = open.clone().acquire_owned().await.expect("the semaphore is never closed");
            if open.available_permits() == 0
                && said_full.is_none_or(|t| t.elapsed() > Duration::from_secs(60))
            {
                tracing::warn!(
                    connections = MAX_CONNECTIONS,
                    "connection cap reached: new connections wait until one closes"
                );
                said_full = Some(std::time::Instant::now());
            }
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            tokio::spawn(connection(tcp, peer, acceptor.clone(), shared.clone(), slot));
        }
    };
    Ok((addr, serve))
}

/// One client connection, holding its slot until it ends.
async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    _slot: OwnedSemaphorePermit,
) {
    let limit = shared.cfg.timeout;
    let tls = match tokio::time::timeout(limit, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => return tracing::debug!(%peer, "TLS handshake not done in time"),
    };
    let expired = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(WriteDeadline::new(tls, limit, expired.clone()));
    let svc = hyper::service::service_fn(move |req| handle(req, shared.clone(), peer));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limit)
        .max_buf_size(READ_BUFFER)
        .serve_connection(io, svc);
    if let Err(e) = conn.await {
        if expired.load(Ordering::Relaxed) {
            tracing::warn!(%peer, "reply not taken within {:.1} s: connection closed", limit.as_secs_f64());
        } else {
            tracing::debug!(%peer, error = %e, "connection ended");
        }
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>, json: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let ct = if json { "application/json" } else { "text/plain; charset=utf-8" };
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(ct));
    r
}

/// A refused request: its reply, and a log line.
fn refused(
    peer: SocketAddr,
    path: &str,
    start: Instant,
    status: StatusCode,
    why: &str,
) -> Response<Full<Bytes>> {
    let ms = start.elapsed().as_millis() as u64;
    tracing::warn!(%peer, path = %webhook::clip(path, 200), status = status.as_u16(), reason = %why, ms, "request refused");
    reply(status, format!("{why}\n"), false)
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    peer: SocketAddr,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let start = Instant::now();
    let path = req.uri().path().to_string();
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "ok\n", false),
        (&Method::POST, "/mutate") => mutate(req, &shared, peer, start).await,
        (_, "/healthz" | "/mutate") => {
            refused(peer, &path, start, StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => refused(peer, &path, start, StatusCode::NOT_FOUND, "not found"),
    })
}

async fn mutate(
    req: Request<Incoming>,
    shared: &Arc<Shared>,
    peer: SocketAddr,
    start: Instant,
) -> Response<Full<Bytes>> {
    let cfg = &shared.cfg;
    let declared =
        req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let deadline = start + cfg.timeout;
    let (body, held) =
        match read_body(req.into_body(), declared, cfg.max_body, &shared.budget, deadline).await {
            Ok(b) => b,
            Err(e) => {
                let status = match e {
                    BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                    BodyError::Slow => StatusCode::REQUEST_TIMEOUT,
                    BodyError::Busy => StatusCode::SERVICE_UNAVAILABLE,
                    BodyError::Read(_) => StatusCode::BAD_REQUEST,
                };
                return refused(peer, "/mutate", start, status, &e.to_string());
            }
        };
    // A turn to be reviewed, within the time the request had to arrive:
    // an answer later than that comes after the API server gave up.
    let turn = match tokio::time::timeout_at(deadline, shared.reviews.clone().acquire_owned()).await {
        Ok(Ok(t)) => t,
        _ => {
            let why = "the webhook is busy (no review turn free within the request timeout); try again";
            return refused(peer, "/mutate", start, StatusCode::SERVICE_UNAVAILABLE, why);
        }
    };
    let (inject, on_error) = (cfg.inject.clone(), cfg.on_error);
    // The turn and the body's holding go with the work: a client that
    // leaves does not end a review already running.
    let job = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let outcome = webhook::decide_owned(body, &inject, on_error);
        let answer =
            outcome.and_then(|o| serde_json::to_vec(&o.reply).map(|b| (b, o)).map_err(|e| e.to_string()));
        (answer, held)
    });
    let (answer, mut held) = match job.await {
        Ok(done) => done,
        Err(e) => {
            tracing::error!(%peer, error = %e, "a review failed");
            return reply(StatusCode::INTERNAL_SERVER_ERROR, "the review failed\n", false);
        }
    };
    let (bytes, outcome) = match answer {
        Ok(a) => a,
        Err(e) => {
            // No review to answer: the body is none (400), logged as one.
            let (ms, why) = (start.elapsed().as_millis() as u64, webhook::clip(&e, webhook::MAX_MESSAGE));
            tracing::warn!(%peer, verdict = %"error", reason = %why, ms, "review");
            return reply(StatusCode::BAD_REQUEST, format!("{why}\n"), false);
        }
    };
    log_review(&outcome, start.elapsed());
    // The reply holds its own size of the budget until it is written.
    let need = bytes.len().saturating_sub(held.num_permits());
    Budget::shrink(&mut held, bytes.len());
    if shared.budget.grow(&mut held, need, Instant::now() + cfg.timeout).await.is_err() {
        let why = "the webhook is busy (no room for the reply within the request timeout); try again";
        return refused(peer, "/mutate", start, StatusCode::SERVICE_UNAVAILABLE, why);
    }
    reply(StatusCode::OK, held_bytes(bytes, held), true)
}

/// The review's line: who, what, the verdict and why, how long it took.
fn log_review(o: &webhook::Outcome, took: Duration) {
    let ms = took.as_millis() as u64;
    let reason = o.reason.as_deref().map(tracing::field::display);
    let (uid, pod) = (webhook::clip(&o.uid, 100), &o.object);
    if o.verdict == Verdict::Refused || took > SLOW {
        tracing::warn!(%uid, %pod, operation = %o.operation, verdict = %o.verdict, reason, ms, "review");
    } else {
        tracing::info!(%uid, %pod, operation = %o.operation, verdict = %o.verdict, reason, ms, "review");
    }
}

/// Runs the server; returns the exit code.
pub fn main(cfg: ServeConfig) -> u8 {
    // Before the runtime's threads take their arenas.
    tune_allocator();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_ansi(ansi).with_writer(std::io::stderr).try_init();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tcpx-rxdm inject serve: {e}");
            return 1;
        }
    };
    rt.block_on(async {
        match bind(cfg).await {
            Ok((addr, serve)) => {
                let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                else {
                    eprintln!("tcpx-rxdm inject serve: cannot handle SIGTERM");
                    return 1;
                };
                tracing::info!(%addr, "serving admission reviews on /mutate");
                // The kubelet's SIGTERM (or ^C) ends it; the API server retries elsewhere.
                tokio::select! {
                    _ = serve => 0,
                    _ = term.recv() => 0,
                    _ = tokio::signal::ctrl_c() => 0,
                }
            }
            Err(e) => {
                eprintln!("tcpx-rxdm inject serve: {e}");
                1
            }
        }
    })
}
