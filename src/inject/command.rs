//! `tcpx-rxdm inject [-f FILE|-] [OPTIONS] [DAEMON FLAGS]`: YAML documents
//! in, the same documents out with TCPX added; a line per object on stderr.

use std::io::Read as _;

use serde::Deserialize as _;
use serde_norway::Value;

use super::{kinds, machine, InjectError, Mode, Nccl, Options};

pub const HELP: &str = "\
Usage: tcpx-rxdm inject [-f FILE|-] [OPTIONS] [DAEMON FLAGS]

Adds GPUDirect-TCPX to every pod template in Kubernetes manifests: Pod, Job,
CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet, JobSet
(jobset.x-k8s.io/v1alpha2, every replicated job), Kubeflow PyTorchJob, TFJob,
XGBoostJob, PaddleJob, JAXJob, MPIJob, and Kubeflow Trainer TrainingRuntime
and ClusterTrainingRuntime (a TrainJob has no pod template: change its
runtime). A `List`'s items too. Other documents pass through unchanged.
Reads FILE (or stdin for `-` or no -f), writes stdout, reports on stderr.

Only containers that request nvidia.com/gpu get the mounts, LD_LIBRARY_PATH
and the NCCL settings. A container asking for MIG instances (nvidia.com/mig-*)
or a Pod pinned to GKE's GPU partitions is refused: TCPX needs whole GPUs. A Pod that runs the reference tcpgpudmarxd is converted
(its flags carried over) or refused, naming the container. Running it again
changes nothing; a newer version replaces an older injection in place.
Comments and formatting of the input are lost (the YAML is re-written).

Options:
  -f, --filename FILE   input (`-`: stdin)
  --mode MODE           native-sidecar (default; Kubernetes >= 1.29): the daemon
                        as an init container that the workload waits for;
                        sidecar: a container beside the workload, which ends when
                        the workload touches <uds_path>/terminated or its last
                        client exited; node: no daemon in the Pod, the node-wide
                        daemon's socket folder (read-only) instead
  --nccl SOURCE         inline (default): the NCCL variables in each GPU
                        container, generated for --machine; configmap: envFrom
                        the ConfigMap `tcpx-rxdm nccl-env --format=configmap`
                        writes (run it on a node of the pool); file: none, the
                        workload sources <uds_path>/nccl.env that the daemon
                        writes for its node
  --machine TYPE        machine type of the nodes, for --nccl=inline
                        (default a3-highgpu-8g)
  --image IMAGE         the daemon's image (default tcpx-rxdm:VERSION of this build)
  --unprivileged        NET_ADMIN (and on GKE its device-injection annotation)
                        instead of privileged: true
  --platform PLATFORM   gke (default): the driver and the NCCL plugin from GKE's
                        /home/kubernetes/bin/nvidia/lib64; gpu-operator: the NVIDIA
                        GPU Operator's runtime class nvidia, the daemon with
                        NVIDIA_VISIBLE_DEVICES=all, no GKE host path
  --nccl-plugin image:DIR|host:DIR
                        with gpu-operator, where the TCPX NCCL plugin is: in the
                        workload's image at DIR (put on LD_LIBRARY_PATH), or in DIR
                        on the node (mounted at /usr/local/nvidia/lib64, put on
                        LD_LIBRARY_PATH); without it, the image's own library
                        path must find the plugin (LD_LIBRARY_PATH is left alone)
  --daemon-cpu Q, --daemon-memory Q
                        the daemon container's resource requests
  --uninject            remove what inject added, nothing else
  DAEMON FLAGS          the daemon's own flags (--name=value, with underscores,
                        e.g. --tenant_isolation=enforce --rx_pool_size=...),
                        replacing the defaults of the same name

Exit status: 0 written; 1 input refused (nothing written); 2 bad options.

`tcpx-rxdm inject serve --help`: the same change as an admission webhook.
";

/// Parses `inject`'s arguments (program and subcommand words removed).
/// `Ok(None)`: `--help`. Returns the options and the input file.
pub fn parse(args: &[String]) -> Result<Option<(Options, Option<String>)>, String> {
    let mut o = Options::default();
    let mut file = None;
    let (mut platform, mut plugin) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if a.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value =
            |flag: &str| inline.clone().or_else(|| it.next().cloned()).ok_or(format!("{flag} needs a value"));
        match name {
            "-h" | "--help" => return Ok(None),
            "-f" | "--filename" => file = Some(value(name)?),
            "--mode" => {
                let v = value(name)?;
                o.mode = Mode::from_name(&v).ok_or(format!(
                    "--mode: invalid value {v:?} (expected one of {})",
                    Mode::NAMES.join(", ")
                ))?;
            }
            "--nccl" => {
                let v = value(name)?;
                o.nccl = Nccl::from_name(&v).ok_or(format!(
                    "--nccl: invalid value {v:?} (expected one of {})",
                    Nccl::NAMES.join(", ")
                ))?;
            }
            "--machine" => {
                let v = value(name)?;
                if machine::view(&v).is_none() {
                    return Err(format!(
                        "--machine: unknown machine {v:?} (known: {})",
                        machine::NAMES.join(", ")
                    ));
                }
                o.machine = v;
            }
            "--image" => o.image = value(name)?,
            "--platform" => platform = Some(value(name)?),
            "--nccl-plugin" => plugin = Some(value(name)?),
            "--daemon-cpu" => o.cpu = Some(value(name)?),
            "--daemon-memory" => o.memory = Some(value(name)?),
            "--unprivileged" if inline.is_none() => o.unprivileged = true,
            "--uninject" if inline.is_none() => o.uninject = true,
            // The daemon's flags are spelt with underscores (absl style).
            _ if a.starts_with('-') && name.contains('_') => {
                o.daemon_flags.push(a.clone());
                let bare = name.trim_start_matches('-');
                let base = bare.strip_prefix("no").unwrap_or(bare);
                let boolean = crate::config::flags::BOOL_FLAGS;
                if inline.is_none() && !boolean.contains(&bare) && !boolean.contains(&base) {
                    o.daemon_flags.push(it.next().cloned().ok_or(format!("{name} needs a value"))?);
                }
            }
            _ if a.starts_with('-') && a != "-" => return Err(format!("unknown option {name}")),
            _ => return Err(format!("unexpected argument {a:?}")),
        }
    }
    o.platform = super::platform::Platform::from_options(platform.as_deref(), plugin.as_deref())?;
    Ok(Some((o, file)))
}

/// Every document of `text` with `opts` applied, and the report lines.
/// Nothing is returned unless every document was accepted.
pub fn transform(text: &str, opts: &Options) -> Result<(String, Vec<String>), InjectError> {
    let mut docs = Vec::new();
    for d in serde_norway::Deserializer::from_str(text) {
        let v = Value::deserialize(d).map_err(|e| InjectError::NotYaml(e.to_string()))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    let mut report = Vec::new();
    for d in &mut docs {
        kinds::apply_doc(d, opts, &mut report)?;
    }
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_norway::to_string(d).map_err(|e| InjectError::NotYaml(e.to_string()))?);
    }
    Ok((out, report))
}

/// Runs the command; returns the exit code.
pub fn main(args: &[String]) -> u8 {
    let (opts, file) = match parse(args) {
        Ok(Some(v)) => v,
        Ok(None) => {
            print!("{HELP}");
            return 0;
        }
        Err(e) => {
            eprintln!("tcpx-rxdm inject: {e}");
            return 2;
        }
    };
    let mut text = String::new();
    let read = match file.as_deref() {
        None | Some("-") => std::io::stdin().read_to_string(&mut text).map(|_| ()),
        Some(p) => std::fs::read_to_string(p).map(|t| text = t),
    };
    if let Err(e) = read {
        eprintln!("tcpx-rxdm inject: {}: {e}", file.as_deref().unwrap_or("stdin"));
        return 1;
    }
    match transform(&text, &opts) {
        Ok((out, report)) => {
            for line in report {
                eprintln!("{line}");
            }
            print!("{out}");
            0
        }
        Err(e) => {
            eprintln!("tcpx-rxdm inject: {e}; nothing written");
            if matches!(e, InjectError::Option(_)) {
                2
            } else {
                1
            }
        }
    }
}
