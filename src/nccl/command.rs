//! `tcpx-rxdm nccl-env [--format=env|text|json|configmap] [--machine PROFILE]
//! [--check [--env-file FILE] [--format=text|json]] [DAEMON FLAGS]`: the
//! topology from the daemon's flags, the node from `--sysfs_root` (or a
//! machine profile).

use std::path::PathBuf;

use super::{check, check_env, generate, machine, process_env, NodeView, Sysfs};
use crate::config::flags::Flags;
use crate::config::presets;
use crate::types::exit::Exit;

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

fn fail(msg: impl std::fmt::Display, end: Exit) -> Exit {
    eprintln!("tcpx-rxdm nccl-env: {msg}");
    end
}

/// Runs the subcommand: failed when problems were found or the node cannot
/// be read; usage for bad flags or topology.
pub fn main(flags: &Flags, opts: &Options) -> Exit {
    // The file first: a file that is not there is the error to report, not
    // a topology that the flags did not name.
    let file_vars = match &opts.env_file {
        None => None,
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => return fail(format_args!("--env-file {}: {e}", path.display()), Exit::Usage),
            };
            match check::parse_env_file(&text) {
                Ok(v) => Some(v),
                Err(line) => {
                    return fail(
                        format_args!("--env-file {} line {line}: expected NAME=value", path.display()),
                        Exit::Usage,
                    )
                }
            }
        }
    };
    let mut flags = flags.clone();
    let view: Box<dyn NodeView> = match opts.machine.as_deref() {
        Some(m) => {
            let Some(view) = machine::view(m) else { return fail(machine::unknown(m), Exit::Usage) };
            if flags.gpu_nic_preset == "auto" {
                flags.gpu_nic_preset = machine::preset(m).unwrap_or("auto").to_string();
            }
            Box::new(view)
        }
        None => Box::new(Sysfs::for_flags(&flags)),
    };
    let topo = match presets::resolve_topology(&flags) {
        Ok((t, _)) => t,
        // Off the GPU node, discovery finds nothing: say how to name the machine instead.
        Err(e) if flags.gpu_nic_preset == "auto" => {
            return fail(
                format_args!(
                    "{e}\nto write the settings for another machine, name it: --machine={} (or \
                     --gpu_nic_preset=a3vm with this node's CPUs)",
                    machine::DEFAULT
                ),
                Exit::Usage,
            )
        }
        Err(e) => return fail(e, Exit::Usage),
    };
    if opts.check {
        let vars = file_vars.unwrap_or_else(|| process_env().0);
        let report = check_env(view.as_ref(), &topo, &flags.uds_path, &vars);
        if opts.json {
            println!("{}", serde_json::to_string_pretty(&report).expect("JSON of plain data"));
        } else {
            print!("{}", report.text());
        }
        return Exit::of(report.ok);
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
            Exit::Done
        }
        Err(e) => {
            let end = if e.is_flag_error() { Exit::Usage } else { Exit::Failed };
            fail(e, end)
        }
    }
}
