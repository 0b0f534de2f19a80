//! The admission side of `inject serve`: an `admission.k8s.io/v1`
//! `AdmissionReview` for a Pod in, the review's response out, with the same
//! change as `tcpx-rxdm inject` as a JSONPatch. Pure: no I/O.
//!
//! What it does, by what the API server sends:
//! - not a Pod, or not `CREATE`: allowed unchanged (an update of a running
//!   Pod is never rewritten);
//! - a Pod of more than [`MAX_VALUES`] JSON values: refused unread, so that
//!   no body builds more than a bounded document (the body alone does not
//!   bound it: 4 MiB of `[0,0,…]` is two million values, 150 MB parsed);
//! - a Pod without inject's record: inject, as the command does on a fresh
//!   manifest; a container or volume of inject's names is refused, never
//!   replaced;
//! - a Pod with a record: left as it is. The record is the Pod author's to
//!   write (a manifest `tcpx-rxdm inject` wrote, or a forgery), so it is
//!   never undone here; it is only checked to describe what the Pod holds.
//!
//! Messages and names in the answer are cut short: the answer's size
//! follows the change inject makes, not what was sent.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::json;
use serde_norway::Value;

mod encoding;
pub use encoding::{base64, base64_decode};

use super::record::{self, Record};
use super::template;
use super::{limits, name_of, object_name, patch, InjectError, Mode, Options, ANNOTATION, DAEMON};

/// What a Pod that inject refuses gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// `allowed: false` with the reason: the Pod is not created.
    Refuse,
    /// `allowed: true`, unchanged, the reason as a warning to the client.
    Allow,
}

/// JSON values (and keys) a reviewed Pod may hold. A Pod as people write
/// them holds a few hundred (the one in tests/inject/admission-review.json:
/// 130). Parsed, each costs up to ~150 bytes beside its text: with the
/// body's 4 MiB of text, a review's two documents (the Pod sent and the
/// Pod injected) stay under ~17 MB whatever the body holds.
pub const MAX_VALUES: usize = 30_000;

/// Longest message (or name) put in an answer or a log line, in bytes.
pub const MAX_MESSAGE: usize = 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review<O> {
    api_version: String,
    kind: String,
    request: Option<Request<O>>,
}

#[derive(Deserialize)]
struct Request<O> {
    uid: String,
    kind: Option<Kind>,
    operation: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    object: Option<O>,
}

#[derive(Deserialize)]
struct Kind {
    #[serde(default)]
    group: String,
    kind: String,
}

/// An object's name only, the rest skipped unread.
#[derive(Deserialize)]
struct Named {
    metadata: Option<Meta>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    generate_name: Option<String>,
}

/// An object whose JSON values (keys included) were counted while it was
/// skipped: nothing of it is kept, and counting stops with an error past
/// [`MAX_VALUES`].
struct Counted;

/// The error that stops counting.
const TOO_MANY: &str = "more JSON values in the object than a review may hold";

struct Count<'a>(&'a Cell<usize>);

impl Count<'_> {
    fn one<E: serde::de::Error>(&self) -> Result<(), E> {
        self.0.set(self.0.get() + 1);
        if self.0.get() > MAX_VALUES {
            return Err(E::custom(TOO_MANY));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.one()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.one()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.one()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.one()
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.one()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.one()
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.one()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(Count(self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key_seed(Count(self.0))?.is_some() {
            map.next_value_seed(Count(self.0))?;
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for Counted {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Counted, D::Error> {
        d.deserialize_any(Count(&Cell::new(0)))?;
        Ok(Counted)
    }
}

/// What became of a review, for the answer and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed with a patch.
    Patched,
    /// Allowed as it is (with a warning where inject refused it and
    /// `--on-error=allow`).
    Unchanged,
    /// Not allowed.
    Refused,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Verdict::Patched => "patched",
            Verdict::Unchanged => "unchanged",
            Verdict::Refused => "refused",
        })
    }
}

/// A review decided: the answer and what a log line says of it.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The `AdmissionReview` to send back.
    pub reply: serde_json::Value,
    pub uid: String,
    /// `namespace/name` (`generateName` where the name is not chosen yet).
    pub object: String,
    pub operation: String,
    pub verdict: Verdict,
    /// Why it was refused, or left unchanged.
    pub reason: Option<String>,
}

/// `text` cut to at most `max` bytes (on a character boundary), marked.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max.saturating_sub(3);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// The response review for `body`, or why the body is no review (a 400).
pub fn review(body: &[u8], opts: &Options, on_error: OnError) -> Result<serde_json::Value, String> {
    decide(body, opts, on_error).map(|o| o.reply)
}

/// [`review`], with what the log says of it.
pub fn decide(body: &[u8], opts: &Options, on_error: OnError) -> Result<Outcome, String> {
    decide_from(Cow::Borrowed(body), opts, on_error)
}

/// [`decide`] on a body it owns, which it frees once the Pod is read
/// from it: a review holds the body or the Pod, not both.
pub fn decide_owned(body: Vec<u8>, opts: &Options, on_error: OnError) -> Result<Outcome, String> {
    decide_from(Cow::Owned(body), opts, on_error)
}

fn parse<'a, O: Deserialize<'a>>(body: &'a [u8]) -> Result<Request<O>, String> {
    let r: Review<O> = serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    if r.api_version != "admission.k8s.io/v1" || r.kind != "AdmissionReview" {
        return Err(format!(
            "expected admission.k8s.io/v1 AdmissionReview, got {} {}",
            clip(&r.api_version, 100),
            clip(&r.kind, 100)
        ));
    }
    r.request.ok_or_else(|| "AdmissionReview without a request".to_string())
}

/// What the first look at a review tells.
struct Head {
    uid: String,
    is_pod: bool,
    operation: String,
    namespace: Option<String>,
    /// The object's name where known without reading it whole.
    name: Option<String>,
    /// Whether there is an object, and whether it holds too many values.
    object: Option<bool>,
}

impl<O> Request<O> {
    fn head(&self, name: Option<String>, too_many: bool) -> Head {
        Head {
            uid: self.uid.clone(),
            is_pod: self.kind.as_ref().is_some_and(|k| k.group.is_empty() && k.kind == "Pod"),
            operation: self.operation.clone().unwrap_or_else(|| "CREATE".into()),
            namespace: self.namespace.clone(),
            name: name.or_else(|| self.name.clone()).filter(|n| !n.is_empty()),
            object: self.object.as_ref().map(|_| too_many),
        }
    }
}

/// The request with its object counted (not kept); a second, skipping
/// look for its name where it holds too many values.
fn first_look(body: &[u8]) -> Result<Head, String> {
    let named = || -> Result<(Request<Named>, Option<String>), String> {
        let req: Request<Named> = parse(body)?;
        let meta = req.object.as_ref().and_then(|o| o.metadata.as_ref());
        let name = meta.and_then(|m| m.name.clone().or_else(|| m.generate_name.clone()));
        Ok((req, name))
    };
    match parse::<Counted>(body) {
        Ok(req) => {
            let head = req.head(None, false);
            // A Pod that is not read whole below is named from a look at
            // its metadata, where the request does not name it.
            if head.name.is_none() && head.object.is_some() && !(head.is_pod && head.operation == "CREATE") {
                return Ok(req.head(named()?.1, false));
            }
            Ok(head)
        }
        Err(e) if e.contains(TOO_MANY) => {
            let (req, name) = named()?;
            Ok(req.head(name, true))
        }
        Err(e) => Err(e),
    }
}

fn decide_from(body: Cow<'_, [u8]>, opts: &Options, on_error: OnError) -> Result<Outcome, String> {
    let head = first_look(&body)?;
    let ns = head.namespace.clone().unwrap_or_default();
    let named = |name: &str| clip(&format!("{ns}/{name}"), MAX_MESSAGE);
    let mut out = Outcome {
        reply: serde_json::Value::Null,
        uid: head.uid.clone(),
        object: named(head.name.as_deref().unwrap_or("(no name)")),
        operation: head.operation.clone(),
        verdict: Verdict::Unchanged,
        reason: None,
    };
    let mut response = json!({ "uid": head.uid, "allowed": true });
    let change = match head.object {
        _ if !head.is_pod => Ok(Change::Unchanged("not a Pod".into())),
        _ if head.operation != "CREATE" => {
            Ok(Change::Unchanged(format!("{}: only CREATE is reviewed", clip(&head.operation, 100))))
        }
        None => Ok(Change::Unchanged("no object".into())),
        Some(true) => Err(InjectError::Object {
            object: format!("Pod/{}", out.object),
            why: format!("more than {MAX_VALUES} JSON values; the webhook reviews no larger Pod"),
        }),
        Some(false) => {
            // A second look, now that its size is known: the object itself.
            let full: Request<Value> = parse(&body)?;
            drop(body);
            let mut pod = full.object.unwrap_or_default();
            let mut name = object_name(&pod);
            if let (Some(ns), false) = (&full.namespace, name.matches('/').count() == 2) {
                name = name.replacen('/', &format!("/{ns}/"), 1);
            }
            let name = clip(&name, MAX_MESSAGE);
            out.object = name.split_once('/').map(|(_, n)| n.to_string()).unwrap_or_default();
            change_pod(&mut pod, opts, &name)
        }
    };
    match change {
        Ok(Change::Patch(ops)) => {
            response["patchType"] = json!("JSONPatch");
            response["patch"] =
                json!(base64(serde_json::to_string(&ops).map_err(|e| e.to_string())?.as_bytes()));
            out.verdict = Verdict::Patched;
        }
        Ok(Change::Unchanged(why)) => out.reason = Some(why),
        Err(e) => {
            let why = clip(&format!("tcpx-rxdm inject: {e}"), MAX_MESSAGE);
            match on_error {
                OnError::Refuse => {
                    response["allowed"] = json!(false);
                    response["status"] = json!({ "code": 422, "message": why });
                    out.verdict = Verdict::Refused;
                }
                OnError::Allow => {
                    response["warnings"] = json!([format!("{why}; Pod left unchanged")]);
                }
            }
            out.reason = Some(why);
        }
    }
    out.reply =
        json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response });
    Ok(out)
}

enum Change {
    Patch(Vec<serde_json::Value>),
    Unchanged(String),
}

/// What happens to a Pod being created.
fn change_pod(pod: &mut Value, opts: &Options, name: &str) -> Result<Change, InjectError> {
    if !pod.is_mapping() {
        return Err(InjectError::Object { object: name.into(), why: "not a Pod (a mapping)".into() });
    }
    let annotation = || format!("metadata.annotations[{ANNOTATION}]");
    match record::record(pod) {
        None => {
            let before = pod.clone();
            match template::inject(pod, opts, name, "", &[])? {
                Some(_) if *pod != before => {}
                done => {
                    let why = done.map_or_else(|| "no GPU container".into(), |d| d.summary);
                    return Ok(Change::Unchanged(why));
                }
            }
            let ops = patch::diff(&before, pod).map_err(|e| InjectError::Object {
                object: name.into(),
                why: format!("the patch cannot be written: {e}"),
            })?;
            Ok(Change::Patch(ops))
        }
        Some(Err(why)) => {
            Err(InjectError::field(name, annotation(), format!("{why}; not a record this version reads")))
        }
        Some(Ok(rec)) => {
            if let Some(spec) = pod.get("spec").filter(|s| s.is_mapping()) {
                limits::check(spec, &opts.machine, name, "")?;
            }
            holds(pod, &rec).map_err(|why| {
                InjectError::field(
                    name,
                    annotation(),
                    format!(
                        "records a {} injection, but {why}; the annotation is inject's record of what it \
                         added: remove it and the webhook injects the Pod",
                        rec.mode.name()
                    ),
                )
            })?;
            Ok(Change::Unchanged(format!("injected already ({})", clip(&rec.text(), 200))))
        }
    }
}

/// Whether a Pod holds what its record says was added: the daemon
/// container where the mode has one, and the socket volume.
fn holds(pod: &Value, rec: &Record) -> Result<(), String> {
    let spec = pod.get("spec");
    let named = |list: &str, want: &str| {
        spec.and_then(|s| s.get(list))
            .and_then(Value::as_sequence)
            .is_some_and(|l| l.iter().any(|c| name_of(c) == want))
    };
    match rec.mode {
        Mode::NativeSidecar if !named("initContainers", DAEMON) => {
            Err(format!("the Pod has no init container {DAEMON}"))
        }
        Mode::Sidecar if !named("containers", DAEMON) => Err(format!("the Pod has no container {DAEMON}")),
        _ if !named("volumes", "tcpx-socket") => Err("the Pod has no volume tcpx-socket".into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
