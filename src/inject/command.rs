//! `tcpx-rxdm inject [-f FILE|-] [OPTIONS] [DAEMON FLAGS]`: YAML documents
//! in, the same documents out with TCPX added; a line per object on stderr,
//! then what a person must know: templates left without TCPX for want of a
//! GPU container, and the daemon image when it was not chosen.

use std::io::Read as _;

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};
use serde::Deserialize as _;
use serde_norway::Value;

use super::template::Outcome;
use super::{kinds, machine, InjectError, Mode, Nccl, Options, GPU_RESOURCE, VERSION};
use crate::config::absl::{self, bool_arg};

/// What `inject` was asked, beyond what decides the change itself.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub opts: Options,
    /// The input file; `None` or `-`: stdin.
    pub file: Option<String>,
    /// A pod template without a GPU container is an error, not a note.
    pub require_gpu: bool,
    /// `--image` was given (else the default is named on stderr).
    pub image_given: bool,
}

const ABOUT: &str = "\
Adds GPUDirect-TCPX to every pod template in Kubernetes manifests: Pod, Job,
CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet, JobSet
(jobset.x-k8s.io/v1alpha2, every replicated job), Kubeflow PyTorchJob, TFJob,
XGBoostJob, PaddleJob, JAXJob, MPIJob, and Kubeflow Trainer TrainingRuntime
and ClusterTrainingRuntime (a TrainJob has no pod template: change its
runtime). A `List`'s items too. Other documents pass through unchanged.
Reads FILE (or stdin for `-` or no -f), writes stdout, reports on stderr.

Only containers that request nvidia.com/gpu (resources.limits) get the
mounts, LD_LIBRARY_PATH and the NCCL settings; a template with none is left
unchanged and said so (an error with --require-gpu). A Pod that runs the
reference tcpgpudmarxd is converted (its flags carried over) or refused,
naming the container. Running it again changes nothing; a newer version
replaces an older injection in place.
Comments and formatting of the input are lost (the YAML is re-written).

DAEMON FLAGS are the daemon's own (`tcpx-rxdm --help`), spelt with
underscores, e.g. --rx_pool_size=2147483648 --log_level=debug: they go to the
daemon container, replacing the defaults of the same name.";

/// Options `inject` and `inject serve` share: what is added, and how.
pub fn shared_args() -> Vec<Arg> {
    let values = |names: &[(&'static str, &'static str)]| {
        PossibleValuesParser::new(names.iter().map(|(n, h)| PossibleValue::new(*n).help(*h)))
    };
    vec![
        Arg::new("mode")
            .long("mode")
            .value_name("MODE")
            .default_value(Mode::NativeSidecar.name())
            .value_parser(values(&[
                (
                    "native-sidecar",
                    "the daemon as an init container the workload waits for (Kubernetes >= 1.29)",
                ),
                (
                    "sidecar",
                    "a container beside the workload, ended by <uds_path>/terminated or its last client",
                ),
                ("node", "no daemon in the Pod: the node-wide daemon's socket folder (read-only)"),
            ]))
            .help("How the daemon runs beside the workload"),
        Arg::new("nccl")
            .long("nccl")
            .value_name("SOURCE")
            .default_value(Nccl::Inline.name())
            .value_parser(values(&[
                ("inline", "the NCCL variables in each GPU container, generated for --machine"),
                ("configmap", "envFrom the ConfigMap `tcpx-rxdm nccl-env --format=configmap` writes"),
                ("file", "none: the workload sources <uds_path>/nccl.env that the daemon writes"),
            ]))
            .help("Where GPU containers get their NCCL settings"),
        Arg::new("machine")
            .long("machine")
            .value_name("TYPE")
            .default_value(machine::DEFAULT)
            .value_parser(PossibleValuesParser::new(machine::NAMES))
            .help("Machine type of the nodes, for --nccl=inline"),
        Arg::new("image").long("image").value_name("IMAGE").default_value(super::DEFAULT_IMAGE).help(
            "The daemon's image, as your nodes pull it (build and push it from this repository's Dockerfile)",
        ),
        bool_arg("unprivileged")
            .help("NET_ADMIN and GKE's device-injection annotation instead of privileged: true"),
        Arg::new("daemon_cpu")
            .long("daemon-cpu")
            .value_name("QUANTITY")
            .help("The daemon container's CPU request"),
        Arg::new("daemon_memory")
            .long("daemon-memory")
            .value_name("QUANTITY")
            .help("The daemon container's memory request"),
    ]
}

/// `inject`'s definition (`serve`, [`super::serve::command`], is added as its subcommand).
pub fn command() -> Command {
    Command::new("inject")
        .about("Add GPUDirect-TCPX to the pod templates of Kubernetes manifests")
        .long_about(ABOUT)
        .override_usage(
            "tcpx-rxdm inject [-f FILE|-] [OPTIONS] [DAEMON FLAGS]\n       \
             tcpx-rxdm inject serve --on-error=refuse|allow [OPTIONS] [DAEMON FLAGS]",
        )
        .args_override_self(true)
        .args_conflicts_with_subcommands(true)
        .arg(
            Arg::new("filename")
                .short('f')
                .long("filename")
                .value_name("FILE")
                .help("Input file (`-`: stdin)"),
        )
        .args(shared_args())
        .arg(bool_arg("uninject").help("Remove what inject added, nothing else"))
        .arg(bool_arg("require_gpu").long("require-gpu").help(
            "Refuse (exit 1, nothing written) a pod template with no container that requests nvidia.com/gpu",
        ))
        .args(absl::daemon_args(&[]))
        .after_help(
            "Exit status: 0 written; 1 input refused (nothing written); 2 bad options.\n\n\
             `tcpx-rxdm inject serve --help`: the same change as an admission webhook.",
        )
}

/// The options of `matches` (of [`shared_args`] and the daemon's flags).
pub fn options(m: &ArgMatches) -> Options {
    let text = |id: &str| m.get_one::<String>(id).cloned();
    let d = Options::default();
    Options {
        mode: text("mode").and_then(|v| Mode::from_name(&v)).unwrap_or(d.mode),
        nccl: text("nccl").and_then(|v| Nccl::from_name(&v)).unwrap_or(d.nccl),
        image: text("image").unwrap_or(d.image),
        machine: text("machine").unwrap_or(d.machine),
        daemon_flags: absl::given_daemon_words(m),
        unprivileged: m.get_flag("unprivileged"),
        cpu: text("daemon_cpu"),
        memory: text("daemon_memory"),
        uninject: m.try_get_one::<bool>("uninject").ok().flatten().copied().unwrap_or(false),
    }
}

/// What `inject` (not `serve`) was asked.
pub fn invocation(m: &ArgMatches) -> Invocation {
    Invocation {
        opts: options(m),
        file: m.get_one::<String>("filename").cloned(),
        require_gpu: m.get_flag("require_gpu"),
        image_given: m.value_source("image") == Some(ValueSource::CommandLine),
    }
}

/// Every document of `text` with `opts` applied, and the report lines.
/// Nothing is returned unless every document was accepted.
pub fn transform(text: &str, opts: &Options) -> Result<(String, Vec<String>), InjectError> {
    let (out, applied) = transform_all(text, opts)?;
    Ok((out, applied.into_iter().map(|a| a.line).collect()))
}

/// [`transform`] with what was done to each template.
pub fn transform_all(text: &str, opts: &Options) -> Result<(String, Vec<kinds::Applied>), InjectError> {
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

/// What stderr says after the per-object lines: templates left without
/// TCPX, and where the daemon image comes from. Empty when all is said.
pub fn advice(applied: &[kinds::Applied], inv: &Invocation) -> Vec<String> {
    let mut out = Vec::new();
    let no_gpu = applied.iter().filter(|a| a.outcome == Outcome::NoGpu).count();
    let injected = applied.iter().filter(|a| a.outcome.has_tcpx()).count();
    if no_gpu > 0 {
        let which = if injected == 0 {
            "nothing was injected: no pod template has a container that requests".to_string()
        } else {
            format!("{no_gpu} pod template(s) left without TCPX: no container requests")
        };
        out.push(format!(
            "{which} {GPU_RESOURCE}. TCPX goes only to GPU containers: add `resources: {{limits: \
             {{{GPU_RESOURCE}: 8}}}}` to the container that runs NCCL and run inject again \
             (--require-gpu makes this an error)."
        ));
    }
    let daemon_image = inv.opts.mode != Mode::Node && !inv.opts.uninject && injected > 0;
    if daemon_image && !inv.image_given {
        let image = &inv.opts.image;
        out.push(format!(
            "the daemon container's image is {image}, the default, which no public registry serves: \
             build it from this repository and push it where your nodes pull from \
             (`docker build -t REGISTRY/tcpx-rxdm:{VERSION} . && docker push REGISTRY/tcpx-rxdm:{VERSION}`), \
             then pass --image=REGISTRY/tcpx-rxdm:{VERSION}."
        ));
    }
    out
}

/// Runs the command; returns the exit code.
pub fn main(inv: Invocation) -> u8 {
    let mut text = String::new();
    let read = match inv.file.as_deref() {
        None | Some("-") => std::io::stdin().read_to_string(&mut text).map(|_| ()),
        Some(p) => std::fs::read_to_string(p).map(|t| text = t),
    };
    if let Err(e) = read {
        eprintln!("tcpx-rxdm inject: {}: {e}", inv.file.as_deref().unwrap_or("stdin"));
        return 1;
    }
    let (out, applied) = match transform_all(&text, &inv.opts) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("tcpx-rxdm inject: {e}; nothing written");
            return if matches!(e, InjectError::Option(_)) { 2 } else { 1 };
        }
    };
    for a in &applied {
        eprintln!("{}", a.line);
    }
    if inv.require_gpu && !inv.opts.uninject {
        if let Some(a) = applied.iter().find(|a| a.outcome == Outcome::NoGpu) {
            eprintln!(
                "tcpx-rxdm inject: {}: no container requests {GPU_RESOURCE} (--require-gpu); nothing written",
                a.place
            );
            return 1;
        }
    }
    for line in advice(&applied, &inv) {
        eprintln!("tcpx-rxdm inject: {line}");
    }
    print!("{out}");
    0
}
