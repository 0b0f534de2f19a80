//! The command tree: `tcpx-rxdm [DAEMON FLAGS]` runs the daemon, with the
//! reference's absl-style flags exactly as before; `tcpx-rxdm COMMAND …`
//! runs a subcommand. One clap definition gives `--help`, `help CMD`, the
//! suggestions for a mistyped command or flag, the shell completions and the
//! man page, so none of them can forget a command or a flag. The commands'
//! modules know nothing of clap: this module defines each command, puts
//! them together, and turns the matches into the plain options each takes
//! (an [`Invocation`]).

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{ArgMatches, Command, CommandFactory};
use clap_complete::Shell;

use crate::config::absl;
use crate::config::flags::Flags;
use crate::inject::serve::ServeConfig;
use crate::{inject, nccl, upgrade};
use daemon_args::DAEMON_HEADING;

mod commands;
mod daemon_args;
mod inject_args;
pub mod pages;

/// What the command line asks for.
#[derive(Debug)]
pub enum Invocation {
    /// Run the daemon.
    Daemon(Box<Flags>),
    Status {
        flags: Box<Flags>,
        what: Option<String>,
        json: bool,
    },
    Doctor {
        flags: Box<Flags>,
        json: bool,
    },
    NcclEnv {
        flags: Box<Flags>,
        opts: nccl::command::Options,
    },
    Inject(inject::command::Invocation),
    InjectServe(Box<ServeConfig>),
    Upgrade(upgrade::Options),
    Completions(Shell),
    /// `version`: what `--version` prints.
    Version,
    /// The man page on stdout, or every page written to a folder.
    Man {
        dir: Option<PathBuf>,
    },
}

/// The whole tree.
pub fn command() -> Command {
    Flags::command()
        .version(env!("CARGO_PKG_VERSION"))
        .disable_version_flag(false)
        .mut_args(|a| a.help_heading(DAEMON_HEADING))
        .override_usage("tcpx-rxdm [DAEMON FLAGS]\n       tcpx-rxdm <COMMAND> [OPTIONS]")
        .args_conflicts_with_subcommands(true)
        .subcommand(commands::status())
        .subcommand(commands::doctor())
        .subcommand(commands::nccl_env())
        .subcommand(inject_args::inject())
        .subcommand(commands::upgrade())
        .subcommand(commands::completions())
        .subcommand(commands::man())
        .subcommand(commands::version())
        .after_help(pages::after_help())
        .after_long_help(pages::after_long_help())
}

/// Whether the command line (program name first) runs a command rather
/// than the daemon (so that an error is not the daemon's).
pub fn is_command_line(args: &[String]) -> bool {
    let cmd = command();
    let argv = absl::options_after_command(&cmd, absl::normalize(&cmd, args.iter().cloned()));
    argv.get(1).is_some_and(|w| cmd.find_subcommand(w).is_some() || w == "help")
}

/// Parses a command line (program name first). Never panics and never
/// exits: `--help`, `--version` and bad command lines are errors to print
/// (`exit_code()` 0 for the first two, 2 for usage errors). Options given
/// before a command's name are the command's (`--uds_path=/x status`).
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Invocation, clap::Error> {
    let mut cmd = command();
    let argv = absl::options_after_command(&cmd, absl::normalize(&cmd, args));
    let m = match cmd.try_get_matches_from_mut(argv.clone()) {
        Ok(m) => m,
        Err(e) => return Err(retired_flag(&mut cmd, &argv, e)),
    };
    let Some((name, sub)) = m.subcommand() else {
        return Flags::from_matches(&mut cmd, &m).map(|f| Invocation::Daemon(Box::new(f)));
    };
    cmd.build();
    let sub_cmd = cmd.find_subcommand_mut(name).expect("a parsed command exists");
    let flags = |c: &mut Command, m: &ArgMatches| Flags::from_matches(c, m).map(Box::new);
    Ok(match name {
        "status" => Invocation::Status {
            flags: flags(sub_cmd, sub)?,
            what: sub.get_one::<String>("what").cloned(),
            json: commands::json_output(sub_cmd, sub)?,
        },
        "doctor" => {
            Invocation::Doctor { flags: flags(sub_cmd, sub)?, json: commands::json_output(sub_cmd, sub)? }
        }
        "nccl-env" => {
            let opts = commands::nccl_env_options(sub_cmd, sub)?;
            Invocation::NcclEnv { flags: flags(sub_cmd, sub)?, opts }
        }
        "inject" => match sub.subcommand() {
            Some((_, serve)) => {
                let serve_cmd = sub_cmd.find_subcommand_mut("serve").expect("inject serve exists");
                let cfg = inject_args::serve_config(serve)
                    .map_err(|e| serve_cmd.error(ErrorKind::ValueValidation, e))?;
                Invocation::InjectServe(Box::new(cfg))
            }
            None => Invocation::Inject(
                inject_args::invocation(sub).map_err(|e| sub_cmd.error(ErrorKind::ValueValidation, e))?,
            ),
        },
        "upgrade" => Invocation::Upgrade(commands::upgrade_options(sub)),
        "completions" => Invocation::Completions(*sub.get_one::<Shell>("shell").expect("required")),
        "man" => Invocation::Man { dir: sub.get_one::<PathBuf>("dir").cloned() },
        "version" => Invocation::Version,
        other => {
            return Err(clap::Error::raw(ErrorKind::InvalidSubcommand, format!("no such command {other}\n")))
        }
    })
}

/// An unknown flag that a reference daemon's command line may carry
/// (`--enable_quickack`, absl's logging flags): the error says what to do
/// instead, still a usage error (exit 2). Any other error is returned as is.
fn retired_flag(cmd: &mut Command, argv: &[String], e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(typed)) = e.get(ContextKind::InvalidArg) else { return e };
    let Some((name, instead)) = crate::config::retired::instead_of(typed) else { return e };
    cmd.build();
    let target = match argv.get(1).and_then(|w| cmd.find_subcommand_mut(w)) {
        Some(sub) => sub,
        None => cmd,
    };
    target.error(
        ErrorKind::UnknownArgument,
        format!("--{name} is a flag the reference tcpgpudmarxd takes and tcpx-rxdm does not: {instead}"),
    )
}

/// Writes the completion script for `shell`.
pub fn write_completions(shell: Shell, out: &mut dyn std::io::Write) {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command(), BIN_NAME, &mut script);
    if shell == Shell::Bash {
        script = bash_case_labels_fixed(&script);
    }
    let _ = out.write_all(&script);
}

const BIN_NAME: &str = "tcpx-rxdm";

/// clap_complete (4.6.11, the newest) names a subcommand's state in bash
/// `tcpx__rxdm__subcmd__inject` where it walks the words, but labels the
/// branch that completes its options `tcpx__subcmd__rxdm__subcmd__inject`
/// (the hyphen in the binary's name turned into a separator): no branch
/// matched, so no subcommand's options were offered. The labels are renamed
/// to the states.
fn bash_case_labels_fixed(script: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(script);
    let wrong = format!("{}__subcmd__", BIN_NAME.replace('-', "__subcmd__"));
    let right = format!("{}__subcmd__", BIN_NAME.replace('-', "__"));
    text.replace(&wrong, &right).into_bytes()
}

/// Writes the top-level man page, or every page into `dir` (returning their paths).
pub fn write_man(
    dir: Option<&std::path::Path>,
    out: &mut dyn std::io::Write,
) -> std::io::Result<Vec<PathBuf>> {
    pages::write_man(command(), dir, out)
}

#[cfg(test)]
mod tests;
