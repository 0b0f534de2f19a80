//! The daemon's flags as arguments of a subcommand, and back: the words a
//! subcommand passes on to the daemon it describes (`inject`).

use clap::{Arg, ArgMatches, CommandFactory};

use crate::config::flags::Flags;

/// The heading the daemon's flags stand under, on every page.
pub const DAEMON_HEADING: &str = "Daemon flags";

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

#[cfg(test)]
mod tests {
    use clap::Command;

    use super::*;
    use crate::config::absl::normalize;

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
