//! One pod template (`{metadata, spec}`): the change itself and its
//! record in [`ANNOTATION`], which says what was set at pod level and which
//! variables the containers already had, so that undoing
//! (`undo`) removes exactly what was added. Injecting again first
//! undoes the recorded change (`apply`), so a second run changes
//! nothing and a newer version replaces an older one in place.

use serde_norway::{Mapping, Value};

use super::checks::{self, Adds};
use super::daemon::{self, map, s, DaemonFlags};
use super::lists::{seq_mut, LISTS};
use super::migrate;
use super::record::{Record, GRACE_SECONDS};
use super::restore::{self, SAVED};
use super::{
    is_gpu, limits, machine, name_of, InjectError, Mode, Nccl, Options, ANNOTATION, DAEMON, VERSION,
};
use crate::nccl::env::CONFIGMAP_NAME;

/// What [`inject`] did to a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// The mode, the NCCL source, the GPU containers, in a few words.
    pub summary: String,
    /// What was added or changed beyond that, a line each.
    pub details: Vec<String>,
    /// What may not work as the author expects.
    pub warnings: Vec<String>,
    /// The daemon's image.
    pub image: String,
}

/// Adds TCPX to the template. `object` and `at` (the template's path, e.g.
/// `spec.template.`) name fields in errors. Returns what was done; `None`
/// when no container requests GPUs (nothing done).
/// `kept`: daemon flags of an earlier injection to keep ([`daemon::chosen`]).
pub fn inject(
    tpl: &mut Value,
    opts: &Options,
    object: &str,
    at: &str,
    kept: &[String],
) -> Result<Option<Injected>, InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    let meta = tpl.get("metadata").cloned().unwrap_or(Value::Null);
    let spec = match tpl.get_mut("spec") {
        Some(v) if v.is_mapping() => v,
        _ => return Err(err("spec".into(), "not a pod spec (a mapping)".into())),
    };
    // MIG: whole GPUs only.
    super::mig::refuse(spec, object, at)?;
    checks::pod(meta.get("annotations"), spec, object, at)?;
    let asked = limits::check(spec, &opts.machine, object, at)?;
    if asked == 0 {
        return Ok(None);
    }
    let gpu_names: Vec<String> = LISTS
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_sequence))
        .flat_map(|cs| cs.iter().filter(|c| is_gpu(c)).map(name_of))
        .collect();
    let devices = (!opts.privileged && opts.mode != Mode::Node && opts.platform.gke_devices())
        .then(daemon::device_annotation);
    if let Some((k, _)) =
        devices.as_ref().filter(|(k, _)| meta.get("annotations").and_then(|a| a.get(k.as_str())).is_some())
    {
        return Err(err(
            format!("metadata.annotations[{k}]"),
            "set already; inject writes its own, which gives the daemon its GPUs (remove it, or use \
             --privileged, which needs none)"
                .into(),
        ));
    }
    let reference = migrate::find(spec, object, at)?;
    // A converted daemon that ran this daemon's image keeps it, unless --image says otherwise.
    let adopted;
    let opts = match reference.as_ref().and_then(|r| r.image.as_ref()).filter(|_| !opts.given.image) {
        Some(image) => {
            adopted = Options { image: image.clone(), ..opts.clone() };
            &adopted
        }
        None => opts,
    };
    let mut carried = kept.to_vec();
    carried.extend(reference.iter().flat_map(|r| r.carried.iter().cloned()));
    let flags = DaemonFlags::new(opts, &carried)?;
    let uds = flags.uds_path();
    let nccl = match opts.nccl {
        Nccl::Inline => Some(machine::nccl_env(&opts.machine, &flags.parsed)?),
        _ => None,
    };
    let mut details = Vec::new();
    let gpus_via = if opts.platform.gke_devices() { "GKE's device annotation" } else { "the NVIDIA runtime" };
    let saved = match &reference {
        Some(r) => {
            let (line, text) = restore::remove(spec, r).map_err(|why| {
                err(
                    format!("spec.{}[{}]", r.list, r.name),
                    format!("{} to convert, but {why}", r.kind.describe()),
                )
            })?;
            details.push(line);
            if r.privileged && !opts.privileged {
                details.push(format!(
                    "{} {} ran privileged: true; inject's daemon does not (only the capabilities it needs, \
                     the GPUs through {gpus_via}): --privileged keeps privileged: true",
                    r.kind.describe(),
                    r.name,
                ));
            }
            Some(text)
        }
        None => None,
    };
    checks::names_free(spec, object, at)?;

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
    let path = |m: &Value| m.get("mountPath").and_then(Value::as_str).unwrap_or_default().to_string();
    if let Some(other) = mounts.iter().find(|m| name_of(m) != "tcpx-socket" && path(m) == uds) {
        return Err(InjectError::Option(format!(
            "--uds_path={uds}: where inject mounts its volume {} in the GPU containers; choose another \
             socket folder",
            name_of(other)
        )));
    }
    let adds = Adds { env: &ours, libraries, uds: &uds, mounts: &mounts, nccl: opts.nccl };
    let kept = checks::gpu_containers(spec, &adds, object, at)?;

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
    let volumes = daemon::volumes(opts);
    seq_mut(spec, "volumes").extend(volumes.iter().cloned());
    let daemon_list = if opts.mode == Mode::NativeSidecar { "initContainers" } else { "containers" };
    if let Some(c) = daemon::container(opts, &flags) {
        seq_mut(spec, daemon_list).insert(0, c);
    }
    let mut added = Vec::new();
    for list in LISTS {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_sequence_mut) else { continue };
        for c in cs.iter_mut().filter(|c| is_gpu(c) && name_of(c) != DAEMON) {
            let cn = name_of(c);
            let env = seq_mut(c, "env");
            let mut vars = Vec::new();
            for (n, v) in &ours {
                if !kept.contains(&format!("{cn}:{n}")) {
                    env.push(map(vec![("name", s(n)), ("value", s(v))]));
                    vars.push(n.clone());
                }
            }
            if opts.nccl == Nccl::ConfigMap && !kept.contains(&format!("{cn}:envFrom")) {
                let r = map(vec![("configMapRef", map(vec![("name", s(CONFIGMAP_NAME))]))]);
                seq_mut(c, "envFrom").push(r);
                vars.push(format!("envFrom ConfigMap {CONFIGMAP_NAME}"));
            }
            seq_mut(c, "volumeMounts").extend(mounts.iter().cloned());
            added.push((cn, vars));
        }
    }
    let mut annotations = vec![];
    if let Some((k, v)) = devices {
        annotations.push((k, v));
        pod.push("devices".into());
    }
    let rec = Record {
        version: VERSION.into(),
        mode: opts.mode,
        nccl: opts.nccl,
        pod,
        kept,
        converted: Some(saved.is_some()),
        platform: opts.platform.record_text(),
        privileged: opts.privileged && opts.mode != Mode::Node,
    };
    details.extend(super::report::details(opts, &flags, &rec, &volumes, &mounts, &added));
    annotations.push((ANNOTATION.to_string(), rec.text()));
    annotations.extend(saved.map(|t| (SAVED.to_string(), t)));
    annotate(tpl, annotations);
    let gpus = gpu_names.len();
    let summary = format!(
        "{} ({} nccl, {} GPU container{}{}{})",
        opts.mode.name(),
        opts.nccl.name(),
        gpus,
        if gpus == 1 { "" } else { "s" },
        if opts.platform.runtime_class().is_some() { ", gpu-operator" } else { "" },
        if opts.privileged && opts.mode != Mode::Node { ", privileged daemon (--privileged)" } else { "" }
    );
    let warnings = super::report::warnings(opts, &flags, asked);
    Ok(Some(Injected { summary, details, warnings, image: opts.image.clone() }))
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
