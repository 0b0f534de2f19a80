//! What inject tells a person about a template it changed, beyond the
//! daemon container: the pod-level fields it set, the daemon's privileges
//! and probe, the volumes, what each GPU container got; and what may not
//! work as they expect.

use serde_norway::Value;

use super::daemon::{describe_privileges, DaemonFlags};
use super::record::{set_value, Record};
use super::{machine, name_of, Mode, Options, DAEMON, GPU_RESOURCE};

/// A value as YAML writes it, on one line.
fn yaml(v: &Value) -> String {
    serde_norway::to_string(v).map(|t| t.trim_end().to_string()).unwrap_or_default()
}

/// One volume as `name (kind path)`.
fn volume(v: &Value) -> String {
    let name = name_of(v);
    match v.get("hostPath").and_then(|h| h.get("path")).and_then(Value::as_str) {
        Some(p) => format!("{name} (host {p})"),
        None => format!("{name} (emptyDir)"),
    }
}

/// The lines saying what was added or changed: the pod's fields, the
/// daemon, the volumes, each GPU container (`added`: its name and the
/// variables it got).
pub fn details(
    opts: &Options,
    flags: &DaemonFlags,
    rec: &Record,
    volumes: &[Value],
    mounts: &[Value],
    added: &[(String, Vec<String>)],
) -> Vec<String> {
    let mut out = Vec::new();
    let fields: Vec<String> = rec
        .pod
        .iter()
        .filter_map(|f| {
            let (k, was) = f.split_once(':').map_or((f.as_str(), None), |(k, w)| (k, Some(w)));
            let v = yaml(&set_value(k)?);
            Some(match was {
                Some(was) => format!("{k}: {v} (was {was})"),
                None => format!("{k}: {v}"),
            })
        })
        .collect();
    if !fields.is_empty() {
        out.push(format!("pod: set {}", fields.join(", ")));
    }
    out.push(match opts.mode {
        Mode::Node => format!(
            "daemon: none in the Pod; the node-wide daemon's {} (host), read-only",
            super::daemon::NODE_SOCKET_DIR
        ),
        mode => format!(
            "daemon: {} {DAEMON}{}, image {}, {}; {}",
            if mode == Mode::NativeSidecar { "init container" } else { "container" },
            if mode == Mode::NativeSidecar { " (restartPolicy: Always)" } else { "" },
            opts.image,
            describe_privileges(opts, &flags.parsed),
            flags.probe().describe(mode)
        ),
    });
    out.push(format!("volumes: {}", volumes.iter().map(volume).collect::<Vec<_>>().join(", ")));
    let at: Vec<String> = mounts
        .iter()
        .map(|m| {
            let path = m.get("mountPath").and_then(Value::as_str).unwrap_or_default();
            let ro = m.get("readOnly") == Some(&Value::Bool(true));
            format!("{path}{}", if ro { " (read-only)" } else { "" })
        })
        .collect();
    for (c, vars) in added {
        let nccl = vars.iter().filter(|v| v.starts_with("NCCL_")).count();
        let mut got: Vec<String> = vars.iter().filter(|v| !v.starts_with("NCCL_")).cloned().collect();
        if nccl > 0 {
            got.push(format!("{nccl} NCCL variables"));
        }
        let env = if got.is_empty() { String::new() } else { format!("env {}; ", got.join(", ")) };
        out.push(format!("{c}: {env}mounts {}", at.join(", ")));
    }
    out
}

/// What may not work as the template's author expects.
/// `own_netns`: the Pod has a network namespace of its own (its port is its own).
pub fn warnings(opts: &Options, flags: &DaemonFlags, asked: u64, own_netns: bool) -> Vec<String> {
    let mut out = Vec::new();
    if opts.privileged && opts.mode != Mode::Node {
        out.push(
            "--privileged: the daemon runs privileged: true, with every capability and host device, no \
             seccomp filter and the host's /sys and /proc/sys writable: a flaw in it, or in anything that \
             reaches it, is the node's. Use it only where the platform cannot give a container the GPUs \
             (no GKE device injector, no NVIDIA runtime); deploy/README.md says what the daemon needs"
                .into(),
        );
    }
    let has = machine::gpus(&opts.machine);
    if let Some(has) = has.filter(|has| asked < *has && opts.mode != Mode::Node) {
        let port = match flags.parsed.metrics_address.0 {
            Some(a) if !own_netns => format!(" and port {}", a.port()),
            _ => String::new(),
        };
        out.push(format!(
            "asks for {asked} of the {has} GPUs ({GPU_RESOURCE}) of a node of machine type {}, but its daemon \
             (--gpu_nic_preset={}) takes all of the node's TCPX NICs: two such Pods on one node would \
             clash over the NICs{port}, and the second one's daemon would not start. Ask for all {has} \
             GPUs, or keep such Pods one per node (a podAntiAffinity on kubernetes.io/hostname), or \
             share nodes through the node-wide daemon (deploy/kubernetes/daemonset.yaml and \
             inject --mode=node)",
            opts.machine, flags.parsed.gpu_nic_preset
        ));
    }
    out
}

/// What `--uninject` took out of a template (`before`: as it was), by the
/// record `rec`.
pub fn removed(before: &Value, rec: &Record) -> Vec<String> {
    let Some(spec) = before.get("spec") else { return Vec::new() };
    let containers: Vec<&Value> =
        super::lists::LISTS.iter().filter_map(|l| spec.get(*l)?.as_sequence()).flatten().collect();
    let mut out = Vec::new();
    if containers.iter().any(|c| name_of(c) == DAEMON) {
        out.push(format!("daemon: container {DAEMON} removed"));
    }
    let fields: Vec<String> = rec
        .pod
        .iter()
        .filter(|f| *f != "devices")
        .map(|f| match f.split_once(':') {
            Some((k, was)) => format!("{k} (back to {was})"),
            None => f.clone(),
        })
        .collect();
    if !fields.is_empty() {
        out.push(format!("pod: removed {} (each while it held inject's value)", fields.join(", ")));
    }
    let volumes: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .map(name_of)
        .filter(|v| super::daemon::VOLUMES.contains(&v.as_str()))
        .collect();
    if !volumes.is_empty() {
        out.push(format!("volumes removed: {}", volumes.join(", ")));
    }
    let gpu: Vec<String> = containers.iter().filter(|c| super::is_gpu(c)).map(|c| name_of(c)).collect();
    if !gpu.is_empty() {
        out.push(format!("{}: inject's variables and mounts removed", gpu.join(", ")));
    }
    out
}
