//! `tcpx-rxdm inject serve` against what a hostile Pod author or client can
//! send: Pods too large or asking for too much are refused with a small
//! answer, a forged record strips nothing, an update is left alone, the
//! health check answers while heavy reviews run, a client that does not
//! read its reply is cut off, connections past the cap wait, every review
//! leaves a log line, and the real binary's peak memory stays under the
//! limit the shipped manifest gives it.

mod webhook;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tcpx_rxdm::inject::serve::MAX_CONNECTIONS;
use tcpx_rxdm::inject::webhook::MAX_VALUES;
use tcpx_rxdm::inject::{Mode, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use webhook::{apply_patch, base64_decode, gpu, pod, request, review_of, Server};

fn answer(body: &str) -> Value {
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
    let a = answer(&body);
    assert_eq!((a["uid"].as_str(), a["allowed"].as_bool()), (Some("u-many"), Some(false)));
    assert!(a["status"]["message"].as_str().unwrap().contains("asks for 1800 GPUs"), "{a}");

    let (_, body, _) = client.post(&review_of("u-16", &pod(vec![gpu("a", 8), gpu("b", 8)]), "CREATE")).await;
    let a = answer(&body);
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
        let a = answer(&body);
        assert!(a.get("patch").is_none(), "{a}");
        assert_eq!(a["allowed"], false);
        assert!(a["status"]["message"].as_str().unwrap().contains("which inject never sets"), "{a}");
    }

    // An update is left alone, even of a Pod inject would refuse.
    let (_, body, _) = client.post(&review_of("u-up", &pod(vec![gpu("a", 8), gpu("b", 8)]), "UPDATE")).await;
    assert_eq!(answer(&body), json!({"uid": "u-up", "allowed": true}));

    // A Pod of millions of values is refused before it is built.
    let mut huge = pod(vec![gpu("a", 1)]);
    huge["metadata"]["annotations"] = json!({"x": vec![json!({}); 1_390_000]});
    let huge = review_of("u-huge", &huge, "CREATE");
    assert!(huge.len() > (4 << 20) - (64 << 10) && huge.len() <= 4 << 20, "{}", huge.len());
    let (status, body, _) = client.post(&huge).await;
    assert_eq!(status, 200);
    assert!(answer(&body)["status"]["message"].as_str().unwrap().contains("JSON values"), "{body}");

    // A fresh Pod still gets its patch, and only what inject adds.
    let (_, body, _) = client.post(&review_of("u-ok", &pod(vec![gpu("trainer", 8)]), "CREATE")).await;
    let a = answer(&body);
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
/// time: how long a check takes is no part of it.
#[test]
fn health_is_answered_while_heavy_reviews_are_in_flight() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let server = Server::start(&["--on-error=refuse"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    rt.block_on(async {
        let client = server.client();
        let bodies = worst_bodies();
        let stop = Instant::now() + Duration::from_secs(4);
        // Reviews begun and ended, by all attackers.
        let begun = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(AtomicUsize::new(0));
        let mut attackers = Vec::new();
        for i in 0..2 {
            let (client, bodies) = (client.clone(), bodies.clone());
            let (begun, ended) = (begun.clone(), ended.clone());
            attackers.push(tokio::spawn(async move {
                let (mut sent, mut answered) = (0, 0);
                while Instant::now() < stop {
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
        while Instant::now() < stop {
            let before = begun.load(Ordering::SeqCst);
            assert!(client.healthy().await);
            checks += 1;
            // A review begun before this check had not ended when it was answered.
            overtook += usize::from(ended.load(Ordering::SeqCst) < before);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut answered = 0;
        for a in attackers {
            answered += a.await.unwrap();
        }
        assert!(answered >= 1, "no heavy review was answered");
        assert!(overtook >= 1, "none of {checks} health checks was answered while a review was in flight");
        eprintln!("{overtook} of {checks} health checks answered while a review was in flight");
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
async fn connections_past_the_cap_wait_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let ca = webhook::ca();
    // Idle connections stay for the request timeout: long, here.
    let (client, _) = webhook::start(dir.path(), &ca, |c| c.timeout = Duration::from_secs(20)).await;
    let mut open = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        open.push(client.connect().await);
    }
    let tcp = tokio::net::TcpStream::connect(client.addr).await.unwrap();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.handshake(tcp).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a connection past the cap was served");
    drop(open.pop());
    let mut s = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("served once a connection closed")
        .unwrap()
        .unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
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
