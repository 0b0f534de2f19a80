//! `tcpx-rxdm inject serve` over real HTTPS: a throwaway CA signs the
//! server's certificate; a client trusting only that CA sends the bytes the
//! API server sends, applies the returned JSONPatch and checks the Pod;
//! malformed, oversized and slow requests get an error and the server goes
//! on; a certificate written over the files is served without a restart.

mod webhook;

use std::path::Path;
use std::time::{Duration, Instant};

use rcgen::KeyPair;
use serde_json::Value;
use tcpx_rxdm::inject::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use webhook::{apply_patch, base64_decode, ca, issue, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_review_comes_back_as_a_patch_that_injects_tcpx() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let (client, _) = webhook::start(dir.path(), &ca, |_| {}).await;
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
    let (client, _) = webhook::start(dir.path(), &ca, |_| {}).await;

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
    let (client, first) = webhook::start(dir.path(), &ca, |_| {}).await;
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
    let mut server = Server::start(&["--on-error=allow", "--tenant_isolation=enforce", "--privileged"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    assert!(rt.block_on(server.client().healthy()));
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(server.child.wait().unwrap().code(), Some(0));
}

/// Clients that hang up mid-head, mid-body and mid-answer, a hundred times
/// each, as the API server does at its timeout: the real binary (a command's
/// process, whose SIGPIPE could kill it on a write to a peer that is gone)
/// serves on and answers the next review.
#[test]
fn clients_that_hang_up_at_any_point_leave_the_webhook_serving() {
    use nix::sys::socket::{setsockopt, sockopt::Linger};
    let mut server = Server::start(&["--on-error=allow"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = server.client();
    let review = webhook::review_of("u-gone", &webhook::pod(vec![webhook::gpu("trainer", 8)]), "CREATE");
    let whole = webhook::request(&review);
    let head = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let review_len = review.len();
    // One round of the three hang-ups; `None` once the server is gone.
    let round = |i: usize| {
        let (client, whole) = (client.clone(), whole.clone());
        async move {
            for cut in [head / 2, head + review_len / 2] {
                let mut s = client.handshake(TcpStream::connect(client.addr).await.ok()?).await.ok()?;
                s.write_all(&whole[..cut]).await.ok()?;
                s.flush().await.ok()?;
            }
            // The whole request, then a reset before the answer is read (or
            // after its first byte): the server's writes meet a peer that is gone.
            let tcp = TcpStream::connect(client.addr).await.ok()?;
            setsockopt(&tcp, Linger, &libc::linger { l_onoff: 1, l_linger: 0 }).unwrap();
            let mut s = client.handshake(tcp).await.ok()?;
            s.write_all(&whole).await.ok()?;
            s.flush().await.ok()?;
            if i % 2 == 1 {
                let _ = s.read(&mut [0u8; 1]).await;
            }
            Some(())
        }
    };
    let rounds = rt.block_on(async {
        for i in 0..100 {
            if round(i).await.is_none() {
                return i;
            }
        }
        100
    });
    if let Some(status) = server.child.try_wait().unwrap() {
        let log = server.lines(Duration::ZERO).join("\n");
        panic!("the webhook ended ({status}) in round {rounds} of 100; its log:\n{log}");
    }
    let (status, body, _) = rt.block_on(client.post(&review));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"uid\":\"u-gone\""), "{body}");
    assert!(rt.block_on(client.healthy()));
}

/// The webhook converts a TCPX daemon a Pod brings, as the command does,
/// keeping it in the Pod for `tcpx-rxdm inject --uninject`; and its probe
/// follows --metrics_address.
#[test]
fn the_webhook_converts_a_hand_written_daemon_and_probes_where_the_daemon_listens() {
    use tcpx_rxdm::inject::webhook::{review, OnError};
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "p", "namespace": "ml" },
        "spec": {
            "containers": [
                { "name": "rxdm", "image": "registry.example/tcpx-rxdm:0.1.0", "args": ["--uds_path=/run/tcpx", "--rx_pool_size=1073741824"],
                  "volumeMounts": [{ "name": "sock", "mountPath": "/run/tcpx" }] },
                { "name": "trainer", "image": "t", "resources": { "limits": { "nvidia.com/gpu": 8 } },
                  "volumeMounts": [{ "name": "sock", "mountPath": "/run/tcpx" }] },
            ],
            "volumes": [{ "name": "sock", "emptyDir": {} }],
        }
    });
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": { "uid": "u", "operation": "CREATE", "namespace": "ml", "kind": { "group": "", "version": "v1", "kind": "Pod" }, "object": pod }
    });
    let opts =
        Options { daemon_flags: vec!["--metrics_address=127.0.0.1:9467".into()], ..Options::default() };
    let answer = review(body.to_string().as_bytes(), &opts, OnError::Refuse).unwrap();
    let patch: Value =
        serde_json::from_slice(&base64_decode(answer["response"]["patch"].as_str().unwrap())).unwrap();
    let mut got = pod.clone();
    apply_patch(&mut got, &patch);
    let names: Vec<&str> =
        got["spec"]["containers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["trainer"], "one daemon, inject's");
    let d = &got["spec"]["initContainers"][0];
    assert_eq!(d["image"], "tcpx-rxdm:0.1.0", "the webhook's --image decides");
    assert!(d["args"].as_array().unwrap().iter().any(|a| a == "--rx_pool_size=1073741824"), "{d}");
    assert_eq!(d["startupProbe"]["exec"]["command"][2], "mine", "{d}");
    let kept = got["metadata"]["annotations"]["tcpx-rxdm.io/converted"].as_str().unwrap();
    assert!(kept.contains("\"name\":\"rxdm\""), "{kept}");
    // Not privileged, the GPUs through GKE's device annotation; `--privileged`
    // (an option of `inject serve` too) gives the old privileged daemon.
    assert_eq!(d["securityContext"]["privileged"], false, "{d}");
    assert_eq!(d["securityContext"]["capabilities"]["drop"][0], "ALL", "{d}");
    assert!(got["metadata"]["annotations"]["devices.gke.io/container.tcpx-daemon"].is_string());
    let privileged =
        review(body.to_string().as_bytes(), &Options { privileged: true, ..opts.clone() }, OnError::Refuse)
            .unwrap();
    let patch: Value =
        serde_json::from_slice(&base64_decode(privileged["response"]["patch"].as_str().unwrap())).unwrap();
    let mut old = pod.clone();
    apply_patch(&mut old, &patch);
    assert_eq!(
        old["spec"]["initContainers"][0]["securityContext"],
        serde_json::json!({ "privileged": true })
    );
    assert!(old["metadata"]["annotations"].get("devices.gke.io/container.tcpx-daemon").is_none());
    // The command gives it back.
    let yaml = serde_norway::to_string(&got).unwrap();
    let back =
        tcpx_rxdm::inject::command::transform(&yaml, &Options { uninject: true, ..Options::default() })
            .unwrap()
            .0;
    assert_eq!(serde_norway::from_str::<Value>(&back).unwrap(), pod);
}
