//! `tcpx-rxdm inject serve` over real HTTPS: a throwaway CA signs the
//! server's certificate; a client trusting only that CA sends the bytes the
//! API server sends, applies the returned JSONPatch and checks the Pod;
//! malformed, oversized and slow requests get an error and the server goes
//! on; a certificate written over the files is served without a restart.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::Value;
use tcpx_rxdm::inject::serve::{bind, ServeConfig};
use tcpx_rxdm::inject::webhook::OnError;
use tcpx_rxdm::inject::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

struct Ca {
    cert: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

fn ca() -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap().der().clone();
    Ca { cert, issuer: Issuer::new(p, key) }
}

/// A new server certificate for localhost, written over `dir`'s files; its DER.
fn issue(ca: &Ca, dir: &Path) -> CertificateDer<'static> {
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

struct Client {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

impl Client {
    fn new(addr: SocketAddr, ca: &Ca) -> Client {
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

    async fn connect(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        self.tls.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap()
    }

    /// Sends `raw` (a whole HTTP/1.1 request), reads to the end: status, body, server certificate.
    async fn send(&self, raw: &[u8]) -> (u16, String, CertificateDer<'static>) {
        let mut s = self.connect().await;
        let peer = s.get_ref().1.peer_certificates().unwrap()[0].clone();
        s.write_all(raw).await.unwrap();
        let mut out = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.expect("an answer");
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body, peer)
    }

    async fn post(&self, body: &[u8]) -> (u16, String, CertificateDer<'static>) {
        let mut raw = format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(body);
        self.send(&raw).await
    }

    async fn healthy(&self) -> bool {
        self.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.0 == 200
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let abc = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let vals: Vec<u32> =
        s.bytes().filter(|b| *b != b'=').map(|b| abc.iter().position(|x| *x == b).unwrap() as u32).collect();
    let mut out = Vec::new();
    for c in vals.chunks(4) {
        let n = c.iter().enumerate().fold(0, |acc, (i, v)| acc | v << (18 - 6 * i));
        out.extend(n.to_be_bytes()[1..c.len()].iter());
    }
    out
}

/// RFC 6902 add/replace/remove on object members, as the API server applies them.
fn apply_patch(doc: &mut Value, patch: &Value) {
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
            at = at.get_mut(p.as_str()).unwrap_or_else(|| panic!("patch path {path:?} missing"));
        }
        let obj = at.as_object_mut().unwrap();
        match op["op"].as_str().unwrap() {
            "add" => drop(obj.insert(last.clone(), op["value"].clone())),
            "replace" => {
                drop(obj.insert(last.clone(), op["value"].clone()).expect("replace of a missing member"))
            }
            "remove" => drop(obj.remove(last).expect("remove of a missing member")),
            other => panic!("unexpected op {other}"),
        }
    }
}

async fn start(dir: &Path, ca: &Ca) -> (Client, CertificateDer<'static>) {
    let first = issue(ca, dir);
    let cfg = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        inject: Options::default(),
        on_error: OnError::Refuse,
        max_body: 64 * 1024,
        timeout: Duration::from_millis(700),
        reload_every: Duration::from_millis(100),
    };
    let (addr, serve) = bind(cfg).await.unwrap();
    tokio::spawn(serve);
    (Client::new(addr, ca), first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_review_comes_back_as_a_patch_that_injects_tcpx() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let (client, _) = start(dir.path(), &ca).await;
    assert!(client.healthy().await);
    let review =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inject/admission-review.json"))
            .unwrap();
    let (status, body, _) = client.post(&review).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let sent: Value = serde_json::from_slice(&review).unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["response"]["uid"], sent["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    let patch: Value =
        serde_json::from_slice(&base64_decode(answer["response"]["patch"].as_str().unwrap())).unwrap();
    let mut pod = sent["request"]["object"].clone();
    apply_patch(&mut pod, &patch);

    // The same change as the command makes on the same Pod.
    let yaml = serde_norway::to_string(&sent["request"]["object"]).unwrap();
    let cli: Value =
        serde_norway::from_str(&tcpx_rxdm::inject::command::transform(&yaml, &Options::default()).unwrap().0)
            .unwrap();
    assert_eq!(pod, cli);
    let spec = &pod["spec"];
    assert_eq!(
        (spec["hostNetwork"].clone(), spec["dnsPolicy"].clone()),
        (Value::Bool(true), Value::from("ClusterFirstWithHostNet"))
    );
    assert_eq!(spec["initContainers"][0]["name"], "tcpx-daemon");
    let mounts = spec["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["mountPath"] == "/run/tcpx"), "{mounts:?}");
    assert!(mounts.iter().any(|m| m["name"] == "kube-api-access-x1y2z"), "the token mount was lost");
    // The patched Pod is a golden file that .ci/deploy-lint validates against the schemas.
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inject/webhook-pod.yaml");
    let mut pod_for_schema = pod.clone();
    pod_for_schema["metadata"]["name"] = Value::from("train-x7k2p");
    pod_for_schema["metadata"].as_object_mut().unwrap().remove("creationTimestamp");
    pod_for_schema.as_object_mut().unwrap().remove("status");
    let text = serde_norway::to_string(&pod_for_schema).unwrap();
    if std::env::var_os("TCPX_UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &text).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&golden).unwrap(), text, "TCPX_UPDATE_GOLDEN=1 rewrites it");

    // Reinvoked on its own output: allowed, no patch.
    let mut again = sent.clone();
    again["request"]["object"] = pod;
    let (_, body, _) = client.post(&serde_json::to_vec(&again).unwrap()).await;
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_an_error_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let (client, _) = start(dir.path(), &ca).await;

    let (status, body, _) = client.post(b"{\"apiVersion\": ").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not an AdmissionReview"), "{body}");
    assert!(client.healthy().await);

    // Oversized: refused on the declared length, and on a chunked body past the limit.
    let (status, _, _) = client
        .send(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10000000\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(status, 413);
    let chunk = "x".repeat(100 * 1024);
    let raw = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    assert_eq!(client.send(raw.as_bytes()).await.0, 413);
    assert!(client.healthy().await);

    // Slow: a body that stops coming gets 408 within the timeout, headers that
    // stop coming a closed connection; neither holds the server.
    let t = Instant::now();
    let (status, _, _) = client
        .send(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"a\"")
        .await;
    assert_eq!(status, 408);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let t = Instant::now();
    let mut s = client.connect().await;
    s.write_all(b"POST /mutate HTTP/1.1\r\nHost: loc").await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await.expect("closed").ok();
    assert!(t.elapsed() < Duration::from_secs(5));
    // Plain text on the TLS port: the handshake fails, nothing else happens.
    let mut plain = TcpStream::connect(client.addr).await.unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut out)).await;
    assert!(client.healthy().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let (client, first) = start(dir.path(), &ca).await;
    assert_eq!(
        client.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.2,
        first
    );
    // A broken pair (a key half written, or a new key beside the old
    // certificate) is not taken: the old one stays.
    let original_key = std::fs::read(dir.path().join("tls.key")).unwrap();
    for key in ["not a key".to_string(), KeyPair::generate().unwrap().serialize_pem()] {
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let served =
            client.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await;
        assert_eq!((served.0, served.2), (200, first.clone()));
    }
    std::fs::write(dir.path().join("tls.key"), original_key).unwrap();
    let second = issue(&ca, dir.path());
    assert_ne!(first, second);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let served =
            client.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.2;
        if served == second {
            break;
        }
        assert!(Instant::now() < deadline, "the new certificate was not picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn the_command_serves_until_sigterm_and_exits_0() {
    use std::io::BufRead as _;
    /// Ends the server however the test ends.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    issue(&ca, dir.path());
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let mut child = Reap(
        std::process::Command::new(env!("CARGO_BIN_EXE_tcpx-rxdm"))
            .args([
                "inject",
                "serve",
                "--on-error=allow",
                "--listen=127.0.0.1:0",
                "--tenant_isolation=enforce",
            ])
            .arg(format!("--tls-cert={}", cert.display()))
            .arg(format!("--tls-key={}", key.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(child.0.stderr.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    let addr = line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next());
    let addr: SocketAddr =
        addr.and_then(|a| a.parse().ok()).unwrap_or_else(|| panic!("no address in {line:?}"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    assert!(rt.block_on(Client::new(addr, &ca).healthy()), "{line}");
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}
