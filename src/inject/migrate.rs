//! A pod template that already runs the reference daemon (`tcpgpudmarxd`,
//! by image or binary path): its flags that mean the same here are carried
//! over to the injected daemon, and the container and the volumes only it
//! used are removed, so that a Pod never runs two daemons. Any other flag
//! is refused with the container's name: converting it is a human's call.

use serde_norway::Value;

use super::{is_gpu, name_of, InjectError};

/// Flags of the reference that mean the same for the injected daemon.
const CARRIED: [&str; 7] = [
    "gpu_nic_preset",
    "gpu_shmem_type",
    "uds_path",
    "setup_param",
    "rx_pool_size",
    "max_rx_rules",
    "num_hops",
];

/// The reference daemon found in a template.
#[derive(Debug, Clone)]
pub struct Reference {
    pub list: String,
    pub name: String,
    /// Its flags, as `--name=value` words.
    pub carried: Vec<String>,
}

/// The words of a `command` or `args` list; a number or boolean as its YAML
/// text (Kubernetes would refuse it, but it is shown as written).
fn strings(v: Option<&Value>) -> Vec<String> {
    let word = |x: &Value| match x {
        Value::String(s) => s.clone(),
        other => serde_norway::to_string(other).map(|t| t.trim_end().to_string()).unwrap_or_default(),
    };
    v.and_then(Value::as_sequence).map(|s| s.iter().map(word).collect()).unwrap_or_default()
}

fn is_reference(c: &Value) -> bool {
    let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
    let first =
        strings(c.get("command")).into_iter().chain(strings(c.get("args"))).next().unwrap_or_default();
    image.contains("tcpgpudmarxd") || first.rsplit('/').next() == Some("tcpgpudmarxd")
}

/// `\"--verbose 128 2 0 \"` (quotes kept literally, as the guide writes it) → `--verbose 128 2 0`.
fn unquote(v: &str) -> String {
    v.trim_matches(|c: char| c == '\\' || c == '"' || c == '\'' || c.is_whitespace()).to_string()
}

/// The flags of inject's own daemon container in `spec` among those a
/// conversion carries (`CARRIED`), as `--name=value` words. Injecting a
/// template again first undoes the earlier injection, which removed the
/// reference daemon long ago: these keep what was carried from it (and any
/// such flag set since), so that injecting twice changes nothing. Values
/// inject writes anyway are left out, so a new mode's own defaults apply.
pub fn own_carried(spec: &Value) -> Vec<String> {
    let own = ["initContainers", "containers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_sequence))
        .flatten()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(super::DAEMON));
    let Some(c) = own else { return Vec::new() };
    let mut argv: Vec<String> = strings(c.get("command"));
    argv.extend(strings(c.get("args")));
    let mut kept = Vec::new();
    let mut it = argv.into_iter().skip_while(|w| !w.starts_with('-'));
    while let Some(w) = it.next() {
        let Some(flag) = w.strip_prefix("--") else { continue };
        let (n, v) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            // A flag of its own (`--nomonitor_shutdown`) takes no value.
            None if CARRIED.contains(&flag) => (flag.to_string(), it.next().unwrap_or_default()),
            None => continue,
        };
        let v = if n == "setup_param" { unquote(&v) } else { v };
        if CARRIED.contains(&n.as_str()) && !super::daemon::is_default(&n, &v) {
            kept.push(format!("--{n}={v}"));
        }
    }
    kept
}

/// Finds the reference daemon; refuses two, or flags without an equivalent.
pub fn find(spec: &Value, object: &str, at: &str) -> Result<Option<Reference>, InjectError> {
    let mut found: Vec<(&str, &Value)> = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in spec.get(list).and_then(Value::as_sequence).into_iter().flatten() {
            if is_reference(c) {
                found.push((list, c));
            }
        }
    }
    let Some((list, c)) = found.first().copied() else { return Ok(None) };
    let name = name_of(c);
    let field = |f: &str| format!("{at}spec.{list}[{name}].{f}");
    if let Some((l2, c2)) = found.get(1) {
        return Err(InjectError::field(
            object,
            format!("{at}spec.{l2}[{}]", name_of(c2)),
            format!("a second reference daemon (besides {name}); convert this Pod by hand"),
        ));
    }
    if is_gpu(c) {
        return Err(InjectError::field(
            object,
            field("resources"),
            "a reference daemon that requests GPUs; convert it by hand",
        ));
    }
    let mut argv: Vec<String> = strings(c.get("command"));
    argv.extend(strings(c.get("args")));
    if argv.first().is_some_and(|a| !a.starts_with('-')) {
        argv.remove(0);
    }
    let mut carried = Vec::new();
    let mut it = argv.into_iter();
    while let Some(w) = it.next() {
        let Some(flag) = w.strip_prefix("--").or_else(|| w.strip_prefix('-')) else {
            return Err(InjectError::field(
                object,
                field("args"),
                format!("\"{w}\": not a flag; convert this container by hand"),
            ));
        };
        let (n, v) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (flag.to_string(), it.next().unwrap_or_default()),
        };
        if !CARRIED.contains(&n.as_str()) {
            return Err(InjectError::field(
                object,
                field("command"),
                format!("reference daemon flag --{n} has no equivalent that inject carries over; convert this container by hand"),
            ));
        }
        carried.push(format!("--{n}={}", if n == "setup_param" { unquote(&v) } else { v }));
    }
    Ok(Some(Reference { list: list.to_string(), name, carried }))
}

/// Removes the reference daemon, the volumes it mounted from the GPU
/// containers' mounts, and those volumes where no other container mounts
/// them. Returns a line for the report.
pub fn remove(spec: &mut Value, r: &Reference) -> String {
    let mut gone: Vec<String> = Vec::new();
    if let Some(cs) = spec.get_mut(&r.list).and_then(Value::as_sequence_mut) {
        if let Some(i) = cs.iter().position(|c| name_of(c) == r.name) {
            let c = cs.remove(i);
            gone = c
                .get("volumeMounts")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .map(name_of)
                .collect();
        }
    }
    let mut still_used = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in spec.get_mut(list).and_then(Value::as_sequence_mut).into_iter().flatten() {
            let gpu = is_gpu(c);
            if let Some(ms) = c.get_mut("volumeMounts").and_then(Value::as_sequence_mut) {
                if gpu {
                    ms.retain(|m| !gone.contains(&name_of(m)));
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
        vs.retain(|v| !removed.contains(&name_of(v)));
    }
    // Lists left empty go, as `--uninject` would drop them: a second run
    // then finds the template as the first left it.
    for key in ["volumes", "initContainers"] {
        if spec.get(key).and_then(Value::as_sequence).is_some_and(Vec::is_empty) {
            spec.as_mapping_mut().map(|m| m.remove(key));
        }
    }
    format!(
        "migrated reference daemon {} ({}; volumes removed: {})",
        r.name,
        if r.carried.is_empty() {
            "no flags".to_string()
        } else {
            format!("flags carried: {}", r.carried.join(" "))
        },
        if removed.is_empty() { "none".to_string() } else { removed.join(", ") }
    )
}
