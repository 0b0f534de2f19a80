//! Command-line flags: the reference's absl-style names and forms,
//! plus ours. `normalize_args` turns absl forms into what clap parses.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser, ValueEnum};

pub use super::flag_values::{
    parse_byte_size, parse_wait, ListenAddr, LogLevel, OfferingNames, UDS_PATH_MAX,
};
use super::flag_values::{parse_listen_addr, parse_mode, parse_uds_path};
use crate::gpu::BinderKind;
use crate::gpu::ShmemType;
use crate::host::tuning::TuningParams;
use crate::nic::sim::{Fault, SimDelay};

/// Preset names accepted by `--gpu_nic_preset` besides a file path.
pub const PRESET_NAMES: [&str; 6] = ["auto", "a3vm", "a3vm4gpu4nic", "a6", "sim", "manual"];

/// Boolean flags, for `--noflag` and `--flag` / `--flag=bool` forms.
pub const BOOL_FLAGS: [&str; 6] = [
    "monitor_shutdown",
    "show_version",
    "leases",
    "shutdown_when_all_clients_exited",
    "claim_sim_nics",
    "node_wide",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NicBackendKind {
    Auto,
    Ethtool,
    Sim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpuBackendKind {
    Auto,
    Cuda,
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How clients of different tenants (workloads) are kept apart (`--tenant_isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TenantIsolation {
    /// No checks: any client may use any GPU and any flow (the reference's behaviour).
    Off,
    /// Decide as `enforce` does, but serve anyway: log and count what would be refused.
    Audit,
    /// Refuse with PERMISSION_DENIED (or RESOURCE_EXHAUSTED over the quota).
    Enforce,
}

impl TenantIsolation {
    pub fn name(self) -> &'static str {
        match self {
            TenantIsolation::Off => "off",
            TenantIsolation::Audit => "audit",
            TenantIsolation::Enforce => "enforce",
        }
    }
}

/// Whether to take over from a daemon serving the same folder (`--takeover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Takeover {
    /// Start normally (a daemon already serving the folder is an error).
    Off,
    /// Take over from the running daemon; fail (exit 1) if there is none or it refuses.
    On,
    /// Take over if a daemon serves the folder, else start normally.
    Auto,
}

/// What a daemon does once it has handed over to a successor (`--after_handover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AfterHandover {
    /// Exit 0 at once (systemd, plain VMs).
    Exit,
    /// Stay up, serving nothing, until SIGTERM, then exit 0 (Kubernetes: a
    /// container that exited would be restarted).
    Wait,
}

/// Who may read `/debug/*` (`--debug_endpoints`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DebugAccess {
    /// Loopback peers only.
    Local,
    /// Any peer.
    All,
    /// Nobody (404).
    Off,
}

impl DebugAccess {
    /// Whether a request from `peer` may read `/debug/*`.
    pub fn allows(self, peer: SocketAddr) -> bool {
        match self {
            DebugAccess::All => true,
            DebugAccess::Off => false,
            DebugAccess::Local => peer.ip().to_canonical().is_loopback(),
        }
    }
}

/// A parser for a value type named by a fixed list of words (so that the type
/// itself needs no clap): `--help` and errors list the words.
fn names_parser<T>(names: &'static [&'static str]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Debug,
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(names).map(|s| s.parse::<T>().expect("a listed name parses"))
}

/// Host tuning from `--setup_param "--verbose INITCWND RTO_MIN_MS QUICKACK"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupParam {
    /// Empty `--setup_param`: no host tuning at all.
    Off,
    Tune(TuningParams),
}

/// How repeated flags combine, under `--help`.
const AFTER_HELP: &str = "Flags take the absl forms --flag=V, --flag V, -flag=V and -flag V; booleans \
also --flag and --noflag. A flag given again overrides the earlier value (as with absl), so words \
appended to a command line change any flag it already sets; only --sim_fault and --sim_delay add up.";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "tcpx-rxdm",
    about = "Receive-datapath manager for GPUDirect-TCPX NICs",
    disable_version_flag = true,
    args_override_self = true,
    after_help = AFTER_HELP
)]
pub struct Flags {
    /// auto (sysfs discovery), a3vm, a3vm4gpu4nic, a6, sim, manual, or a path to a preset file.
    #[arg(long = "gpu_nic_preset", default_value = "auto", value_hint = clap::ValueHint::FilePath,
          value_parser = OfferingNames { inner: parse_preset, names: &PRESET_NAMES }, hide_possible_values = true)]
    pub gpu_nic_preset: String,
    /// Topology textproto file (with --gpu_nic_preset=manual).
    #[arg(long = "gpu_nic_topology")]
    pub gpu_nic_topology: Option<PathBuf>,
    /// Inline topology textproto (with --gpu_nic_preset=manual).
    #[arg(long = "gpu_nic_topology_proto", allow_hyphen_values = true)]
    pub gpu_nic_topology_proto: Option<String>,
    /// fd (VMM memory shared as a POSIX fd) or file (legacy CUDA IPC handle).
    #[arg(long = "gpu_shmem_type", default_value = "fd", value_parser = names_parser::<ShmemType>(ShmemType::NAMES))]
    pub gpu_shmem_type: ShmemType,
    /// Folder for the Unix sockets (created if missing).
    #[arg(long = "uds_path", default_value = "/run/tcpx", value_parser = parse_uds_path)]
    pub uds_path: PathBuf,
    /// Bytes per GPU pool, or with a unit: K, M, G, T (powers of 1024: 2G =
    /// 2147483648); 0 = the topology's value or 4 GiB.
    #[arg(long = "rx_pool_size", default_value = "0", value_parser = parse_byte_size)]
    pub rx_pool_size: u64,
    /// Rule slots per NIC; 0 = the topology's value. Ignored for a3vm.
    #[arg(long = "max_rx_rules", default_value_t = 0)]
    pub max_rx_rules: u32,
    /// Host tuning: "--verbose INITCWND RTO_MIN_MS QUICKACK"; empty disables tuning.
    #[arg(long = "setup_param", default_value = "--verbose 128 2 0", allow_hyphen_values = true, value_parser = parse_setup_param)]
    pub setup_param: SetupParam,
    /// Run DIR/setup.sh and DIR/teardown.sh instead of native host tuning.
    #[arg(long = "tuning_script_path")]
    pub tuning_script_path: Option<PathBuf>,
    /// Exit when the last registered application disconnects.
    #[arg(long = "monitor_shutdown", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub monitor_shutdown: bool,
    /// Print the version and exit.
    #[arg(long = "show_version", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub show_version: bool,
    /// PCIe hops from a NIC up to the switch it shares with its GPUs (discovery).
    #[arg(long = "num_hops", default_value_t = 2)]
    pub num_hops: u32,

    /// NIC control backend.
    #[arg(long = "nic_backend", value_enum, default_value = "auto")]
    pub nic_backend: NicBackendKind,
    /// GPU pool backend.
    #[arg(long = "gpu_backend", value_enum, default_value = "auto")]
    pub gpu_backend: GpuBackendKind,
    /// How pools are bound to NIC queues.
    #[arg(long = "bind_backend", default_value = "auto", value_parser = names_parser::<BinderKind>(BinderKind::NAMES))]
    pub bind_backend: BinderKind,
    /// Address of the HTTP endpoints (/metrics, /healthz, /readyz, /debug/*): IP:PORT,
    /// :PORT (every address) or localhost:PORT; empty disables.
    #[arg(long = "metrics_address", default_value = "0.0.0.0:9467", value_parser = parse_listen_addr)]
    pub metrics_address: ListenAddr,
    /// Mode of the socket files, octal.
    #[arg(long = "socket_mode", default_value = "0660", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Mode of the status socket (`rxdm_status`), octal. It shows every
    /// client's flows, so by default only the daemon's user may read it.
    #[arg(long = "status_socket_mode", default_value = "0600", value_parser = parse_mode)]
    pub status_socket_mode: u32,
    /// Keeping the jobs on one node apart: a client may use only the GPUs
    /// whose device node it sees, install rules only for its own TCP
    /// connections, and remove only its own rules. `audit` decides the same
    /// way but serves anyway, logging and counting each refusal.
    #[arg(long = "tenant_isolation", value_enum, default_value = "audit")]
    pub tenant_isolation: TenantIsolation,
    /// Most rules one tenant's workload (a Pod, a Slurm job, a systemd unit,
    /// else a cgroup) may hold across all NICs; 0: no limit.
    #[arg(long = "max_rules_per_tenant", default_value_t = 0)]
    pub max_rules_per_tenant: u32,
    /// The first N levels (1 to 64) of a client's cgroup path name its
    /// workload, for layouts other than Kubernetes, Slurm and systemd; 0: those.
    // No layout in use nests 64 levels deep: more is a typo.
    #[arg(long = "workload_cgroup_depth", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub workload_cgroup_depth: u32,
    /// Group owning the socket files (name or gid).
    #[arg(long = "socket_group")]
    pub socket_group: Option<String>,
    /// Log format.
    #[arg(long = "log_format", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Least severe events logged (warning is taken for warn); a fatal error is
    /// printed whatever the level. RUST_LOG, a tracing filter with per-module
    /// directives, overrides it.
    #[arg(long = "log_level", value_enum, ignore_case = true, default_value = "info")]
    pub log_level: LogLevel,
    /// Root of sysfs for the PCI tree (default /hostsysfs when present, else
    /// /sys); the interfaces are those of the daemon's own network namespace.
    #[arg(long = "sysfs_root")]
    pub sysfs_root: Option<PathBuf>,
    /// Root of procfs (default /hostprocsysfs when present, else /proc).
    #[arg(long = "procfs_root")]
    pub procfs_root: Option<PathBuf>,
    /// Most client connections served at once; more wait in the backlog.
    #[arg(long = "max_connections", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Threads serving the rule sockets; 0: one per two cores the daemon may
    /// run on (its CPU affinity and quota), at least 2, at most 32.
    #[arg(long = "rule_io_threads", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub rule_io_threads: u32,
    /// Track each client process (pidfd) and remove its rules when it exits.
    #[arg(long = "leases", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub leases: bool,
    /// File whose appearance ends the daemon (orderly shutdown, exit 0); relative to
    /// --uds_path unless absolute; empty disables.
    #[arg(long = "shutdown_file", default_value = "terminated")]
    pub shutdown_file: String,
    /// Exit once client processes were seen and none has been alive for
    /// --wait_time_before_exit seconds.
    #[arg(long = "shutdown_when_all_clients_exited", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub shutdown_when_all_clients_exited: bool,
    /// Seconds without a live client before --shutdown_when_all_clients_exited fires.
    #[arg(long = "wait_time_before_exit", default_value_t = 5)]
    pub wait_time_before_exit: u64,
    /// Simulated NIC fault OP:ERRNO:PROB (repeatable), e.g. add_rule:EBUSY:0.1.
    #[arg(long = "sim_fault", action = ArgAction::Append)]
    pub sim_fault: Vec<Fault>,
    /// Simulated NIC delay OP:DELAY or OP:DELAY:IFNAME for every call of OP, on every NIC or
    /// only IFNAME (repeatable); DELAY in milliseconds or with a unit, e.g.
    /// del_rule:50, del_rule:50ms, add_rule:200us, add_rule:1000:eth1; or until=FILE:
    /// each call waits until FILE exists.
    #[arg(long = "sim_delay", action = ArgAction::Append)]
    pub sim_delay: Vec<SimDelay>,
    /// Claim simulated NICs too (real ones always are), so that a second
    /// simulated daemon in this network namespace is refused.
    #[arg(long = "claim_sim_nics", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub claim_sim_nics: bool,
    /// HTTP requests served at once (more get 503 at once), and as many
    /// connections waiting for their request head (a new one closes the
    /// oldest still waiting); /healthz and /readyz need no slot.
    #[arg(long = "max_http_connections", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_http_connections: u32,
    /// Who may read /debug/*: off (the default: they list every tenant's
    /// flows, and an HTTP peer cannot be told to be the node's operator),
    /// local (loopback peers), all.
    #[arg(long = "debug_endpoints", value_enum, default_value = "off")]
    pub debug_endpoints: DebugAccess,
    /// Seconds a rule or queue connection may go without a complete request
    /// before it is closed; 0 never. Registry and pool connections never are.
    #[arg(long = "client_idle_timeout", default_value_t = 60)]
    pub client_idle_timeout: u64,
    /// A node-wide daemon (systemd unit, DaemonSet) that no client can end: no
    /// --shutdown_file, no --monitor_shutdown, no --shutdown_when_all_clients_exited
    /// (setting one of them too is an error), and SIGHUP is logged and ignored.
    #[arg(long = "node_wide", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub node_wide: bool,
    /// How long to wait for the topology's NICs to appear (a NIC slow to come up at
    /// boot) before failing: seconds, or with a unit (500ms, 90s, 2m, 1h); 0 fails at
    /// once. With discovery (auto, a6) it waits until discovery finds the NICs.
    /// `tcpx-rxdm status` says what it waits for; SIGTERM ends the wait (exit 0).
    #[arg(long = "wait_for_nics", default_value = "0", value_parser = parse_wait)]
    pub wait_for_nics: Duration,
    /// Take over the NICs, pools, rules and clients of the daemon serving this
    /// --uds_path, without a failed request (an upgrade): on, or auto (take over
    /// if one serves, else start normally). Run it as the daemon's user with its
    /// capabilities, or with CAP_SYS_PTRACE: it must prove it could take the
    /// daemon's descriptors (SIGUSR2 and `tcpx-rxdm upgrade` need no proof).
    #[arg(long = "takeover", value_enum, num_args = 0..=1, require_equals = true,
          default_value = "off", default_missing_value = "on")]
    pub takeover: Takeover,
    /// How long each side of a takeover waits for the other before giving up
    /// (the serving daemon then serves on): seconds, or with a unit.
    #[arg(long = "takeover_timeout", default_value = "10s", value_parser = parse_wait)]
    pub takeover_timeout: Duration,
    /// Once this daemon has handed over to a successor: exit (0), or wait,
    /// serving nothing, for SIGTERM (a Kubernetes container, which would
    /// otherwise be restarted).
    #[arg(long = "after_handover", value_enum, default_value = "exit")]
    pub after_handover: AfterHandover,
}

impl Flags {
    /// `--shutdown_file` as a path (relative names live in `--uds_path`); `None` when disabled.
    pub fn shutdown_file(&self) -> Option<PathBuf> {
        match self.shutdown_file.as_str() {
            "" => None,
            f => Some(self.uds_path.join(f)),
        }
    }

    pub fn sysfs_root(&self) -> PathBuf {
        default_root(&self.sysfs_root, "/hostsysfs", "/sys")
    }

    pub fn procfs_root(&self) -> PathBuf {
        default_root(&self.procfs_root, "/hostprocsysfs", "/proc")
    }

    /// Parses normalised-or-not arguments (the program name first).
    /// Never panics and never exits: a bad command line is an error.
    pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Flags, clap::Error> {
        let mut cmd = Flags::command();
        let matches = cmd.try_get_matches_from_mut(normalize_args(args))?;
        Flags::from_matches(&mut cmd, &matches)
    }

    /// The flags from the matches of `cmd`, a command that has the daemon's
    /// flags (the daemon's own, or a subcommand's with the daemon's flags
    /// cloned in, as `cli` builds them); errors are formatted for `cmd`.
    pub fn from_matches(cmd: &mut clap::Command, matches: &ArgMatches) -> Result<Flags, clap::Error> {
        let mut flags = Flags::from_arg_matches(matches).map_err(|e| e.format(cmd))?;
        if flags.node_wide {
            flags.make_node_wide(matches).map_err(|msg| cmd.error(ErrorKind::ArgumentConflict, msg))?;
        }
        Ok(flags)
    }

    /// `--node_wide`: turns off every way a client could end the daemon, and
    /// refuses a command line that asks for one of them explicitly.
    fn make_node_wide(&mut self, matches: &ArgMatches) -> Result<(), String> {
        let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        let conflict = if given("shutdown_file") && !self.shutdown_file.is_empty() {
            Some(format!("--shutdown_file={}", self.shutdown_file))
        } else if given("monitor_shutdown") && self.monitor_shutdown {
            Some("--monitor_shutdown".to_string())
        } else if given("shutdown_when_all_clients_exited") && self.shutdown_when_all_clients_exited {
            Some("--shutdown_when_all_clients_exited".to_string())
        } else {
            None
        };
        if let Some(flag) = conflict {
            return Err(format!(
                "--node_wide: a node-wide daemon never ends on a client's behalf; drop {flag} \
                 (or --node_wide for a per-job daemon)"
            ));
        }
        self.shutdown_file.clear();
        self.monitor_shutdown = false;
        self.shutdown_when_all_clients_exited = false;
        Ok(())
    }
}

fn default_root(flag: &Option<PathBuf>, host: &str, plain: &str) -> PathBuf {
    match flag {
        Some(p) => p.clone(),
        None if std::path::Path::new(host).is_dir() => PathBuf::from(host),
        None => PathBuf::from(plain),
    }
}

/// Rewrites absl flag forms into clap's: `-flag[=v]` → `--flag[=v]`,
/// `--noflag` → `--flag=false` for boolean flags. Stops at a bare `--`.
pub fn normalize_args<I: IntoIterator<Item = String>>(args: I) -> Vec<String> {
    super::absl::normalize(&Flags::command(), args)
}

/// A preset name, or a preset file. A value that looks like a path (a `/`,
/// or a file name's extension) is a file: one that is not there is "no
/// such file", not an unknown preset.
fn parse_preset(s: &str) -> Result<String, String> {
    let path = std::path::Path::new(s);
    if PRESET_NAMES.contains(&s) || path.is_file() {
        return Ok(s.to_string());
    }
    let names = PRESET_NAMES.join(", ");
    if path.is_dir() {
        return Err(format!("{s} is a folder; expected a preset file or one of {names}"));
    }
    if s.contains('/') || path.extension().is_some() {
        return Err(format!("no such file {s} (a preset file; or one of {names})"));
    }
    Err(format!("unknown preset (expected one of {names} or a path to a preset file)"))
}

/// Accepts the GKE manifest's literal `\"--verbose 128 2 0 \"` as well as the plain form.
pub fn parse_setup_param(s: &str) -> Result<SetupParam, String> {
    let cleaned: String = s.chars().filter(|c| *c != '\\' && *c != '"' && *c != '\'').collect();
    let mut words: Vec<&str> = cleaned.split_whitespace().collect();
    if words.first() == Some(&"--verbose") {
        words.remove(0);
    }
    match words.as_slice() {
        [] if !s.contains("--verbose") => Ok(SetupParam::Off),
        [a, b, c] => {
            let num =
                |w: &str| w.parse::<u32>().map_err(|_| format!("\"{w}\" is not a non-negative integer"));
            Ok(SetupParam::Tune(TuningParams { initcwnd: num(a)?, rto_min_ms: num(b)?, quickack: num(c)? }))
        }
        _ => Err("expected \"--verbose INITCWND RTO_MIN_MS QUICKACK\"".into()),
    }
}

#[cfg(test)]
mod tests;
