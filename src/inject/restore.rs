//! A converted daemon ([`super::migrate`]) taken out of a template, and put
//! back. What converting removes (the container, the volumes only it used,
//! the GPU containers' mounts of them) is kept, with where each was, as
//! JSON in the annotation [`SAVED`], beside inject's record; `--uninject`
//! puts each back where it was. The annotation is the manifest author's to
//! write, so it is read strictly: it may give back only a TCPX daemon, and
//! nothing that would clash with what the template holds.

use serde::{Deserialize, Serialize};
use serde_norway::Value;

use super::lists::seq_mut;
use super::migrate::{self, Reference};
use super::{is_gpu, name_of};

/// The annotation that keeps a converted daemon for `--uninject`.
pub const SAVED: &str = "tcpx-rxdm.io/converted";

/// What converting removed, each with its place.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    list: String,
    index: usize,
    container: Value,
    /// `(index, volume)` in the Pod's volumes.
    volumes: Vec<(usize, Value)>,
    /// `(container, index, mount)` in that container's mounts.
    mounts: Vec<(String, usize, Value)>,
}

const LISTS: [&str; 2] = ["initContainers", "containers"];

/// Removes the daemon, the volumes it mounted from the GPU containers'
/// mounts, and those volumes where no other container mounts them. Returns
/// a line for the report and the text for [`SAVED`].
pub fn remove(spec: &mut Value, r: &Reference) -> Result<(String, String), String> {
    let mut saved =
        Saved { list: r.list.clone(), index: 0, container: Value::Null, volumes: vec![], mounts: vec![] };
    if let Some(cs) = spec.get_mut(&r.list).and_then(Value::as_sequence_mut) {
        if let Some(i) = cs.iter().position(|c| name_of(c) == r.name) {
            (saved.index, saved.container) = (i, cs.remove(i));
        }
    }
    // The volume of a job-end file its script waited for stays: the
    // workload creates the file there, and inject's daemon watches it.
    let kept = r.script.as_ref().and_then(|s| s.wait.as_ref()).map(|(_, m)| name_of(m));
    let gone: Vec<String> = saved
        .container
        .get("volumeMounts")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .map(name_of)
        .filter(|v| Some(v) != kept.as_ref())
        .collect();
    let mut still_used = Vec::new();
    for list in LISTS {
        for c in spec.get_mut(list).and_then(Value::as_sequence_mut).into_iter().flatten() {
            let (gpu, cn) = (is_gpu(c), name_of(c));
            if let Some(ms) = c.get_mut("volumeMounts").and_then(Value::as_sequence_mut) {
                if gpu {
                    for (i, m) in std::mem::take(ms).into_iter().enumerate() {
                        if gone.contains(&name_of(&m)) {
                            saved.mounts.push((cn.clone(), i, m));
                        } else {
                            ms.push(m);
                        }
                    }
                }
                still_used.extend(ms.iter().map(name_of));
            }
            if c.get("volumeMounts").and_then(Value::as_sequence).is_some_and(Vec::is_empty) {
                c.as_mapping_mut().map(|m| m.remove("volumeMounts"));
            }
        }
    }
    let removed: Vec<String> = gone.iter().filter(|v| !still_used.contains(v)).cloned().collect();
    if let Some(vs) = spec.get_mut("volumes").and_then(Value::as_sequence_mut) {
        for (i, v) in std::mem::take(vs).into_iter().enumerate() {
            if removed.contains(&name_of(&v)) {
                saved.volumes.push((i, v));
            } else {
                vs.push(v);
            }
        }
    }
    // Lists left empty go, as `--uninject` would drop them: a second run
    // then finds the template as the first left it.
    for key in ["volumes", "initContainers"] {
        if spec.get(key).and_then(Value::as_sequence).is_some_and(Vec::is_empty) {
            spec.as_mapping_mut().map(|m| m.remove(key));
        }
    }
    let text =
        serde_json::to_string(&saved).map_err(|e| format!("it cannot be kept for --uninject ({e})"))?;
    let flags = match (&r.carried[..], &r.dropped[..]) {
        ([], []) => "no flags".to_string(),
        (c, []) => format!("flags carried: {}", c.join(" ")),
        (c, d) => format!(
            "flags carried: {}; left to inject's --mode: {}",
            if c.is_empty() { "none".to_string() } else { c.join(" ") },
            d.join(" ")
        ),
    };
    let started = match &r.script {
        Some(s) => format!(", started by a {} -c script", s.shell),
        None => String::new(),
    };
    let line = format!(
        "converted {} {}{started} ({flags}; volumes removed: {}; --uninject brings it back)",
        r.kind.describe(),
        r.name,
        if removed.is_empty() { "none".to_string() } else { removed.join(", ") }
    );
    Ok((line, text))
}

fn insert_at(items: &mut Vec<Value>, i: usize, v: Value) {
    items.insert(i.min(items.len()), v);
}

/// Puts back what [`remove`] took (its [`SAVED`] text). Returns the report's
/// words for it, or why it cannot be (nothing changed then).
pub fn restore(spec: &mut Value, text: &str) -> Result<String, String> {
    let saved: Saved =
        serde_json::from_str(text).map_err(|e| format!("not what inject writes there ({e})"))?;
    let name = name_of(&saved.container);
    let Some(kind) = migrate::kind(&saved.container).filter(|_| LISTS.contains(&saved.list.as_str())) else {
        return Err("it holds no TCPX daemon container to give back".into());
    };
    // Check everything first: all of it goes back, or none.
    let containers = |spec: &Value| -> Vec<String> {
        LISTS.iter().filter_map(|l| spec.get(*l)?.as_sequence()).flatten().map(name_of).collect()
    };
    if containers(spec).contains(&name) {
        return Err(format!("the template has a container {name} again"));
    }
    let volumes: Vec<String> =
        spec.get("volumes").and_then(Value::as_sequence).into_iter().flatten().map(name_of).collect();
    if let Some((_, v)) = saved.volumes.iter().find(|(_, v)| volumes.contains(&name_of(v))) {
        return Err(format!("the template has a volume {} again", name_of(v)));
    }
    for (cn, _, m) in &saved.mounts {
        let c = LISTS
            .iter()
            .filter_map(|l| spec.get(*l)?.as_sequence())
            .flatten()
            .find(|c| name_of(c) == *cn)
            .ok_or_else(|| format!("its mount {} was in container {cn}, which is gone", name_of(m)))?;
        let at = m.get("mountPath");
        if c.get("volumeMounts")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .any(|x| x.get("mountPath") == at)
        {
            let at = at.and_then(Value::as_str).unwrap_or("its path");
            return Err(format!("container {cn} mounts something at {at} again"));
        }
    }
    insert_at(seq_mut(spec, &saved.list), saved.index, saved.container);
    for (i, v) in saved.volumes {
        insert_at(seq_mut(spec, "volumes"), i, v);
    }
    for (cn, i, m) in saved.mounts {
        for list in LISTS {
            for c in spec.get_mut(list).and_then(Value::as_sequence_mut).into_iter().flatten() {
                if name_of(c) == cn {
                    insert_at(seq_mut(c, "volumeMounts"), i, m.clone());
                }
            }
        }
    }
    Ok(format!("{} {name} restored", kind.describe()))
}
