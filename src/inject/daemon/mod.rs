//! The daemon container of each mode, its flags, and the volumes it needs.

use serde_norway::{Mapping, Value};

use super::pod_flags::{self, not_for_a_pod};
use super::probe::Probe;
use super::{InjectError, Mode, Options, DAEMON, LIBRARIES};
use crate::caps::Cap;
use crate::config::flags::{Flags, BOOL_FLAGS};

/// The reference daemon's binary, which the image keeps as an alias: the
/// classic sidecar keeps the GKE guide's command line.
pub const REFERENCE_BIN: &str = "/tcpgpudmarxd/build/app/tcpgpudmarxd";
/// Where the daemon finds the host's /sys and /proc/sys: volume, host path,
/// mount path, read-only. `/sys` is only read (topology, NIC attributes);
/// of `/proc/sys` only `net` is written (host tuning): the rest of it is
/// not the daemon's to change, and root may write much of it with no
/// capability at all (`kernel.core_pattern` runs a program as the host's root).
const HOST_MOUNTS: [(&str, &str, &str, bool); 2] = [
    ("tcpx-sys", "/sys", "/hostsysfs", true),
    ("tcpx-proc-sys", "/proc/sys/net", "/hostprocsysfs/net", false),
];
/// The same with `--privileged`, as before least privilege: both whole and writable.
const PRIVILEGED_HOST_MOUNTS: [(&str, &str, &str, bool); 2] =
    [("tcpx-sys", "/sys", "/hostsysfs", false), ("tcpx-proc-sys", "/proc/sys", "/hostprocsysfs", false)];

fn host_mounts(opts: &Options) -> [(&'static str, &'static str, &'static str, bool); 2] {
    if opts.privileged {
        PRIVILEGED_HOST_MOUNTS
    } else {
        HOST_MOUNTS
    }
}
/// The classic sidecar's health log, read by the workload's ready loop.
pub const HEALTH_DIR: &str = "/run/tcpx-health";
/// Names of the volumes inject may add (reserved: a Pod that has one of
/// its own is refused).
pub const VOLUMES: [&str; 5] = ["tcpx-libraries", "tcpx-sys", "tcpx-proc-sys", "tcpx-socket", "tcpx-health"];
/// The node-wide daemon's socket folder on the host.
pub const NODE_SOCKET_DIR: &str = "/run/tcpx";

pub use super::lists::{map, s};

fn list(items: Vec<Value>) -> Value {
    Value::Sequence(items)
}

/// One daemon flag: its name (no dashes) and value (`None`: a boolean form).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Flag {
    name: String,
    value: Option<String>,
}

impl Flag {
    fn new(name: &str, value: &str) -> Flag {
        Flag { name: name.into(), value: Some(value.into()) }
    }

    /// The flag's name as a key: `nofoo` and `foo` are one flag.
    fn key(&self) -> &str {
        let n = self.name.as_str();
        match n.strip_prefix("no") {
            Some(b) if self.value.is_none() && BOOL_FLAGS.contains(&b) => b,
            _ => n,
        }
    }

    fn word(&self) -> String {
        match &self.value {
            Some(v) => format!("--{}={v}", self.name),
            None => format!("--{}", self.name),
        }
    }
}

/// Splits `--name=value`, `--name value` and boolean `--name` words.
fn parse_words(words: &[String]) -> Result<Vec<Flag>, InjectError> {
    let mut out = Vec::new();
    let mut it = words.iter();
    while let Some(w) = it.next() {
        let Some(f) = w.strip_prefix("--").or_else(|| w.strip_prefix('-')) else {
            return Err(InjectError::Option(format!("daemon flag \"{w}\": expected --name[=value]")));
        };
        match f.split_once('=') {
            Some((n, v)) => out.push(Flag::new(n, v)),
            None => {
                let base = f.strip_prefix("no").unwrap_or(f);
                if BOOL_FLAGS.contains(&f) || BOOL_FLAGS.contains(&base) {
                    out.push(Flag { name: f.into(), value: None });
                } else {
                    let v = it.next().ok_or_else(|| InjectError::Option(format!("--{f} needs a value")))?;
                    out.push(Flag::new(f, v));
                }
            }
        }
    }
    Ok(out)
}

/// The daemon's flags for `opts`: the mode's defaults, the user's flags
/// replacing those of the same name, then the user's others. The first
/// `core` of them form the GKE guide's command line in the classic sidecar.
pub struct DaemonFlags {
    list: Vec<Flag>,
    /// As the daemon reads them; a preset file (`preset_file`) as `auto`.
    pub parsed: Flags,
    /// `--gpu_nic_preset` names a file, read on the node.
    pub preset_file: Option<String>,
}

/// Flags the guide's command line holds, in its order.
const CORE: [&str; 4] = ["gpu_nic_preset", "gpu_shmem_type", "uds_path", "setup_param"];

/// Inject's values for [`CORE`], in its order: the guide's.
const CORE_DEFAULTS: [&str; 4] = ["a3vm", "fd", "/run/tcpx", "--verbose 128 2 0"];

/// `\"--verbose 128 2 0 \"` (quotes kept literally, as the guide writes it) → `--verbose 128 2 0`.
pub fn unquote(v: &str) -> String {
    v.trim_matches(|c: char| c == '\\' || c == '"' || c == '\'' || c.is_whitespace()).to_string()
}

/// The daemon's flags inject writes for `mode` when given none.
fn defaults(mode: Mode) -> Vec<Flag> {
    let mut list: Vec<Flag> = CORE.iter().zip(CORE_DEFAULTS).map(|(n, v)| Flag::new(n, v)).collect();
    // A daemon in the Pod serves only the Pod: one tenant, nothing to
    // keep apart (IPv6 flows are still repaired).
    let own = || Flag::new("tenant_isolation", "off");
    match mode {
        Mode::NativeSidecar => {
            list.push(own());
            list.push(Flag::new("metrics_address", "0.0.0.0:9467"));
            // The kubelet ends the daemon; clients coming and going must not.
            list.push(Flag { name: "nomonitor_shutdown".into(), value: None });
        }
        Mode::Sidecar => {
            list.push(own());
            list.push(Flag::new("shutdown_file", "terminated"));
            list.push(Flag { name: "shutdown_when_all_clients_exited".into(), value: None });
            list.push(Flag::new("wait_time_before_exit", "30"));
            list.push(Flag::new("metrics_address", "0.0.0.0:9467"));
        }
        Mode::Node => return vec![Flag::new("uds_path", NODE_SOCKET_DIR)],
    }
    list
}

/// The flags of a daemon container inject wrote for `mode` (its command
/// line's words, the binary left out) that differ from what inject writes
/// for that mode anyway: what the user asked for then, or what was carried
/// over from a converted daemon. Injecting again keeps them.
pub fn chosen(mode: Mode, words: &[String]) -> Vec<String> {
    let words: Vec<String> = words.iter().skip_while(|w| !w.starts_with('-')).cloned().collect();
    let Ok(flags) = parse_words(&words) else { return Vec::new() };
    let defaults = defaults(mode);
    flags
        .into_iter()
        .map(|f| match (f.key(), &f.value) {
            // The classic sidecar's quoted form of the guide.
            ("setup_param", Some(v)) => Flag::new(&f.name, &unquote(v)),
            _ => f,
        })
        .filter(|f| !defaults.contains(f))
        .map(|f| f.word())
        .collect()
}

impl DaemonFlags {
    /// The flags for `opts`: the mode's defaults, then `carried` (from a
    /// daemon the Pod had: converted, or inject's own of an earlier run),
    /// then the user's. Each replaces the one of the same name.
    pub fn new(opts: &Options, carried: &[String]) -> Result<DaemonFlags, InjectError> {
        let mut list = defaults(opts.mode);
        let mut carried = parse_words(carried)?;
        let user = parse_words(&opts.daemon_flags)?;
        if let Some((f, why)) = user.iter().find_map(|f| Some((f, not_for_a_pod(f.key())?))) {
            return Err(InjectError::Option(format!("--{}: {why}", f.name)));
        }
        if opts.mode == Mode::Node {
            if let Some(f) = user.iter().find(|f| f.key() != "uds_path") {
                return Err(InjectError::Option(format!(
                    "--{}: with --mode=node the Pod has no daemon of its own; only --uds_path (where the \
                     workload finds the node daemon's sockets) applies. The node-wide daemon's flags are \
                     set in its DaemonSet (deploy/kubernetes/daemonset.yaml)",
                    f.name
                )));
            }
            // The node-wide daemon has flags of its own: of a daemon the
            // Pod had, only its socket folder (where the workload looks) stays.
            carried.retain(|f| f.key() == "uds_path");
        }
        for f in carried.into_iter().chain(user) {
            match list.iter_mut().find(|g| g.key() == f.key()) {
                Some(g) => *g = f,
                None => list.push(f),
            }
        }
        // The level as the daemon names it (`warning` → `warn`).
        for f in list.iter_mut().filter(|f| f.key() == "log_level") {
            let level =
                pod_flags::log_level(f.value.as_deref().unwrap_or_default()).map_err(InjectError::Option)?;
            f.value = Some(level.to_string());
        }
        // A preset file is read on the node, not where inject runs: parsed
        // here as `auto` (the machine's preset), its path kept in the Pod.
        let preset_file = list
            .iter()
            .find(|f| f.key() == "gpu_nic_preset")
            .and_then(|f| f.value.clone())
            .filter(|v| pod_flags::is_preset_file(v));
        let words = list.iter().map(|f| match (&preset_file, f.key()) {
            (Some(_), "gpu_nic_preset") => "--gpu_nic_preset=auto".to_string(),
            _ => f.word(),
        });
        let argv = std::iter::once("tcpx-rxdm".to_string()).chain(words);
        let parsed = Flags::parse_args(argv).map_err(|e| {
            let text = e.to_string();
            InjectError::Option(format!(
                "daemon flags: {}",
                text.lines().next().unwrap_or_default().trim_start_matches("error: ")
            ))
        })?;
        if parsed.node_wide && opts.mode != Mode::Node {
            return Err(InjectError::Option("--node_wide: a node-wide daemon is --mode=node".into()));
        }
        if opts.mode != Mode::Node {
            pod_flags::check(&parsed, opts.mode).map_err(InjectError::Option)?;
            match &preset_file {
                Some(file) if opts.nccl == super::Nccl::Inline => {
                    return Err(InjectError::Option(format!(
                        "--gpu_nic_preset={file}: a preset file is read on the node, so inject cannot write \
                         the NCCL settings for it: use --nccl=file (the daemon writes them on the node) or \
                         --nccl=configmap"
                    )))
                }
                Some(_) => {}
                None => pod_flags::topology(&parsed).map_err(InjectError::Option)?,
            }
        }
        Ok(DaemonFlags { list, parsed, preset_file })
    }

    pub fn uds_path(&self) -> String {
        self.parsed.uds_path.to_string_lossy().trim_end_matches('/').to_string()
    }

    /// How the kubelet learns that this daemon is ready.
    pub fn probe(&self) -> Probe {
        Probe::for_flags(&self.parsed)
    }
}

/// The pod's volumes for the mode and platform, each `(name, volume)`.
pub fn volumes(opts: &Options) -> Vec<Value> {
    let host =
        |name: &str, path: &str| map(vec![("name", s(name)), ("hostPath", map(vec![("path", s(path))]))]);
    let empty = |name: &str| map(vec![("name", s(name)), ("emptyDir", Value::Mapping(Mapping::new()))]);
    let mut v: Vec<Value> = opts.platform.library_volume().into_iter().collect();
    match opts.mode {
        Mode::NativeSidecar => {
            v.extend(host_mounts(opts).iter().map(|(n, p, _, _)| host(n, p)));
            v.push(empty("tcpx-socket"));
        }
        Mode::Sidecar => {
            v.extend(host_mounts(opts).iter().map(|(n, p, _, _)| host(n, p)));
            v.push(host("tcpx-socket", "/run/tcpx"));
            v.push(empty("tcpx-health"));
        }
        Mode::Node => v.push(map(vec![
            ("name", s("tcpx-socket")),
            ("hostPath", map(vec![("path", s(NODE_SOCKET_DIR)), ("type", s("Directory"))])),
        ])),
    }
    v
}

fn mount(name: &str, path: &str, read_only: bool) -> Value {
    let mut m = vec![("name", s(name)), ("mountPath", s(path))];
    if read_only {
        m.push(("readOnly", Value::Bool(true)));
    }
    map(m)
}

/// The mounts every GPU container gets.
pub fn workload_mounts(opts: &Options, uds: &str) -> Vec<Value> {
    let mode = opts.mode;
    let mut v = Vec::new();
    if opts.platform.library_volume().is_some() {
        v.push(mount("tcpx-libraries", LIBRARIES, true));
    }
    v.push(mount("tcpx-socket", uds, mode == Mode::Node));
    if mode == Mode::Sidecar {
        v.push(mount("tcpx-health", HEALTH_DIR, true));
    }
    v
}

fn env(name: &str, value: &str) -> Value {
    map(vec![("name", s(name)), ("value", s(value))])
}

/// The capabilities a daemon in a Pod needs (`SECURITY.md`, *Privileges*):
/// `NET_ADMIN` for the NICs, the dma-buf bind and the route metrics, and
/// `NET_BIND_SERVICE` for an HTTP port below 1024. It serves one Pod with
/// isolation off, so it reads no other user's process (`SYS_PTRACE`), and
/// gives the sockets no group of their own unless told to (`CHOWN`).
pub fn capabilities(flags: &Flags) -> Vec<Cap> {
    let mut caps = vec![Cap::NetAdmin];
    if flags.metrics_address.0.is_some_and(|a| a.port() != 0 && a.port() < 1024) {
        caps.push(Cap::NetBindService);
    }
    if flags.socket_group.is_some() {
        caps.push(Cap::Chown);
    }
    caps
}

/// The daemon container's privileges: written here only, so that a Pod's
/// daemon has the same wherever inject writes one. Not privileged: every
/// capability dropped but [`capabilities`], no privilege escalation, a
/// read-only root (it writes only to its volumes), the runtime's default
/// seccomp profile. `--privileged`: as before, `privileged: true` alone.
pub fn security_context(opts: &Options, flags: &Flags) -> Value {
    if opts.privileged {
        return map(vec![("privileged", Value::Bool(true))]);
    }
    let add = capabilities(flags).into_iter().map(|c| s(c.short_name())).collect();
    map(vec![
        ("privileged", Value::Bool(false)),
        ("allowPrivilegeEscalation", Value::Bool(false)),
        ("capabilities", map(vec![("drop", list(vec![s("ALL")])), ("add", list(add))])),
        ("readOnlyRootFilesystem", Value::Bool(true)),
        ("seccompProfile", map(vec![("type", s("RuntimeDefault"))])),
    ])
}

/// What [`security_context`] gives the daemon, for the report.
pub fn describe_privileges(opts: &Options, flags: &Flags) -> String {
    if opts.privileged {
        return "privileged: true (--privileged)".into();
    }
    let caps: Vec<&str> = capabilities(flags).into_iter().map(Cap::short_name).collect();
    let gpus = match opts.platform.gke_devices() {
        true => "GKE's device annotation",
        false => "the NVIDIA runtime",
    };
    format!(
        "not privileged: {} {} only, a read-only root, seccomp RuntimeDefault, the GPUs through {gpus}",
        if caps.len() == 1 { "capability" } else { "capabilities" },
        caps.join(", ")
    )
}

/// The daemon container (none in node mode).
pub fn container(opts: &Options, flags: &DaemonFlags) -> Option<Value> {
    let uds = flags.uds_path();
    let mut c = vec![("name", s(DAEMON)), ("image", s(&opts.image))];
    match opts.mode {
        Mode::Node => return None,
        Mode::NativeSidecar => {
            c.push(("restartPolicy", s("Always")));
            c.push(("args", list(flags.list.iter().map(|f| s(&f.word())).collect())));
        }
        Mode::Sidecar => {
            // The GKE guide's command line: binary, then each core flag and its value.
            let mut cmd = vec![s(REFERENCE_BIN)];
            let (core, rest): (Vec<&Flag>, Vec<&Flag>) =
                flags.list.iter().partition(|f| CORE.contains(&f.key()) && f.value.is_some());
            for f in core {
                let v = f.value.as_deref().unwrap_or_default();
                cmd.push(s(&format!("--{}", f.name)));
                // The guide quotes this value inside the word; both daemons take it so.
                cmd.push(s(&if f.key() == "setup_param" { format!("\\\"{v} \\\"") } else { v.to_string() }));
            }
            c.push(("command", list(cmd)));
            c.push(("args", list(rest.iter().map(|f| s(&f.word())).collect())));
        }
    }
    let libraries = opts.platform.daemon_mounts_libraries();
    let mut envs: Vec<Value> = libraries.then(|| env("LD_LIBRARY_PATH", LIBRARIES)).into_iter().collect();
    envs.extend(opts.platform.daemon_env().into_iter().map(|(n, v)| env(n, v)));
    if opts.mode == Mode::Sidecar {
        envs.push(env("HEALTH_CHECK_LOG_FILE", &format!("{HEALTH_DIR}/health.log")));
    }
    c.push(("env", list(envs)));
    c.push(("securityContext", security_context(opts, &flags.parsed)));
    let mut requests = Vec::new();
    if let Some(cpu) = &opts.cpu {
        requests.push(("cpu", s(cpu)));
    }
    if let Some(mem) = &opts.memory {
        requests.push(("memory", s(mem)));
    }
    if !requests.is_empty() {
        c.push(("resources", map(vec![("requests", map(requests))])));
    }
    c.extend(flags.probe().fields(&flags.parsed, opts.mode, &uds));
    let mut mounts: Vec<Value> =
        libraries.then(|| mount("tcpx-libraries", LIBRARIES, true)).into_iter().collect();
    mounts.extend(host_mounts(opts).iter().map(|(n, _, at, ro)| mount(n, at, *ro)));
    mounts.push(mount("tcpx-socket", &uds, false));
    if opts.mode == Mode::Sidecar {
        mounts.push(mount("tcpx-health", HEALTH_DIR, false));
    }
    c.push(("volumeMounts", list(mounts)));
    Some(map(c))
}

#[cfg(test)]
mod tests;
