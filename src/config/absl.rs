//! absl's flag forms for any clap command.
//!
//! The reference daemon takes `--flag=V`, `--flag V`, `-flag=V`, `-flag V`,
//! and for booleans also `--flag`, `--flag=true|false` and `--noflag`.
//! [`normalize`] rewrites those words into what clap parses, for the command
//! (or subcommand) each word is given to, so that every subcommand accepts
//! the same forms as the daemon (`status --nojson`, `doctor -uds_path=/x`).

use std::any::TypeId;

use clap::{Arg, ArgAction, Command};

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

/// Moves the options given before a subcommand's name to just after it
/// (`tcpx-rxdm --uds_path=/x status` → `tcpx-rxdm status --uds_path=/x`), as
/// kubectl and cargo take global options on either side of the command.
/// `args` is already [`normalize`]d; a help or version flag among the words
/// moved, or a first word that is not a subcommand, leaves them as they are.
pub fn options_after_command(cmd: &Command, args: Vec<String>) -> Vec<String> {
    let mut i = 1;
    while let Some(word) = args.get(i) {
        if word == "--" || word == "-" || !word.starts_with('-') {
            break;
        }
        if ["-h", "--help", "-V", "--version"].contains(&word.as_str()) {
            return args;
        }
        let name = word.trim_start_matches('-');
        i += 1;
        if !name.contains('=') && long(cmd, name).is_some_and(takes_next_word) {
            i += 1;
        }
    }
    let Some(sub) = args.get(i).filter(|w| cmd.find_subcommand(w.as_str()).is_some()) else { return args };
    if i == 1 || sub == "help" {
        return args;
    }
    let mut out = vec![args[0].clone(), sub.clone()];
    out.extend(args[1..i].iter().cloned());
    out.extend(args[i + 1..].iter().cloned());
    out
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
    fn options_before_a_command_move_after_its_name() {
        let hoist = |args: &[&str]| {
            let argv = std::iter::once("t").chain(args.iter().copied()).map(String::from).collect();
            options_after_command(&cmd(), argv)[1..].to_vec()
        };
        assert_eq!(hoist(&["--uds_path=/x", "serve", "--check"]), ["serve", "--uds_path=/x", "--check"]);
        assert_eq!(hoist(&["--uds_path", "/x", "--json", "serve"]), ["serve", "--uds_path", "/x", "--json"]);
        // Not a command, no options first, or a help flag: as given.
        assert_eq!(hoist(&["--uds_path", "serve"]), ["--uds_path", "serve"]);
        assert_eq!(hoist(&["serve", "--json"]), ["serve", "--json"]);
        assert_eq!(hoist(&["--help", "serve"]), ["--help", "serve"]);
        assert_eq!(hoist(&["--json", "--", "serve"]), ["--json", "--", "serve"]);
    }
}
