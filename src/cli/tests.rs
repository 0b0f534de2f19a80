//! The tree is well formed and each command line lands where it should.

use super::*;

fn parse_line(line: &[&str]) -> Result<Invocation, clap::Error> {
    parse(std::iter::once("tcpx-rxdm").chain(line.iter().copied()).map(String::from))
}

#[test]
fn the_tree_passes_claps_own_checks() {
    // Panics (in debug builds) on a duplicated name, a bad default, a conflict naming no argument.
    command().debug_assert();
}

#[test]
fn no_words_or_daemon_flags_run_the_daemon_as_before() {
    let Ok(Invocation::Daemon(f)) = parse_line(&[]) else { panic!("not the daemon") };
    assert_eq!(f.gpu_nic_preset, "auto");
    let line = ["-gpu_nic_preset", "sim", "--uds_path=/tmp/x", "--nomonitor_shutdown", "--leases=false"];
    let Ok(Invocation::Daemon(f)) = parse_line(&line) else { panic!("not the daemon") };
    assert_eq!((f.gpu_nic_preset.as_str(), f.uds_path.to_str()), ("sim", Some("/tmp/x")));
    assert!(!f.monitor_shutdown && !f.leases);
    // The same conflicts as the daemon's own parser.
    assert_eq!(parse_line(&["--node_wide", "--monitor_shutdown"]).unwrap_err().exit_code(), 2);
}

#[test]
fn subcommands_take_their_options_in_every_absl_form() {
    for (line, want) in [
        (&["status", "--json"][..], true),
        (&["status", "--json=true"], true),
        (&["status", "-json"], true),
        (&["status", "--json", "--nojson"], false),
        (&["status", "--json=0"], false),
    ] {
        let Ok(Invocation::Status { json, .. }) = parse_line(line) else { panic!("{line:?}") };
        assert_eq!(json, want, "{line:?}");
    }
    let Ok(Invocation::Status { flags, what, .. }) = parse_line(&["status", "mine", "-uds_path", "/run/x"])
    else {
        panic!("status mine")
    };
    assert_eq!((what.as_deref(), flags.uds_path.to_str()), (Some("mine"), Some("/run/x")));
    // The daemon flags a command reads, in the daemon's forms.
    let Ok(Invocation::Doctor { flags, json }) =
        parse_line(&["doctor", "-gpu_nic_preset=sim", "--tenant_isolation", "enforce", "--nojson"])
    else {
        panic!("doctor")
    };
    assert_eq!((flags.gpu_nic_preset.as_str(), json), ("sim", false));
}

#[test]
fn nccl_env_options_are_checked_together() {
    let Ok(Invocation::NcclEnv { opts, .. }) = parse_line(&["nccl-env", "--json"]) else { panic!() };
    assert_eq!((opts.format, opts.check), (nccl::command::Format::Json, false));
    let Ok(Invocation::NcclEnv { opts, .. }) = parse_line(&["nccl-env", "--check", "--env-file", "f"]) else {
        panic!()
    };
    assert_eq!(opts.env_file.as_deref(), Some(std::path::Path::new("f")));
    for bad in [&["nccl-env", "--env-file=f"][..], &["nccl-env", "--check", "--format=env"]] {
        let e = parse_line(bad).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{bad:?}");
        assert!(e.to_string().contains("Usage: tcpx-rxdm nccl-env"), "{e}");
    }
}

#[test]
fn inject_passes_the_daemon_flags_given_on_in_order() {
    let Ok(Invocation::Inject(inv)) =
        parse_line(&["inject", "-f", "-", "--noleases", "--tenant_isolation", "enforce", "--require-gpu"])
    else {
        panic!("inject")
    };
    assert_eq!(inv.opts.daemon_flags, ["--leases=false", "--tenant_isolation=enforce"]);
    assert!(inv.require_gpu && !inv.opts.given.image && !inv.opts.given.mode);
    assert_eq!(inv.files, ["-"]);
    let Ok(Invocation::InjectServe(cfg)) =
        parse_line(&["inject", "serve", "--on-error=allow", "--mode=sidecar"])
    else {
        panic!("inject serve")
    };
    assert_eq!(cfg.inject.mode, inject::Mode::Sidecar);
    // A bad daemon flag for the injected daemon is a usage error of `inject serve`.
    let e = parse_line(&["inject", "serve", "--on-error=allow", "--node_wide"]).unwrap_err();
    assert!(e.to_string().contains("Usage: tcpx-rxdm inject serve"), "{e}");
}

#[test]
fn mistakes_get_a_suggestion_and_the_usage_of_the_command_given() {
    let e = parse_line(&["stauts"]).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("'status'"), "{e}");
    for (line, usage) in [
        (&["status", "--jsn"][..], "Usage: tcpx-rxdm status"),
        (&["doctor", "--uds_pth=/x"], "Usage: tcpx-rxdm doctor"),
        (&["upgrade", "--timout=1s"], "Usage: tcpx-rxdm upgrade"),
        (&["inject", "--imgae=x"], "Usage: tcpx-rxdm inject"),
    ] {
        let e = parse_line(line).unwrap_err().to_string();
        assert!(e.contains("tip: a similar argument exists") && e.contains(usage), "{line:?}: {e}");
        assert!(!e.contains("[DAEMON FLAGS]\n       tcpx-rxdm <COMMAND>"), "the daemon's usage: {e}");
    }
}

#[test]
fn completions_and_man_pages_come_from_the_tree() {
    let mut out = Vec::new();
    write_man(None, &mut out).unwrap();
    let page = String::from_utf8(out).unwrap();
    for word in ["nccl\\-env", "completions", "\\-\\-gpu_nic_preset"] {
        assert!(page.contains(word), "{word} not in the man page");
    }
    let dir = tempfile::tempdir().unwrap();
    let pages = write_man(Some(dir.path()), &mut Vec::new()).unwrap();
    let names: Vec<String> =
        pages.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert!(
        names.contains(&"tcpx-rxdm.1".to_string()) && names.contains(&"tcpx-rxdm-inject-serve.1".to_string())
    );
}

fn upgrade(args: &[&str]) -> Result<upgrade::Options, String> {
    let mut line = vec!["upgrade"];
    line.extend(args);
    match parse_line(&line) {
        Ok(Invocation::Upgrade(o)) => Ok(o),
        Ok(other) => panic!("{args:?}: {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn upgrade_takes_the_folder_and_a_timeout_in_both_value_forms() {
    use std::time::Duration;
    let o = upgrade(&[]).unwrap();
    assert_eq!(o, upgrade::Options { uds_path: "/run/tcpx".into(), timeout: Duration::from_secs(60) });
    let o = upgrade(&["--uds_path=/tmp/x", "--timeout=1500ms"]).unwrap();
    assert_eq!(o, upgrade::Options { uds_path: "/tmp/x".into(), timeout: Duration::from_millis(1500) });
    let o = upgrade(&["-uds_path", "/tmp/y", "--timeout", "2m"]).unwrap();
    assert_eq!(o, upgrade::Options { uds_path: "/tmp/y".into(), timeout: Duration::from_secs(120) });
    assert_eq!(upgrade(&["--uds-path=/z"]).unwrap().uds_path, std::path::PathBuf::from("/z"));
    assert_eq!(upgrade(&["--timeout=90"]).unwrap().timeout, Duration::from_secs(90));
}

#[test]
fn upgrade_refuses_bad_arguments_naming_the_flag() {
    for bad in ["0", "soon", "2h"] {
        let e = upgrade(&[&format!("--timeout={bad}")]).unwrap_err();
        assert!(
            e.contains(&format!("invalid value '{bad}' for '--timeout")) && e.contains("up to 1 hour"),
            "{e}"
        );
    }
    assert!(upgrade(&["--timeout"]).unwrap_err().contains("a value is required for '--timeout"));
    let e = upgrade(&["--takeover"]).unwrap_err();
    assert!(e.contains("--takeover is a daemon flag") && e.contains("reads only --uds_path"), "{e}");
    assert!(upgrade(&["now"]).unwrap_err().contains("unexpected argument 'now'"));
    // The daemon's checks of the folder apply: its length, and empty.
    let long = format!("--uds_path=/{}", "x".repeat(100));
    assert!(upgrade(&[&long]).unwrap_err().contains("--uds_path"));
    assert!(upgrade(&["--uds_path="]).unwrap_err().contains("empty"));
}

fn status_json(line: &[&str]) -> Result<bool, String> {
    match parse_line(line) {
        Ok(Invocation::Status { json, .. }) | Ok(Invocation::Doctor { json, .. }) => Ok(json),
        Ok(Invocation::NcclEnv { opts, .. }) => Ok(opts.json),
        Ok(other) => panic!("{line:?}: {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn one_format_option_on_every_printing_command() {
    for cmd in ["status", "doctor", "nccl-env"] {
        // --format, as kubectl writes it (-o, --output), and the older --json.
        for json in [&["--format=json"][..], &["-o", "json"], &["--output=json"], &["--json"]] {
            let line: Vec<&str> = std::iter::once(cmd).chain(json.iter().copied()).collect();
            assert_eq!(status_json(&line), Ok(true), "{line:?}");
        }
        assert_eq!(status_json(&[cmd, "--format=text"]), Ok(false), "{cmd}");
        let e = status_json(&[cmd, "--json", "--format=text"]).unwrap_err();
        assert!(e.contains("--json and --format=text differ"), "{e}");
        let e = status_json(&[cmd, "-o", "yaml"]).unwrap_err();
        assert!(e.contains("'yaml' for '--format") && e.contains("text") && e.contains("json"), "{e}");
    }
    // nccl-env's own forms; text is env, and with --check the report's.
    let format = |line: &[&str]| match parse_line(line) {
        Ok(Invocation::NcclEnv { opts, .. }) => Ok((opts.format, opts.json)),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.to_string()),
    };
    use nccl::command::Format;
    assert_eq!(format(&["nccl-env", "-o", "configmap"]), Ok((Format::ConfigMap, false)));
    assert_eq!(format(&["nccl-env", "--format=text"]), Ok((Format::Env, false)));
    assert_eq!(format(&["nccl-env", "--format=json"]), Ok((Format::Json, true)));
    assert_eq!(format(&["nccl-env", "--check", "--format=json"]).map(|f| f.1), Ok(true));
    assert_eq!(format(&["nccl-env", "--check", "--format=text"]).map(|f| f.1), Ok(false));
    let e = format(&["nccl-env", "--check", "--format=configmap"]).unwrap_err();
    assert!(e.contains("--format=configmap does not go with --check"), "{e}");
}

#[test]
fn a_command_refuses_the_daemon_flags_it_does_not_read_naming_them() {
    for (line, flag, reads) in [
        (&["status", "--gpu_nic_preset=a3vm"][..], "--gpu_nic_preset", "reads only --uds_path"),
        (&["status", "--noleases"], "--leases", "reads only --uds_path"),
        (&["--gpu_nic_preset=sim", "status"], "--gpu_nic_preset", "reads only --uds_path"),
        (&["doctor", "--node_wide"], "--node_wide", "`tcpx-rxdm doctor --help` lists"),
        (&["nccl-env", "--log_level=debug"], "--log_level", "`tcpx-rxdm nccl-env --help` lists"),
        (&["version", "--uds_path=/x"], "--uds_path", "reads none of the daemon's flags"),
    ] {
        let e = parse_line(line).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{line:?}");
        let e = e.to_string();
        assert!(e.contains(&format!("{flag} is a daemon flag")) && e.contains(reads), "{line:?}: {e}");
        assert!(
            e.contains(&format!("Usage: tcpx-rxdm {}", line.iter().find(|w| !w.starts_with('-')).unwrap()))
        );
    }
    // Those they read are taken, the daemon's defaults for the rest.
    let Ok(Invocation::Doctor { flags, .. }) =
        parse_line(&["doctor", "--tenant_isolation=enforce", "--socket_group=tcpx", "--takeover"])
    else {
        panic!("doctor")
    };
    assert_eq!(flags.socket_group.as_deref(), Some("tcpx"));
    assert_eq!(flags.uds_path.to_str(), Some("/run/tcpx"));
    // inject passes the daemon's flags on, but not those no Pod's daemon may have.
    for (flag, why) in [("--node_wide", "runs once per node"), ("--show_version", "prints the version")] {
        for line in [&["inject", flag][..], &["inject", "serve", "--on-error=allow", flag]] {
            let e = parse_line(line).unwrap_err().to_string();
            assert!(e.contains(&format!("{flag}: ")) && e.contains(why), "{line:?}: {e}");
        }
    }
}

#[test]
fn an_unknown_flag_gets_no_advice_that_fails_too() {
    // clap would advise `-- --foo_bar`, which these commands' arguments refuse as well.
    for line in [&["inject", "--foo_bar=1"][..], &["status", "--foo"], &["completions", "--foo"]] {
        let e = parse_line(line).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = e.to_string();
        assert!(e.contains("unexpected argument '--foo") && !e.contains("-- --foo"), "{line:?}: {e}");
        assert!(e.contains("Usage: tcpx-rxdm"), "{e}");
    }
    // A near miss still gets its suggestion.
    let e = parse_line(&["inject", "--imgae=x"]).unwrap_err().to_string();
    assert!(e.contains("a similar argument exists: '--image'") && !e.contains("'-- "), "{e}");
}

#[test]
fn help_of_help_is_a_page_as_with_cargo() {
    for line in [&["help", "--help"][..], &["help", "-h"], &["help", "status", "--help"]] {
        let e = parse_line(line).unwrap_err();
        assert_eq!((e.kind(), e.exit_code()), (clap::error::ErrorKind::DisplayHelp, 0), "{line:?}");
        assert!(e.to_string().contains("Usage: tcpx-rxdm help [COMMAND]"), "{e}");
    }
}

#[test]
fn options_before_the_command_and_version() {
    let Ok(Invocation::Status { flags, json, .. }) = parse_line(&["--uds_path=/tmp/x", "--json", "status"])
    else {
        panic!("status")
    };
    assert_eq!((flags.uds_path.to_str(), json), (Some("/tmp/x"), true));
    assert!(matches!(parse_line(&["version"]), Ok(Invocation::Version)));
    assert!(is_command_line(&["tcpx-rxdm".into(), "--uds_path=/x".into(), "status".into()]));
    assert!(!is_command_line(&["tcpx-rxdm".into(), "--uds_path=/x".into()]));
}
