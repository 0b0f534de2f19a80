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
