//! `tcpx-rxdm inject serve`: the mutating admission webhook over HTTPS.
//! hyper serves HTTP/1.1 over rustls; the certificate is read from files
//! and read again whenever they change (cert-manager rotates the Secret
//! behind them), each new handshake getting the current one. Requests are
//! bounded: headers and body must arrive within the request timeout, the
//! body within the size limit; the answer to a bad request is an error
//! status and the server goes on serving.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

use super::webhook::{self, OnError};
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

/// The certificate now served, replaced when its files change.
#[derive(Debug)]
struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Certificate chain and key from PEM bytes.
fn load(cert: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("certificate: no PEM certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("key: {e}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| format!("key: {e}"))?;
    let pair = CertifiedKey::new(chain, signer);
    // Files replaced one after the other can hold a new key and the old
    // certificate for a moment: such a pair is not served.
    match pair.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(Arc::new(pair))
        }
        Err(e) => Err(format!("certificate and key do not match: {e}")),
    }
}

fn read_pair(cfg: &ServeConfig) -> Result<(Vec<u8>, Vec<u8>), String> {
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    Ok((read(&cfg.cert)?, read(&cfg.key)?))
}

/// Binds and loads the certificate; the returned future serves until dropped.
pub async fn bind(cfg: ServeConfig) -> Result<(SocketAddr, impl std::future::Future<Output = ()>), String> {
    let (cert, key) = read_pair(&cfg)?;
    let resolver = Arc::new(Reloading { current: RwLock::new(load(&cert, &key)?) });
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener =
        tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| format!("{}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let cfg = Arc::new(cfg);
    let reload = {
        let cfg = cfg.clone();
        async move {
            let mut loaded = (cert, key);
            loop {
                tokio::time::sleep(cfg.reload_every).await;
                match read_pair(&cfg) {
                    Ok(now) if now != loaded => match load(&now.0, &now.1) {
                        Ok(ck) => {
                            *resolver.current.write().unwrap_or_else(|e| e.into_inner()) = ck;
                            tracing::info!(cert = %cfg.cert.display(), "certificate reloaded");
                            loaded = now;
                        }
                        // Half-written files (cert and key updated one after the
                        // other): keep serving the old pair, try again next tick.
                        Err(e) => tracing::warn!(error = %e, "certificate files changed but do not load yet"),
                    },
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "certificate files unreadable; serving the loaded one")
                    }
                }
            }
        }
    };
    let serve = async move {
        tokio::spawn(reload);
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let (acceptor, cfg) = (acceptor.clone(), cfg.clone());
            tokio::spawn(async move {
                let Ok(Ok(tls)) = tokio::time::timeout(cfg.timeout, acceptor.accept(tcp)).await else {
                    return;
                };
                let svc_cfg = cfg.clone();
                let svc = hyper::service::service_fn(move |req| handle(req, svc_cfg.clone()));
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(cfg.timeout)
                    .serve_connection(TokioIo::new(tls), svc);
                let _ = conn.await;
            });
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

async fn handle(
    req: Request<Incoming>,
    cfg: Arc<ServeConfig>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "ok\n", false),
        (&Method::POST, "/mutate") => mutate(req, &cfg).await,
        (_, "/healthz" | "/mutate") => reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n", false),
        _ => reply(StatusCode::NOT_FOUND, "not found\n", false),
    })
}

async fn mutate(req: Request<Incoming>, cfg: &ServeConfig) -> Response<Full<Bytes>> {
    let too_big =
        || reply(StatusCode::PAYLOAD_TOO_LARGE, format!("request body over {} bytes\n", cfg.max_body), false);
    let declared =
        req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cfg.max_body as u64) {
        return too_big();
    }
    let body = Limited::new(req.into_body(), cfg.max_body).collect();
    let bytes = match tokio::time::timeout(cfg.timeout, body).await {
        Err(_) => return reply(StatusCode::REQUEST_TIMEOUT, "request body not received in time\n", false),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_big(),
        Ok(Err(e)) => return reply(StatusCode::BAD_REQUEST, format!("reading the body: {e}\n"), false),
        Ok(Ok(b)) => b.to_bytes(),
    };
    match webhook::review(&bytes, &cfg.inject, cfg.on_error) {
        Ok(v) => reply(StatusCode::OK, v.to_string(), true),
        Err(e) => reply(StatusCode::BAD_REQUEST, format!("{e}\n"), false),
    }
}

/// Runs the server; returns the exit code.
pub fn main(cfg: ServeConfig) -> u8 {
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
