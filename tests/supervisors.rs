//! What the supervisors around the daemon do to it, outside any container:
//! the reader of its log goes away (a closed pipe: `| tee` ended, journald
//! restarting), the environment carries a `RUST_LOG` that is no filter, a
//! first start as a normal user on the default root folder. (The same under
//! systemd as PID 1: `.ci/systemd-test`.)

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::wait_until;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tcpx_rxdm::daemon::READY_LINE;

const BIN: &str = env!("CARGO_BIN_EXE_tcpx-rxdm");

/// Ends a test that would otherwise hang; far above anything asserted.
const HANG: Duration = Duration::from_secs(60);

#[test]
fn a_log_reader_that_goes_away_costs_lines_not_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("tcpx");
    let mut child = Command::new(BIN)
        .args(["--gpu_nic_preset=sim", "--metrics_address=", "--node_wide"])
        .arg(format!("--uds_path={}", uds.display()))
        // Every step logs: the writes after the reader left are many.
        .env("RUST_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let mut log = BufReader::new(child.stderr.take().unwrap()).lines();
    assert!(log.by_ref().map_while(Result::ok).any(|l| l.contains(READY_LINE)), "never ready");
    // The reader goes away: the pipe has no reader left.
    drop(log);
    // Node-wide, SIGHUP is logged and ignored: lines for no one.
    for _ in 0..3 {
        kill(pid, Signal::SIGHUP).unwrap();
    }
    let status =
        || Command::new(BIN).arg("status").arg(format!("--uds_path={}", uds.display())).output().unwrap();
    for _ in 0..3 {
        let out = status();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains(": ready, up"));
    }
    assert!(child.try_wait().unwrap().is_none(), "the daemon ended without its log reader");
    assert!(uds.join("nccl.env").exists());
    // And the stop, which logs the most, still restores and cleans up.
    kill(pid, Signal::SIGTERM).unwrap();
    wait_until(HANG, || child.try_wait().unwrap().is_some());
    let code = child.wait().unwrap();
    assert_eq!(code.code(), Some(0), "{code}");
    assert!(!uds.join("nccl.env").exists() && !uds.exists(), "left behind for workloads to source");
}

#[test]
fn a_rust_log_that_is_no_filter_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("tcpx");
    for bad in ["tcpx_rxdm=dbug", "bogus[["] {
        let out = Command::new(BIN)
            .args(["--gpu_nic_preset=sim", "--metrics_address="])
            .arg(format!("--uds_path={}", uds.display()))
            .env("RUST_LOG", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(&format!("RUST_LOG={bad} cannot be read as a log filter")), "{err}");
        assert!(err.contains("unset RUST_LOG to use --log_level"), "{err}");
        assert!(!uds.exists(), "{bad}: started before refusing");

        // The webhook too, before it listens.
        let out = Command::new(BIN)
            .args(["inject", "serve", "--on-error=allow", "--listen=127.0.0.1:0"])
            .args(["--tls-cert=/nonexistent/tls.crt", "--tls-key=/nonexistent/tls.key"])
            .env("RUST_LOG", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(&format!("RUST_LOG={bad} cannot be read")), "{err}");

        // A short command says so and does its work.
        let out = Command::new(BIN)
            .args(["nccl-env", "--gpu_nic_preset=sim"])
            .env("RUST_LOG", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{bad}: {err}");
        assert!(
            err.contains(&format!("RUST_LOG={bad} cannot be read")) && err.contains("logging errors only"),
            "{err}"
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("NCCL_"), "{bad}: no settings printed");
    }
}

#[test]
fn a_first_start_as_a_normal_user_on_a_root_folder_says_what_to_do() {
    // Where root cannot be refused, run it as nobody.
    let mut cmd = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
        c
    } else {
        Command::new(BIN)
    };
    let root_owned = tempfile::tempdir().unwrap();
    let mut uds = root_owned.path().join("tcpx");
    if !nix::unistd::geteuid().is_root() {
        // A normal user's own temporary folder is theirs; /run is root's.
        uds = "/run/tcpx-rxdm-test-not-yours/tcpx".into();
    }
    let out = cmd
        .args(["--gpu_nic_preset=sim", "--metrics_address="])
        .arg(format!("--uds_path={}", uds.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(
        err.contains("run the daemon as root, or give it a folder this user may write with --uds_path"),
        "{err}"
    );
}
