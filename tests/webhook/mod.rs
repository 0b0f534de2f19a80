//! Shared by the webhook's HTTPS tests: a throwaway CA and the server's
//! certificate, a client trusting only that CA that sends raw HTTP/1.1, the
//! server in-process or as the real binary (its log lines collected), and
//! the JSONPatch decoding the API server does.
#![allow(dead_code)]

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::Value;
use tcpx_rxdm::inject::serve::{bind, ServeConfig};
use tcpx_rxdm::inject::webhook::OnError;
use tcpx_rxdm::inject::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

pub struct Ca {
    pub cert: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

pub fn ca() -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap().der().clone();
    Ca { cert, issuer: Issuer::new(p, key) }
}

/// A new server certificate for localhost, written over `dir`'s files; its DER.
pub fn issue(ca: &Ca, dir: &Path) -> CertificateDer<'static> {
    let key = KeyPair::generate().unwrap();
    let p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    // Written aside and renamed in, as a Secret volume's update appears.
    for (name, text) in [("tls.key", key.serialize_pem()), ("tls.crt", cert.pem())] {
        std::fs::write(dir.join(format!(".{name}")), text).unwrap();
        std::fs::rename(dir.join(format!(".{name}")), dir.join(name)).unwrap();
    }
    cert.der().clone()
}

#[derive(Clone)]
pub struct Client {
    pub addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

pub type Tls = tokio_rustls::client::TlsStream<TcpStream>;

impl Client {
    pub fn new(addr: SocketAddr, ca: &Ca) -> Client {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        // Full handshakes only: a resumed session shows no certificate.
        cfg.resumption = rustls::client::Resumption::disabled();
        Client { addr, tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)) }
    }

    pub async fn handshake(&self, tcp: TcpStream) -> std::io::Result<Tls> {
        self.tls.connect(ServerName::try_from("localhost").unwrap(), tcp).await
    }

    pub async fn connect(&self) -> Tls {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        self.handshake(tcp).await.unwrap()
    }

    /// Sends `raw` (a whole HTTP/1.1 request), reads to the end: status, body, server certificate.
    pub async fn send(&self, raw: &[u8]) -> (u16, String, CertificateDer<'static>) {
        let mut s = self.connect().await;
        let peer = s.get_ref().1.peer_certificates().unwrap()[0].clone();
        // A server may answer (413, 503) and close before taking it all.
        let _ = s.write_all(raw).await;
        let mut out = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.expect("an answer");
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body, peer)
    }

    pub async fn post(&self, body: &[u8]) -> (u16, String, CertificateDer<'static>) {
        self.send(&request(body)).await
    }

    pub async fn healthy(&self) -> bool {
        self.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.0 == 200
    }
}

/// One request and its reply on a kept-alive connection: status and body.
/// `None` if the connection closed first.
pub async fn exchange(s: &mut Tls, raw: &[u8]) -> Option<(u16, String)> {
    s.write_all(raw).await.ok()?;
    let mut got = Vec::new();
    let mut buf = vec![0; 64 << 10];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut buf).await.ok().filter(|n| *n > 0)?;
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_string();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let len: usize = head.lines().find_map(|l| {
        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().ok())
    })??;
    while got.len() < head_end + len {
        let n = s.read(&mut buf).await.ok().filter(|n| *n > 0)?;
        got.extend_from_slice(&buf[..n]);
    }
    Some((status, String::from_utf8_lossy(&got[head_end..head_end + len]).to_string()))
}

/// A POST of `body` to /mutate on a connection kept alive.
pub fn request_kept_alive(body: &[u8]) -> Vec<u8> {
    String::from_utf8(request(body)).unwrap().replace("Connection: close\r\n", "").into_bytes()
}

/// A POST of `body` to /mutate.
pub fn request(body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

/// An AdmissionReview of `object` as the API server sends it.
pub fn review_of(uid: &str, object: &Value, operation: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": operation,
            "object": object,
        }
    }))
    .unwrap()
}

/// A Pod of `containers` (JSON).
pub fn pod(containers: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": containers}})
}

pub fn gpu(name: &str, n: u32) -> Value {
    serde_json::json!({"name": name, "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": n}}})
}

/// The review's `patch` field, decoded (strict base64).
pub fn base64_decode(s: &str) -> Vec<u8> {
    tcpx_rxdm::inject::webhook::base64_decode(s).expect("strict base64")
}

/// RFC 6902 add/replace/remove on object members and list items, as the API server applies them.
pub fn apply_patch(doc: &mut Value, patch: &Value) {
    for op in patch.as_array().unwrap() {
        let path: Vec<String> = op["path"]
            .as_str()
            .unwrap()
            .split('/')
            .skip(1)
            .map(|p| p.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, parents) = path.split_last().unwrap();
        let mut at = &mut *doc;
        for p in parents {
            at = match at {
                Value::Array(items) => items.get_mut(p.parse::<usize>().unwrap()),
                other => other.get_mut(p.as_str()),
            }
            .unwrap_or_else(|| panic!("patch path {path:?} missing"));
        }
        let value = op.get("value").cloned();
        match (at, op["op"].as_str().unwrap()) {
            (Value::Array(items), "add") => {
                let i = if last == "-" { items.len() } else { last.parse().unwrap() };
                items.insert(i, value.unwrap());
            }
            (Value::Array(items), "remove") => drop(items.remove(last.parse().unwrap())),
            (Value::Array(items), "replace") => items[last.parse::<usize>().unwrap()] = value.unwrap(),
            (Value::Object(obj), "add") => drop(obj.insert(last.clone(), value.unwrap())),
            (Value::Object(obj), "replace") => {
                drop(obj.insert(last.clone(), value.unwrap()).expect("replace of a missing member"))
            }
            (Value::Object(obj), "remove") => drop(obj.remove(last).expect("remove of a missing member")),
            (_, other) => panic!("unexpected op {other} at {path:?}"),
        }
    }
}

/// The server in-process, with `tweak` applied to the test settings.
pub async fn start(
    dir: &Path,
    ca: &Ca,
    tweak: impl FnOnce(&mut ServeConfig),
) -> (Client, CertificateDer<'static>) {
    let first = issue(ca, dir);
    let mut cfg = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        inject: Options::default(),
        on_error: OnError::Refuse,
        max_body: 64 * 1024,
        timeout: Duration::from_millis(700),
        reload_every: Duration::from_millis(100),
    };
    tweak(&mut cfg);
    let (addr, serve) = bind(cfg).await.unwrap();
    tokio::spawn(serve);
    (Client::new(addr, ca), first)
}

/// The real binary serving on a free port, ended however the test ends;
/// its log lines arrive on `log`.
pub struct Server {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    pub log: mpsc::Receiver<String>,
    pub ca: Ca,
    _dir: tempfile::TempDir,
}

impl Server {
    pub fn start(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        issue(&ca, dir.path());
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tcpx-rxdm"))
            .args(["inject", "serve", "--listen=127.0.0.1:0"])
            .args(args)
            .arg(format!("--tls-cert={}", cert.display()))
            .arg(format!("--tls-key={}", key.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let line = lines.next().unwrap().unwrap();
        let addr = line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next());
        let addr: SocketAddr =
            addr.and_then(|a| a.parse().ok()).unwrap_or_else(|| panic!("no address in {line:?}"));
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Server { child, addr, log, ca, _dir: dir }
    }

    pub fn client(&self) -> Client {
        Client::new(self.addr, &self.ca)
    }

    /// The log lines written so far (waiting `settle` for late ones).
    pub fn lines(&self, settle: Duration) -> Vec<String> {
        std::thread::sleep(settle);
        self.log.try_iter().collect()
    }

    /// Peak resident memory so far (VmHWM), in MiB.
    pub fn peak_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        kib / 1024.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
