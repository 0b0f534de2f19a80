//! The admission side of `inject serve`: an `admission.k8s.io/v1`
//! `AdmissionReview` for a Pod in, the review's response out, with the same
//! change as `tcpx-rxdm inject` as a JSONPatch. Pure: no I/O.

use serde::Deserialize;
use serde_json::json;
use serde_norway::Value;

use super::{object_name, template, Options};

/// What a Pod that inject refuses gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// `allowed: false` with the reason: the Pod is not created.
    Refuse,
    /// `allowed: true`, unchanged, the reason as a warning to the client.
    Allow,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: String,
    kind: String,
    request: Option<Request>,
}

#[derive(Deserialize)]
struct Request {
    uid: String,
    kind: Option<Kind>,
    object: Option<Value>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct Kind {
    #[serde(default)]
    group: String,
    kind: String,
}

/// The response review for `body`, or why the body is no review (a 400).
pub fn review(body: &[u8], opts: &Options, on_error: OnError) -> Result<serde_json::Value, String> {
    let r: Review = serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    if r.api_version != "admission.k8s.io/v1" || r.kind != "AdmissionReview" {
        return Err(format!(
            "expected admission.k8s.io/v1 AdmissionReview, got {} {}",
            r.api_version, r.kind
        ));
    }
    let req = r.request.ok_or("AdmissionReview without a request")?;
    let mut response = json!({ "uid": req.uid, "allowed": true });
    let is_pod = req.kind.as_ref().is_some_and(|k| k.group.is_empty() && k.kind == "Pod");
    if let (true, Some(mut pod)) = (is_pod, req.object) {
        let before = pod.clone();
        let mut name = object_name(&pod);
        if let (Some(ns), false) = (&req.namespace, name.matches('/').count() == 2) {
            name = name.replacen('/', &format!("/{ns}/"), 1);
        }
        match template::apply(&mut pod, opts, &name, "") {
            Ok(_) if pod == before => {}
            Ok(_) => {
                let patch = patch(&before, &pod).map_err(|e| format!("patch: {e}"))?;
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(base64(patch.to_string().as_bytes()));
            }
            Err(e) => match on_error {
                OnError::Refuse => {
                    response["allowed"] = json!(false);
                    response["status"] = json!({ "code": 422, "message": format!("tcpx-rxdm inject: {e}") });
                }
                OnError::Allow => {
                    response["warnings"] = json!([format!("tcpx-rxdm inject: {e}; Pod left unchanged")]);
                }
            },
        }
    }
    Ok(json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response }))
}

/// Replaces the two parts inject changes: the spec and the annotations.
fn patch(before: &Value, after: &Value) -> Result<serde_json::Value, serde_json::Error> {
    let mut ops =
        vec![json!({ "op": "replace", "path": "/spec", "value": serde_json::to_value(&after["spec"])? })];
    let ann = |v: &Value| v.get("metadata").and_then(|m| m.get("annotations")).cloned();
    match (ann(before), ann(after)) {
        (b, a) if b == a => {}
        (None, Some(a)) => ops.push(
            json!({ "op": "add", "path": "/metadata/annotations", "value": serde_json::to_value(&a)? }),
        ),
        (Some(_), Some(a)) => ops.push(
            json!({ "op": "replace", "path": "/metadata/annotations", "value": serde_json::to_value(&a)? }),
        ),
        (Some(_), None) => ops.push(json!({ "op": "remove", "path": "/metadata/annotations" })),
        (None, None) => {}
    }
    Ok(serde_json::Value::Array(ops))
}

/// Standard base64 with padding (the review's `patch` field).
pub fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn a_refused_pod_is_denied_or_let_through_as_configured() {
        let pod = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","kind":{"group":"","version":"v1","kind":"Pod"},"namespace":"ml","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"hostNetwork":false,"containers":[{"name":"c","image":"i","resources":{"limits":{"nvidia.com/gpu":"8"}}}]}}}}"#;
        let o = Options::default();
        let denied = review(pod, &o, OnError::Refuse).unwrap();
        assert_eq!(denied["response"]["allowed"], json!(false));
        let msg = denied["response"]["status"]["message"].as_str().unwrap();
        assert!(msg.contains("Pod/ml/p: spec.hostNetwork"), "{msg}");
        let allowed = review(pod, &o, OnError::Allow).unwrap();
        assert_eq!(allowed["response"]["allowed"], json!(true));
        assert!(allowed["response"].get("patch").is_none());
        assert!(allowed["response"]["warnings"][0].as_str().unwrap().contains("left unchanged"));
    }
}
