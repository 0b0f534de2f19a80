//! One pod template (`{metadata, spec}`): the change itself and its
//! record in [`ANNOTATION`], which says what was set at pod level and which
//! variables the containers already had, so that undoing
//! (`undo`) removes exactly what was added. Injecting again first
//! undoes the recorded change (`apply`), so a second run changes
//! nothing and a newer version replaces an older one in place.

use serde_norway::{Mapping, Value};

use super::checks::{self, Adds};
use super::daemon::{self, map, s, DaemonFlags};
use super::devices;
use super::lists::{seq_mut, LISTS};
use super::migrate;
use super::network::{self, Layout};
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
    let layout = network::layout(meta.get("annotations"), spec, opts.mode, object, at)?;
    checks::pod(spec, object, at)?;
    let asked = limits::check(spec, &opts.machine, object, at)?;
    if asked == 0 {
        return Ok(None);
    }
    let gpu_names: Vec<String> = LISTS
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_sequence))
        .flat_map(|cs| cs.iter().filter(|c| is_gpu(c)).map(name_of))
        .collect();
    // GKE's device annotation: inject's, or the Pod's own where it lists every device.
    let wants_devices = !opts.privileged && opts.mode != Mode::Node && opts.platform.gke_devices();
    let own_devices = match devices::given(meta.get("annotations")) {
        devices::Given::Short(why) if wants_devices => {
            let what = "the daemon needs the eight GPUs, /dev/nvidiactl and /dev/nvidia-uvm: add them, or \
                        remove the annotation (inject writes its own), or use --privileged, which needs none";
            let key = devices::device_annotation().0;
            return Err(err(format!("metadata.annotations[{key}]"), format!("{why}; {what}")));
        }
        given => wants_devices && given == devices::Given::All,
    };
    let devices = (wants_devices && !own_devices).then(devices::device_annotation);
    let reference = migrate::find(spec, object, at)?;
    // A converted daemon that ran this daemon's image keeps it, and its
    // requests stay, unless --image, --daemon-cpu, --daemon-memory say otherwise.
    let adopted;
    let mut requested = Vec::new();
    let opts = match &reference {
        Some(r) => {
            let mut o = opts.clone();
            if let Some(image) = r.image.as_ref().filter(|_| !opts.given.image) {
                o.image = image.clone();
            }
            let [cpu, memory] = &r.requests;
            for (given, mine, theirs, what) in [
                (opts.given.cpu, &mut o.cpu, cpu, "cpu"),
                (opts.given.memory, &mut o.memory, memory, "memory"),
            ] {
                if let (false, None, Some(v)) = (given, &mine, theirs) {
                    *mine = Some(v.clone());
                    requested.push(format!("{what} {v}"));
                }
            }
            adopted = o;
            &adopted
        }
        None => opts,
    };
    let mut carried = kept.to_vec();
    carried.extend(reference.iter().flat_map(|r| r.carried.iter().cloned()));
    let flags = DaemonFlags::new(opts, &carried)?;
    network::check_nics(&layout, &flags, &opts.machine, object, at)?;
    let uds = flags.uds_path();
    let nccl = match opts.nccl {
        Nccl::Inline => Some(machine::nccl_env(&opts.machine, &flags.parsed)?),
        _ => None,
    };
    let mut details = vec![layout.describe()];
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
            if r.privileged && !opts.privileged && opts.mode != Mode::Node {
                details.push(format!(
                    "{} {} ran privileged: true; inject's daemon does not (only the capabilities it needs, \
                     the GPUs through {gpus_via}): --privileged keeps privileged: true",
                    r.kind.describe(),
                    r.name,
                ));
            }
            details.extend(job_end(r, opts.mode));
            if !requested.is_empty() && opts.mode != Mode::Node {
                details.push(format!(
                    "daemon requests {}, as {} asked (--daemon-cpu and --daemon-memory replace them)",
                    requested.join(", "),
                    r.name
                ));
            }
            Some(text)
        }
        None => None,
    };
    if own_devices {
        details.push(format!(
            "GPUs: the Pod's own {} annotation lists every device the daemon needs; kept as it is",
            devices::device_annotation().0
        ));
    }
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
    let host = matches!(layout, Layout::Node { .. });
    // ClusterFirst, the API server's default, would give a host-network Pod
    // the node's resolver: it becomes ClusterFirstWithHostNet, recorded.
    if host && spec.get("hostNetwork").is_none() && spec.get("dnsPolicy") == Some(&s("ClusterFirst")) {
        spec.as_mapping_mut().expect("a mapping").insert(s("dnsPolicy"), s("ClusterFirstWithHostNet"));
        pod.push("dnsPolicy:ClusterFirst".into());
    }
    let mut set = |spec: &mut Value, key: &str, v: Value| {
        if spec.get(key).is_none() {
            spec.as_mapping_mut().expect("a mapping").insert(s(key), v);
            pod.push(key.to_string());
        }
    };
    // A multi-networking Pod stays in its own network namespace.
    if host {
        set(spec, "hostNetwork", Value::Bool(true));
        set(spec, "dnsPolicy", s("ClusterFirstWithHostNet"));
    }
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
    let mut volumes = daemon::volumes(opts);
    // In its own namespace, the Pod's socket folder stays the kind it was
    // (an emptyDir where hostPath is not allowed, on Autopilot).
    let kept_socket =
        reference.as_ref().and_then(|r| r.socket_volume.as_ref()).and_then(network::socket_volume);
    if let (false, Some(v)) = (host, kept_socket) {
        volumes.iter_mut().filter(|x| name_of(x) == "tcpx-socket").for_each(|x| *x = v.clone());
        details.push(format!(
            "socket folder: tcpx-socket is {}, the kind of volume the Pod's daemon kept its sockets in",
            if v.get("emptyDir").is_some() { "an emptyDir" } else { "a host path" }
        ));
    }
    seq_mut(spec, "volumes").extend(volumes.iter().cloned());
    let daemon_list = if opts.mode == Mode::NativeSidecar { "initContainers" } else { "containers" };
    if let Some(mut c) = daemon::container(opts, &flags) {
        if let Some(r) = &reference {
            keep_job_end_mount(&mut c, r)
                .map_err(|why| err(format!("spec.{}[{}].volumeMounts", r.list, r.name), why))?;
        }
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
    let warnings = super::report::warnings(opts, &flags, asked, !host);
    Ok(Some(Injected { summary, details, warnings, image: opts.image.clone() }))
}

/// The report's line on the job-end file a converted daemon's script waited for.
fn job_end(r: &migrate::Reference, mode: Mode) -> Option<String> {
    let (file, m) = r.script.as_ref()?.wait.as_ref()?;
    let (v, at) = (name_of(m), m.get("mountPath").and_then(Value::as_str).unwrap_or_default());
    Some(match mode {
        Mode::Node => format!(
            "job end: {}'s script waited for {file}; the node-wide daemon does not end with a job (volume \
             {v} stays with the workload)",
            r.name
        ),
        _ => format!(
            "job end: {}'s script waited for {file}; inject's daemon ends when it appears \
             (--shutdown_file={file}), volume {v} still mounted at {at}",
            r.name
        ),
    })
}

/// The mount of the job-end file a converted daemon's script waited for,
/// added to inject's daemon container; refused where that holds a mount at
/// its path already.
fn keep_job_end_mount(c: &mut Value, r: &migrate::Reference) -> Result<(), String> {
    let Some((file, m)) = r.script.as_ref().and_then(|s| s.wait.as_ref()) else { return Ok(()) };
    let at = |m: &Value| {
        m.get("mountPath").and_then(Value::as_str).unwrap_or_default().trim_end_matches('/').to_string()
    };
    let mounts = seq_mut(c, "volumeMounts");
    if let Some(ours) = mounts.iter().find(|x| at(x) == at(m)) {
        return Err(format!(
            "{} {}: its script waits for {file} on volume {} at {}, where inject's daemon mounts {} (its \
             own); mount that volume elsewhere in both containers, or convert this container by hand",
            r.kind.describe(),
            r.name,
            name_of(m),
            at(m),
            name_of(ours)
        ));
    }
    mounts.push(m.clone());
    Ok(())
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
