//! `tcpx-rxdm nccl-env [--format=env|json|configmap] [--check [--env-file
//! FILE] [--json]] [DAEMON FLAGS]`: the topology from the daemon's flags,
//! the node from `--sysfs_root`.

use std::path::PathBuf;

use super::{check, check_env, generate, process_env, Sysfs};
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
}

/// Runs the subcommand; returns the exit code (0 fine, 1 problems found or
/// the node unreadable, 2 bad flags or topology).
pub fn main(flags: &Flags, opts: &Options) -> u8 {
    let topo = match presets::resolve_topology(flags) {
        Ok((t, _)) => t,
        Err(e) => {
            eprintln!("tcpx-rxdm nccl-env: {e}");
            return 2;
        }
    };
    let view = Sysfs::new(&flags.sysfs_root());
    if opts.check {
        let vars = match &opts.env_file {
            None => process_env().0,
            Some(path) => {
                let text = match std::fs::read_to_string(path) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("tcpx-rxdm nccl-env: --env-file {}: {e}", path.display());
                        return 2;
                    }
                };
                match check::parse_env_file(&text) {
                    Ok(v) => v,
                    Err(line) => {
                        eprintln!(
                            "tcpx-rxdm nccl-env: --env-file {} line {line}: expected NAME=value",
                            path.display()
                        );
                        return 2;
                    }
                }
            }
        };
        let report = check_env(&view, &topo, &flags.uds_path, &vars);
        if opts.json {
            println!("{}", serde_json::to_string_pretty(&report).expect("JSON of plain data"));
        } else {
            print!("{}", report.text());
        }
        return if report.ok { 0 } else { 1 };
    }
    match generate(&view, &topo, &flags.uds_path) {
        Ok(env) => {
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
            eprintln!("tcpx-rxdm nccl-env: {e}");
            if e.is_flag_error() {
                2
            } else {
                1
            }
        }
    }
}
