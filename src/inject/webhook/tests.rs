use serde_json::{json, Value as Json};

use super::*;
use crate::inject::command::transform;
use crate::inject::patch::tests::apply;
use crate::inject::Nccl;

/// An `AdmissionReview` as the API server sends it, for `object`.
fn review_of(object: &Json, operation: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "ml",
            "operation": operation,
            "object": object,
        }
    }))
    .unwrap()
}

fn gpu(name: &str, n: u32) -> Json {
    json!({"name": name, "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": n}}})
}

fn pod(containers: Vec<Json>) -> Json {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": containers}})
}

/// The review's outcome and the Pod its patch makes (the Pod itself where there is none).
fn run(object: &Json, operation: &str, on_error: OnError) -> (Outcome, Json) {
    let o = decide(&review_of(object, operation), &Options::default(), on_error).unwrap();
    let mut after = object.clone();
    if let Some(p) = o.reply["response"]["patch"].as_str() {
        let ops: Vec<Json> = serde_json::from_slice(&decode(p)).unwrap();
        apply(&mut after, &ops);
    }
    (o, after)
}

fn decode(s: &str) -> Vec<u8> {
    base64_decode(s).expect("strict base64")
}

#[test]
fn base64_matches_the_rfc_examples() {
    let cases = [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ];
    for (plain, coded) in cases {
        assert_eq!(base64(plain.as_bytes()), coded);
        assert_eq!(decode(coded), plain.as_bytes());
    }
    for bad in ["Zg=", "Zg=a", "Z===", "Zm9v!A==", "===="] {
        assert_eq!(base64_decode(bad), None, "{bad} is not strict base64");
    }
}

#[test]
fn a_review_that_is_not_one_is_an_error_and_other_kinds_pass() {
    let o = Options::default();
    assert!(review(b"{", &o, OnError::Refuse).is_err());
    assert!(review(br#"{"apiVersion":"v1","kind":"Pod"}"#, &o, OnError::Refuse)
        .unwrap_err()
        .contains("AdmissionReview"));
    let svc = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Service"},"object":{"kind":"Service"}}}"#;
    let r = review(svc, &o, OnError::Refuse).unwrap();
    assert_eq!(r["response"], json!({"uid": "u1", "allowed": true}));
    // Nesting past the parser's depth is an error, not a crash.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let body = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"","kind":"Pod"}},"object":{deep}}}}}"#
    );
    assert!(review(body.as_bytes(), &o, OnError::Refuse).unwrap_err().contains("recursion limit"));
}

#[test]
fn a_refused_pod_is_denied_or_let_through_as_configured() {
    let pod = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","kind":{"group":"","version":"v1","kind":"Pod"},"namespace":"ml","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"hostNetwork":false,"containers":[{"name":"c","image":"i","resources":{"limits":{"nvidia.com/gpu":"8"}}}]}}}}"#;
    let o = Options::default();
    let denied = decide(pod, &o, OnError::Refuse).unwrap();
    assert_eq!(denied.reply["response"]["allowed"], json!(false));
    let msg = denied.reply["response"]["status"]["message"].as_str().unwrap();
    assert!(msg.contains("Pod/ml/p: spec.hostNetwork"), "{msg}");
    assert_eq!(
        (denied.verdict, denied.object.as_str(), denied.uid.as_str()),
        (Verdict::Refused, "ml/p", "u2")
    );
    assert_eq!(denied.reason.as_deref(), Some(msg));
    let allowed = decide(pod, &o, OnError::Allow).unwrap();
    assert_eq!(allowed.reply["response"]["allowed"], json!(true));
    assert!(allowed.reply["response"].get("patch").is_none());
    assert!(allowed.reply["response"]["warnings"][0].as_str().unwrap().contains("left unchanged"));
    assert_eq!(allowed.verdict, Verdict::Unchanged);
}

#[test]
fn a_pod_gets_the_commands_change_as_a_patch_of_what_was_added() {
    // A large container beside the GPU one: the patch does not copy it.
    let big = json!({"name": "logger", "image": "fluent", "args": ["x".repeat(1 << 20)]});
    let sent = pod(vec![big, gpu("trainer", 8)]);
    let (o, after) = run(&sent, "CREATE", OnError::Refuse);
    assert_eq!(o.verdict, Verdict::Patched, "{:?}", o.reason);
    assert!(o.reply.to_string().len() < 16 << 10, "reply of {} bytes", o.reply.to_string().len());
    let yaml = serde_norway::to_string(&sent).unwrap();
    let cli: Json = serde_norway::from_str(&transform(&yaml, &Options::default()).unwrap().0).unwrap();
    assert_eq!(after, cli);
}

#[test]
fn more_gpus_than_the_machine_has_are_refused_with_the_count_and_a_bounded_answer() {
    let (o, after) = run(&pod(vec![gpu("a", 8), gpu("b", 8)]), "CREATE", OnError::Refuse);
    assert_eq!(o.verdict, Verdict::Refused);
    let msg = o.reply["response"]["status"]["message"].as_str().unwrap();
    assert!(msg.contains("asks for 16 GPUs") && msg.contains("machine type a3-highgpu-8g has 8"), "{msg}");
    assert_eq!(after, pod(vec![gpu("a", 8), gpu("b", 8)]));

    // Thousands of GPU containers, the shape that once grew the answer
    // without bound: refused, and the answer stays small.
    // (Past some 2,700 such containers the Pod is refused for its size.)
    for (n, why) in [(1_800, "asks for 1800 GPUs"), (10_000, "more than 30000 JSON values")] {
        let many: Vec<Json> = (0..n).map(|i| gpu(&format!("c{i}"), 1)).collect();
        let o = decide(&review_of(&pod(many), "CREATE"), &Options::default(), OnError::Refuse).unwrap();
        assert_eq!(o.verdict, Verdict::Refused);
        let text = o.reply.to_string();
        assert!(text.len() < 2 * MAX_MESSAGE, "{n}: {} bytes", text.len());
        assert!(text.contains(why), "{text}");
    }
}

#[test]
fn a_pod_of_too_many_values_is_refused_unread_by_name() {
    // 4 MiB of empty objects: two thirds of a million values.
    let mut sent = pod(vec![gpu("a", 1)]);
    sent["metadata"]["annotations"] = json!({"x": vec![json!({}); 1_400_000]});
    let body = review_of(&sent, "CREATE");
    assert!(body.len() > 4 << 20);
    let o = decide(&body, &Options::default(), OnError::Refuse).unwrap();
    assert_eq!((o.verdict, o.object.as_str()), (Verdict::Refused, "ml/p"));
    let msg = o.reply["response"]["status"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("more than {MAX_VALUES} JSON values")), "{msg}");
    // Just under the bound: reviewed.
    let mut fits = pod(vec![gpu("a", 1)]);
    fits["metadata"]["annotations"] = json!({"x": vec![json!(0); MAX_VALUES - 100]});
    let o = decide(&review_of(&fits, "CREATE"), &Options::default(), OnError::Refuse).unwrap();
    assert_eq!(o.verdict, Verdict::Patched, "{:?}", o.reason);
    // Long names and messages are cut.
    let mut long = pod(vec![gpu("a", 1)]);
    long["metadata"]["name"] = json!("n".repeat(100_000));
    long["spec"]["hostNetwork"] = json!("y".repeat(100_000));
    let o = decide(&review_of(&long, "CREATE"), &Options::default(), OnError::Refuse).unwrap();
    assert!(o.reply.to_string().len() < 2 * MAX_MESSAGE + 200, "{}", o.reply);
    assert!(o.object.len() <= MAX_MESSAGE);
}

#[test]
fn an_update_or_a_delete_is_let_through_unchanged() {
    for op in ["UPDATE", "DELETE", "CONNECT"] {
        let (o, after) = run(&pod(vec![gpu("a", 8)]), op, OnError::Refuse);
        assert_eq!(o.verdict, Verdict::Unchanged);
        assert_eq!(o.operation, op);
        assert!(o.reply["response"].get("patch").is_none(), "{op}");
        assert_eq!(o.reply["response"]["allowed"], true);
        assert!(o.reason.unwrap().contains("only CREATE"));
        assert_eq!(after, pod(vec![gpu("a", 8)]));
    }
    // Even a Pod inject would refuse.
    let (o, _) = run(&pod(vec![gpu("a", 8), gpu("b", 8)]), "UPDATE", OnError::Refuse);
    assert_eq!(o.reply["response"]["allowed"], true);
}

/// A Pod with its own `securityContext`, `runtimeClassName` and a container
/// of the daemon's name, under a record its author wrote.
fn forged(record: &str, list: &str) -> Json {
    let mut p = pod(vec![gpu("trainer", 8)]);
    p["metadata"]["annotations"] = json!({ ANNOTATION: record });
    p["spec"]["securityContext"] = json!({"runAsNonRoot": true});
    p["spec"]["runtimeClassName"] = json!("gvisor");
    p["spec"]["hostNetwork"] = json!(true);
    let own = json!({"name": DAEMON, "image": "mine", "restartPolicy": "Always"});
    match list {
        "containers" => p["spec"]["containers"].as_array_mut().unwrap().push(own),
        _ => p["spec"][list] = json!([own]),
    }
    p
}

#[test]
fn a_forged_record_strips_nothing() {
    for record in [
        "version=0.1.0 mode=native-sidecar nccl=inline pod=securityContext,runtimeClassName",
        "version=0.1.0 mode=native-sidecar nccl=inline pod=hostPID:true",
        "version=0.1.0 mode=native-sidecar nccl=inline pod=hostNetwork",
        "version=0.1.0 mode=sidecar nccl=file",
        "garbage",
    ] {
        for list in ["initContainers", "containers"] {
            for on_error in [OnError::Refuse, OnError::Allow] {
                let sent = forged(record, list);
                let (o, after) = run(&sent, "CREATE", on_error);
                assert!(o.reply["response"].get("patch").is_none(), "{record} {list}: {}", o.reply);
                assert_eq!(after, sent);
                assert_ne!(o.verdict, Verdict::Patched);
            }
        }
    }
    // Why, in words.
    let (o, _) = run(
        &forged("version=0.1.0 mode=node nccl=file pod=hostPID:true", "containers"),
        "CREATE",
        OnError::Refuse,
    );
    assert!(o.reason.unwrap().contains(r#"names pod field "hostPID:true", which inject never sets"#));
    let (o, _) = run(
        &forged("version=0.1.0 mode=native-sidecar nccl=inline", "containers"),
        "CREATE",
        OnError::Refuse,
    );
    let why = o.reason.unwrap();
    assert!(
        why.contains("records a native-sidecar injection, but the Pod has no init container tcpx-daemon"),
        "{why}"
    );
    // Without a record, a container of the daemon's name is refused, not replaced.
    let mut own = forged("x", "initContainers");
    own["metadata"].as_object_mut().unwrap().remove("annotations");
    let (o, after) = run(&own, "CREATE", OnError::Refuse);
    assert_eq!(o.verdict, Verdict::Refused);
    let why = o.reason.unwrap();
    assert!(
        why.contains("a container of the name inject gives its daemon, which inject did not write"),
        "{why}"
    );
    assert_eq!(after, own);
}

#[test]
fn a_manifest_the_command_injected_is_left_as_it_is() {
    let plain = pod(vec![gpu("trainer", 8)]);
    let yaml = serde_norway::to_string(&plain).unwrap();
    for opts in [
        Options::default(),
        Options { mode: Mode::Sidecar, nccl: Nccl::File, ..Options::default() },
        Options { mode: Mode::Node, nccl: Nccl::ConfigMap, ..Options::default() },
    ] {
        let injected: Json = serde_norway::from_str(&transform(&yaml, &opts).unwrap().0).unwrap();
        let (o, after) = run(&injected, "CREATE", OnError::Refuse);
        assert_eq!(o.verdict, Verdict::Unchanged, "{:?}: {:?}", opts.mode, o.reason);
        assert!(o.reason.unwrap().starts_with("injected already (version="));
        assert_eq!(after, injected);
    }
    // And its own output, sent again (a Pod both webhooks match).
    let (first, once) = run(&plain, "CREATE", OnError::Refuse);
    assert_eq!(first.verdict, Verdict::Patched);
    let (again, twice) = run(&once, "CREATE", OnError::Refuse);
    assert_eq!(again.verdict, Verdict::Unchanged);
    assert_eq!(once, twice);
}
