//! One pod template (`{metadata, spec}`): the checks, the change, its
//! record and its undoing. The record in [`ANNOTATION`] says what was set
//! at pod level and which variables the containers already had, so that
//! undoing removes exactly what was added; injecting again first undoes the
//! recorded change, so a second run changes nothing and a newer version
//! replaces an older one in place. Each pod-level field is undone only
//! while it holds the value inject gave it ([`super::record`]).

use serde_norway::{Mapping, Value};

use super::daemon::{self, map, s, DaemonFlags, VOLUMES};
use super::lists::{drop_empty, retain_list, seq_mut};
use super::migrate::{self, Reference};
use super::record::{set_value, GRACE_SECONDS};
use super::{
    is_gpu, limits, machine, name_of, show, InjectError, Mode, Nccl, Options, ANNOTATION, DAEMON,
    GPU_RESOURCE, VERSION,
};
use crate::nccl::env::{CONFIGMAP_NAME, UNIX_CLIENT_PREFIX};

pub use super::record::{record, Outcome, Record};

/// An env entry's value for a message: quoted, or how it is set otherwise.
fn shown(v: Option<&str>) -> String {
    match v {
        Some(v) => format!("\"{v}\""),
        None => "a value not given inline (valueFrom)".into(),
    }
}

/// The names of the container lists, init containers first.
const LISTS: [&str; 2] = ["initContainers", "containers"];

/// The variables that `Nccl::Inline` adds (the generator's, for the default machine).
pub fn inline_names() -> Vec<String> {
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

fn is_our_configmap(e: &Value) -> bool {
    e.get("configMapRef").and_then(|r| r.get("name")).and_then(Value::as_str) == Some(CONFIGMAP_NAME)
}

/// Undoes the recorded change.
pub fn remove(tpl: &mut Value, rec: &Record) {
    let names = env_names(rec.nccl);
    let Some(spec) = tpl.get_mut("spec").filter(|s| s.is_mapping()) else { return };
    for list in LISTS {
        retain_list(spec, list, |c| name_of(c) != DAEMON);
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_sequence_mut) {
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
    retain_list(spec, "volumes", |v| !VOLUMES.contains(&name_of(v).as_str()));
    // Each field goes (or gets its old value back) only while it holds the
    // value inject gave it: one changed since is the author's.
    let spec = spec.as_mapping_mut().expect("a mapping");
    for f in rec.pod.iter().filter(|f| *f != "devices") {
        let (k, was) = f.split_once(':').map_or((f.as_str(), None), |(k, w)| (k, Some(w)));
        let Some(given) = set_value(k) else { continue };
        if spec.get(k) != Some(&given) {
            continue;
        }
        match was {
            Some(was) => spec.insert(s(k), s(was)),
            None => spec.remove(k),
        };
    }
    if let Some(meta) = tpl.get_mut("metadata").filter(|m| m.is_mapping()) {
        if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_mapping_mut) {
            ann.remove(ANNOTATION);
            let (k, v) = daemon::device_annotation();
            if rec.pod.iter().any(|f| f == "devices") && ann.get(k.as_str()) == Some(&s(&v)) {
                ann.remove(k.as_str());
            }
        }
        drop_empty(meta, "annotations");
        drop_empty(tpl, "metadata");
    }
}

/// Adds TCPX to the template. `object` and `at` (the template's path, e.g.
/// `spec.template.`) name fields in errors. Returns what was done; `None`
/// when no container requests GPUs (nothing done).
/// `kept`: flags of an earlier injection to keep ([`migrate::own_carried`]).
pub fn inject(
    tpl: &mut Value,
    opts: &Options,
    object: &str,
    at: &str,
    kept: &[String],
) -> Result<Option<String>, InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    let spec = match tpl.get_mut("spec") {
        Some(v) if v.is_mapping() => v,
        _ => return Err(err("spec".into(), "not a pod spec (a mapping)".into())),
    };
    // MIG: whole GPUs only.
    super::mig::refuse(spec, object, at)?;
    match spec.get("hostNetwork") {
        None | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            return Err(err(
                "spec.hostNetwork".into(),
                "false; TCPX needs the node's network (hostNetwork: true), remove the field or set it true"
                    .into(),
            ))
        }
        Some(v) => return Err(err("spec.hostNetwork".into(), format!("{} is not a boolean", show(v)))),
    }
    for list in LISTS {
        if spec.get(list).is_some_and(|v| !v.is_sequence()) {
            return Err(err(format!("spec.{list}"), "not a list".into()));
        }
    }
    if limits::check(spec, &opts.machine, object, at)? == 0 {
        return Ok(None);
    }
    let gpu_count: usize = LISTS
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_sequence))
        .map(|cs| cs.iter().filter(|c| is_gpu(c)).count())
        .sum();
    // Containers are told apart by name (record, reference daemon): two of one
    // name would change as one, a name no DNS label (a blank) breaks the record.
    let mut names = std::collections::BTreeSet::new();
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
    let reference: Option<Reference> = migrate::find(spec, object, at)?;
    let carried = reference.as_ref().map_or_else(|| kept.to_vec(), |r| r.carried.clone());
    let flags = DaemonFlags::new(opts, &carried)?;
    let uds = flags.uds_path();
    let nccl = match opts.nccl {
        Nccl::Inline => Some(machine::nccl_env(&opts.machine, &flags.parsed)?),
        _ => None,
    };
    let mut notes = Vec::new();
    if let Some(r) = &reference {
        notes.push(migrate::remove(spec, r));
    }
    for list in LISTS {
        if spec
            .get(list)
            .and_then(Value::as_sequence)
            .is_some_and(|cs| cs.iter().any(|c| name_of(c) == DAEMON))
        {
            return Err(err(
                format!("spec.{list}[{DAEMON}]"),
                "a container of this name exists; inject adds its own".into(),
            ));
        }
    }
    if let Some(v) = spec
        .get("volumes")
        .and_then(Value::as_sequence)
        .and_then(|vs| vs.iter().find(|v| VOLUMES.contains(&name_of(v).as_str())))
    {
        return Err(err(
            format!("spec.volumes[{}]", name_of(v)),
            "a volume of this name exists; inject adds its own".into(),
        ));
    }

    // The GPU containers: refuse conflicts before changing anything.
    // The platform decides the library folder (GKE's mount, the plugin's, or
    // none: the image's own library path is left as it is).
    let libraries = opts.platform.library_dir();
    let mut ours: Vec<(String, String)> =
        libraries.iter().map(|l| ("LD_LIBRARY_PATH".to_string(), l.to_string())).collect();
    if let Some(env) = &nccl {
        ours.extend(env.vars.iter().map(|v| (v.name.clone(), v.value.clone())));
    }
    let mounts = daemon::workload_mounts(opts, &uds);
    let mut kept = Vec::new();
    for list in LISTS {
        for c in spec.get(list).and_then(Value::as_sequence).into_iter().flatten().filter(|c| is_gpu(c)) {
            let cn = name_of(c);
            let field = |f: &str| format!("spec.{list}[{cn}].{f}");
            for e in c.get("env").and_then(Value::as_sequence).into_iter().flatten() {
                let n = e.get("name").and_then(Value::as_str).unwrap_or_default();
                let v = e.get("value").and_then(Value::as_str);
                if n == "LD_LIBRARY_PATH" {
                    let Some(libraries) = libraries else {
                        kept.push(format!("{cn}:{n}"));
                        continue;
                    };
                    if v.is_some_and(|v| v.split(':').any(|p| p == libraries)) {
                        kept.push(format!("{cn}:{n}"));
                        continue;
                    }
                    return Err(err(
                        field("env[LD_LIBRARY_PATH]"),
                        format!("does not hold {libraries}; add it (the NCCL plugin is loaded from there)"),
                    ));
                }
                if let Some((_, want)) = ours.iter().find(|(o, _)| o == n) {
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
                if n == UNIX_CLIENT_PREFIX && v != Some(uds.as_str()) {
                    return Err(err(
                        field(&format!("env[{n}]")),
                        format!("{} is not the daemon's socket folder {uds}", shown(v)),
                    ));
                }
            }
            if opts.nccl == Nccl::ConfigMap
                && c.get("envFrom")
                    .and_then(Value::as_sequence)
                    .is_some_and(|ef| ef.iter().any(is_our_configmap))
            {
                kept.push(format!("{cn}:envFrom"));
            }
            for m in c.get("volumeMounts").and_then(Value::as_sequence).into_iter().flatten() {
                // Undoing removes the GPU containers' mounts of these names.
                if VOLUMES.contains(&name_of(m).as_str()) {
                    return Err(err(
                        field(&format!("volumeMounts[{}]", name_of(m))),
                        "a mount of a volume inject adds; rename the mount and its volume".into(),
                    ));
                }
                let path = m.get("mountPath").and_then(Value::as_str).unwrap_or_default();
                if mounts.iter().any(|x| x.get("mountPath").and_then(Value::as_str) == Some(path)) {
                    return Err(err(
                        field(&format!("volumeMounts[{}]", name_of(m))),
                        format!("{path} is mounted already; inject mounts its own volume there"),
                    ));
                }
            }
        }
    }

    let mut pod = Vec::new();
    // ClusterFirst, the API server's default, would give a host-network Pod
    // the node's resolver: it becomes ClusterFirstWithHostNet, recorded.
    if spec.get("hostNetwork").is_none() && spec.get("dnsPolicy") == Some(&s("ClusterFirst")) {
        spec.as_mapping_mut().expect("a mapping").insert(s("dnsPolicy"), s("ClusterFirstWithHostNet"));
        pod.push("dnsPolicy:ClusterFirst".into());
    }
    let mut set = |spec: &mut Value, key: &str, v: Value| {
        if spec.get(key).is_none() {
            spec.as_mapping_mut().expect("a mapping").insert(s(key), v);
            pod.push(key.to_string());
        }
    };
    set(spec, "hostNetwork", Value::Bool(true));
    set(spec, "dnsPolicy", s("ClusterFirstWithHostNet"));
    // The platform's runtime class (GPU Operator); one the Pod names is kept.
    if let Some(class) = opts.platform.runtime_class() {
        set(spec, "runtimeClassName", s(class));
    }
    if opts.mode != Mode::Node {
        // Leases follow client processes by pidfd: one pid namespace per Pod
        // makes that work on kernels before 6.5 (hostPID excludes it).
        if spec.get("hostPID") != Some(&Value::Bool(true)) {
            set(spec, "shareProcessNamespace", Value::Bool(true));
        }
        set(spec, "terminationGracePeriodSeconds", Value::Number(GRACE_SECONDS.into()));
    }
    seq_mut(spec, "volumes").extend(daemon::volumes(opts));
    if let Some(c) = daemon::container(opts, &flags) {
        let list = if opts.mode == Mode::NativeSidecar { "initContainers" } else { "containers" };
        seq_mut(spec, list).insert(0, c);
    }
    for list in LISTS {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_sequence_mut) else { continue };
        for c in cs.iter_mut().filter(|c| is_gpu(c) && name_of(c) != DAEMON) {
            let cn = name_of(c);
            let env = seq_mut(c, "env");
            for (n, v) in &ours {
                if !kept.contains(&format!("{cn}:{n}")) {
                    env.push(map(vec![("name", s(n)), ("value", s(v))]));
                }
            }
            if opts.nccl == Nccl::ConfigMap && !kept.contains(&format!("{cn}:envFrom")) {
                let r = map(vec![("configMapRef", map(vec![("name", s(CONFIGMAP_NAME))]))]);
                seq_mut(c, "envFrom").push(r);
            }
            seq_mut(c, "volumeMounts").extend(mounts.iter().cloned());
        }
    }
    let mut annotations = vec![];
    if opts.unprivileged && opts.mode != Mode::Node && opts.platform.gke_devices() {
        let (k, v) = daemon::device_annotation();
        if tpl.get("metadata").and_then(|m| m.get("annotations")).and_then(|a| a.get(k.as_str())).is_some() {
            return Err(err(
                format!("metadata.annotations[{k}]"),
                "set already; --unprivileged adds its own".into(),
            ));
        }
        annotations.push((k, v));
        pod.push("devices".into());
    }
    let rec = Record { version: VERSION.into(), mode: opts.mode, nccl: opts.nccl, pod, kept };
    annotations.push((ANNOTATION.to_string(), rec.text()));
    annotate(tpl, annotations);
    notes.insert(
        0,
        format!(
            "{} ({} nccl, {} GPU container{}{})",
            opts.mode.name(),
            opts.nccl.name(),
            gpu_count,
            if gpu_count == 1 { "" } else { "s" },
            if opts.platform.runtime_class().is_some() { ", gpu-operator" } else { "" }
        ),
    );
    Ok(Some(notes.join("; ")))
}

/// Sets annotations, creating `metadata` (first) where the template has none.
fn annotate(tpl: &mut Value, pairs: Vec<(String, String)>) {
    let m = tpl.as_mapping_mut().expect("a template is a mapping");
    if !m.get("metadata").is_some_and(Value::is_mapping) {
        let rest = std::mem::take(m);
        m.insert(s("metadata"), Value::Mapping(Mapping::new()));
        m.extend(rest.into_iter().filter(|(k, _)| k.as_str() != Some("metadata")));
    }
    let meta = m.get_mut("metadata").expect("just made");
    if !meta.get("annotations").is_some_and(Value::is_mapping) {
        meta.as_mapping_mut().expect("a mapping").insert(s("annotations"), Value::Mapping(Mapping::new()));
    }
    let ann = meta.get_mut("annotations").and_then(Value::as_mapping_mut).expect("just made");
    for (k, v) in pairs {
        ann.insert(s(&k), s(&v));
    }
}

/// Applies `opts` to one template: undo any recorded change, then inject
/// (or stop there with `--uninject`). Returns what was done and the report
/// line saying so. "Already injected" only where the annotation says so.
pub fn apply(
    tpl: &mut Value,
    opts: &Options,
    object: &str,
    at: &str,
) -> Result<(Outcome, String), InjectError> {
    if !tpl.is_mapping() {
        return Err(InjectError::field(object, at.trim_end_matches('.'), "not a pod template (a mapping)"));
    }
    let before = tpl.clone();
    let prior = match record(tpl) {
        Some(Ok(r)) => Some(r),
        Some(Err(why)) => {
            return Err(InjectError::field(
                object,
                format!("{at}metadata.annotations[{ANNOTATION}]"),
                format!("{why}; not a record this version reads"),
            ))
        }
        None => None,
    };
    // A Pod moved to the node-wide daemon has no daemon of its own to keep flags for.
    let kept = match (&prior, opts.mode) {
        (Some(_), m) if m != Mode::Node => tpl.get("spec").map(migrate::own_carried).unwrap_or_default(),
        _ => Vec::new(),
    };
    if let Some(r) = &prior {
        remove(tpl, r);
    }
    if opts.uninject {
        return Ok(match prior {
            Some(r) => (Outcome::Removed, format!("removed ({} {} injection)", r.version, r.mode.name())),
            None => (Outcome::NotInjected, "not injected; unchanged".into()),
        });
    }
    let what = inject(tpl, opts, object, at, &kept)?;
    Ok(match (what, prior) {
        (None, None) => (Outcome::NoGpu, format!("no container requests {GPU_RESOURCE}; nothing injected")),
        (None, Some(r)) => (
            Outcome::NoGpu,
            format!(
                "no container requests {GPU_RESOURCE} any more; the {} {} injection removed",
                r.version,
                r.mode.name()
            ),
        ),
        (Some(_), Some(_)) if *tpl == before => {
            (Outcome::Unchanged, format!("already injected ({VERSION}, {}); unchanged", opts.mode.name()))
        }
        (Some(what), Some(r)) => {
            (Outcome::Updated, format!("updated from {} {}: {what}", r.version, r.mode.name()))
        }
        (Some(what), None) => (Outcome::Injected, format!("injected: {what}")),
    })
}
