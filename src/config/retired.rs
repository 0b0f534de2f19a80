//! Flags a reference daemon's command line may carry that tcpx-rxdm does not
//! take: the reference's own `--enable_quickack` (older releases) and the
//! flags of the absl libraries it links (logging, flag files, help forms).
//! Each comes with what to do instead, so that a command line carried over
//! stops with the way forward, not a bare "unexpected argument" (still exit 2:
//! nothing is silently ignored). docs/MIGRATING.md lists the same flags.

/// A flag's name (without dashes) and what to do instead.
pub const RETIRED: [(&str, &str); 11] = [
    (
        "enable_quickack",
        "quickack is the third value of --setup_param: --setup_param=\"--verbose 128 2 1\" turns it on \
         (the default, \"--verbose 128 2 0\", leaves it off)",
    ),
    ("logtostderr", "logs always go to stderr (the journal, the container's log): drop it"),
    ("alsologtostderr", "logs always go to stderr (the journal, the container's log): drop it"),
    ("log_dir", "there are no log files: logs go to stderr (the journal, the container's log); drop it"),
    ("minloglevel", "use --log_level (error, warn, info, debug or trace)"),
    ("stderrthreshold", "use --log_level (error, warn, info, debug or trace)"),
    ("v", "use --log_level=debug (or trace) for more detail"),
    ("vmodule", "per-module levels go in RUST_LOG, e.g. RUST_LOG=info,tcpx_rxdm::steering=debug"),
    (
        "flagfile",
        "flags are read from the command line only: put them there (the systemd unit appends \
         TCPX_RXDM_ARGS from /etc/default/tcpx-rxdm)",
    ),
    ("helpfull", "use --help: it lists every flag"),
    ("helpshort", "use --help"),
];

/// What to do instead of `flag` (as typed: dashes and a `=value` allowed,
/// also the `--noflag` form), when it is one tcpx-rxdm does not take.
pub fn instead_of(flag: &str) -> Option<(&'static str, &'static str)> {
    let name = flag.trim_start_matches('-').split('=').next().unwrap_or_default();
    let find = |n: &str| RETIRED.iter().find(|(r, _)| *r == n).copied();
    find(name).or_else(|| name.strip_prefix("no").and_then(find))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_retired_flag_is_found_and_ours_are_not() {
        for typed in ["--enable_quickack", "-enable_quickack=true", "--noenable_quickack", "--v=2"] {
            assert!(instead_of(typed).is_some(), "{typed}");
        }
        assert_eq!(instead_of("--enable_quickack").unwrap().0, "enable_quickack");
        for ours in ["--setup_param", "--log_level=info", "--verbose"] {
            assert!(instead_of(ours).is_none(), "{ours}");
        }
        for (name, _) in RETIRED {
            let line = ["tcpx-rxdm".to_string(), format!("--{name}=1")];
            assert!(crate::config::flags::Flags::parse_args(line).is_err(), "--{name} is a flag of ours");
        }
    }
}
