//! `tcpx-rxdm inject`: TCPX added to every pod template of a set of
//! Kubernetes manifests, and taken out again (`--uninject`). Pure functions
//! over YAML values, so that any front end (the command, an admission
//! webhook) applies the same change.
//!
//! - [`kinds`]: where each kind keeps its pod templates.
//! - [`template`]: one pod template: the checks and the change itself,
//!   recorded in an annotation; [`undo`]: its undoing; [`apply`]: a
//!   template injected again (the earlier injection's options kept unless
//!   given again), or taken out.
//! - [`record`]: that annotation (never trusted to remove what it names),
//!   and what was done to a template.
//! - [`migrate`]: a TCPX daemon the Pod already runs, converted;
//!   [`script`]: one a shell script starts (`bash -c`), read;
//!   [`restore`]: kept in the template, and given back by `--uninject`.
//! - [`network`]: which network namespace the daemon runs in: the node's,
//!   or the Pod's own where GKE multi-networking gives it the GPU NICs.
//! - [`daemon`]: the daemon container of each mode and its flags;
//!   [`devices`]: GKE's device annotation that gives it the GPUs;
//!   [`pod_flags`]: the daemon flags that make no sense in a Pod;
//!   [`probe`]: its probes, which follow `--metrics_address`.
//! - [`values`]: inject's own option values (image, quantities).
//! - [`lists`]: the lists and mappings inject creates, empties and removes.
//! - [`limits`]: the GPUs and containers a Pod may ask for.
//! - [`machine`]: machine profiles, the node view that the NCCL settings are
//!   generated for when a manifest is written off the node.
//! - [`platform`]: GKE or the NVIDIA GPU Operator: where the driver and the
//!   NCCL plugin come from.
//! - [`mig`]: the refusal of MIG instances and GKE's GPU partitions.
//! - [`command`]: the command line, documents in and out, the report.
//! - [`webhook`]: an `AdmissionReview` in, its response (a JSONPatch) out.
//! - [`patch`]: the JSONPatch from the Pod sent to the Pod injected.
//! - [`serve`]: `inject serve`, the webhook over HTTPS; [`transport`]: what
//!   bounds a client there (buffered bytes, a reply's write time);
//!   [`certs`]: its certificate, read again when its files change.

pub mod apply;
pub mod certs;
pub mod checks;
pub mod command;
pub mod daemon;
pub mod devices;
pub mod files;
pub mod kinds;
pub mod limits;
pub mod lists;
pub mod machine;
pub mod mig;
pub mod migrate;
pub mod network;
pub mod patch;
pub mod platform;
pub mod pod_flags;
pub mod probe;
pub mod record;
pub mod report;
pub mod restore;
pub mod script;
pub mod serve;
pub mod template;
pub mod transport;
pub mod undo;
pub mod values;
pub mod webhook;

use serde_norway::Value;

/// The annotation on each changed pod template: version, mode, and what was
/// set at pod level, so that `--uninject` removes exactly that.
pub const ANNOTATION: &str = "tcpx-rxdm.io/injected";
/// The daemon container's name.
pub const DAEMON: &str = "tcpx-daemon";
/// Resource name that marks a container as a GPU container.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Where the NVIDIA libraries are mounted (and `LD_LIBRARY_PATH` points).
pub const LIBRARIES: &str = "/usr/local/nvidia/lib64";
/// The daemon's own version, recorded in the annotation.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The daemon image when `--image` is not given: this build's name and
/// version, which no public registry serves (inject says so).
pub const DEFAULT_IMAGE: &str = concat!("tcpx-rxdm:", env!("CARGO_PKG_VERSION"));

/// How the daemon runs beside the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// An init container with `restartPolicy: Always` (Kubernetes >= 1.29).
    NativeSidecar,
    /// A container next to the workload, ended by the job-end handshake.
    Sidecar,
    /// No daemon in the Pod: the node-wide daemon's socket folder.
    Node,
}

impl Mode {
    pub const NAMES: [&'static str; 3] = ["native-sidecar", "sidecar", "node"];

    pub fn name(self) -> &'static str {
        match self {
            Mode::NativeSidecar => "native-sidecar",
            Mode::Sidecar => "sidecar",
            Mode::Node => "node",
        }
    }

    pub fn from_name(s: &str) -> Option<Mode> {
        [Mode::NativeSidecar, Mode::Sidecar, Mode::Node].into_iter().find(|m| m.name() == s)
    }
}

/// Where GPU containers get their NCCL settings from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nccl {
    /// Each variable in the container's `env`, for the `--machine` profile.
    Inline,
    /// `envFrom` the ConfigMap that `nccl-env --format=configmap` writes.
    ConfigMap,
    /// Nothing in the spec: the workload sources `<uds_path>/nccl.env`,
    /// which the daemon writes for the node it runs on.
    File,
}

impl Nccl {
    pub const NAMES: [&'static str; 3] = ["inline", "configmap", "file"];

    pub fn name(self) -> &'static str {
        match self {
            Nccl::Inline => "inline",
            Nccl::ConfigMap => "configmap",
            Nccl::File => "file",
        }
    }

    pub fn from_name(s: &str) -> Option<Nccl> {
        [Nccl::Inline, Nccl::ConfigMap, Nccl::File].into_iter().find(|m| m.name() == s)
    }
}

/// Everything that decides what is added.
#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub nccl: Nccl,
    pub image: String,
    /// The machine profile for `Nccl::Inline`.
    pub machine: String,
    /// The daemon's flags given by the user (`--name[=value]` words).
    pub daemon_flags: Vec<String>,
    /// `--privileged`: the daemon as before least privilege, `privileged: true`.
    pub privileged: bool,
    /// The daemon container's `resources.requests` (`cpu`, `memory`).
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub uninject: bool,
    /// The cluster's GPU stack (`--platform`, `--nccl-plugin`).
    pub platform: platform::Platform,
    /// Which options were given: on a template injected before, those not
    /// given keep the earlier injection's values.
    pub given: Given,
}

/// Options given on the command line (or by a caller that sets them all).
/// Daemon flags are not here: an earlier injection's are always kept, each
/// given again replacing its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Given {
    pub mode: bool,
    pub nccl: bool,
    pub image: bool,
    pub privileged: bool,
    /// `--daemon-cpu`, `--daemon-memory`.
    pub cpu: bool,
    pub memory: bool,
    pub platform: bool,
}

impl Given {
    /// Every option given: the options decide alone.
    pub const ALL: Given = Given {
        mode: true,
        nccl: true,
        image: true,
        privileged: true,
        cpu: true,
        memory: true,
        platform: true,
    };
    /// None given: on a template injected before, every option keeps the
    /// earlier injection's value (`tcpx-rxdm inject -f out.yaml`).
    pub const NONE: Given = Given {
        mode: false,
        nccl: false,
        image: false,
        privileged: false,
        cpu: false,
        memory: false,
        platform: false,
    };
}

impl Default for Options {
    fn default() -> Options {
        Options {
            mode: Mode::NativeSidecar,
            nccl: Nccl::Inline,
            image: DEFAULT_IMAGE.to_string(),
            machine: machine::DEFAULT.to_string(),
            daemon_flags: Vec::new(),
            privileged: false,
            cpu: None,
            memory: None,
            uninject: false,
            platform: platform::Platform::Gke,
            given: Given::ALL,
        }
    }
}

/// Why a manifest was refused; names the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    #[error("input is not YAML: {0}")]
    NotYaml(String),
    #[error("{object}: {field}: {why}")]
    Field { object: String, field: String, why: String },
    /// The object as a whole (its size, its shape).
    #[error("{object}: {why}")]
    Object { object: String, why: String },
    /// A bad option (exit 2 rather than 1).
    #[error("{0}")]
    Option(String),
}

impl InjectError {
    pub fn field(object: &str, field: impl Into<String>, why: impl Into<String>) -> InjectError {
        InjectError::Field { object: object.to_string(), field: field.into(), why: why.into() }
    }
}

/// `Kind/name` (with the namespace when set), for messages.
pub fn object_name(doc: &Value) -> String {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("(no kind)");
    let meta = doc.get("metadata");
    let name = meta
        .and_then(|m| m.get("name").or_else(|| m.get("generateName")))
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    match meta.and_then(|m| m.get("namespace")).and_then(Value::as_str) {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// Whether a container asks for GPUs.
pub fn is_gpu(c: &Value) -> bool {
    limits::gpus(c) > 0
}

pub fn name_of(c: &Value) -> String {
    c.get("name").and_then(Value::as_str).unwrap_or("?").to_string()
}

/// Longest text from a manifest quoted in a message.
const SHOWN: usize = 80;

/// A text from the manifest, quoted and cut short, for messages.
pub fn show_str(t: &str) -> String {
    match t.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}…", &t[..cut]),
        None => format!("{t:?}"),
    }
}

/// A value from the manifest as JSON, cut short, for messages.
pub fn show(v: &Value) -> String {
    if let Value::String(t) = v {
        return show_str(t);
    }
    let t = serde_json::to_string(v).unwrap_or_else(|_| "(a YAML value with no JSON form)".into());
    match t.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &t[..cut]),
        None => t,
    }
}
