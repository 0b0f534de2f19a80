//! What a pod template must be for inject to change it, checked before
//! anything is changed. Each refusal names the field, why inject cannot go
//! on, and what to do.

use std::collections::BTreeSet;

use serde_norway::Value;

use super::daemon::VOLUMES;
use super::lists::LISTS;
use super::migrate;
use super::{is_gpu, name_of, InjectError, Nccl, ANNOTATION, DAEMON};
use crate::nccl::env::{CONFIGMAP_NAME, UNIX_CLIENT_PREFIX};

/// Whether an `envFrom` entry is the ConfigMap `--nccl=configmap` adds.
pub fn is_our_configmap(e: &Value) -> bool {
    e.get("configMapRef").and_then(|r| r.get("name")).and_then(Value::as_str) == Some(CONFIGMAP_NAME)
}

/// An env entry's value for a message: quoted, or how it is set otherwise.
fn shown(v: Option<&str>) -> String {
    match v {
        Some(v) => format!("\"{v}\""),
        None => "a value not given inline (valueFrom)".into(),
    }
}

/// The pod as a whole: its lists, its container names (its network is
/// [`super::network`]'s).
pub fn pod(spec: &Value, object: &str, at: &str) -> Result<(), InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    for list in LISTS {
        if spec.get(list).is_some_and(|v| !v.is_sequence()) {
            return Err(err(format!("spec.{list}"), "not a list".into()));
        }
    }
    // Containers are told apart by name (record, converted daemon): two of one
    // name would change as one, a name no DNS label (a blank) breaks the record.
    let mut names = BTreeSet::new();
    for list in LISTS {
        for c in spec.get(list).and_then(Value::as_sequence).into_iter().flatten() {
            let n = name_of(c);
            let label = !n.is_empty()
                && n.len() <= 63
                && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !n.starts_with('-')
                && !n.ends_with('-');
            if !label {
                return Err(err(
                    format!("spec.{list}[{}]", n.escape_debug()),
                    "not a container name Kubernetes takes (lowercase letters, digits and '-', at most 63)"
                        .into(),
                ));
            }
            if !names.insert(n) {
                return Err(err(
                    format!("spec.{list}[{}]", name_of(c)),
                    "a second container of this name; container names must be unique in a Pod".into(),
                ));
            }
        }
    }
    Ok(())
}

/// The names inject gives its container and volumes, once any daemon it
/// converts is gone.
pub fn names_free(spec: &Value, object: &str, at: &str) -> Result<(), InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    for list in LISTS {
        let Some(c) = spec
            .get(list)
            .and_then(Value::as_sequence)
            .and_then(|cs| cs.iter().find(|c| name_of(c) == DAEMON))
        else {
            continue;
        };
        let image = c.get("image").and_then(Value::as_str).unwrap_or("none");
        return Err(err(
            format!("spec.{list}[{DAEMON}]"),
            format!(
                "a container of the name inject gives its daemon, which inject did not write (the \
                 template has no {ANNOTATION} record) and which runs neither tcpx-rxdm nor tcpgpudmarxd \
                 (image {image}). If it is a TCPX daemon you wrote, remove it and run inject again (it \
                 writes its own; pass your daemon's flags to inject), or run it from tcpx-rxdm's image \
                 or binary so that inject converts it; if it is something else, rename it"
            ),
        ));
    }
    if let Some(v) = spec
        .get("volumes")
        .and_then(Value::as_sequence)
        .and_then(|vs| vs.iter().find(|v| VOLUMES.contains(&name_of(v).as_str())))
    {
        return Err(err(
            format!("spec.volumes[{}]", name_of(v)),
            format!(
                "a volume of a name inject gives its own ({}); rename yours and its mounts",
                VOLUMES.join(", ")
            ),
        ));
    }
    Ok(())
}

/// What inject adds to the GPU containers, each `(name, value)`, the
/// folder `LD_LIBRARY_PATH` must hold (if any), and the mounts.
pub struct Adds<'a> {
    pub env: &'a [(String, String)],
    pub libraries: Option<&'a str>,
    pub uds: &'a str,
    pub mounts: &'a [Value],
    pub nccl: Nccl,
}

/// What inject would add to each GPU container that conflicts with what
/// it has. Returns what it has already (`container:VARIABLE`,
/// `container:envFrom`), which inject leaves and its record keeps.
pub fn gpu_containers(spec: &Value, adds: &Adds, object: &str, at: &str) -> Result<Vec<String>, InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    let mut kept = Vec::new();
    for list in LISTS {
        for c in spec.get(list).and_then(Value::as_sequence).into_iter().flatten().filter(|c| is_gpu(c)) {
            let cn = name_of(c);
            let field = |f: &str| format!("spec.{list}[{cn}].{f}");
            for e in c.get("env").and_then(Value::as_sequence).into_iter().flatten() {
                let n = e.get("name").and_then(Value::as_str).unwrap_or_default();
                let v = e.get("value").and_then(Value::as_str);
                if n == "LD_LIBRARY_PATH" {
                    match adds.libraries {
                        Some(l) if !v.is_some_and(|v| v.split(':').any(|p| p == l)) => {
                            return Err(err(
                                field("env[LD_LIBRARY_PATH]"),
                                format!("does not hold {l}; add it (the NCCL plugin is loaded from there)"),
                            ))
                        }
                        _ => kept.push(format!("{cn}:{n}")),
                    }
                    continue;
                }
                if let Some((_, want)) = adds.env.iter().find(|(o, _)| o == n) {
                    if v == Some(want.as_str()) {
                        kept.push(format!("{cn}:{n}"));
                        continue;
                    }
                    return Err(err(
                        field(&format!("env[{n}]")),
                        format!(
                            "{} conflicts with the NCCL setting inject adds, \"{want}\" (remove it, or use --nccl=file)",
                            shown(v)
                        ),
                    ));
                }
                if n == UNIX_CLIENT_PREFIX && v != Some(adds.uds) {
                    return Err(err(
                        field(&format!("env[{n}]")),
                        format!("{} is not the daemon's socket folder {}", shown(v), adds.uds),
                    ));
                }
            }
            if adds.nccl == Nccl::ConfigMap
                && c.get("envFrom")
                    .and_then(Value::as_sequence)
                    .is_some_and(|ef| ef.iter().any(is_our_configmap))
            {
                kept.push(format!("{cn}:envFrom"));
            }
            for m in c.get("volumeMounts").and_then(Value::as_sequence).into_iter().flatten() {
                let mn = name_of(m);
                // Undoing removes the GPU containers' mounts of these names.
                if VOLUMES.contains(&mn.as_str()) {
                    return Err(err(
                        field(&format!("volumeMounts[{mn}]")),
                        "a mount of a volume inject adds; rename the mount and its volume".into(),
                    ));
                }
                let path = m.get("mountPath").and_then(Value::as_str).unwrap_or_default();
                if let Some(ours) =
                    adds.mounts.iter().find(|x| x.get("mountPath").and_then(Value::as_str) == Some(path))
                {
                    return Err(err(
                        field(&format!("volumeMounts[{mn}]")),
                        taken_path(spec, &cn, &mn, path, ours),
                    ));
                }
            }
        }
    }
    Ok(kept)
}

/// Why a GPU container's mount at a path inject mounts its own volume is
/// refused, and what to do: for the socket folder, most often a daemon of
/// the user's own serves it (named where another container mounts it).
fn taken_path(spec: &Value, container: &str, volume: &str, path: &str, ours: &Value) -> String {
    let what = match name_of(ours).as_str() {
        "tcpx-socket" => "the daemon's socket folder",
        "tcpx-libraries" => "the NVIDIA libraries and the NCCL plugin",
        _ => "the daemon's health log",
    };
    let others: Vec<String> = LISTS
        .iter()
        .filter_map(|l| spec.get(*l)?.as_sequence())
        .flatten()
        .filter(|c| name_of(c) != container)
        .filter(|c| {
            c.get("volumeMounts")
                .and_then(Value::as_sequence)
                .is_some_and(|ms| ms.iter().any(|m| name_of(m) == volume))
        })
        .map(|c| match migrate::kind(c) {
            Some(_) => name_of(c),
            None => {
                format!("{} (image {})", name_of(c), c.get("image").and_then(Value::as_str).unwrap_or("none"))
            }
        })
        .collect();
    let shared = match &others[..] {
        [] => String::new(),
        [one] => format!("; container {one} mounts {volume} too"),
        more => format!("; containers {} mount {volume} too", more.join(", ")),
    };
    format!(
        "volume {volume} is mounted at {path}, where inject mounts {what} (its volume {}){shared}. If a \
         TCPX daemon you wrote serves that folder, remove its container, this mount and the volume, and \
         run inject again (it adds its own daemon; pass your daemon's flags to inject); otherwise mount \
         {volume} elsewhere{}",
        name_of(ours),
        if name_of(ours) == "tcpx-socket" {
            ", or give the daemon another folder with --uds_path=DIR"
        } else {
            ""
        }
    )
}
