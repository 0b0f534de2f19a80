//! One pod template (`{metadata, spec}`): the checks, the change, its
//! record and its undoing. The record in [`ANNOTATION`] says what was set
//! at pod level and which variables the containers already had, so that
//! undoing removes exactly what was added; injecting again first undoes the
//! recorded change, so a second run changes nothing and a newer version
//! replaces an older one in place.

use serde_norway::{Mapping, Value};

use super::daemon::{self, map, s, DaemonFlags, VOLUMES};
use super::migrate::{self, Reference};
use super::{
    is_gpu, machine, name_of, InjectError, Mode, Nccl, Options, ANNOTATION, DAEMON, GPU_RESOURCE, LIBRARIES,
    VERSION,
};
use crate::nccl::env::{CONFIGMAP_NAME, UNIX_CLIENT_PREFIX};

/// What the annotation records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub version: String,
    pub mode: Mode,
    pub nccl: Nccl,
    /// Pod-level fields set (`hostNetwork`, …; `devices` for the annotation).
    pub pod: Vec<String>,
    /// `container:VARIABLE` (or `container:envFrom`) present before.
    pub kept: Vec<String>,
}

impl Record {
    pub fn text(&self) -> String {
        let mut t = format!("version={} mode={} nccl={}", self.version, self.mode.name(), self.nccl.name());
        for (k, v) in [("pod", &self.pod), ("kept", &self.kept)] {
            if !v.is_empty() {
                t.push_str(&format!(" {k}={}", v.join(",")));
            }
        }
        t
    }

    pub fn parse(text: &str) -> Option<Record> {
        let mut r =
            Record { version: String::new(), mode: Mode::Node, nccl: Nccl::File, pod: vec![], kept: vec![] };
        let mut seen = (false, false);
        for part in text.split_whitespace() {
            let (k, v) = part.split_once('=')?;
            let items = || v.split(',').filter(|x| !x.is_empty()).map(String::from).collect();
            match k {
                "version" => r.version = v.to_string(),
                "mode" => (r.mode, seen.0) = (Mode::from_name(v)?, true),
                "nccl" => (r.nccl, seen.1) = (Nccl::from_name(v)?, true),
                "pod" => r.pod = items(),
                "kept" => r.kept = items(),
                _ => return None,
            }
        }
        (seen.0 && seen.1 && !r.version.is_empty()).then_some(r)
    }
}

/// The recorded injection of a template, if any.
pub fn record(tpl: &Value) -> Option<Result<Record, String>> {
    let text = tpl.get("metadata")?.get("annotations")?.get(ANNOTATION)?;
    Some(text.as_str().and_then(Record::parse).ok_or_else(|| format!("{text:?}")))
}

/// The names of the container lists, init containers first.
const LISTS: [&str; 2] = ["initContainers", "containers"];

pub fn seq_mut<'a>(m: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    let m = m.as_mapping_mut().expect("checked to be a mapping");
    if !m.get(key).is_some_and(Value::is_sequence) {
        m.insert(s(key), Value::Sequence(vec![]));
    }
    m.get_mut(key).and_then(Value::as_sequence_mut).expect("just inserted")
}

/// Removes `key` from mapping `m` if it holds an empty sequence or mapping.
fn drop_empty(m: &mut Value, key: &str) {
    let empty = match m.get(key) {
        Some(Value::Sequence(v)) => v.is_empty(),
        Some(Value::Mapping(v)) => v.is_empty(),
        _ => false,
    };
    if empty {
        m.as_mapping_mut().map(|m| m.remove(key));
    }
}

/// Keeps the items of list `key` of mapping `m` that `keep` accepts. A list
/// this empties goes; one the user left empty stays (injecting again keeps it).
fn retain_list(m: &mut Value, key: &str, keep: impl FnMut(&Value) -> bool) {
    let Some(items) = m.get_mut(key).and_then(Value::as_sequence_mut) else { return };
    if items.is_empty() {
        return;
    }
    items.retain(keep);
    if items.is_empty() {
        m.as_mapping_mut().map(|m| m.remove(key));
    }
}

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
    let spec = spec.as_mapping_mut().expect("a mapping");
    for f in rec.pod.iter().filter(|f| *f != "devices") {
        match f.split_once(':') {
            // A field that had another value: that value comes back.
            Some((k, was)) => spec.insert(s(k), s(was)),
            None => spec.remove(f.as_str()),
        };
    }
    if let Some(meta) = tpl.get_mut("metadata").filter(|m| m.is_mapping()) {
        if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_mapping_mut) {
            ann.remove(ANNOTATION);
            if rec.pod.iter().any(|f| f == "devices") {
                ann.remove(daemon::device_annotation().0.as_str());
            }
        }
        drop_empty(meta, "annotations");
        drop_empty(tpl, "metadata");
    }
}

/// Adds TCPX to the template. `object` and `at` (the template's path, e.g.
/// `spec.template.`) name fields in errors. Returns what was done.
pub fn inject(tpl: &mut Value, opts: &Options, object: &str, at: &str) -> Result<String, InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    let spec = match tpl.get_mut("spec") {
        Some(v) if v.is_mapping() => v,
        _ => return Err(err("spec".into(), "not a pod spec (a mapping)".into())),
    };
    match spec.get("hostNetwork") {
        None | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            return Err(err(
                "spec.hostNetwork".into(),
                "false; TCPX needs the node's network (hostNetwork: true), remove the field or set it true"
                    .into(),
            ))
        }
        Some(v) => return Err(err("spec.hostNetwork".into(), format!("{v:?} is not a boolean"))),
    }
    for list in LISTS {
        if spec.get(list).is_some_and(|v| !v.is_sequence()) {
            return Err(err(format!("spec.{list}"), "not a list".into()));
        }
    }
    let gpu_count: usize = LISTS
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_sequence))
        .map(|cs| cs.iter().filter(|c| is_gpu(c)).count())
        .sum();
    if gpu_count == 0 {
        return Ok(format!("no container requests {GPU_RESOURCE}; unchanged"));
    }
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
    let carried = reference.as_ref().map(|r| r.carried.clone()).unwrap_or_default();
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
    let mut ours: Vec<(String, String)> = vec![("LD_LIBRARY_PATH".into(), LIBRARIES.into())];
    if let Some(env) = &nccl {
        ours.extend(env.vars.iter().map(|v| (v.name.clone(), v.value.clone())));
    }
    let mounts = daemon::workload_mounts(opts.mode, &uds);
    let mut kept = Vec::new();
    for list in LISTS {
        for c in spec.get(list).and_then(Value::as_sequence).into_iter().flatten().filter(|c| is_gpu(c)) {
            let cn = name_of(c);
            let field = |f: &str| format!("spec.{list}[{cn}].{f}");
            for e in c.get("env").and_then(Value::as_sequence).into_iter().flatten() {
                let n = e.get("name").and_then(Value::as_str).unwrap_or_default();
                let v = e.get("value").and_then(Value::as_str);
                if n == "LD_LIBRARY_PATH" {
                    if v.is_some_and(|v| v.split(':').any(|p| p == LIBRARIES)) {
                        kept.push(format!("{cn}:{n}"));
                        continue;
                    }
                    return Err(err(
                        field("env[LD_LIBRARY_PATH]"),
                        format!(
                            "does not hold {LIBRARIES}; add it (the NCCL plugin loads the driver from there)"
                        ),
                    ));
                }
                if let Some((_, want)) = ours.iter().find(|(o, _)| o == n) {
                    if v == Some(want.as_str()) {
                        kept.push(format!("{cn}:{n}"));
                        continue;
                    }
                    return Err(err(field(&format!("env[{n}]")), format!("conflicting NCCL setting {v:?}; inject sets {want:?} (remove it, or use --nccl=file)")));
                }
                if n == UNIX_CLIENT_PREFIX && v != Some(uds.as_str()) {
                    return Err(err(
                        field(&format!("env[{n}]")),
                        format!("{v:?} is not the daemon's socket folder {uds:?}"),
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
    if opts.mode != Mode::Node {
        // Leases follow client processes by pidfd: one pid namespace per Pod
        // makes that work on kernels before 6.5 (hostPID excludes it).
        if spec.get("hostPID") != Some(&Value::Bool(true)) {
            set(spec, "shareProcessNamespace", Value::Bool(true));
        }
        // Time for the daemon to remove its rules and restore the NICs.
        set(spec, "terminationGracePeriodSeconds", Value::Number(60.into()));
    }
    seq_mut(spec, "volumes").extend(daemon::volumes(opts.mode));
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
    if opts.unprivileged && opts.mode != Mode::Node {
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
            "{} ({} nccl, {} GPU container{})",
            opts.mode.name(),
            opts.nccl.name(),
            gpu_count,
            if gpu_count == 1 { "" } else { "s" }
        ),
    );
    Ok(notes.join("; "))
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
/// (or stop there with `--uninject`). Returns the report line.
pub fn apply(tpl: &mut Value, opts: &Options, object: &str, at: &str) -> Result<String, InjectError> {
    if !tpl.is_mapping() {
        return Err(InjectError::field(object, at.trim_end_matches('.'), "not a pod template (a mapping)"));
    }
    let before = tpl.clone();
    let prior = match record(tpl) {
        Some(Ok(r)) => Some(r),
        Some(Err(text)) => {
            return Err(InjectError::field(
                object,
                format!("{at}metadata.annotations[{ANNOTATION}]"),
                format!("{text} is not a record this version reads"),
            ))
        }
        None => None,
    };
    if let Some(r) = &prior {
        remove(tpl, r);
    }
    if opts.uninject {
        return Ok(match prior {
            Some(r) => format!("removed ({} {} injection)", r.version, r.mode.name()),
            None => "not injected; unchanged".into(),
        });
    }
    let what = inject(tpl, opts, object, at)?;
    Ok(match prior {
        _ if *tpl == before => format!("already injected ({VERSION}, {}); unchanged", opts.mode.name()),
        Some(r) => format!("updated from {} {}: {what}", r.version, r.mode.name()),
        None => format!("injected: {what}"),
    })
}
