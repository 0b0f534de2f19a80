//! Undoing a recorded injection: what inject added goes, each pod-level
//! field only while it holds the value inject gave it ([`super::record`]),
//! and a daemon the injection converted comes back ([`super::restore`]).

use serde_norway::Value;

use super::checks::is_our_configmap;
use super::daemon::DaemonFlags;
use super::daemon::{s, VOLUMES};
use super::lists::LISTS;
use super::lists::{drop_empty, retain_list};
use super::record::{set_value, Record};
use super::restore::{self, SAVED};
use super::{is_gpu, machine, name_of, InjectError, Nccl, Options, ANNOTATION, DAEMON};

/// The variables that `Nccl::Inline` adds (the generator's, for the default machine).
fn inline_names() -> Vec<String> {
    let flags = DaemonFlags::new(&Options::default(), &[]).expect("the default flags parse");
    machine::nccl_env(machine::DEFAULT, &flags.parsed)
        .map(|e| e.vars.into_iter().map(|v| v.name).collect())
        .unwrap_or_default()
}

fn env_names(nccl: Nccl) -> Vec<String> {
    let mut n = vec!["LD_LIBRARY_PATH".to_string()];
    if nccl == Nccl::Inline {
        n.extend(inline_names());
    }
    n
}

/// What became of a daemon the injection had converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Converted {
    /// None was converted.
    None,
    /// Given back: the report's words for it.
    Restored(String),
    /// Written by an inject that did not keep one: whether there was one is unknown.
    Unknown,
}

/// Undoes the recorded change; `object` and `at` name the annotation when
/// the converted daemon it keeps cannot be given back (nothing is changed then).
pub fn remove(tpl: &mut Value, rec: &Record, object: &str, at: &str) -> Result<Converted, InjectError> {
    let saved = tpl
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(SAVED))
        .map(|v| v.as_str().map(String::from).ok_or_else(|| "not a text".to_string()));
    let bad = |why: String| {
        InjectError::field(
            object,
            format!("{at}metadata.annotations[{SAVED}]"),
            format!(
                "the daemon this injection converted cannot be given back: {why}. Put it back by hand, \
                 then remove this annotation and run inject again"
            ),
        )
    };
    let saved = match (rec.converted, saved) {
        (Some(true), None) => return Err(bad("the annotation is missing".into())),
        (Some(true), Some(t)) => Some(t.map_err(bad)?),
        _ => None,
    };
    let names = env_names(rec.nccl);
    let Some(spec) = tpl.get_mut("spec").filter(|s| s.is_mapping()) else { return Ok(Converted::None) };
    let mut undone = spec.clone();
    for list in LISTS {
        retain_list(&mut undone, list, |c| name_of(c) != DAEMON);
        if let Some(cs) = undone.get_mut(list).and_then(Value::as_sequence_mut) {
            for c in cs.iter_mut().filter(|c| is_gpu(c)) {
                let cn = name_of(c);
                let kept = |what: &str| rec.kept.contains(&format!("{cn}:{what}"));
                retain_list(c, "env", |e| {
                    let n = e.get("name").and_then(Value::as_str).unwrap_or_default();
                    !names.iter().any(|x| x == n) || kept(n)
                });
                if rec.nccl == Nccl::ConfigMap && !kept("envFrom") {
                    retain_list(c, "envFrom", |e| !is_our_configmap(e));
                }
                retain_list(c, "volumeMounts", |m| !VOLUMES.contains(&name_of(m).as_str()));
            }
        }
    }
    retain_list(&mut undone, "volumes", |v| !VOLUMES.contains(&name_of(v).as_str()));
    // Each field goes (or gets its old value back) only while it holds the
    // value inject gave it: one changed since is the author's.
    let m = undone.as_mapping_mut().expect("a mapping");
    for f in rec.pod.iter().filter(|f| *f != "devices") {
        let (k, was) = f.split_once(':').map_or((f.as_str(), None), |(k, w)| (k, Some(w)));
        let Some(given) = set_value(k) else { continue };
        if m.get(k) != Some(&given) {
            continue;
        }
        match was {
            Some(was) => m.insert(s(k), s(was)),
            None => m.remove(k),
        };
    }
    let converted = match (&saved, rec.converted) {
        (Some(text), _) => Converted::Restored(restore::restore(&mut undone, text).map_err(bad)?),
        (None, None) => Converted::Unknown,
        (None, Some(_)) => Converted::None,
    };
    *spec = undone;
    if let Some(meta) = tpl.get_mut("metadata").filter(|m| m.is_mapping()) {
        if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_mapping_mut) {
            ann.remove(ANNOTATION);
            if saved.is_some() {
                ann.remove(SAVED);
            }
            let (k, v) = super::devices::device_annotation();
            if rec.pod.iter().any(|f| f == "devices") && ann.get(k.as_str()) == Some(&s(&v)) {
                ann.remove(k.as_str());
            }
        }
        drop_empty(meta, "annotations");
        drop_empty(tpl, "metadata");
    }
    Ok(converted)
}
