//! Tests of flag parsing: absl forms, defaults, and errors that name the flag.

use super::*;

fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
    Flags::parse_args(std::iter::once("tcpx-rxdm").chain(args.iter().copied()).map(String::from))
}

#[test]
fn absl_forms_are_accepted() {
    for args in [
        &["--gpu_nic_preset=sim"][..],
        &["--gpu_nic_preset", "sim"],
        &["-gpu_nic_preset=sim"],
        &["-gpu_nic_preset", "sim"],
    ] {
        assert_eq!(parse(args).unwrap().gpu_nic_preset, "sim", "{args:?}");
    }
    assert!(parse(&[]).unwrap().monitor_shutdown);
    assert!(!parse(&["--nomonitor_shutdown"]).unwrap().monitor_shutdown);
    assert!(!parse(&["-nomonitor_shutdown"]).unwrap().monitor_shutdown);
    assert!(!parse(&["--monitor_shutdown=false"]).unwrap().monitor_shutdown);
    assert!(parse(&["--monitor_shutdown"]).unwrap().monitor_shutdown);
    assert!(parse(&["--show_version"]).unwrap().show_version);
}

#[test]
fn workload_cgroup_depth_is_a_number_of_levels_up_to_64() {
    assert_eq!(parse(&[]).unwrap().workload_cgroup_depth, 0, "the layouts by default");
    assert_eq!(parse(&["--workload_cgroup_depth=3"]).unwrap().workload_cgroup_depth, 3);
    assert_eq!(parse(&["--workload_cgroup_depth=64"]).unwrap().workload_cgroup_depth, 64);
    for bad in ["65", "-1", "two", ""] {
        let e = parse(&[&format!("--workload_cgroup_depth={bad}")]).unwrap_err();
        assert!(e.to_string().contains("--workload_cgroup_depth"), "{bad}: {e}");
        assert_eq!(e.exit_code(), 2, "{bad}");
    }
}

#[test]
fn bad_flags_name_the_flag() {
    let e = parse(&["--gpu_nic_preset=bogus"]).unwrap_err();
    assert!(e.to_string().contains("--gpu_nic_preset"), "{e}");
    assert_eq!(e.exit_code(), 2);
    let e = parse(&["--no_such_flag=1"]).unwrap_err();
    assert!(e.to_string().contains("--no_such_flag"), "{e}");
    let e = parse(&["--max_rx_rules=-3"]).unwrap_err();
    assert!(e.to_string().contains("--max_rx_rules"), "{e}");
    let e = parse(&["--socket_mode=999"]).unwrap_err();
    assert!(e.to_string().contains("--socket_mode"), "{e}");
    let e = parse(&["--sim_fault=add_rule:EWHAT:1"]).unwrap_err();
    assert!(e.to_string().contains("--sim_fault"), "{e}");
}

#[test]
fn setup_param_accepts_manifest_literal() {
    let want = SetupParam::Tune(TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 0 });
    assert_eq!(parse(&[r#"--setup_param=\"--verbose 128 2 0 \""#]).unwrap().setup_param, want);
    assert_eq!(parse(&["--setup_param", r#"\"--verbose 128 2 0 \""#]).unwrap().setup_param, want);
    assert_eq!(parse(&["--setup_param", "--verbose 128 2 0"]).unwrap().setup_param, want);
    assert_eq!(parse(&[]).unwrap().setup_param, want);
    assert_eq!(parse(&["--setup_param="]).unwrap().setup_param, SetupParam::Off);
    assert!(parse(&["--setup_param=--verbose 1 2"]).is_err());
    assert!(parse(&["--setup_param=--verbose a b c"]).is_err());
}

#[test]
fn ours_parse() {
    let f = parse(&[
        "--metrics_address=",
        "--socket_mode=0600",
        "--sim_fault=add_rule:EBUSY:1",
        "--sim_fault=del_rule:EIO:0.5",
    ])
    .unwrap();
    assert_eq!(f.metrics_address, ListenAddr(None));
    assert_eq!(f.socket_mode, 0o600);
    assert_eq!(f.sim_fault.len(), 2);
    assert_eq!(parse(&[]).unwrap().metrics_address, ListenAddr(Some("0.0.0.0:9467".parse().unwrap())));
    assert!(parse(&["--max_connections=0"]).is_err());
}

#[test]
fn job_end_and_lease_flags() {
    let f = parse(&["--uds_path=/run/tcpx"]).unwrap();
    assert!(f.leases);
    assert!(!f.shutdown_when_all_clients_exited);
    assert_eq!(f.wait_time_before_exit, 5);
    assert_eq!(f.shutdown_file(), Some(PathBuf::from("/run/tcpx/terminated")));
    let f = parse(&[
        "--noleases",
        "--shutdown_when_all_clients_exited",
        "--wait_time_before_exit=30",
        "--shutdown_file=/tmp/done",
    ])
    .unwrap();
    assert!(!f.leases);
    assert!(f.shutdown_when_all_clients_exited);
    assert_eq!(f.wait_time_before_exit, 30);
    assert_eq!(f.shutdown_file(), Some(PathBuf::from("/tmp/done")));
    assert_eq!(parse(&["--shutdown_file="]).unwrap().shutdown_file(), None);
    let e = parse(&["--wait_time_before_exit=-1"]).unwrap_err();
    assert!(e.to_string().contains("--wait_time_before_exit"), "{e}");
}

#[test]
fn a_later_flag_overrides_an_earlier_one() {
    // Every form, as appended to a unit's or a script's command line.
    let f = parse(&["--gpu_nic_preset=auto", "--uds_path=/run/tcpx", "--gpu_nic_preset", "sim"]).unwrap();
    assert_eq!(f.gpu_nic_preset, "sim");
    let f = parse(&["--uds_path=/run/tcpx", "-uds_path=/a", "--uds_path", "/b"]).unwrap();
    assert_eq!(f.uds_path, PathBuf::from("/b"));
    assert!(parse(&["--nomonitor_shutdown", "--monitor_shutdown"]).unwrap().monitor_shutdown);
    assert!(!parse(&["--monitor_shutdown", "--nomonitor_shutdown"]).unwrap().monitor_shutdown);
    assert!(!parse(&["--leases=true", "-noleases"]).unwrap().leases);
    let f = parse(&["--metrics_address=0.0.0.0:9467", "--metrics_address="]).unwrap();
    assert_eq!(f.metrics_address, ListenAddr(None));
    let f = parse(&["--setup_param=", "--setup_param", "--verbose 10 20 1"]).unwrap();
    assert_eq!(f.setup_param, SetupParam::Tune(TuningParams { initcwnd: 10, rto_min_ms: 20, quickack: 1 }));
    assert_eq!(parse(&["--log_format=json", "--log_format=text"]).unwrap().log_format, LogFormat::Text);
    // Repeatable flags still add up.
    assert_eq!(
        parse(&["--sim_fault=add_rule:EBUSY:1", "--sim_fault=del_rule:EIO:1"]).unwrap().sim_fault.len(),
        2
    );
    // A bad later value is still an error naming the flag.
    let e = parse(&["--max_rx_rules=4", "--max_rx_rules=x"]).unwrap_err();
    assert!(e.to_string().contains("--max_rx_rules"), "{e}");
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn every_flag_may_be_repeated() {
    // One value each flag accepts; given twice, the command line still parses.
    let cmd = <Flags as clap::CommandFactory>::command();
    for arg in cmd.get_arguments().filter(|a| a.get_long().is_some_and(|l| l != "help")) {
        let long = arg.get_long().unwrap();
        let value = match long {
            "gpu_nic_preset" => "sim".to_string(),
            "sim_fault" => "add_rule:EBUSY:1".to_string(),
            "sim_delay" => "add_rule:1".to_string(),
            "metrics_address" => "127.0.0.1:1".to_string(),
            "setup_param" => "--verbose 1 2 3".to_string(),
            "socket_mode" => "0600".to_string(),
            "wait_for_nics" | "takeover_timeout" => "5s".to_string(),
            l if BOOL_FLAGS.contains(&l) => "true".to_string(),
            _ => match arg.get_possible_values().first() {
                Some(v) => v.get_name().to_string(),
                None if arg
                    .get_default_values()
                    .first()
                    .is_some_and(|d| d.to_string_lossy().parse::<u64>().is_ok()) =>
                {
                    "7".to_string()
                }
                None => "/x".to_string(),
            },
        };
        let a = format!("--{long}={value}");
        let r = parse(&[&a, &a]);
        assert!(r.is_ok(), "{a} twice: {}", r.unwrap_err());
    }
}

#[test]
fn takeover_takes_on_auto_or_nothing_and_a_timeout() {
    use crate::config::flags::Takeover;
    assert_eq!(parse(&[]).unwrap().takeover, Takeover::Off);
    assert_eq!(parse(&["--takeover"]).unwrap().takeover, Takeover::On);
    assert_eq!(parse(&["--takeover=auto"]).unwrap().takeover, Takeover::Auto);
    let f = parse(&["--takeover=auto", "--takeover_timeout=1500ms"]).unwrap();
    assert_eq!(f.takeover_timeout, std::time::Duration::from_millis(1500));
    assert!(parse(&["--takeover=sometimes"]).unwrap_err().to_string().contains("--takeover"));
}

#[test]
fn help_says_a_later_flag_wins() {
    let help = <Flags as clap::CommandFactory>::command().render_help().to_string();
    assert!(help.contains("overrides the earlier value"), "{help}");
}

#[test]
fn node_wide_turns_off_every_client_triggered_end() {
    let f = parse(&["--uds_path=/run/tcpx", "--node_wide"]).unwrap();
    assert!(f.node_wide);
    assert_eq!(f.shutdown_file(), None, "the sidecar's shutdown file must not end a node-wide daemon");
    assert!(!f.monitor_shutdown);
    assert!(!f.shutdown_when_all_clients_exited);
    // Explicitly off is fine; explicitly on is a conflict naming both flags.
    assert!(parse(&["--node_wide", "--nomonitor_shutdown", "--shutdown_file="]).is_ok());
    for bad in ["--shutdown_file=done", "--monitor_shutdown", "--shutdown_when_all_clients_exited"] {
        let e = parse(&["--node_wide", bad]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{bad}");
        let msg = e.to_string();
        assert!(msg.contains("--node_wide") && msg.contains(bad.split('=').next().unwrap()), "{msg}");
    }
    // A later --nonode_wide gives the per-job defaults back.
    let f = parse(&["--node_wide", "--nonode_wide"]).unwrap();
    assert_eq!(f.shutdown_file(), Some(PathBuf::from("/run/tcpx/terminated")));
    assert!(f.monitor_shutdown);
}

#[test]
fn wait_for_nics_takes_seconds_or_a_unit() {
    assert_eq!(parse(&[]).unwrap().wait_for_nics, Duration::ZERO);
    assert_eq!(parse(&["--wait_for_nics=90"]).unwrap().wait_for_nics, Duration::from_secs(90));
    assert_eq!(parse(&["--wait_for_nics=90s"]).unwrap().wait_for_nics, Duration::from_secs(90));
    assert_eq!(parse(&["--wait_for_nics", "1500ms"]).unwrap().wait_for_nics, Duration::from_millis(1500));
    assert_eq!(parse(&["--wait_for_nics=2m"]).unwrap().wait_for_nics, Duration::from_secs(120));
    assert_eq!(parse(&["--wait_for_nics=2min"]).unwrap().wait_for_nics, Duration::from_secs(120));
    assert_eq!(parse(&["--wait_for_nics=1h"]).unwrap().wait_for_nics, Duration::from_secs(3600));
    for bad in ["-1", "soon", "5h", "61m", "", "1.5s", "2 m"] {
        let e = parse(&[&format!("--wait_for_nics={bad}")]).unwrap_err();
        assert!(e.to_string().contains("--wait_for_nics"), "{bad}: {e}");
    }
}

#[test]
fn log_level_takes_the_documented_levels_and_names_them_otherwise() {
    for (given, want) in [
        ("error", LogLevel::Error),
        ("warn", LogLevel::Warn),
        ("warning", LogLevel::Warn),
        ("DEBUG", LogLevel::Debug),
    ] {
        assert_eq!(parse(&[&format!("--log_level={given}")]).unwrap().log_level, want, "{given}");
        assert_eq!(LogLevel::parse(given), Ok(want), "{given}");
    }
    assert_eq!(parse(&[]).unwrap().log_level, LogLevel::Info);
    for bad in ["verbose", "warn,tcpx_rxdm=debug", ""] {
        let e = parse(&[&format!("--log_level={bad}")]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{bad}");
        let text = e.to_string();
        assert!(text.contains("--log_level") && text.contains("error, warn, info, debug, trace"), "{text}");
        let mine = LogLevel::parse(bad).unwrap_err();
        assert!(mine.contains("--log_level") && mine.contains("error, warn, info, debug, trace"), "{mine}");
    }
}

#[test]
fn rx_pool_size_takes_bytes_or_binary_units() {
    for (given, want) in [
        ("0", 0),
        ("2147483648", 2 << 30),
        ("1G", 1 << 30),
        ("1g", 1 << 30),
        ("512Mi", 512 << 20),
        ("4GiB", 4 << 30),
        ("64K", 64 << 10),
    ] {
        assert_eq!(parse(&[&format!("--rx_pool_size={given}")]).unwrap().rx_pool_size, want, "{given}");
    }
    for (bad, why) in [
        ("1GB", "ambiguous"),
        ("1.5G", "whole numbers"),
        ("2X", "unknown unit"),
        ("lots", "expected bytes"),
        ("-1", "expected"),
    ] {
        let e = parse(&[&format!("--rx_pool_size={bad}")]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("--rx_pool_size") && text.contains(why), "{bad}: {text}");
    }
    let e = parse(&["--rx_pool_size=1GB"]).unwrap_err().to_string();
    assert!(e.contains("1G or 1GiB"), "{e}");
    assert!(parse(&["--rx_pool_size=99999999T"]).unwrap_err().to_string().contains("64 bits"));
}

#[test]
fn metrics_address_takes_the_forms_servers_are_given() {
    let addr = |v: &str| parse(&[&format!("--metrics_address={v}")]).map(|f| f.metrics_address.0);
    assert_eq!(addr(":9467").unwrap(), Some("0.0.0.0:9467".parse().unwrap()));
    assert_eq!(addr("localhost:9000").unwrap(), Some("127.0.0.1:9000".parse().unwrap()));
    assert_eq!(addr("[::1]:9467").unwrap(), Some("[::1]:9467".parse().unwrap()));
    assert_eq!(addr("").unwrap(), None);
    for bad in ["example.com:9467", "9467", ":http", "0.0.0.0"] {
        let e = addr(bad).unwrap_err().to_string();
        assert!(e.contains("--metrics_address") && e.contains("IP:PORT"), "{bad}: {e}");
    }
}

#[test]
fn the_debug_endpoints_are_off_unless_asked_for() {
    // They list every tenant's flows, and an HTTP peer cannot be told to be the operator.
    let f = Flags::parse_args(["tcpx-rxdm".to_string()]).unwrap();
    assert_eq!(f.debug_endpoints, DebugAccess::Off);
    let f = Flags::parse_args(["tcpx-rxdm".to_string(), "--debug_endpoints=local".to_string()]).unwrap();
    assert_eq!(f.debug_endpoints, DebugAccess::Local);
}
