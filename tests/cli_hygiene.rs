//! Command-line behaviour a user meets first: a socket folder the NCCL
//! plugin could not use is refused before anything is touched, printing
//! subcommands end quietly when their reader goes away, and a discovery that
//! finds nothing says what to use instead.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use common::{run_bin, Daemon, BIN};

#[test]
fn a_uds_path_longer_than_the_plugin_can_use_exits_2_before_touching_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().display().to_string();
    // 76 characters work; 77 do not.
    let path = |n: usize| format!("{base}/{}", "u".repeat(n - base.len() - 1));
    let long = path(77);
    let (code, _, err) =
        run_bin(&["--gpu_nic_preset=sim", "--metrics_address=", &format!("--uds_path={long}")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--uds_path") && err.contains("76") && err.contains("NCCL"), "{err}");
    assert!(err.contains("77 characters"), "{err}");
    // Refused while parsing flags: no folder made, no NIC primed, no pool.
    assert!(!std::path::Path::new(&long).exists(), "the folder was created");
    assert!(!err.contains("primed") && !err.contains("topology loaded"), "{err}");

    let ok = path(76);
    let mut d = Daemon::start(&["--metrics_address=", &format!("--uds_path={ok}")]);
    assert!(std::path::Path::new(&ok).join("rx_rule_manager").exists());
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit(std::time::Duration::from_secs(20)).success());
}

/// Runs `args` with stdout a pipe whose reader is already gone; returns the
/// exit status and stderr.
fn run_into_closed_pipe(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_quiet_end(what: &str, status: std::process::ExitStatus, err: &str) {
    // The conventional end: SIGPIPE's default action (a shell reports 141), or exit 0.
    let quiet = status.signal() == Some(libc::SIGPIPE) || status.code() == Some(0);
    assert!(quiet, "{what}: {status:?}\n{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{what}: {err}");
}

#[test]
fn printing_subcommands_end_quietly_on_a_closed_pipe() {
    let (status, err) = run_into_closed_pipe(&["doctor", "--gpu_nic_preset=sim"]);
    assert_quiet_end("doctor", status, &err);
    let (status, err) = run_into_closed_pipe(&["doctor", "--gpu_nic_preset=sim", "--json"]);
    assert_quiet_end("doctor --json", status, &err);

    let d = Daemon::start(&["--metrics_address="]);
    let uds = d.uds_arg();
    for args in [vec!["status"], vec!["status", "flows"], vec!["status", "flows", "--json"]] {
        let mut all = args.clone();
        all.push(&uds);
        let (status, err) = run_into_closed_pipe(&all);
        assert_quiet_end(&args.join(" "), status, &err);
    }
    // With a reader, the same command still prints and exits 0.
    let (code, out, err) = run_bin(&["status", &uds]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.is_empty());
}

#[test]
fn auto_preset_that_finds_no_gpu_nic_suggests_sim() {
    // An empty sysfs: no NIC, no GPU.
    let sys = tempfile::tempdir().unwrap();
    for d in ["class/net", "bus/pci/devices"] {
        std::fs::create_dir_all(sys.path().join(d)).unwrap();
    }
    let uds = tempfile::tempdir().unwrap();
    let (code, _, err) = run_bin(&[
        "--gpu_nic_preset=auto",
        "--metrics_address=",
        &format!("--sysfs_root={}", sys.path().display()),
        &format!("--uds_path={}", uds.path().display()),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--gpu_nic_preset=auto"), "{err}");
    assert!(err.contains("--gpu_nic_preset=sim"), "{err}");
}
