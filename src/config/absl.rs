//! absl's flag forms for any clap command, and the daemon's flags as
//! arguments of a subcommand.
//!
//! The reference daemon takes `--flag=V`, `--flag V`, `-flag=V`, `-flag V`,
//! and for booleans also `--flag`, `--flag=true|false` and `--noflag`.
//! [`normalize`] rewrites those words into what clap parses, for the command
//! (or subcommand) each word is given to, so that every subcommand accepts
//! the same forms as the daemon (`status --nojson`, `doctor -uds_path=/x`).

use std::any::TypeId;

use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory};

use super::flags::Flags;

/// The heading the daemon's flags stand under on a subcommand's page.
pub const DAEMON_HEADING: &str = "Daemon flags";

/// Whether `arg` is an absl boolean: a `bool` value, optional on the command line.
fn is_bool(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Set)
        && arg.get_value_parser().type_id() == TypeId::of::<bool>()
        && arg.get_num_args().is_some_and(|r| r.min_values() == 0)
}

/// Whether `arg` takes its value from the next word when given without `=`.
fn takes_next_word(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Set | ArgAction::Append)
        && arg.get_num_args().is_none_or(|r| r.min_values() != 0)
}

fn long<'a>(cmd: &'a Command, name: &str) -> Option<&'a Arg> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|v| v.contains(&name)))
}

/// Rewrites absl forms into clap's, word by word, for `cmd` and then for the
/// subcommand whose name appears (`inject serve …`): `-flag[=V]` →
/// `--flag[=V]`, `--noflag` → `--flag=false` for booleans. A single-dash
/// word that starts with one of the command's short options (`-fFILE`) is
/// left alone. Everything after a bare `--` is passed through.
pub fn normalize<I: IntoIterator<Item = String>>(cmd: &Command, args: I) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = cmd;
    let mut value_next = false;
    let mut passthrough = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || passthrough || value_next || arg == "-" {
            value_next = false;
            out.push(arg);
            continue;
        }
        if arg == "--" {
            passthrough = true;
            out.push(arg);
            continue;
        }
        if !arg.starts_with('-') {
            if let Some(sub) = cur.find_subcommand(&arg) {
                cur = sub;
            }
            out.push(arg);
            continue;
        }
        let word = match arg.strip_prefix("--") {
            Some(_) => arg,
            None => {
                let bare = &arg[1..];
                let name = bare.split('=').next().unwrap_or_default();
                let known = |n: &str| long(cur, n).is_some() || n == "help" || n == "version";
                let is_long = known(name) || name.strip_prefix("no").is_some_and(known);
                let short = bare.chars().next().filter(|c| c.is_ascii_alphabetic());
                let is_short =
                    short.is_some_and(|c| c == 'h' || cur.get_arguments().any(|a| a.get_short() == Some(c)));
                if bare.len() < 2 || short.is_none() || (is_short && !is_long) {
                    out.push(arg);
                    continue;
                }
                format!("-{arg}")
            }
        };
        let (name, has_value) = match word[2..].split_once('=') {
            Some((n, _)) => (n, true),
            None => (&word[2..], false),
        };
        let negated = name.strip_prefix("no").and_then(|b| long(cur, b)).filter(|a| is_bool(a));
        match (negated, has_value) {
            (Some(arg), false) => out.push(format!("--{}=false", arg.get_long().unwrap_or_default())),
            _ => {
                value_next = !has_value && long(cur, name).is_some_and(takes_next_word);
                out.push(word);
            }
        }
    }
    out
}

/// The daemon's flags as arguments of a subcommand, under [`DAEMON_HEADING`]:
/// those named in `shown` on its page, the others accepted (a daemon's whole
/// command line may be given) but hidden.
pub fn daemon_args(shown: &[&str]) -> Vec<Arg> {
    Flags::command()
        .get_arguments()
        .map(|a| {
            let id = a.get_id().as_str();
            a.clone().help_heading(DAEMON_HEADING).hide(!shown.contains(&id))
        })
        .collect()
}

/// The daemon's flags given on the command line of `matches` (a command
/// built with [`daemon_args`]), as `--name=value` words in the order given.
pub fn given_daemon_words(matches: &ArgMatches) -> Vec<String> {
    let mut words: Vec<(usize, String)> = Vec::new();
    for arg in Flags::command().get_arguments() {
        let id = arg.get_id().as_str();
        let Some(name) = arg.get_long() else { continue };
        if matches.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let values = matches.get_raw(id).into_iter().flatten();
        let indices = matches.indices_of(id).into_iter().flatten();
        for (at, v) in indices.zip(values) {
            words.push((at, format!("--{name}={}", v.to_string_lossy())));
        }
    }
    words.sort();
    words.into_iter().map(|(_, w)| w).collect()
}

/// A boolean option in absl's forms (`--name`, `--name=true|false`, `--noname`
/// after [`normalize`]), false unless given.
pub fn bool_arg(name: &'static str) -> Arg {
    Arg::new(name)
        .long(name)
        .action(ArgAction::Set)
        .num_args(0..=1)
        .require_equals(true)
        .value_name("BOOL")
        .default_value("false")
        .default_missing_value("true")
        .hide_default_value(true)
        .hide_possible_values(true)
        .value_parser(clap::builder::BoolishValueParser::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> Command {
        Command::new("t")
            .arg(bool_arg("json"))
            .arg(Arg::new("file").short('f').long("filename"))
            .arg(Arg::new("uds_path").long("uds_path"))
            .subcommand(Command::new("serve").arg(bool_arg("check")).arg(Arg::new("listen").long("listen")))
    }

    fn norm(args: &[&str]) -> Vec<String> {
        normalize(&cmd(), std::iter::once("t").chain(args.iter().copied()).map(String::from))[1..].to_vec()
    }

    #[test]
    fn absl_forms_become_clap_forms_per_command() {
        assert_eq!(
            norm(&["--nojson", "-json=true", "-uds_path", "/x"]),
            ["--json=false", "--json=true", "--uds_path", "/x"]
        );
        // A value in the next word is never rewritten, even when it looks like a flag.
        assert_eq!(norm(&["--uds_path", "-nojson"]), ["--uds_path", "-nojson"]);
        // Short options stay short; a word led by one is its value.
        assert_eq!(norm(&["-f", "-", "-fx.yaml", "-h"]), ["-f", "-", "-fx.yaml", "-h"]);
        assert_eq!(norm(&["-help", "-filename=a"]), ["--help", "--filename=a"]);
        // After the subcommand's name, its own booleans.
        assert_eq!(norm(&["serve", "--nocheck", "-listen=:1"]), ["serve", "--check=false", "--listen=:1"]);
        // Unknown words go to clap as long flags, which names them.
        assert_eq!(norm(&["-bogus", "--nobogus", "--", "-json"]), ["--bogus", "--nobogus", "--", "-json"]);
    }

    #[test]
    fn daemon_flags_given_come_back_as_words_in_order() {
        let c = Command::new("t").args(daemon_args(&["uds_path"])).args_override_self(true);
        let m = c
            .try_get_matches_from([
                "t",
                "--uds_path=/a",
                "--noleases",
                "--sim_fault=add_rule:EIO:1",
                "--uds_path",
                "/b",
            ])
            .unwrap_err();
        // --noleases is absl: it needs normalize first.
        assert_eq!(m.kind(), clap::error::ErrorKind::UnknownArgument);
        let c = Command::new("t").args(daemon_args(&["uds_path"])).args_override_self(true);
        let argv = [
            "t",
            "--uds_path=/a",
            "--noleases",
            "--sim_fault=add_rule:EIO:1",
            "--uds_path",
            "/b",
            "--takeover",
        ];
        let m = c.clone().try_get_matches_from(normalize(&c, argv.map(String::from))).unwrap();
        assert_eq!(
            given_daemon_words(&m),
            ["--leases=false", "--sim_fault=add_rule:EIO:1", "--uds_path=/b", "--takeover=on"]
        );
        // Only the shown flags are on the page.
        let help = c.clone().render_help().to_string();
        assert!(help.contains("--uds_path") && !help.contains("--leases"), "{help}");
    }
}
