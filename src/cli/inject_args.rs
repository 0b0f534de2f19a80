//! The definitions of `inject` and `inject serve`, and their options as
//! those commands take them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

use super::daemon_args::{daemon_args_but, given_daemon_words};
use crate::config::absl::bool_arg;
use crate::config::flags::{OfferingNames, PRESET_NAMES};
use crate::inject::command::Invocation;
use crate::inject::serve::ServeConfig;
use crate::inject::webhook::OnError;
use crate::inject::{self, machine, Given, Mode, Nccl, Options};

const ABOUT: &str = "\
Adds GPUDirect-TCPX to every pod template in Kubernetes manifests: Pod, Job,
CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet, JobSet
(jobset.x-k8s.io/v1alpha2, every replicated job), Kubeflow PyTorchJob, TFJob,
XGBoostJob, PaddleJob, JAXJob, MPIJob, and Kubeflow Trainer TrainingRuntime
and ClusterTrainingRuntime (a TrainJob has no pod template: change its
runtime). A `List`'s items too. Other documents pass through unchanged.
Reads every -f in order, as kubectl does: a file, `-` for stdin (also
without -f), or a folder's .yaml, .yml and .json files in name order (its
subfolders' too with -R). Writes one YAML stream to stdout, and on stderr a
line per pod template saying what was added or changed (the network layout
and why, pod fields such as hostNetwork, the daemon's privileges and probe,
the volumes, each GPU container's variables and mounts).

The daemon runs where the GPU NICs are: in the Pod's own network namespace
for a Pod that GKE multi-networking gives them (networking.gke.io/interfaces;
no hostNetwork is added, the annotations stay), else on the node's network
(hostNetwork: true).

Only containers that request nvidia.com/gpu (resources.limits) get the
mounts, LD_LIBRARY_PATH and the NCCL settings; a template with none is left
unchanged and said so (a JobSet's CPU-only coordinator, say); with
--require-gpu, an object none of whose templates has a GPU container is an
error. A Pod asking for fewer GPUs than the machine has is warned about:
its daemon takes all of the node's TCPX NICs. A container asking
for MIG instances (nvidia.com/mig-*) or a Pod pinned to GKE's GPU partitions
is refused: TCPX needs whole GPUs. A Pod that runs a TCPX daemon already
(the reference tcpgpudmarxd, also from a `bash -c` script that waits for a
job-end file, or a tcpx-rxdm container written by hand) is converted, its
flags carried over, or refused naming the container and the flag; --uninject
gives it back. Running it again changes nothing: options
not given keep the values of the earlier injection (--mode, --nccl,
--image, ...), options given replace them.
Comments and formatting of the input are lost (the YAML is re-written).

DAEMON FLAGS are the daemon's own (`tcpx-rxdm --help`), spelt with
underscores, e.g. --rx_pool_size=2147483648 --log_level=debug: they go to the
daemon container, replacing the defaults of the same name, checked as the
daemon checks them. Flags for one process or one node (--show_version,
--takeover, --node_wide, ...) are refused. The probe follows
--metrics_address: an HTTP probe on its port where the daemon listens on
every address, else `tcpx-rxdm status mine` run in the daemon's container.";

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
        Arg::new("image")
            .long("image")
            .value_name("IMAGE")
            .default_value(inject::DEFAULT_IMAGE)
            .value_parser(inject::values::image)
            .help("The daemon's image, as your nodes pull it (build and push it from this repository's Dockerfile)"),
        bool_arg("privileged").help(
            "Run the daemon privileged: true, as inject did before least privilege, instead of with only \
             NET_ADMIN and the GPUs through the platform's device mechanism; only for a platform without \
             one (see deploy/README.md)",
        ),
        // The default now; kept so that scripts that ask for it still work.
        bool_arg("unprivileged").hide(true).conflicts_with("privileged"),
        Arg::new("platform")
            .long("platform")
            .value_name("PLATFORM")
            .default_value("gke")
            .value_parser(values(&[
                ("gke", "the driver and the NCCL plugin from GKE's /home/kubernetes/bin/nvidia/lib64"),
                (
                    "gpu-operator",
                    "the NVIDIA GPU Operator: runtime class nvidia, NVIDIA_VISIBLE_DEVICES=all, no GKE host path",
                ),
            ]))
            .help("Where the GPU driver and the NCCL plugin come from"),
        Arg::new("nccl_plugin")
            .long("nccl-plugin")
            .value_name("image:DIR|host:DIR")
            .help(
                "With --platform=gpu-operator, where the TCPX NCCL plugin is: in the workload's image at DIR, \
                 or in DIR on the node (mounted); without it the image's own library path must find it",
            ),
        Arg::new("daemon_cpu")
            .long("daemon-cpu")
            .value_name("QUANTITY")
            .value_parser(inject::values::cpu)
            .help("The daemon container's CPU request, a Kubernetes quantity (500m, 2)"),
        Arg::new("daemon_memory")
            .long("daemon-memory")
            .value_name("QUANTITY")
            .value_parser(inject::values::memory)
            .help("The daemon container's memory request, a Kubernetes quantity (512Mi, 2Gi)"),
    ]
}

/// The daemon flags inject refuses whatever their value: not on its
/// command line at all (nor offered by completion); given, they are refused
/// naming why ([`super::unknown_flag`]).
pub fn refused_in_a_pod(id: &str) -> bool {
    inject::pod_flags::not_for_a_pod(id).is_some()
}

/// `--gpu_nic_preset` for the daemon in a Pod: a preset file is in the
/// daemon's container, not where inject runs.
fn in_the_pod(a: Arg) -> Arg {
    a.value_parser(OfferingNames { inner: inject::pod_flags::preset, names: &PRESET_NAMES })
}

/// `inject`, with `serve` as its subcommand.
pub fn inject() -> Command {
    Command::new("inject")
        .about("Add GPUDirect-TCPX to the pod templates of Kubernetes manifests")
        .long_about(ABOUT)
        .override_usage(
            "tcpx-rxdm inject [-f FILE|DIR|-]... [-R] [OPTIONS] [DAEMON FLAGS]\n       \
             tcpx-rxdm inject serve --on-error=refuse|allow [OPTIONS] [DAEMON FLAGS]",
        )
        .args_override_self(true)
        .args_conflicts_with_subcommands(true)
        .arg(
            Arg::new("filename")
                .short('f')
                .long("filename")
                .value_name("FILE")
                .action(ArgAction::Append)
                .help("Input: a file, a folder's manifests, or `-` for stdin; again for more, read in order"),
        )
        .arg(bool_arg("recursive").short('R').help("With a folder for -f, its subfolders too"))
        // kubectl takes files only after -f: a file given bare is named, with the fix.
        .arg(Arg::new("bare").value_name("FILE").num_args(1..).hide(true))
        .args(shared_args())
        .arg(bool_arg("uninject").help("Remove what inject added, nothing else"))
        .arg(bool_arg("require_gpu").long("require-gpu").help(
            "Refuse (exit 1, nothing written) an object none of whose pod templates has a container that \
             requests nvidia.com/gpu",
        ))
        .args(daemon_args_but(refused_in_a_pod))
        .mut_arg("gpu_nic_preset", in_the_pod)
        .after_help(
            "Exit status: 0 written; 1 input refused (nothing written); 2 bad options.\n\n\
             `tcpx-rxdm inject serve --help`: the same change as an admission webhook.",
        )
        .subcommand(serve())
}

/// The options of `matches` (of [`shared_args`] and the daemon's flags).
pub fn options(m: &ArgMatches) -> Result<Options, String> {
    let text = |id: &str| m.get_one::<String>(id).cloned();
    let given = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    let d = Options::default();
    let platform = inject::platform::Platform::from_options(
        text("platform").as_deref(),
        text("nccl_plugin").as_deref(),
    )?;
    Ok(Options {
        mode: text("mode").and_then(|v| Mode::from_name(&v)).unwrap_or(d.mode),
        nccl: text("nccl").and_then(|v| Nccl::from_name(&v)).unwrap_or(d.nccl),
        image: text("image").unwrap_or(d.image),
        machine: text("machine").unwrap_or(d.machine),
        daemon_flags: given_daemon_words(m),
        privileged: m.get_flag("privileged"),
        cpu: text("daemon_cpu"),
        memory: text("daemon_memory"),
        uninject: m.try_get_one::<bool>("uninject").ok().flatten().copied().unwrap_or(false),
        platform,
        given: Given {
            mode: given("mode"),
            nccl: given("nccl"),
            image: given("image"),
            privileged: given("privileged") || given("unprivileged"),
            cpu: given("daemon_cpu"),
            memory: given("daemon_memory"),
            platform: given("platform") || given("nccl_plugin"),
        },
    })
}

/// What `inject` (not `serve`) was asked. The daemon's flags are checked
/// here, once, whatever the input holds.
pub fn invocation(m: &ArgMatches) -> Result<Invocation, String> {
    if let Some(f) = m.get_many::<String>("bare").and_then(|mut f| f.next()) {
        let path = f.contains(['.', '/']) || std::path::Path::new(f).exists();
        return Err(if path {
            format!("{f}: input files go after -f, as with kubectl (`tcpx-rxdm inject -f {f}`); `-f -` reads stdin")
        } else {
            format!("no command {f} (inject has one: serve); input files go after -f (`tcpx-rxdm inject -f FILE`)")
        });
    }
    let opts = options(m)?;
    check_daemon_flags(&opts)?;
    Ok(Invocation {
        opts,
        files: m.get_many::<String>("filename").into_iter().flatten().cloned().collect(),
        recursive: m.get_flag("recursive"),
        require_gpu: m.get_flag("require_gpu"),
    })
}

/// The daemon's flags as the mode asked for (or the default one) would
/// write them; each template's daemon is checked again with its own mode.
fn check_daemon_flags(opts: &Options) -> Result<(), String> {
    if opts.uninject {
        return Ok(());
    }
    inject::daemon::DaemonFlags::new(opts, &[]).map(drop).map_err(|e| e.to_string())
}

/// Seconds above 0 and below an hour (fractions allowed).
fn seconds(v: &str) -> Result<Duration, String> {
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 && s < 3600.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err("expected seconds, above 0 and below 3600".into()),
    }
}

/// `inject serve`: the server's options, then inject's.
pub fn serve() -> Command {
    Command::new("serve")
        .about("Apply inject to each new Pod, as a mutating admission webhook over HTTPS")
        .long_about(
            "A mutating admission webhook (admission.k8s.io/v1, JSONPatch) that applies `tcpx-rxdm \
             inject` with the inject options below to each Pod the API server sends to POST /mutate. \
             GET /healthz answers ok. The TLS files are read again when they change (certificate \
             rotation). A Pod with no GPU container passes unchanged.",
        )
        .override_usage("tcpx-rxdm inject serve --on-error=refuse|allow [OPTIONS] [DAEMON FLAGS]")
        .args_override_self(true)
        .arg(
            Arg::new("on_error")
                .long("on-error")
                .value_name("POLICY")
                .required(true)
                .value_parser([
                    PossibleValue::new("refuse").help("a Pod inject refuses is denied, with the reason"),
                    PossibleValue::new("allow").help("it is created unchanged, the reason as a warning"),
                ])
                .help("What happens to a Pod inject refuses (required: see the webhook's failurePolicy)"),
        )
        .arg(
            Arg::new("listen")
                .long("listen")
                .value_name("ADDR")
                .default_value("0.0.0.0:8443")
                .value_parser(|v: &str| {
                    v.parse::<SocketAddr>().map_err(|_| "expected IP:PORT, e.g. 0.0.0.0:8443")
                })
                .help("Address to serve HTTPS on"),
        )
        .arg(
            Arg::new("tls_cert")
                .long("tls-cert")
                .value_name("FILE")
                .default_value("/tls/tls.crt")
                .value_parser(clap::value_parser!(PathBuf))
                .help("The certificate chain (PEM)"),
        )
        .arg(
            Arg::new("tls_key")
                .long("tls-key")
                .value_name("FILE")
                .default_value("/tls/tls.key")
                .value_parser(clap::value_parser!(PathBuf))
                .help("The private key (PEM)"),
        )
        .arg(
            Arg::new("max_request_bytes")
                .long("max-request-bytes")
                .value_name("N")
                .default_value("4194304")
                .value_parser(clap::value_parser!(u64).range(1..=1 << 30))
                .help("Largest request body accepted"),
        )
        .arg(
            Arg::new("request_timeout")
                .long("request-timeout")
                .value_name("SECS")
                .default_value("5")
                .value_parser(seconds)
                .help("Time for a request's headers, and again for its body"),
        )
        .arg(
            Arg::new("reload_interval")
                .long("reload-interval")
                .value_name("SECS")
                .default_value("10")
                .value_parser(seconds)
                .help("Time between checks of the TLS files"),
        )
        .args(shared_args())
        .args(daemon_args_but(refused_in_a_pod))
        .mut_arg("gpu_nic_preset", in_the_pod)
        .after_help("Exit status: 0 stopped by SIGTERM or SIGINT; 1 could not serve; 2 bad options.")
}

/// The server's settings from the matches of [`command`]; the inject
/// options are checked here, once, not at the first Pod.
pub fn serve_config(m: &ArgMatches) -> Result<ServeConfig, String> {
    let on_error = match m.get_one::<String>("on_error").map(String::as_str) {
        Some("allow") => OnError::Allow,
        _ => OnError::Refuse,
    };
    let path = |id: &str| m.get_one::<PathBuf>(id).cloned().unwrap_or_default();
    let duration = |id: &str| m.get_one::<Duration>(id).copied().unwrap_or_default();
    let cfg = ServeConfig {
        listen: *m.get_one::<SocketAddr>("listen").expect("has a default"),
        cert: path("tls_cert"),
        key: path("tls_key"),
        // The webhook never injects a Pod twice, and its operator's options
        // decide: a converted daemon's image is not the Pod author's to choose.
        inject: Options { given: Given::ALL, ..options(m)? },
        on_error,
        max_body: usize::try_from(*m.get_one::<u64>("max_request_bytes").expect("has a default"))
            .unwrap_or(usize::MAX),
        timeout: duration("request_timeout"),
        reload_every: duration("reload_interval"),
    };
    inject::daemon::DaemonFlags::new(&cfg.inject, &[]).map_err(|e| e.to_string())?;
    Ok(cfg)
}
