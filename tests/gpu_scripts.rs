//! The GPU scripts (`tests/gpu/*.sh`) run only on a machine with NVIDIA
//! GPUs, but what they read of the daemon and how their client asks can be
//! checked here, against the sim daemon: the parser of the daemon's log line
//! (`daemon_gpu_minors` in `lib.sh`) on the line the daemon really prints,
//! and `fetch_pool.py`, the client of `tenants.sh`, in each of its modes.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{require_root, Daemon};

fn gpu_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gpu"))
}

#[test]
fn every_gpu_script_parses() {
    for script in ["check.sh", "bench.sh", "tenants.sh", "takeover.sh", "rule_path.sh", "lib.sh"] {
        let out = Command::new("bash").arg("-n").arg(gpu_dir().join(script)).output().unwrap();
        assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn the_scripts_read_the_gpu_minors_from_the_line_the_daemon_logs() {
    let d = Daemon::start(&["--tenant_isolation=enforce"]);
    let line = d.wait_for_log("tenant isolation", Duration::from_secs(5)).expect("the tenant isolation line");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    std::fs::write(&log, d.log().join("\n") + "\n").unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#". "$1/lib.sh" && daemon_gpu_minors "$2""#)
        .arg("bash")
        .arg(gpu_dir())
        .arg(&log)
        .env("OUT", dir.path().join("out"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The sim topology's eight GPUs have no driver entry: each its place.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n1\n2\n3\n4\n5\n6\n7\n", "from {line}");
}

#[test]
#[ignore = "needs root: mount namespaces"]
fn the_tenant_scripts_client_holds_the_node_as_told() {
    require_root("mount namespaces");
    let d = Daemon::start(&["--tenant_isolation=enforce"]);
    let uds = d.dir.path().display().to_string();
    let fetch = |mode: &str| {
        // A /dev of its own with a stand-in for the first sim GPU (minor 0).
        let script = r#"mount -t tmpfs tmpfs /dev && : > /dev/nvidia0 && exec python3 "$@""#;
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
            .arg(gpu_dir().join("fetch_pool.py"))
            .args([&uds, common::GPU0, "/dev/nvidia0", mode])
            .output()
            .unwrap();
        assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(fetch("rw"), "fd");
    for mode in ["ro", "path", "close"] {
        let got = fetch(mode);
        assert!(got.starts_with("status 7: ") && got.contains(common::GPU0), "{mode}: {got}");
    }
}
