//! Tests of the daemon container and its flags.

use super::*;

/// A container's command line, as `migrate` reads it.
fn argv(c: &Value) -> Vec<String> {
    let words = |k: &str| {
        c.get(k).and_then(Value::as_sequence).into_iter().flatten().map(|w| w.as_str().unwrap().to_string())
    };
    words("command").chain(words("args")).collect()
}
use crate::config::flags::TenantIsolation;

fn args(opts: &Options) -> Vec<String> {
    let f = DaemonFlags::new(opts, &[]).unwrap();
    f.list.iter().map(Flag::word).collect()
}

#[test]
fn user_flags_replace_the_defaults_of_the_same_name_in_place() {
    let opts = Options {
        daemon_flags: [
            "--metrics_address=0.0.0.0:9999",
            "--uds_path",
            "/run/x",
            "--tenant_isolation=enforce",
        ]
        .map(String::from)
        .to_vec(),
        ..Options::default()
    };
    let a = args(&opts);
    assert_eq!(a[2], "--uds_path=/run/x");
    assert_eq!(a[5], "--metrics_address=0.0.0.0:9999", "{a:?}");
    assert_eq!(a.iter().filter(|w| w.starts_with("--metrics_address")).count(), 1, "{a:?}");
    assert_eq!(a[4], "--tenant_isolation=enforce", "{a:?}");
    assert_eq!(a.iter().filter(|w| w.starts_with("--uds_path")).count(), 1);
}

#[test]
fn a_daemon_in_the_pod_runs_without_tenant_checks_unless_told() {
    for mode in [Mode::NativeSidecar, Mode::Sidecar] {
        let opts = Options { mode, ..Options::default() };
        let f = DaemonFlags::new(&opts, &[]).unwrap();
        assert_eq!(f.parsed.tenant_isolation, TenantIsolation::Off, "{mode:?}");
        let opts = Options { mode, daemon_flags: vec!["--tenant_isolation=enforce".into()], ..opts };
        let a = args(&opts);
        assert_eq!(a.iter().filter(|w| w.starts_with("--tenant_isolation")).count(), 1, "{a:?}");
        assert!(a.contains(&"--tenant_isolation=enforce".to_string()), "{a:?}");
    }
}

#[test]
fn flags_that_cannot_work_in_a_pod_are_refused_naming_the_flag() {
    for (mode, flags, says) in [
        (Mode::NativeSidecar, "--show_version", "--show_version: prints the version and exits"),
        (Mode::Sidecar, "--takeover=auto", "--takeover: an upgrade hands"),
        (Mode::NativeSidecar, "--monitor_shutdown", "--monitor_shutdown: a native sidecar that exits"),
        (Mode::NativeSidecar, "--log_level=verbose", "invalid value 'verbose' for '--log_level"),
        (Mode::Sidecar, "--log_level=info,h2=off", "invalid value 'info,h2=off' for '--log_level"),
        (Mode::NativeSidecar, "--node_wide", "--node_wide: a node-wide daemon runs once per node"),
        (Mode::Sidecar, "--sim_fault=add_rule:EIO:1", "--sim_fault and --sim_delay need --nic_backend=sim"),
        (Mode::Sidecar, "--gpu_backend=host --gpu_shmem_type=file", "--gpu_shmem_type=file needs CUDA pools"),
    ] {
        let daemon_flags = flags.split(' ').map(String::from).collect();
        let opts = Options { mode, daemon_flags, ..Options::default() };
        let e = DaemonFlags::new(&opts, &[]).err().unwrap_or_else(|| panic!("{flags} taken"));
        assert!(matches!(&e, InjectError::Option(m) if m.starts_with(says)), "{flags}: {e}");
    }
    // The classic sidecar ends with its last client: that is its own.
    let opts = Options {
        mode: Mode::Sidecar,
        daemon_flags: vec!["--monitor_shutdown".into()],
        ..Options::default()
    };
    assert!(DaemonFlags::new(&opts, &[]).is_ok());
}

#[test]
fn injecting_again_keeps_the_flags_that_differ_from_the_modes_own() {
    for mode in [Mode::NativeSidecar, Mode::Sidecar] {
        let opts = Options {
            mode,
            daemon_flags: ["--rx_pool_size=1073741824", "--setup_param=--verbose 64 1 1"]
                .map(String::from)
                .to_vec(),
            ..Options::default()
        };
        let f = DaemonFlags::new(&opts, &[]).unwrap();
        let c = container(&opts, &f).unwrap();
        let words = argv(&c);
        assert_eq!(
            chosen(mode, &words),
            ["--setup_param=--verbose 64 1 1", "--rx_pool_size=1073741824"],
            "{mode:?}"
        );
        // Written with the defaults only: nothing to keep.
        let plain = Options { mode, ..Options::default() };
        let c = container(&plain, &DaemonFlags::new(&plain, &[]).unwrap()).unwrap();
        assert!(chosen(mode, &argv(&c)).is_empty(), "{mode:?}");
    }
}

#[test]
fn the_classic_sidecar_keeps_the_guides_command_line() {
    let opts = Options { mode: Mode::Sidecar, ..Options::default() };
    let f = DaemonFlags::new(&opts, &[]).unwrap();
    let c = container(&opts, &f).unwrap();
    let cmd: Vec<&str> = c["command"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(cmd[0], REFERENCE_BIN);
    assert_eq!(&cmd[1..7], ["--gpu_nic_preset", "a3vm", "--gpu_shmem_type", "fd", "--uds_path", "/run/tcpx"]);
    assert_eq!(cmd[8], r#"\"--verbose 128 2 0 \""#);
    // Which the daemon reads as the plain value.
    let argv = cmd.iter().map(|s| s.to_string());
    assert_eq!(Flags::parse_args(argv).unwrap().setup_param, f.parsed.setup_param);
}
