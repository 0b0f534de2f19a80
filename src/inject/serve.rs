//! `tcpx-rxdm inject serve`: the mutating admission webhook over HTTPS.
//! hyper serves HTTP/1.1 over rustls; the certificate is read from files
//! and read again whenever they change (cert-manager rotates the Secret
//! behind them), each new handshake getting the current one.
//!
//! Whatever a client sends, the server's work and memory stay bounded, and
//! a few hostile clients cannot keep the API server's reviews waiting:
//! - at most [`MAX_HANDSHAKES`] TLS handshakes at once, each done within
//!   [`HANDSHAKE_TIMEOUT`], and at most [`MAX_CONNECTIONS`] connections
//!   served; when either is full, the connection waiting longest on its
//!   client is closed to make room ([`conns`]), so connections that stall
//!   cannot keep a new one in the backlog;
//! - a request's headers must arrive within the request timeout, its body
//!   within a second plus a second per 4 MiB, and a reply must be written
//!   within the request timeout;
//! - each request's first [`SHARE`] bytes (body, then reply) come from room
//!   kept for every connection; the rest from [`BUFFER_BYTES`] (or twice
//!   the body limit, if more) shared by all, drawn on as bytes arrive; a
//!   request that finds no room in time gets 503;
//! - reviews run off the async workers, [`REVIEWS_AT_ONCE`] at a time plus
//!   one more for bodies within the share, so `/healthz` answers while they
//!   run and a typical review does not queue behind large ones; each
//!   review's document is bounded by [`webhook::MAX_VALUES`].
//!
//! Each review is logged (uid, Pod, operation, verdict, reason, time), as
//! is each refused or slow request.

mod connection;
pub mod conns;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::rustls::{self, ServerConfig};

use super::certs;
use super::transport::{held_bytes, read_body, BodyError, BodyRules, Budget};
use super::webhook::{self, OnError, Verdict};
use super::Options;
use crate::types::exit::Exit;

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

/// Connections served at once. Past that, the one waiting longest on its
/// client is closed for a new one ([`conns`]).
pub const MAX_CONNECTIONS: usize = 64;
/// TLS handshakes at once, apart from the connections served: a
/// connection holds no place among those until its handshake is done.
pub const MAX_HANDSHAKES: usize = 128;
/// Time for a TLS handshake (or the request timeout, if shorter): one
/// round trip and a signature, milliseconds for an API server.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// Reviews run at once (fewer on a machine of fewer cores). Each may hold
/// two documents of [`webhook::MAX_VALUES`] (about 17 MB at worst): two
/// fit the shipped 128 MiB limit with the buffers below, and a review
/// takes milliseconds, so more would add memory rather than speed.
pub const REVIEWS_AT_ONCE: usize = 2;
/// One more review at once, only for bodies within [`SHARE`]: a typical
/// Pod is reviewed while large ones hold the other turns.
pub const QUICK_REVIEWS: usize = 1;
/// Bytes of each request's body, then its reply, taken from room kept for
/// every connection: a Pod's review is a few KiB to tens of KiB, so it
/// never waits for room, whatever others hold.
pub const SHARE: usize = 128 << 10;
/// Bytes of request bodies and replies held at once past their shares:
/// three bodies of the default limit, drawn on as bytes arrive.
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
    quick: Arc<Semaphore>,
    conns: Arc<conns::Conns>,
    /// When the last "cap reached" warning was logged.
    said_full: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Shared {
    /// A connection was closed to make room: a warning at most once a minute.
    fn made_room(&self, what: &str) {
        let mut said = self.said_full.lock().unwrap_or_else(|e| e.into_inner());
        if said.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
            let (handshakes, served) = self.conns.counts();
            tracing::warn!(
                handshakes,
                served,
                "{what} full: the connection waiting longest on its client was closed to make room (logged at most once a minute)"
            );
            *said = Some(std::time::Instant::now());
        }
    }
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
    let tls = Arc::new(tls);
    let listener =
        tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| format!("{}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let reviews = REVIEWS_AT_ONCE.min(cores);
    // A share for each connection served, and for each review still
    // running after its client left.
    let holders = MAX_CONNECTIONS + reviews + QUICK_REVIEWS;
    let shared = Arc::new(Shared {
        budget: Budget::new(SHARE, holders, BUFFER_BYTES.max(cfg.max_body.saturating_mul(2))),
        reviews: Arc::new(Semaphore::new(reviews)),
        quick: Arc::new(Semaphore::new(QUICK_REVIEWS)),
        conns: conns::Conns::new(MAX_HANDSHAKES, MAX_CONNECTIONS),
        said_full: std::sync::Mutex::new(None),
        cfg,
    });
    let serve = async move {
        tokio::spawn(reload);
        loop {
            // Never waits longer than a handshake's guaranteed time: past
            // that, the oldest one is closed for the next.
            shared.conns.room_for_handshake().await;
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (ticket, evicted) = shared.conns.admit();
            if evicted {
                shared.made_room("TLS handshakes");
            }
            tokio::spawn(connection::serve(tcp, peer, tls.clone(), shared.clone(), ticket));
        }
    };
    Ok((addr, serve))
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

/// A request in progress: the connection waits on its client until the
/// body is in, and again once the reply is handed to hyper to write.
struct InRequest(conns::Track);

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.set(conns::Stage::Client);
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    peer: SocketAddr,
    track: conns::Track,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let start = Instant::now();
    track.set(conns::Stage::Client);
    let request = InRequest(track);
    let path = req.uri().path().to_string();
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "ok\n", false),
        (&Method::POST, "/mutate") => mutate(req, &shared, peer, start, &request.0).await,
        (_, "/healthz" | "/mutate") => {
            refused(peer, &path, start, StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => refused(peer, &path, start, StatusCode::NOT_FOUND, "not found"),
    })
}

/// A turn to review a body of `len` bytes: any turn, or for a body within
/// the share, the quick one too.
async fn review_turn(shared: &Shared, len: usize) -> OwnedSemaphorePermit {
    let any = shared.reviews.clone().acquire_owned();
    let turn = if len <= SHARE {
        tokio::select! {
            t = any => t,
            t = shared.quick.clone().acquire_owned() => t,
        }
    } else {
        any.await
    };
    turn.expect("the semaphores are never closed")
}

async fn mutate(
    req: Request<Incoming>,
    shared: &Arc<Shared>,
    peer: SocketAddr,
    start: Instant,
    track: &conns::Track,
) -> Response<Full<Bytes>> {
    let cfg = &shared.cfg;
    let declared =
        req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let deadline = start + cfg.timeout;
    let rules = BodyRules { max: cfg.max_body, deadline };
    // Waiting for room is the server's turn, not the client's.
    let room_wait =
        |waiting: bool| track.set(if waiting { conns::Stage::Server } else { conns::Stage::Client });
    let (body, held) = match read_body(req.into_body(), declared, rules, &shared.budget, &room_wait).await {
        Ok(b) => b,
        Err(e) => {
            let status = match e {
                BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::Slow { .. } | BodyError::GaveBack { .. } => StatusCode::REQUEST_TIMEOUT,
                BodyError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
                BodyError::Read(_) => StatusCode::BAD_REQUEST,
            };
            return refused(peer, "/mutate", start, status, &e.to_string());
        }
    };
    track.set(conns::Stage::Server);
    // A turn to be reviewed, within the time the request had to arrive:
    // an answer later than that comes after the API server gave up.
    let turn = match tokio::time::timeout_at(deadline, review_turn(shared, body.len())).await {
        Ok(t) => t,
        Err(_) => {
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
    Budget::shrink_to(&mut held, bytes.len());
    if shared.budget.grow_to(&mut held, bytes.len(), Instant::now() + cfg.timeout, None, || {}).await.is_err()
    {
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

/// Runs the server until SIGTERM or ^C (done); failed when it cannot start.
pub fn main(cfg: ServeConfig) -> Exit {
    // Before the runtime's threads take their arenas.
    tune_allocator();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "tcpx-rxdm inject serve: {e}");
            return Exit::Failed;
        }
    };
    rt.block_on(async {
        match bind(cfg).await {
            Ok((addr, serve)) => {
                let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                else {
                    let _ = writeln!(std::io::stderr(), "tcpx-rxdm inject serve: cannot handle SIGTERM");
                    return Exit::Failed;
                };
                tracing::info!(%addr, "serving admission reviews on /mutate");
                // The kubelet's SIGTERM (or ^C) ends it; the API server retries elsewhere.
                tokio::select! {
                    _ = serve => Exit::Done,
                    _ = term.recv() => Exit::Done,
                    _ = tokio::signal::ctrl_c() => Exit::Done,
                }
            }
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "tcpx-rxdm inject serve: {e}");
                Exit::Failed
            }
        }
    })
}
