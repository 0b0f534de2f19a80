//! The admission webhook under hostile clients: how long the API server's
//! reviews take while clients hold 4 MiB bodies and stall TLS handshakes.
//! Prints numbers; asserts nothing.
//!
//! cargo build --release && cargo run --release --example webhook_bench -- [--bin target/release/tcpx-rxdm]
//!     [--also OTHER_BINARY] [--secs 8] [--cases none,bodies,handshakes,both]
//!
//! Each binary runs `inject serve` as the shipped manifest runs it
//! (`--on-error=refuse --request-timeout=4`), a fresh process for each case:
//! - `none`: no attack;
//! - `bodies`: 3 clients each declare a 4 MiB body, send all of it but the
//!   last byte and hold; when answered or closed, they start again;
//! - `handshakes`: 200 clients open TCP and never finish TLS (half send
//!   nothing, half six bytes of a ClientHello); when closed, they open
//!   another;
//! - `both`.
//!
//! The API server is played by three clients: two send
//! `tests/inject/admission-review.json` (2.7 KiB), one on a kept-alive
//! connection (a review every 100 ms; it reconnects if closed), one opening
//! a new connection for each review (every 250 ms); the third sends the
//! largest review the API server can send (that Pod grown to 3 MiB, the API
//! server's limit on a request body) on a new connection every second. A
//! review fails unless it is a 200 with a patch within 5 s, the webhook's
//! `timeoutSeconds`. Measuring starts a second after the attack. With
//! `--also`, the two binaries take turns case by case in one run.

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// The API server's wait for the webhook (`timeoutSeconds` in webhook.yaml).
const API_TIMEOUT: Duration = Duration::from_secs(5);

struct Args {
    bins: Vec<String>,
    secs: u64,
    cases: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        bins: vec!["target/release/tcpx-rxdm".into()],
        secs: 8,
        cases: ["none", "bodies", "handshakes", "both"].map(String::from).to_vec(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let [flag, v] = pair else { panic!("{} needs a value", pair[0]) };
        match flag.as_str() {
            "--bin" => a.bins[0] = v.clone(),
            "--also" => a.bins.push(v.clone()),
            "--secs" => a.secs = v.parse().expect("--secs N"),
            "--cases" => a.cases = v.split(',').map(String::from).collect(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// A CA and a server certificate for localhost, written into `dir`.
fn certificates(dir: &Path) -> CertificateDer<'static> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = p.self_signed(&ca_key).unwrap().der().clone();
    let issuer = Issuer::new(p, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".into()]).unwrap().signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    ca
}

/// `inject serve` on a free port, killed when dropped; its log is drained.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(bin: &str, dir: &Path) -> Server {
        let mut child = Command::new(bin)
            .args(["inject", "serve", "--listen=127.0.0.1:0", "--on-error=refuse", "--request-timeout=4"])
            .arg(format!("--tls-cert={}", dir.join("tls.crt").display()))
            .arg(format!("--tls-key={}", dir.join("tls.key").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin}: {e}"));
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        let addr = line
            .split("addr=")
            .nth(1)
            .and_then(|a| a.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{bin}: no address in {line:?}"));
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone)]
struct Client {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

impl Client {
    fn new(addr: SocketAddr, ca: &CertificateDer<'static>) -> Client {
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Client { addr, tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)) }
    }

    async fn connect(&self) -> std::io::Result<Tls> {
        let tcp = TcpStream::connect(self.addr).await?;
        self.tls.connect(ServerName::try_from("localhost").unwrap(), tcp).await
    }
}

/// A POST of `body` to /mutate, kept alive.
fn post(body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

/// Sends `raw` on `s` and reads one reply: whether it was a 200 with a patch.
async fn exchange(s: &mut Tls, raw: &[u8]) -> std::io::Result<bool> {
    s.write_all(raw).await?;
    let mut got = Vec::new();
    let mut buf = vec![0; 64 << 10];
    let closed = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed");
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(closed());
        }
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:")?.trim().parse().ok())
        .ok_or_else(closed)?;
    while got.len() < head_end + len {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(closed());
        }
        got.extend_from_slice(&buf[..n]);
    }
    let body = &got[head_end..head_end + len];
    Ok(head.starts_with("http/1.1 200") && body.windows(8).any(|w| w == b"\"patch\":"))
}

/// One review's time, or `None` for a failure.
type Outcome = Option<Duration>;

/// The API server on one kept-alive connection: a review every `every`.
async fn pooled(client: Client, raw: Arc<Vec<u8>>, every: Duration, stop: Arc<AtomicBool>) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut conn: Option<Tls> = None;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let review = async {
            let s = match conn.as_mut() {
                Some(s) => s,
                None => conn.insert(client.connect().await?),
            };
            exchange(s, &raw).await
        };
        let ok = matches!(tokio::time::timeout(API_TIMEOUT, review).await, Ok(Ok(true)));
        if !ok {
            conn = None;
        }
        out.push(ok.then(|| t.elapsed()));
        tokio::time::sleep(every.saturating_sub(t.elapsed())).await;
    }
    out
}

/// The API server opening a new connection for each review.
async fn fresh(client: Client, raw: Arc<Vec<u8>>, every: Duration, stop: Arc<AtomicBool>) -> Vec<Outcome> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let review = async { exchange(&mut client.connect().await?, &raw).await };
        let ok = matches!(tokio::time::timeout(API_TIMEOUT, review).await, Ok(Ok(true)));
        out.push(ok.then(|| t.elapsed()));
        tokio::time::sleep(every.saturating_sub(t.elapsed())).await;
    }
    out
}

/// Declares a 4 MiB body, sends all but its last byte, holds; again.
async fn hold_body(client: Client, stop: Arc<AtomicBool>) {
    let len = 4 << 20;
    let mut raw =
        format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len}\r\n\r\n").into_bytes();
    raw.extend(std::iter::repeat_n(b' ', len - 1));
    while !stop.load(Ordering::Relaxed) {
        let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(10), client.connect()).await else {
            continue;
        };
        let _ = s.write_all(&raw).await;
        let mut sink = vec![0; 4096];
        while !stop.load(Ordering::Relaxed) {
            // An answer (the server gave up on the body) or a close: again.
            if tokio::time::timeout(Duration::from_millis(100), s.read(&mut sink)).await.is_ok() {
                break;
            }
        }
    }
}

/// Opens TCP and never finishes TLS; again when closed.
async fn stall_handshake(addr: SocketAddr, partial: bool, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut tcp) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if partial {
            let _ = tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
        }
        let mut sink = [0; 64];
        while !stop.load(Ordering::Relaxed) {
            let read = tokio::time::timeout(Duration::from_millis(100), tcp.read(&mut sink)).await;
            if matches!(read, Ok(Ok(0) | Err(_))) {
                break;
            }
        }
    }
}

/// p-th percentile of sorted `v`.
fn pct(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn row(bin: &str, case: &str, who: &str, outcomes: &[Outcome]) {
    let mut ok: Vec<Duration> = outcomes.iter().flatten().copied().collect();
    ok.sort();
    let failed = outcomes.len() - ok.len();
    let within = ok.iter().filter(|d| **d <= Duration::from_secs(2)).count();
    // No answer at all: no times to show.
    let ms = |d: Option<&Duration>| d.map_or("-".to_string(), |d| format!("{:.1}", d.as_secs_f64() * 1e3));
    println!(
        "| {bin} | {case} | {who} | {} | {failed} | {} | {} | {} | {within}/{} |",
        outcomes.len(),
        ms((!ok.is_empty()).then(|| pct(&ok, 0.5)).as_ref()),
        ms((!ok.is_empty()).then(|| pct(&ok, 0.99)).as_ref()),
        ms(ok.last()),
        outcomes.len(),
    );
}

async fn run_case(bin: &str, case: &str, secs: u64, dir: &Path, ca: &CertificateDer<'static>, review: &[u8]) {
    let server = Server::start(bin, dir);
    let client = Client::new(server.addr, ca);
    let stop = Arc::new(AtomicBool::new(false));
    let mut attack = Vec::new();
    if matches!(case, "bodies" | "both") {
        for _ in 0..3 {
            attack.push(tokio::spawn(hold_body(client.clone(), stop.clone())));
        }
    }
    if matches!(case, "handshakes" | "both") {
        for i in 0..200 {
            attack.push(tokio::spawn(stall_handshake(server.addr, i % 2 == 1, stop.clone())));
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let raw = Arc::new(post(review));
    let done = Arc::new(AtomicBool::new(false));
    let kept = tokio::spawn(pooled(client.clone(), raw.clone(), Duration::from_millis(100), done.clone()));
    let new = tokio::spawn(fresh(client.clone(), raw, Duration::from_millis(250), done.clone()));
    let big = tokio::spawn(fresh(
        client.clone(),
        Arc::new(post(&largest(review))),
        Duration::from_secs(1),
        done.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    done.store(true, Ordering::Relaxed);
    let (kept, new, big) = (kept.await.unwrap(), new.await.unwrap(), big.await.unwrap());
    stop.store(true, Ordering::Relaxed);
    for a in attack {
        let _ = a.await;
    }
    drop(server);
    row(bin, case, "kept-alive", &kept);
    row(bin, case, "new connection", &new);
    row(bin, case, "3 MiB review, new connection", &big);
}

/// `review` with its Pod's first container given arguments up to 3 MiB:
/// the largest Pod the API server takes in a request.
fn largest(review: &[u8]) -> Vec<u8> {
    let mut r: serde_json::Value = serde_json::from_slice(review).unwrap();
    let pod_bytes = serde_json::to_vec(&r["request"]["object"]).unwrap().len();
    let fill = (3 << 20) - pod_bytes - 32;
    r["request"]["object"]["spec"]["containers"][0]["args"] = serde_json::json!(["a".repeat(fill)]);
    let out = serde_json::to_vec(&r).unwrap();
    assert!(serde_json::to_vec(&r["request"]["object"]).unwrap().len() <= 3 << 20);
    out
}

fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    let ca = certificates(dir.path());
    let review =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inject/admission-review.json"))
            .expect("tests/inject/admission-review.json");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{cores} cores, load average {} at the start; each case {} s after 1 s of attack; a review fails past {} s or without a 200 and a patch",
        load.split_whitespace().next().unwrap_or("unknown"),
        a.secs,
        API_TIMEOUT.as_secs()
    );
    println!();
    println!("| binary | attack | API server's connection | reviews | failed | p50 ms | p99 ms | max ms | within 2 s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for case in &a.cases {
        for bin in &a.bins {
            rt.block_on(run_case(bin, case, a.secs, dir.path(), &ca, &review));
        }
    }
}
