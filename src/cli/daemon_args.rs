//! The daemon's flags as arguments of a subcommand, and back: the words a
//! subcommand passes on to the daemon it describes (`inject`), and the
//! daemon's flags of a command that reads some of them (`status`, `doctor`).

use clap::{Arg, ArgMatches, Command, CommandFactory};

use crate::config::flags::{Flags, BOOL_FLAGS};

/// The heading the daemon's flags stand under, on every page.
pub const DAEMON_HEADING: &str = "Daemon flags";

/// The daemon's flags named in `reads`, for a command that reads them,
/// under [`DAEMON_HEADING`]. The others are not the command's: given to it,
/// they are refused by name ([`daemon_flag_named`]), not accepted unread.
pub fn daemon_args(reads: &[&str]) -> Vec<Arg> {
    Flags::command()
        .get_arguments()
        .filter(|a| reads.contains(&a.get_id().as_str()))
        .map(|a| a.clone().help_heading(DAEMON_HEADING))
        .collect()
}

/// Every daemon flag but those `refused` names, hidden: a command that
/// passes them on to a daemon (`inject`) and names them `[DAEMON FLAGS]`.
pub fn daemon_args_but(refused: impl Fn(&str) -> bool) -> Vec<Arg> {
    Flags::command()
        .get_arguments()
        .filter(|a| !refused(a.get_id().as_str()))
        .map(|a| a.clone().help_heading(DAEMON_HEADING).hide(true))
        .collect()
}

/// The daemon flag that `typed` (a word as given: its dashes, a `=value`,
/// or a boolean's `--noflag` form) names, if it names one.
pub fn daemon_flag_named(typed: &str) -> Option<String> {
    let name = typed.trim_start_matches('-').split('=').next().unwrap_or_default();
    let flags = Flags::command();
    let is_flag = |n: &str| flags.get_arguments().any(|a| a.get_long() == Some(n));
    match name.strip_prefix("no") {
        _ if is_flag(name) => Some(name.to_string()),
        Some(bare) if BOOL_FLAGS.contains(&bare) => Some(bare.to_string()),
        _ => None,
    }
}

/// The daemon's flags given on the command line of `matches` (a command
/// built with [`daemon_args`] or [`daemon_args_but`]), as `--name=value`
/// words in the order given.
pub fn given_daemon_words(matches: &ArgMatches) -> Vec<String> {
    let mut words: Vec<(usize, String)> = Vec::new();
    let daemon = Flags::command();
    for id in matches.ids() {
        let Some(name) = daemon.get_arguments().find(|a| a.get_id() == id).and_then(Arg::get_long) else {
            continue;
        };
        let id = id.as_str();
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

/// The daemon's flags of a command that reads some of them: those given,
/// the daemon's defaults for the rest (and its checks of flags that go
/// together); an error is a usage error of `cmd`.
pub fn flags_of(cmd: &mut Command, matches: &ArgMatches) -> Result<Flags, clap::Error> {
    let argv = std::iter::once("tcpx-rxdm".to_string()).chain(given_daemon_words(matches));
    Flags::parse_args(argv).map_err(|e| {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default().trim_start_matches("error: ");
        cmd.error(e.kind(), first)
    })
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::Command;

    use super::*;
    use crate::config::absl::normalize;

    #[test]
    fn daemon_flags_given_come_back_as_words_in_order() {
        let c = Command::new("t").args(daemon_args_but(|id| id == "node_wide")).args_override_self(true);
        let argv = [
            "t",
            "--uds_path=/a",
            "--noleases",
            "--sim_fault=add_rule:EIO:1",
            "--uds_path",
            "/b",
            "--takeover",
        ];
        // --noleases is absl: it needs normalize first.
        let e = c.clone().try_get_matches_from(argv).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        let m = c.clone().try_get_matches_from(normalize(&c, argv.map(String::from))).unwrap();
        assert_eq!(
            given_daemon_words(&m),
            ["--leases=false", "--sim_fault=add_rule:EIO:1", "--uds_path=/b", "--takeover=on"]
        );
        // Hidden from the page; a refused one is not there at all.
        let help = c.clone().render_help().to_string();
        assert!(!help.contains("--uds_path"), "{help}");
        let e = c.clone().try_get_matches_from(["t", "--node_wide"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn a_command_has_only_the_daemon_flags_it_reads_and_its_flags_get_the_daemons_defaults() {
        let mut c = Command::new("t").args(daemon_args(&["uds_path", "leases"])).args_override_self(true);
        let help = c.render_help().to_string();
        assert!(help.contains("--uds_path") && help.contains("--leases"), "{help}");
        assert!(!help.contains("--gpu_nic_preset"), "{help}");
        let argv = ["t", "--uds_path=/x", "--noleases"].map(String::from);
        let m = c.clone().try_get_matches_from(normalize(&c, argv)).unwrap();
        let f = flags_of(&mut c, &m).unwrap();
        assert_eq!((f.uds_path.to_str(), f.leases, f.gpu_nic_preset.as_str()), (Some("/x"), false, "auto"));
        let e = c.clone().try_get_matches_from(["t", "--gpu_nic_preset=sim"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn daemon_flags_are_known_in_every_form_and_others_are_not() {
        for (typed, name) in [
            ("--gpu_nic_preset", "gpu_nic_preset"),
            ("-uds_path=/x", "uds_path"),
            ("--noleases", "leases"),
            ("--node_wide=true", "node_wide"),
        ] {
            assert_eq!(daemon_flag_named(typed).as_deref(), Some(name), "{typed}");
        }
        for other in ["--json", "--format=json", "--nouds_path", "--notakeover", "-o"] {
            assert_eq!(daemon_flag_named(other), None, "{other}");
        }
    }
}
