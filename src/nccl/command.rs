//! `tcpx-rxdm nccl-env [--format=env|json|configmap] [--machine PROFILE]
//! [--check [--env-file FILE] [--json]] [DAEMON FLAGS]`: the topology from
//! the daemon's flags, the node from `--sysfs_root` (or a machine profile).

use std::path::PathBuf;

use clap::builder::PossibleValuesParser;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};

use super::{check, check_env, generate, machine, process_env, NodeView, Sysfs};
use crate::config::absl::{self, bool_arg};
use crate::config::flags::Flags;
use crate::config::presets;

/// Output forms of the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Env,
    Json,
    ConfigMap,
}

impl Format {
    pub const NAMES: [&'static str; 3] = ["env", "json", "configmap"];

    pub fn from_name(s: &str) -> Option<Format> {
        match s {
            "env" => Some(Format::Env),
            "json" => Some(Format::Json),
            "configmap" => Some(Format::ConfigMap),
            _ => None,
        }
    }
}

/// The subcommand's own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub format: Format,
    pub check: bool,
    /// With `check`: read this file instead of the process environment.
    pub env_file: Option<PathBuf>,
    /// With `check`: the report as JSON.
    pub json: bool,
    /// A machine profile to use instead of this node's sysfs.
    pub machine: Option<String>,
}

/// The daemon's flags that `nccl-env` reads.
const DAEMON_FLAGS: [&str; 6] =
    ["gpu_nic_preset", "gpu_nic_topology", "gpu_nic_topology_proto", "uds_path", "sysfs_root", "num_hops"];

/// The subcommand's definition: its page, its options, the daemon flags it reads.
pub fn command() -> Command {
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
        .arg(
            Arg::new("format")
                .long("format")
                .value_name("FORMAT")
                .value_parser(PossibleValuesParser::new(Format::NAMES))
                .default_value("env")
                .help("env: a file for `. FILE`; json; configmap: a Kubernetes ConfigMap for envFrom"),
        )
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
        .arg(bool_arg("json").help("JSON output: the check's report, or the settings (as --format=json)"))
        .args(absl::daemon_args(&DAEMON_FLAGS))
        .after_help(
            "Exit status: 0 printed, or the check passed; 1 problems found; 2 bad flags, or no topology.",
        )
}

/// The options of `matches` (of [`command`]), checked for consistency;
/// errors are usage errors of `cmd`.
pub fn options(cmd: &mut Command, m: &ArgMatches) -> Result<Options, clap::Error> {
    let given = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    let check = m.get_flag("check");
    let json = m.get_flag("json");
    let mut format = m.get_one::<String>("format").and_then(|f| Format::from_name(f)).unwrap_or(Format::Env);
    let env_file = m.get_one::<PathBuf>("env_file").cloned();
    if env_file.is_some() && !check {
        return Err(
            cmd.error(ErrorKind::ArgumentConflict, "--env-file goes with --check (the file to check)")
        );
    }
    if check && given("format") {
        return Err(cmd.error(ErrorKind::ArgumentConflict, "--format does not go with --check (use --json)"));
    }
    if json && !check {
        if given("format") && format != Format::Json {
            return Err(
                cmd.error(ErrorKind::ArgumentConflict, "--json and --format differ: give one of them")
            );
        }
        format = Format::Json;
    }
    Ok(Options { format, check, env_file, json, machine: m.get_one::<String>("machine").cloned() })
}

fn fail(msg: impl std::fmt::Display, code: u8) -> u8 {
    eprintln!("tcpx-rxdm nccl-env: {msg}");
    code
}

/// Runs the subcommand; returns the exit code (0 fine, 1 problems found or
/// the node unreadable, 2 bad flags or topology).
pub fn main(flags: &Flags, opts: &Options) -> u8 {
    // The file first: a file that is not there is the error to report, not
    // a topology that the flags did not name.
    let file_vars = match &opts.env_file {
        None => None,
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => return fail(format_args!("--env-file {}: {e}", path.display()), 2),
            };
            match check::parse_env_file(&text) {
                Ok(v) => Some(v),
                Err(line) => {
                    return fail(
                        format_args!("--env-file {} line {line}: expected NAME=value", path.display()),
                        2,
                    )
                }
            }
        }
    };
    let mut flags = flags.clone();
    let view: Box<dyn NodeView> = match opts.machine.as_deref() {
        Some(m) => {
            let Some(view) = machine::view(m) else { return fail(machine::unknown(m), 2) };
            if flags.gpu_nic_preset == "auto" {
                flags.gpu_nic_preset = machine::preset(m).unwrap_or("auto").to_string();
            }
            Box::new(view)
        }
        None => Box::new(Sysfs::new(&flags.sysfs_root())),
    };
    let topo = match presets::resolve_topology(&flags) {
        Ok((t, _)) => t,
        Err(e) => return fail(e, 2),
    };
    if opts.check {
        let vars = file_vars.unwrap_or_else(|| process_env().0);
        let report = check_env(view.as_ref(), &topo, &flags.uds_path, &vars);
        if opts.json {
            println!("{}", serde_json::to_string_pretty(&report).expect("JSON of plain data"));
        } else {
            print!("{}", report.text());
        }
        return if report.ok { 0 } else { 1 };
    }
    match generate(view.as_ref(), &topo, &flags.uds_path) {
        Ok(env) => {
            for n in &env.notes {
                eprintln!("tcpx-rxdm nccl-env: note: {n}");
            }
            match opts.format {
                Format::Env => print!("{}", env.to_env()),
                Format::Json => {
                    println!("{}", serde_json::to_string_pretty(&env.to_json()).expect("JSON of plain data"))
                }
                Format::ConfigMap => print!("{}", env.to_configmap()),
            }
            0
        }
        Err(e) => {
            let code = if e.is_flag_error() { 2 } else { 1 };
            fail(e, code)
        }
    }
}
