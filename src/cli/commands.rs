//! The definitions of `status`, `doctor`, `nccl-env`, `upgrade`,
//! `completions` and `man`, and their options as the commands take them.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::error::ErrorKind;
use clap::{Arg, ArgMatches, Command};
use clap_complete::Shell;

use super::daemon_args::daemon_args;
use crate::config::absl::bool_arg;
use crate::nccl::command::{Format, Options as NcclOptions};
use crate::nccl::machine;
use crate::upgrade::Options as UpgradeOptions;

pub fn status() -> Command {
    Command::new("status")
        .about("Ask the running daemon how it is: ready, NICs, clients; or its flows")
        .long_about(
            "Asks the daemon serving --uds_path over its status socket and prints its answer. \
             `flows` lists the rules it holds, per client; `mine` answers ready only when the daemon \
             serving is in this process's cgroup (a container's readiness probe across a takeover).",
        )
        .args_override_self(true)
        .arg(
            Arg::new("what")
                .value_name("WHAT")
                .value_parser([
                    PossibleValue::new("flows").help("the rules the daemon holds, per client"),
                    PossibleValue::new("mine").help("ready, and serving from this cgroup"),
                    PossibleValue::new("status").hide(true),
                ])
                .help("What to ask: the daemon's status (default), flows, or mine"),
        )
        .arg(format_arg(TEXT_OR_JSON, "How to print the daemon's answer"))
        .arg(json_arg())
        .args(daemon_args(&STATUS_READS))
        .after_help(
            "Exit status: 0 answered and ready; 1 unreachable, refused or not ready (still starting, e.g. \
             waiting for its NICs: the first line says what for); 2 bad arguments.",
        )
}

/// The daemon's flags `status` reads: where to ask.
const STATUS_READS: [&str; 1] = ["uds_path"];

/// `text` and `json`, the forms `status` and `doctor` print.
const TEXT_OR_JSON: &[(&str, &str)] = &[("text", "for people (the default)"), ("json", "for scripts")];

/// `--format` (`-o`, and `--output` as kubectl writes it): the one spelling
/// of the output form on every command that prints a report.
fn format_arg(values: &[(&'static str, &'static str)], help: &'static str) -> Arg {
    let values = values.iter().map(|(n, h)| PossibleValue::new(*n).help(*h));
    Arg::new("format")
        .long("format")
        .short('o')
        .visible_alias("output")
        .value_name("FORMAT")
        .value_parser(PossibleValuesParser::new(values))
        .help(format!("{help}; --json is --format=json"))
}

/// `--json`: `--format=json` as the commands spelt it before `--format`
/// (scripts and probes keep working); off the page.
fn json_arg() -> Arg {
    bool_arg("json").hide(true).help("The same as --format=json")
}

/// Whether `--format=json` (or `--json`) was asked for; the two differing
/// is a usage error.
pub fn json_output(cmd: &mut Command, m: &ArgMatches) -> Result<bool, clap::Error> {
    let json = m.get_flag("json");
    match m.get_one::<String>("format").map(String::as_str) {
        Some("json") => Ok(true),
        Some(other) if json => Err(cmd.error(
            ErrorKind::ArgumentConflict,
            format!("--json and --format={other} differ: give one of them"),
        )),
        _ => Ok(json),
    }
}

/// The daemon's flags the doctor's checks read: the topology and the node,
/// the backends, host tuning, the socket folder and the limits it checks,
/// and the flags that decide which capabilities the daemon needs.
const DOCTOR_READS: [&str; 20] = [
    "gpu_nic_preset",
    "gpu_nic_topology",
    "gpu_nic_topology_proto",
    "uds_path",
    "sysfs_root",
    "procfs_root",
    "num_hops",
    "nic_backend",
    "gpu_backend",
    "bind_backend",
    "setup_param",
    "tuning_script_path",
    "max_connections",
    "leases",
    "rx_pool_size",
    "max_rx_rules",
    "socket_group",
    "tenant_isolation",
    "takeover",
    "metrics_address",
];

pub fn doctor() -> Command {
    Command::new("doctor")
        .about("Check whether GPUDirect-TCPX will work on this node, and if not, why")
        .long_about(
            "Read-only checks of this node for a daemon started with these daemon flags: kernel, \
             NICs, GPUs, PCIe layout, host settings, the socket folder, the NCCL settings in the \
             environment. One line per check: a mark, what was found, and what to do about it.",
        )
        .args_override_self(true)
        .arg(format_arg(TEXT_OR_JSON, "How to print the report"))
        .arg(json_arg())
        .args(daemon_args(&DOCTOR_READS))
        .after_help("Exit status: 0 ready; 1 not ready; 2 bad flags.")
}

/// The daemon's flags `nccl-env` reads.
const NCCL_ENV_READS: [&str; 6] =
    ["gpu_nic_preset", "gpu_nic_topology", "gpu_nic_topology_proto", "uds_path", "sysfs_root", "num_hops"];

pub fn nccl_env() -> Command {
    Command::new("nccl-env")
        .about("Print the NCCL plugin's settings for this node, or check an environment against them")
        .long_about(
            "Prints the NCCL plugin's settings (NCCL_GPUDIRECTTCPX_* and the NCCL tuning that goes \
             with them) for this node and the daemon that the daemon flags describe, or with --check \
             compares the environment (or FILE) with them and prints the value to use for each finding. \
             The node is read from sysfs, or described by --machine when the settings are written \
             elsewhere. A node that cannot keep the plugin's TX and RX threads apart (fewer than 4 \
             cores per NUMA node) gets no CPU bindings, and a comment saying so.",
        )
        .args_override_self(true)
        .arg(format_arg(
            NCCL_ENV_FORMATS,
            "How to print the settings (env by default), or with --check the report (text or json)",
        ))
        .arg(
            Arg::new("machine")
                .long("machine")
                .value_name("PROFILE")
                .value_parser(PossibleValuesParser::new(machine::NAMES))
                .conflicts_with("sysfs_root")
                .help("Describe the node by a machine profile instead of reading sysfs"),
        )
        .arg(bool_arg("check").help("Check the environment (or --env-file) instead of printing it"))
        .arg(
            Arg::new("env_file")
                .long("env-file")
                .alias("env_file")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("With --check: read NAME=value lines from FILE instead of the environment"),
        )
        .arg(json_arg())
        .args(daemon_args(&NCCL_ENV_READS))
        .after_help(
            "Exit status: 0 printed, or the check passed; 1 problems found; 2 bad flags, or no topology.",
        )
}

/// What `nccl-env --format` takes: the settings' forms, and `text` (the
/// settings as `env` writes them, or the check's report).
const NCCL_ENV_FORMATS: &[(&str, &str)] = &[
    ("env", "the settings as a file for `. FILE` (the default)"),
    ("text", "as env; with --check, the report for people (its default)"),
    ("json", "the settings, or with --check the report, as JSON"),
    ("configmap", "the settings as a Kubernetes ConfigMap for envFrom"),
];

/// `nccl-env`'s options, checked for consistency; errors are usage errors of `cmd`.
pub fn nccl_env_options(cmd: &mut Command, m: &ArgMatches) -> Result<NcclOptions, clap::Error> {
    let check = m.get_flag("check");
    let json_flag = m.get_flag("json");
    let env_file = m.get_one::<PathBuf>("env_file").cloned();
    if env_file.is_some() && !check {
        return Err(
            cmd.error(ErrorKind::ArgumentConflict, "--env-file goes with --check (the file to check)")
        );
    }
    let asked = m.get_one::<String>("format").map(String::as_str);
    if let Some(f) = asked.filter(|f| json_flag && *f != "json") {
        return Err(cmd.error(
            ErrorKind::ArgumentConflict,
            format!("--json and --format={f} differ: give one of them"),
        ));
    }
    let json = json_flag || asked == Some("json");
    let format = match asked {
        _ if check => {
            if let Some(f) = asked.filter(|f| !["text", "json"].contains(f)) {
                return Err(cmd.error(
                    ErrorKind::ArgumentConflict,
                    format!("--format={f} does not go with --check: its report is text or json"),
                ));
            }
            Format::Env
        }
        _ if json => Format::Json,
        Some("configmap") => Format::ConfigMap,
        _ => Format::Env,
    };
    Ok(NcclOptions { format, check, env_file, json, machine: m.get_one::<String>("machine").cloned() })
}

/// A duration as the daemon's duration flags take it, more than zero.
fn upgrade_timeout(s: &str) -> Result<Duration, String> {
    crate::config::flags::parse_wait(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| "expected a duration above 0, up to 1 hour: 60, 60s, 1500ms, 2m or 1h".into())
}

/// `upgrade`: the folder (the daemon's own `--uds_path`, with its default
/// and checks) and how long to wait.
pub fn upgrade() -> Command {
    let uds = daemon_args(&["uds_path"])
        .into_iter()
        .find(|a| a.get_id() == "uds_path")
        .expect("the daemon has --uds_path")
        .help_heading(None)
        .alias("uds-path")
        .display_order(0)
        .help("The daemon's socket folder (its --uds_path)");
    Command::new("upgrade")
        .about("Hand a running daemon over to the binary now installed, without a failed request")
        .long_about(
            "Makes the daemon serving --uds_path hand over to the binary now installed at the path it \
             was started from, without touching NICs, pools or clients: sends it SIGUSR2 and waits \
             until the successor serves. Prints `upgraded: pid OLD -> pid NEW`.",
        )
        .args_override_self(true)
        .arg(uds)
        .arg(
            Arg::new("timeout")
                .long("timeout")
                .value_name("DURATION")
                .default_value("60s")
                .value_parser(upgrade_timeout)
                .help("How long to wait: seconds, or with a unit (500ms, 90s, 2m, 1h)"),
        )
        .after_help(
            "Exit status: 0 upgraded; 1 not upgraded (the old daemon serves on; its log says why); \
             2 bad arguments.",
        )
}

pub fn upgrade_options(m: &ArgMatches) -> UpgradeOptions {
    UpgradeOptions {
        uds_path: m.get_one::<PathBuf>("uds_path").cloned().unwrap_or_default(),
        timeout: *m.get_one::<Duration>("timeout").expect("has a default"),
    }
}

pub fn completions() -> Command {
    Command::new("completions")
        .about("Print the completion script for a shell")
        .long_about(
            "Prints the completion script for SHELL on stdout. Install it where the shell looks, e.g.\n  \
             tcpx-rxdm completions bash > /usr/share/bash-completion/completions/tcpx-rxdm\n  \
             tcpx-rxdm completions zsh > /usr/share/zsh/vendor-completions/_tcpx-rxdm\n  \
             tcpx-rxdm completions fish > /usr/share/fish/vendor_completions.d/tcpx-rxdm.fish",
        )
        .arg(Arg::new("shell").value_name("SHELL").required(true).value_parser(clap::value_parser!(Shell)))
}

pub fn man() -> Command {
    Command::new("man")
        .about("Print the man page, or write one per command to a folder")
        .long_about(
            "Prints tcpx-rxdm(1) in roff on stdout (`tcpx-rxdm man | man -l -`), or with --dir writes \
             tcpx-rxdm.1 and one page per command (tcpx-rxdm-status.1, …) into DIR.",
        )
        .arg(
            Arg::new("dir")
                .long("dir")
                .value_name("DIR")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Write every page into DIR instead"),
        )
}

pub fn version() -> Command {
    Command::new("version").about("Print the version (as --version and --show_version do)").long_about(
        "Prints `tcpx-rxdm VERSION`, as --version and the reference's --show_version do. The \
             running daemon's version is in `tcpx-rxdm status` (its first line).",
    )
}
