//! `tcpx-rxdm inject serve` against what a hostile Pod author or client can
//! send: Pods too large or asking for too much are refused with a small
//! answer, a forged record strips nothing, an update is left alone, the
//! health check answers while heavy reviews run, a client that does not
//! read its reply is cut off, a connection past the cap takes the place of
//! the one idle longest, a review is answered while clients hold 4 MiB
//! bodies and stall hundreds of handshakes, every review leaves a log line,
//! and the real binary's peak memory stays under the limit the shipped
//! manifest gives it.

mod webhook;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tcpx_rxdm::inject::serve::MAX_CONNECTIONS;
use tcpx_rxdm::inject::webhook::MAX_VALUES;
use tcpx_rxdm::inject::{Mode, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use webhook::{apply_patch, base64_decode, gpu, pod, request, review_of, Server};

fn answer_of(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap_or_else(|e| panic!("{e}: {body}"))["response"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_pods_get_a_small_refusal_and_a_forged_record_strips_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ca = webhook::ca();
    let (client, _) = webhook::start(dir.path(), &ca, |c| c.max_body = 4 << 20).await;

    // 1,800 GPU containers, once 131 MB of work: refused, a small answer.
    let many: Vec<Value> = (0..1800).map(|i| gpu(&format!("c{i}"), 1)).collect();
    let (status, body, _) = client.post(&review_of("u-many", &pod(many), "CREATE")).await;
    assert_eq!(status, 200);
    assert!(body.len() < 1024, "an answer of {} bytes", body.len());
    let a = answer_of(&body);
    assert_eq!((a["uid"].as_str(), a["allowed"].as_bool()), (Some("u-many"), Some(false)));
    assert!(a["status"]["message"].as_str().unwrap().contains("asks for 1800 GPUs"), "{a}");

    let (_, body, _) = client.post(&review_of("u-16", &pod(vec![gpu("a", 8), gpu("b", 8)]), "CREATE")).await;
    let a = answer_of(&body);
    assert_eq!(a["allowed"], false);
    let msg = a["status"]["message"].as_str().unwrap();
    assert!(msg.contains("asks for 16 GPUs") && msg.contains("a3-highgpu-8g has 8"), "{msg}");

    // A forged record naming the author's own fields, beside the author's
    // own container of the daemon's name: nothing is taken from the Pod.
    for record in ["pod=securityContext,runtimeClassName", "pod=hostPID:true"] {
        let mut forged = pod(vec![gpu("trainer", 8), json!({"name": "tcpx-daemon", "image": "mine"})]);
        forged["metadata"]["annotations"] =
            json!({"tcpx-rxdm.io/injected": format!("version=0.1.0 mode=sidecar nccl=file {record}")});
        forged["spec"]["securityContext"] = json!({"runAsNonRoot": true});
        forged["spec"]["runtimeClassName"] = json!("gvisor");
        let (_, body, _) = client.post(&review_of("u-forged", &forged, "CREATE")).await;
        let a = answer_of(&body);
        assert!(a.get("patch").is_none(), "{a}");
        assert_eq!(a["allowed"], false);
        assert!(a["status"]["message"].as_str().unwrap().contains("which inject never sets"), "{a}");
    }

    // An update is left alone, even of a Pod inject would refuse.
    let (_, body, _) = client.post(&review_of("u-up", &pod(vec![gpu("a", 8), gpu("b", 8)]), "UPDATE")).await;
    assert_eq!(answer_of(&body), json!({"uid": "u-up", "allowed": true}));

    // A Pod of millions of values is refused before it is built.
    let mut huge = pod(vec![gpu("a", 1)]);
    huge["metadata"]["annotations"] = json!({"x": vec![json!({}); 1_390_000]});
    let huge = review_of("u-huge", &huge, "CREATE");
    assert!(huge.len() > (4 << 20) - (64 << 10) && huge.len() <= 4 << 20, "{}", huge.len());
    let (status, body, _) = client.post(&huge).await;
    assert_eq!(status, 200);
    assert!(answer_of(&body)["status"]["message"].as_str().unwrap().contains("JSON values"), "{body}");

    // A fresh Pod still gets its patch, and only what inject adds.
    let (_, body, _) = client.post(&review_of("u-ok", &pod(vec![gpu("trainer", 8)]), "CREATE")).await;
    let a = answer_of(&body);
    let patch: Value = serde_json::from_slice(&base64_decode(a["patch"].as_str().unwrap())).unwrap();
    let mut patched = pod(vec![gpu("trainer", 8)]);
    apply_patch(&mut patched, &patch);
    assert_eq!(patched["spec"]["initContainers"][0]["name"], "tcpx-daemon");
    assert_eq!(patched["spec"]["containers"][0]["image"], "trainer");
}

/// The largest review bodies that cost the most to hold: each just under
/// 4 MiB, (a) an array of a million empty objects, (b) as many values as
/// a review may hold with the rest of the bytes in strings, (c) one GPU
/// container with a 4 MB argument, reviewed and patched.
fn worst_bodies() -> Vec<Vec<u8>> {
    let limit = 4 << 20;
    let mut objects = pod(vec![gpu("a", 1)]);
    objects["metadata"]["annotations"] = json!({"x": vec![json!({}); 1_390_000]});
    let mut values = pod(vec![gpu("a", 1)]);
    let n = MAX_VALUES - 100;
    let fill = "v".repeat(limit / n - 8);
    values["metadata"]["annotations"] = json!({"x": vec![json!(fill); n]});
    let mut arg = gpu("a", 1);
    arg["args"] = json!(["a".repeat(limit - 2048)]);
    let bodies: Vec<Vec<u8>> = [objects, values, pod(vec![arg])]
        .iter()
        .enumerate()
        .map(|(i, p)| review_of(&format!("u-worst-{i}"), p, "CREATE"))
        .collect();
    for b in &bodies {
        assert!(b.len() <= limit && b.len() > limit * 3 / 4, "a body of {} bytes", b.len());
    }
    bodies
}

/// A health check is answered while heavy reviews are in flight: some check
/// begins after a review and ends before it (a server that made it wait
/// would answer it only after every review begun before it). Order, not
/// time: checks go on until one has overtaken a review (a hang guard ends a
/// server that never lets one), and how long a check takes is no part of it.
#[test]
fn health_is_answered_while_heavy_reviews_are_in_flight() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const HANG: Duration = Duration::from_secs(120);
    let server = Server::start(&["--on-error=refuse"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    rt.block_on(async {
        let client = server.client();
        let bodies = worst_bodies();
        let guard = Instant::now() + HANG;
        // Reviews begun and ended, by all attackers; set once a check overtook one.
        let begun = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let mut attackers = Vec::new();
        for i in 0..2 {
            let (client, bodies) = (client.clone(), bodies.clone());
            let (begun, ended, done) = (begun.clone(), ended.clone(), done.clone());
            attackers.push(tokio::spawn(async move {
                let (mut sent, mut answered) = (0, 0);
                // Until a check overtook a review and this attacker had one answered.
                while !(done.load(Ordering::SeqCst) && answered > 0) && Instant::now() < guard {
                    begun.fetch_add(1, Ordering::SeqCst);
                    let (status, _, _) = client.post(&bodies[(i + sent) % bodies.len()]).await;
                    ended.fetch_add(1, Ordering::SeqCst);
                    // On a loaded machine a 4 MiB body may miss the request
                    // timeout (408) or find the buffers full (503).
                    assert!([200, 408, 503].contains(&status), "status {status}");
                    sent += 1;
                    answered += usize::from(status == 200);
                }
                answered
            }));
        }
        let (mut checks, mut overtook) = (0, 0);
        while overtook == 0 {
            assert!(
                Instant::now() < guard,
                "none of {checks} health checks was answered while a review was in flight"
            );
            let before = begun.load(Ordering::SeqCst);
            assert!(client.healthy().await);
            checks += 1;
            // A review begun before this check had not ended when it was answered.
            overtook += usize::from(ended.load(Ordering::SeqCst) < before);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        done.store(true, Ordering::SeqCst);
        let mut answered = 0;
        for a in attackers {
            answered += a.await.unwrap();
        }
        assert!(answered >= 1, "no heavy review was answered");
        eprintln!("check {checks} was answered while a review was in flight");
    });
}

#[test]
fn peak_memory_stays_under_the_manifests_limit_under_the_worst_bodies() {
    // The limit the shipped Deployment gives the container.
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/injector/injector.yaml"),
    )
    .unwrap();
    let limit_mib: f64 = manifest
        .split("limits:")
        .nth(1)
        .and_then(|l| l.split("memory:").nth(1))
        .and_then(|m| m.split_whitespace().next()?.strip_suffix("Mi")?.parse().ok())
        .expect("a memory limit in Mi");
    let server = Server::start(&["--on-error=refuse"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    rt.block_on(async {
        let client = server.client();
        let bodies = worst_bodies();
        // Sixteen clients at once, each body kind several times: more
        // bodies than the buffers hold and more reviews than run at once.
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (client, body) = (client.clone(), bodies[i % bodies.len()].clone());
            tasks.push(tokio::spawn(async move {
                let mut codes = Vec::new();
                for _ in 0..3 {
                    codes.push(client.post(&body).await.0);
                }
                codes
            }));
        }
        for t in tasks {
            for code in t.await.unwrap() {
                // Answered, or told the server is busy or the body too
                // slow (sixteen 4 MiB uploads share two cores): never
                // dropped without a word.
                assert!([200, 408, 503].contains(&code), "status {code}");
            }
        }
    });
    let peak = server.peak_mib();
    eprintln!("peak resident memory under attack: {peak:.1} MiB (limit {limit_mib} MiB)");
    assert!(peak < limit_mib * 0.8, "peak {peak:.1} MiB against a limit of {limit_mib} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_reply_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let ca = webhook::ca();
    // The classic sidecar puts the daemon first in `containers`: the patch
    // then carries the GPU container whole, its 3 MB argument and all.
    let (client, _) = webhook::start(dir.path(), &ca, |c| {
        c.max_body = 4 << 20;
        c.timeout = Duration::from_secs(2);
        c.inject = Options { mode: Mode::Sidecar, ..Options::default() };
    })
    .await;
    let mut big = gpu("trainer", 8);
    big["args"] = json!(["a".repeat(3 << 20)]);
    let body = review_of("u-big", &pod(vec![big]), "CREATE");
    let (status, reply, _) = client.post(&body).await;
    assert_eq!(status, 200);
    assert!(reply.len() > 4 << 20, "a reply of {} bytes", reply.len());

    // Three such requests on one connection from a client that reads
    // nothing: the replies fill the socket buffers (some 4 MB on loopback)
    // and the second or third one cannot be written.
    let keep =
        |raw: Vec<u8>| String::from_utf8(raw).unwrap().replace("Connection: close\r\n", "").into_bytes();
    let (raw, last) = (keep(request(&body)), request(&body));
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(client.addr).await.unwrap();
    let s = client.handshake(tcp).await.unwrap();
    let (mut rd, mut wr) = tokio::io::split(s);
    let sender = tokio::spawn(async move {
        for r in [&raw, &raw, &last] {
            if wr.write_all(r).await.is_err() {
                break;
            }
        }
        wr
    });
    // Each reply gets 2 s from its first write; by 15 s the server has closed.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was still open");
    let whole = 3 * reply.len();
    assert!(got.len() < whole, "all three replies ({} bytes) came", got.len());
    sender.abort();
    assert!(client.healthy().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_the_connection_idle_longest_is_closed_for_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = webhook::ca();
    // Idle connections stay for the request timeout: past the hang bound, here.
    let (client, _) = webhook::start(dir.path(), &ca, |c| c.timeout = 4 * HANG).await;
    let health = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let mut open = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        open.push(client.connect().await);
    }
    // The youngest used once: kept alive, and now the last to wait on its client.
    let mut young = open.pop().unwrap();
    assert_eq!(webhook::exchange(&mut young, health).await.map(|r| r.0), Some(200));
    // One more: served (it waits a quarter second, not for a connection to end).
    let mut new = tokio::time::timeout(HANG, client.connect()).await.expect("a new connection was served");
    assert_eq!(webhook::exchange(&mut new, health).await.map(|r| r.0), Some(200));
    // The oldest idle one made room: closed.
    let mut oldest = open.remove(0);
    let mut rest = Vec::new();
    let read =
        tokio::time::timeout(HANG, oldest.read_to_end(&mut rest)).await.expect("the oldest was closed");
    assert!(read.is_err() || rest.is_empty(), "{read:?} {rest:?}");
    // The others are kept alive and served.
    assert_eq!(webhook::exchange(&mut young, health).await.map(|r| r.0), Some(200));
    assert_eq!(webhook::exchange(&mut open[1], health).await.map(|r| r.0), Some(200));
}

/// Bound on how long a step may take before the test calls it a hang: far
/// past what any of them needs, so it asserts an answer, not a speed.
const HANG: Duration = Duration::from_secs(30);

/// How a held body ended: the status and text of the answer (0: none), and
/// whether the connection was reset (an answer sent while the client still
/// sent is dropped by the kernel with the connection) or hung.
struct Ended {
    status: u16,
    text: String,
    reset: bool,
    hung: bool,
}

/// A client that declares a 4 MiB body, sends all of it but the last byte
/// and holds, over and over; how each ended.
async fn hold_a_body(client: webhook::Client, stop: Arc<AtomicBool>) -> Vec<Ended> {
    let len = 4 << 20;
    let mut answers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = tokio::time::timeout(HANG, client.connect()).await else { continue };
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        );
        let mut raw = head.into_bytes();
        raw.extend(std::iter::repeat_n(b' ', len - 1));
        let _ = s.write_all(&raw).await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(HANG, s.read_to_end(&mut out)).await;
        let reset = matches!(&read, Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset);
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        answers.push(Ended { status, text, reset, hung: read.is_err() });
    }
    answers
}

/// A client that opens TCP connections and never finishes TLS (sends
/// nothing, or part of a ClientHello), opening another whenever the
/// server closes one; how many the server closed.
async fn stall_handshakes(addr: std::net::SocketAddr, partial: bool, stop: Arc<AtomicBool>) -> usize {
    let mut closed = 0;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if partial {
            // A handshake record of 512 bytes, a ClientHello, six bytes of it.
            let _ = tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
        }
        let mut sink = [0; 64];
        loop {
            tokio::select! {
                r = tcp.read(&mut sink) => if matches!(r, Ok(0) | Err(_)) { closed += 1; break },
                () = tokio::time::sleep(Duration::from_millis(100)) => if stop.load(Ordering::Relaxed) { return closed },
            }
        }
    }
    closed
}

#[test]
fn a_review_is_answered_while_clients_hold_bodies_and_stall_handshakes() {
    // A request timeout far past the hang bound: nothing the attackers hold
    // is freed by it, so the review must get through while they hold.
    let server = Server::start(&["--on-error=refuse", "--request-timeout=120"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let client = server.client();
        let review =
            std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inject/admission-review.json"))
                .unwrap();
        // The API server's kept-alive connection, open before the attack.
        let mut pooled = client.connect().await;
        let stop = Arc::new(AtomicBool::new(false));
        let holders: Vec<_> =
            (0..3).map(|_| tokio::spawn(hold_a_body(client.clone(), stop.clone()))).collect();
        let stallers: Vec<_> =
            (0..200).map(|i| tokio::spawn(stall_handshakes(client.addr, i % 2 == 0, stop.clone()))).collect();
        // The attack in place: bodies sent, handshakes stalled.
        tokio::time::sleep(Duration::from_secs(1)).await;

        let check = |answer: Option<(u16, String)>, what: &str| {
            let (status, body) = answer.unwrap_or_else(|| panic!("{what}: the connection closed"));
            assert_eq!(status, 200, "{what}: {body}");
            let a = answer_of(&body);
            let sent: Value = serde_json::from_slice(&review).unwrap();
            assert_eq!((&a["uid"], &a["allowed"]), (&sent["request"]["uid"], &json!(true)), "{what}: {a}");
            let patch: Value = serde_json::from_slice(&base64_decode(a["patch"].as_str().unwrap())).unwrap();
            let mut pod = sent["request"]["object"].clone();
            apply_patch(&mut pod, &patch);
            assert_eq!(pod["spec"]["initContainers"][0]["name"], "tcpx-daemon", "{what}");
        };
        // On the kept-alive connection, twice; on a new one, twice (kept alive).
        let raw = webhook::request_kept_alive(&review);
        for what in ["kept-alive connection", "kept-alive connection, again"] {
            check(tokio::time::timeout(HANG, webhook::exchange(&mut pooled, &raw)).await.expect(what), what);
        }
        let mut fresh =
            tokio::time::timeout(HANG, client.connect()).await.expect("a new connection was served");
        for what in ["new connection", "new connection, again"] {
            check(tokio::time::timeout(HANG, webhook::exchange(&mut fresh, &raw)).await.expect(what), what);
        }

        stop.store(true, Ordering::Relaxed);
        let mut answers = Vec::new();
        for h in holders {
            answers.extend(h.await.unwrap());
        }
        let mut closed = 0;
        for s in stallers {
            closed += s.await.unwrap();
        }
        // The held bodies were told why, not left hanging.
        assert!(!answers.is_empty());
        for a in &answers {
            let (status, text) = (a.status, &a.text);
            assert!(!a.hung, "a held body got no answer");
            assert!(
                (status == 408
                    && (text.contains("not received in time") || text.contains("needed its room")))
                    || (status == 503 && text.contains("busy"))
                    || (status == 0 && a.reset),
                "{status}: {text}"
            );
        }
        assert!(answers.iter().any(|a| a.status == 408), "no held body was told why");
        // And stalled handshakes were closed, not left to wait out the request timeout.
        assert!(closed > 0);
    });
}

#[test]
fn every_review_and_every_refused_request_is_logged() {
    let server = Server::start(&["--on-error=refuse"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let c = server.client();
        assert_eq!(c.post(&review_of("u-patch", &pod(vec![gpu("a", 8)]), "CREATE")).await.0, 200);
        assert_eq!(
            c.post(&review_of("u-refuse", &pod(vec![gpu("a", 8), gpu("b", 8)]), "CREATE")).await.0,
            200
        );
        assert_eq!(c.post(&review_of("u-update", &pod(vec![gpu("a", 8)]), "UPDATE")).await.0, 200);
        assert_eq!(c.post(b"{\"apiVersion\": ").await.0, 400);
        assert_eq!(
            c.send(b"GET /other HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.0,
            404
        );
    });
    let lines = server.lines(Duration::from_millis(300));
    let find = |needle: &str| -> &String {
        let found: Vec<&String> = lines.iter().filter(|l| l.contains(needle)).collect();
        assert_eq!(found.len(), 1, "{needle}: {lines:#?}");
        found[0]
    };
    for (uid, level, verdict, op) in [
        ("u-patch", "INFO", "verdict=patched", "operation=CREATE"),
        ("u-refuse", "WARN", "verdict=refused", "operation=CREATE"),
        ("u-update", "INFO", "verdict=unchanged", "operation=UPDATE"),
    ] {
        let l = find(&format!("uid={uid} "));
        for want in [level, " review ", "pod=ml/p ", verdict, op, " ms="] {
            assert!(l.contains(want), "{want:?} missing from {l}");
        }
    }
    assert!(find("uid=u-refuse").contains("asks for 16 GPUs"));
    assert!(find("uid=u-update").contains("only CREATE is reviewed"));
    let bad = find("verdict=error");
    assert!(bad.contains(" review ") && bad.contains("reason=not an AdmissionReview"), "{bad}");
    let other = find("status=404");
    assert!(other.contains("request refused") && other.contains("path=/other"), "{other}");
    assert_eq!(lines.iter().filter(|l| l.contains(" review ")).count(), 4, "{lines:#?}");
}
