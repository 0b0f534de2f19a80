//! A pod template that already runs a TCPX daemon inject did not write:
//! the reference (`tcpgpudmarxd`, by image or binary path) or a hand-written
//! `tcpx-rxdm` daemon container. Its flags are carried over to the injected
//! daemon where they mean the same there; the container and the volumes
//! only it used are removed, so that a Pod never runs two daemons, and kept
//! in the template (by `restore`) so that `--uninject` brings them back. A flag that cannot be carried is refused with the container's name
//! and why: converting it is a human's call.

use serde_norway::Value;

use super::pod_flags::not_for_a_pod;
use super::{is_gpu, name_of, script, values, InjectError};
use crate::config::flags::{Flags, BOOL_FLAGS};

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

/// Flags that say how the daemon ends, which inject sets for each mode:
/// left out of what is carried, and said so.
const ENDS: [&str; 4] =
    ["monitor_shutdown", "shutdown_file", "shutdown_when_all_clients_exited", "wait_time_before_exit"];

/// Flags naming a path inside the container (its image or its mounts),
/// which inject's daemon container does not have.
const PATHS: [&str; 4] = ["gpu_nic_topology", "tuning_script_path", "sysfs_root", "procfs_root"];

/// Which daemon a container runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Google's `tcpgpudmarxd`, or this one at its path.
    Reference,
    /// `tcpx-rxdm` itself, written by hand (inject's record would say otherwise).
    Ours,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Reference => "reference daemon",
            Kind::Ours => "hand-written tcpx-rxdm daemon",
        }
    }
}

/// The daemon found in a template.
#[derive(Debug, Clone)]
pub struct Reference {
    pub kind: Kind,
    pub list: String,
    pub name: String,
    /// Its flags carried over, as `--name=value` words.
    pub carried: Vec<String>,
    /// Its flags left to inject (how the daemon ends).
    pub dropped: Vec<String>,
    /// Whether it ran `privileged: true`.
    pub privileged: bool,
    /// Its image, where it is this daemon's (`tcpx-rxdm`): kept.
    pub image: Option<String>,
    /// Started by a shell script: the shell and the job-end file it waited for.
    pub script: Option<Started>,
    /// The Pod's volume it mounted at its socket folder.
    pub socket_volume: Option<Value>,
    /// Its `cpu` and `memory` requests, where they are quantities.
    pub requests: [Option<String>; 2],
}

/// A daemon a shell script started ([`script`]).
#[derive(Debug, Clone)]
pub struct Started {
    pub shell: String,
    /// The file its loop waited for, and its container's mount that holds
    /// the file: inject's daemon keeps that mount and ends when the file
    /// appears (`--shutdown_file`).
    pub wait: Option<(String, Value)>,
}

/// The words of a `command` or `args` list; a number or boolean as its YAML
/// text (Kubernetes would refuse it, but it is shown as written).
pub fn strings(v: Option<&Value>) -> Vec<String> {
    let word = |x: &Value| match x {
        Value::String(s) => s.clone(),
        other => serde_norway::to_string(other).map(|t| t.trim_end().to_string()).unwrap_or_default(),
    };
    v.and_then(Value::as_sequence).map(|s| s.iter().map(word).collect()).unwrap_or_default()
}

/// The words of a container's command line: `command`, then `args`.
pub fn argv(c: &Value) -> Vec<String> {
    let mut argv = strings(c.get("command"));
    argv.extend(strings(c.get("args")));
    argv
}

/// Which daemon `c` runs, if any: by its image or its binary, which a
/// shell script may start. A `tcpx-rxdm` running one of its commands
/// (`nccl-env`, …) is no daemon. A script inject cannot read is a
/// reference daemon where it names `tcpgpudmarxd` in a container without
/// GPUs (so that it is refused, not run beside inject's daemon).
pub fn kind(c: &Value) -> Option<Kind> {
    let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
    let mut argv = argv(c);
    match script::started(&argv) {
        Some(Ok(s)) => argv = s.argv,
        Some(Err(_)) => {
            let named = !is_gpu(c) && argv.iter().any(|w| w.contains("tcpgpudmarxd"));
            return (image.contains("tcpgpudmarxd") || named).then_some(Kind::Reference);
        }
        None => {}
    }
    let binary = argv.first().filter(|w| !w.starts_with('-')).map(|w| w.rsplit('/').next().unwrap_or(w));
    if image.contains("tcpgpudmarxd") || binary == Some("tcpgpudmarxd") {
        return Some(Kind::Reference);
    }
    let ours = binary == Some("tcpx-rxdm") || (binary.is_none() && image.contains("tcpx-rxdm"));
    let command = argv.get(usize::from(binary.is_some())).is_some_and(|w| !w.starts_with('-'));
    (ours && !command).then_some(Kind::Ours)
}

/// Why a flag of a daemon being converted cannot be carried over (`None`:
/// it can). The reference's flags that mean the same here are carried, and
/// so is every other flag of this daemon that works in a Pod (a reference
/// container running this image may have any).
fn not_carried(name: &str, value: &str) -> Option<String> {
    if PATHS.contains(&name) || (name == "gpu_nic_preset" && value.contains('/')) {
        return Some(format!(
            "names a path inside this container, which inject's daemon container does not have; put \
             the file where both see it (a volume) and give inject --{name} yourself, or convert this \
             container by hand"
        ));
    }
    if CARRIED.contains(&name) {
        return None;
    }
    if let Some(why) = not_for_a_pod(name) {
        return Some(format!("has no place in a Pod's daemon: {why}; remove it from this container"));
    }
    None
}

/// Finds the daemon inject did not write; refuses two, or flags that
/// cannot be carried over.
pub fn find(spec: &Value, object: &str, at: &str) -> Result<Option<Reference>, InjectError> {
    let mut found: Vec<(&str, &Value, Kind)> = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in spec.get(list).and_then(Value::as_sequence).into_iter().flatten() {
            if let Some(k) = kind(c) {
                found.push((list, c, k));
            }
        }
    }
    let Some((list, c, kind)) = found.first().copied() else { return Ok(None) };
    let name = name_of(c);
    let field = |f: &str| format!("{at}spec.{list}[{name}].{f}");
    let what = kind.describe();
    if let Some((l2, c2, _)) = found.get(1) {
        return Err(InjectError::field(
            object,
            format!("{at}spec.{l2}[{}]", name_of(c2)),
            format!("a second TCPX daemon (besides {what} {name}); a Pod runs one: convert this Pod by hand"),
        ));
    }
    if is_gpu(c) {
        return Err(InjectError::field(
            object,
            field("resources"),
            format!("a {what} that requests GPUs; convert it by hand"),
        ));
    }
    let (mut argv, script) = match script::started(&argv(c)) {
        None => (argv(c), None),
        Some(Ok(s)) => (s.argv, Some((s.shell, s.wait_file))),
        Some(Err(why)) => {
            return Err(InjectError::field(
                object,
                field("command"),
                format!(
                    "{what} {name} is started by a shell script, which inject cannot read: {why}. {}; \
                     replace the script with the daemon's command line (command and args), or convert \
                     this container by hand",
                    script::READS
                ),
            ))
        }
    };
    if argv.first().is_some_and(|a| !a.starts_with('-')) {
        argv.remove(0);
    }
    let (mut carried, mut dropped) = (Vec::new(), Vec::new());
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
            None if BOOL_FLAGS.contains(&flag)
                || flag.strip_prefix("no").is_some_and(|b| BOOL_FLAGS.contains(&b)) =>
            {
                (flag.to_string(), String::new())
            }
            None => (flag.to_string(), it.next().unwrap_or_default()),
        };
        let word = match (v.is_empty() && !flag.contains('='), n.as_str()) {
            (true, _) => format!("--{n}"),
            (_, "setup_param") => format!("--{n}={}", super::daemon::unquote(&v)),
            _ => format!("--{n}={v}"),
        };
        let base = n.strip_prefix("no").filter(|b| BOOL_FLAGS.contains(b)).unwrap_or(&n);
        if ENDS.contains(&base) {
            dropped.push(word);
            continue;
        }
        if let Some(why) = not_carried(base, &v) {
            return Err(InjectError::field(object, field("command"), format!("{what} flag --{n} {why}")));
        }
        // Its value as the daemon reads it, checked here to name this container.
        if let Err(e) = Flags::parse_args(["tcpx-rxdm".to_string(), word.clone()]) {
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default().trim_start_matches("error: ");
            if first.starts_with("unexpected argument") {
                return Err(InjectError::field(
                    object,
                    field("command"),
                    format!(
                        "{what} flag --{n} is a flag of neither tcpgpudmarxd nor tcpx-rxdm; remove it from \
                         this container, or convert it by hand"
                    ),
                ));
            }
            return Err(InjectError::field(object, field("command"), format!("{what} flag {word}: {first}")));
        }
        carried.push(word);
    }
    let script = match script {
        Some((shell, Some(file))) => {
            let m = holding(c, &file).ok_or_else(|| {
                InjectError::field(
                    object,
                    field("volumeMounts"),
                    format!(
                        "{what} {name}: its script waits for {file}, which is on none of its volumes, so \
                         no other container can create it; mount the volume the workload writes it on, \
                         or convert this container by hand"
                    ),
                )
            })?;
            if !volumes(spec).any(|v| name_of(v) == name_of(&m)) {
                return Err(InjectError::field(
                    object,
                    field("volumeMounts"),
                    format!(
                        "{what} {name}: its script waits for {file} on volume {}, which the Pod does not \
                         have; add the volume (the workload creates the file there)",
                        name_of(&m)
                    ),
                ));
            }
            carried.push(format!("--shutdown_file={file}"));
            Some(Started { shell, wait: Some((file, m)) })
        }
        Some((shell, None)) => Some(Started { shell, wait: None }),
        None => None,
    };
    // Its socket folder: as given, else the default of the daemon it ran.
    let default = if kind == Kind::Reference { REFERENCE_UDS } else { "/run/tcpx" };
    let uds = carried.iter().rev().find_map(|w| w.strip_prefix("--uds_path=")).unwrap_or(default);
    let socket_volume = mounts(c)
        .find(|m| same_path(m, uds))
        .and_then(|m| volumes(spec).find(|v| name_of(v) == name_of(m)))
        .cloned();
    let request = |k: &str, valid: fn(&str) -> Result<String, String>| {
        let v = c.get("resources")?.get("requests")?.get(k)?;
        let text = match v {
            Value::String(t) => t.clone(),
            Value::Number(n) => n.to_string(),
            _ => return None,
        };
        valid(&text).ok()
    };
    let requests = [request("cpu", values::cpu), request("memory", values::memory)];
    let privileged = c.get("securityContext").and_then(|s| s.get("privileged")) == Some(&Value::Bool(true));
    let image = c.get("image").and_then(Value::as_str).filter(|i| i.contains("tcpx-rxdm")).map(String::from);
    Ok(Some(Reference {
        kind,
        list: list.to_string(),
        name,
        carried,
        dropped,
        privileged,
        image,
        script,
        socket_volume,
        requests,
    }))
}

/// The reference's socket folder when it is given no `--uds_path`.
const REFERENCE_UDS: &str = "/tmp";

fn mounts(c: &Value) -> impl Iterator<Item = &Value> {
    c.get("volumeMounts").and_then(Value::as_sequence).into_iter().flatten()
}

fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec.get("volumes").and_then(Value::as_sequence).into_iter().flatten()
}

/// A mount's path, without a trailing `/`.
fn mount_path(m: &Value) -> &str {
    let p = m.get("mountPath").and_then(Value::as_str).unwrap_or_default();
    match p.trim_end_matches('/') {
        "" if p.starts_with('/') => "/",
        t => t,
    }
}

fn same_path(m: &Value, path: &str) -> bool {
    let want = match path.trim_end_matches('/') {
        "" => "/",
        t => t,
    };
    mount_path(m) == want
}

/// The mount of `c` that holds `file` (the deepest one).
fn holding(c: &Value, file: &str) -> Option<Value> {
    mounts(c)
        .filter(|m| {
            let at = mount_path(m);
            at == "/" || file.strip_prefix(at).is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
        })
        .max_by_key(|m| mount_path(m).len())
        .cloned()
}
