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
    // A daemon's whole command line is accepted by the commands that read its flags.
    let Ok(Invocation::Doctor { flags, json }) =
        parse_line(&["doctor", "--gpu_nic_preset=sim", "--tenant_isolation=enforce", "--nojson"])
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
    assert!(upgrade(&["--takeover"]).unwrap_err().contains("unexpected argument '--takeover'"));
    assert!(upgrade(&["now"]).unwrap_err().contains("unexpected argument 'now'"));
    // The daemon's checks of the folder apply: its length, and empty.
    let long = format!("--uds_path=/{}", "x".repeat(100));
    assert!(upgrade(&[&long]).unwrap_err().contains("--uds_path"));
    assert!(upgrade(&["--uds_path="]).unwrap_err().contains("empty"));
}

#[test]
fn output_json_as_kubectl_writes_it() {
    for line in [&["status", "-o", "json"][..], &["status", "--output=json"], &["status", "--json"]] {
        let Ok(Invocation::Status { json, .. }) = parse_line(line) else { panic!("{line:?}") };
        assert!(json, "{line:?}");
    }
    let Ok(Invocation::Doctor { json, .. }) = parse_line(&["doctor", "-o", "json"]) else { panic!() };
    assert!(json);
    let Ok(Invocation::Doctor { json, .. }) = parse_line(&["doctor", "-o", "text"]) else { panic!() };
    assert!(!json);
    let e = parse_line(&["doctor", "--json", "-o", "text"]).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let e = parse_line(&["status", "-o", "yaml"]).unwrap_err().to_string();
    assert!(e.contains("--output") && e.contains("text, json"), "{e}");
    let Ok(Invocation::NcclEnv { opts, .. }) = parse_line(&["nccl-env", "-o", "configmap"]) else { panic!() };
    assert_eq!(opts.format, nccl::command::Format::ConfigMap);
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
