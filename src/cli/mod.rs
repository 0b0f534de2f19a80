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
use daemon_args::{flags_of, DAEMON_HEADING};

mod commands;
mod completions;
mod daemon_args;
mod inject_args;
pub mod logging;
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
    if let Some(page) = help_of_help(&mut cmd, &argv) {
        return Err(page);
    }
    let m = match cmd.try_get_matches_from_mut(argv.clone()) {
        Ok(m) => m,
        Err(e) => return Err(unknown_flag(&mut cmd, &argv, e)),
    };
    let Some((name, sub)) = m.subcommand() else {
        return Flags::from_matches(&mut cmd, &m).map(|f| Invocation::Daemon(Box::new(f)));
    };
    cmd.build();
    let sub_cmd = cmd.find_subcommand_mut(name).expect("a parsed command exists");
    let flags = |c: &mut Command, m: &ArgMatches| flags_of(c, m).map(Box::new);
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

/// `tcpx-rxdm help --help` (or `-h` anywhere after `help`): the page of
/// `help` itself, exit 0, as cargo and kubectl show it (clap's `help` takes
/// command names only, and would call `--help` an unknown command).
fn help_of_help(cmd: &mut Command, argv: &[String]) -> Option<clap::Error> {
    let rest = argv.get(2..).filter(|_| argv.get(1).is_some_and(|w| w == "help"))?;
    if !rest.iter().take_while(|w| *w != "--").any(|w| w == "--help" || w == "-h") {
        return None;
    }
    cmd.build();
    let built = cmd.find_subcommand("help")?;
    let page = Command::new("help")
        .bin_name("tcpx-rxdm help")
        .about(built.get_about().cloned().unwrap_or_default())
        .long_about(
            "Prints the page of tcpx-rxdm (as `tcpx-rxdm --help`), or of the command named: \
             `tcpx-rxdm help inject serve` is `tcpx-rxdm inject serve --help`.",
        )
        .arg(
            clap::Arg::new("command")
                .value_name("COMMAND")
                .num_args(0..)
                .help("A command, and its subcommand (inject serve)"),
        );
    page.try_get_matches_from(["help", "--help"]).err()
}

/// The names of the commands `argv` runs (`["inject", "serve"]`).
fn command_path(cmd: &Command, argv: &[String]) -> Vec<String> {
    let mut path = Vec::new();
    let mut cur = cmd;
    for w in argv.iter().skip(1).take_while(|w| *w != "--") {
        if let Some(sub) = cur.find_subcommand(w) {
            path.push(w.clone());
            cur = sub;
        }
    }
    path
}

/// A flag the command does not take, said with what to do instead: a flag
/// the reference tcpgpudmarxd takes and tcpx-rxdm does not (`--enable_quickack`,
/// absl's logging flags), a daemon flag given to a command that does not
/// read it, or one no daemon in a Pod may have (`inject`). Other unknown
/// words keep clap's message, less its advice to pass the word after `--`:
/// no argument of ours takes a word that starts with a dash, so that would
/// fail too. Still a usage error (exit 2): nothing is silently ignored.
fn unknown_flag(cmd: &mut Command, argv: &[String], e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(typed)) = e.get(ContextKind::InvalidArg) else { return e };
    let typed = typed.clone();
    cmd.build();
    let path = command_path(cmd, argv);
    let mut target: &mut Command = cmd;
    for name in &path {
        target = target.find_subcommand_mut(name).expect("a command found by name");
    }
    if let Some((name, instead)) = crate::config::retired::instead_of(&typed) {
        let msg =
            format!("--{name} is a flag the reference tcpgpudmarxd takes and tcpx-rxdm does not: {instead}");
        return target.error(ErrorKind::UnknownArgument, msg);
    }
    let daemon_flag = daemon_args::daemon_flag_named(&typed).filter(|_| !path.is_empty());
    if let Some(name) = daemon_flag {
        let why = match path[0].as_str() {
            "inject" => inject::pod_flags::not_for_a_pod(&name).map(|why| format!("--{name}: {why}")),
            _ => Some(not_read_by(target, &path, &name)),
        };
        if let Some(why) = why {
            return target.error(ErrorKind::UnknownArgument, why);
        }
    }
    without_dash_dash_advice(target, e)
}

/// Why the daemon flag `name` is refused by the command at `path`, and
/// which of the daemon's flags that command does read.
fn not_read_by(target: &Command, path: &[String], name: &str) -> String {
    let daemon = Flags::command();
    let reads: Vec<String> = target
        .get_arguments()
        .filter(|a| daemon.get_arguments().any(|d| d.get_id() == a.get_id()))
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let full = format!("tcpx-rxdm {}", path.join(" "));
    let reads = match reads.len() {
        0 => "it reads none of the daemon's flags".to_string(),
        1..=4 => format!("of the daemon's flags it reads only {}", reads.join(", ")),
        _ => format!("`{full} --help` lists the daemon's flags it reads"),
    };
    format!("--{name} is a daemon flag (`tcpx-rxdm --help`), and `{full}` does not read it: {reads}")
}

/// `e` without clap's advice to pass the unknown word after `--`.
fn without_dash_dash_advice(target: &Command, e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::StyledStrs(tips)) = e.get(ContextKind::Suggested) else { return e };
    let kept: Vec<_> = tips.iter().filter(|t| !t.to_string().starts_with("to pass '")).cloned().collect();
    if kept.len() == tips.len() {
        return e;
    }
    let mut out = clap::Error::new(e.kind()).with_cmd(target);
    for (kind, value) in e.context().filter(|(k, _)| *k != ContextKind::Suggested) {
        out.insert(kind, value.clone());
    }
    if !kept.is_empty() {
        out.insert(ContextKind::Suggested, ContextValue::StyledStrs(kept));
    }
    out
}

/// Writes the completion script for `shell`.
pub fn write_completions(shell: Shell, out: &mut dyn std::io::Write) {
    let _ = out.write_all(completions::script(command(), shell).as_bytes());
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
