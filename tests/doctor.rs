//! `tcpx-rxdm doctor` as a black box: simulated NICs, fabricated sysfs trees,
//! `--json`, bad flags. (The veth check, which needs root, is in doctor_netns.rs.)

mod common;

use common::run_bin;
use common::sysfs::*;

/// Runs `tcpx-rxdm doctor ARGS`; returns (exit code, stdout, stderr).
fn doctor(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["doctor"];
    all.extend(args);
    run_bin(&all)
}

/// The report line for `section` / `name` (text output), e.g. `✔ ntuple: …`.
fn line<'a>(out: &'a str, section: &str, name: &str) -> &'a str {
    let body =
        out.split(&format!("\n{section}\n")).nth(1).unwrap_or_else(|| panic!("no section {section}:\n{out}"));
    let body = body.split("\n\n").next().unwrap();
    body.lines()
        .map(str::trim)
        .find(|l| l.split_once(' ').is_some_and(|(_, rest)| rest.starts_with(&format!("{name}:"))))
        .unwrap_or_else(|| panic!("no line {name} in {section}:\n{out}"))
}

#[test]
fn sim_preset_is_healthy_and_the_node_is_left_alone() {
    let uds = tempfile::tempdir().unwrap();
    let folder = uds.path().join("tcpx");
    let (code, out, err) = doctor(&["--gpu_nic_preset=sim", &format!("--uds_path={}", folder.display())]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("verdict: ready"), "{out}");
    assert!(!out.contains('✗'), "{out}");
    for nic in ["eth1", "eth2", "eth3", "eth4"] {
        let sec = format!("NIC {nic}");
        assert!(line(&out, &sec, "ntuple").starts_with("✔ ntuple: supported, 100000 rule slots"), "{out}");
        assert!(line(&out, &sec, "header split").contains("private flags"), "{out}");
        assert!(line(&out, &sec, "channels").contains("16 rx queues"), "{out}");
    }
    assert!(line(&out, "topology", "eth1").contains("0000:04:00.0 queues 8-11; 0000:05:00.0 queues 12-15"));
    assert!(line(&out, "GPUs", "pools").starts_with('–'), "{out}");
    // Read-only: the socket folder is not even created.
    assert!(!folder.exists(), "doctor created {}", folder.display());
}

#[test]
fn json_report_parses_and_agrees_with_the_exit_code() {
    let uds = tempfile::tempdir().unwrap();
    let (code, out, err) =
        doctor(&["--gpu_nic_preset=sim", "--json", &format!("--uds_path={}", uds.path().display())]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["ok"], true);
    assert_eq!(v["nic_backend"], "sim");
    let checks = v["checks"].as_array().unwrap();
    assert!(checks.len() > 20, "{out}");
    for c in checks {
        assert!(["pass", "warn", "fail", "skip"].contains(&c["status"].as_str().unwrap()), "{c}");
        assert!(c["found"].as_str().is_some_and(|f| !f.is_empty()), "{c}");
    }
    let ntuple = checks.iter().find(|c| c["section"] == "NIC eth3" && c["name"] == "ntuple").unwrap();
    assert_eq!(ntuple["status"], "pass");

    // A failing report is a failing JSON report too.
    let fake = a3_highgpu_8g();
    std::fs::remove_dir_all(
        fake.root().join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0"),
    )
    .unwrap();
    let (code, out, _) = doctor(&[
        "--gpu_nic_preset=a3vm",
        "--json",
        &format!("--sysfs_root={}", fake.root().display()),
        "--nic_backend=sim",
        "--gpu_backend=host",
        &format!("--uds_path={}", uds.path().display()),
    ]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["failures"], 2, "{out}"); // the GPU count and eth1's pairing
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let (code, _, err) = doctor(&["--gpu_nic_preset=bogus"]);
    assert_eq!(code, 2);
    assert!(err.contains("--gpu_nic_preset"), "{err}");
    let (code, _, err) = doctor(&["--json=maybe"]);
    assert_eq!(code, 2);
    assert!(err.contains("--json"), "{err}");
    let (code, _, err) = doctor(&["extra"]);
    assert_eq!(code, 2);
    assert!(err.contains("extra"), "{err}");
}

/// The a3vm preset against a fabricated a3-highgpu-8g tree.
fn a3vm_on(fake: &FakeSysfs) -> (i32, String) {
    let uds = tempfile::tempdir().unwrap();
    let (code, out, err) = doctor(&[
        "--gpu_nic_preset=a3vm",
        &format!("--sysfs_root={}", fake.root().display()),
        "--nic_backend=sim",
        "--gpu_backend=host",
        &format!("--uds_path={}", uds.path().display()),
    ]);
    assert!(!err.contains("panicked"), "{err}");
    (code, out)
}

#[test]
fn fabricated_a3_node_pairs_every_gpu_with_its_nic() {
    let fake = a3_highgpu_8g();
    let (code, out) = a3vm_on(&fake);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        line(&out, "topology", "eth1"),
        "✔ eth1: eth1 (0000:06:00.0) ↔ 0000:04:00.0 queues 8-11 (4 PCIe hops, shared switch); \
         0000:05:00.0 queues 12-15 (4 PCIe hops, shared switch)"
    );
    assert!(
        line(&out, "topology", "GPU count").starts_with("✔ GPU count: 8 NVIDIA GPUs on the PCI bus"),
        "{out}"
    );
    // The host NIC is listed as left out, with the reason.
    assert!(
        line(&out, "topology", "other NICs").contains("eth0 (0000:00:04.0, gve): not in the topology"),
        "{out}"
    );
}

#[test]
fn missing_gpu_is_named_with_its_nic() {
    let fake = a3_highgpu_8g();
    // The second GPU behind eth1 fell off the bus.
    std::fs::remove_dir_all(
        fake.root().join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0"),
    )
    .unwrap();
    let (code, out) = a3vm_on(&fake);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        line(&out, "topology", "GPU count"),
        "✗ GPU count: 7 NVIDIA GPUs on the PCI bus, the topology wants 8: missing 0000:05:00.0 (behind eth1)"
    );
    let eth1 = line(&out, "topology", "eth1");
    assert!(eth1.starts_with('✗') && eth1.contains("0000:05:00.0 MISSING from the PCI bus"), "{eth1}");
    assert!(line(&out, "topology", "eth2").starts_with('✔'), "{out}");
    assert!(out.contains("NOT ready: 2 problems"), "{out}");
}

#[test]
fn moved_nic_is_explained() {
    // eth1 and eth2 swapped places (as when an extra NIC shifts the names).
    let fake = FakeSysfs::new();
    a3_block(&fake, "0000:00:01.0", 0x04, "eth2");
    a3_block(&fake, "0000:00:02.0", 0x0a, "eth1");
    a3_block(&fake, "0000:80:01.0", 0x84, "eth3");
    a3_block(&fake, "0000:80:02.0", 0x8a, "eth4");
    let (code, out) = a3vm_on(&fake);
    assert_eq!(code, 1, "{out}");
    let eth1 = line(&out, "topology", "eth1");
    assert!(
        eth1.starts_with('✗')
            && eth1.contains(
                "eth1 is at 0000:0c:00.0, the topology says 0000:06:00.0; 0000:06:00.0 is now eth2"
            ),
        "{eth1}"
    );
    assert!(out.contains("--gpu_nic_preset=auto"), "the fix names discovery:\n{out}");
}

#[test]
fn a_running_daemon_is_seen_through_its_lock_and_keeps_it() {
    let d = common::Daemon::start(&[]);
    let uds = format!("--uds_path={}", d.dir.path().display());
    let (code, out, err) = doctor(&["--gpu_nic_preset=sim", &uds]);
    assert_eq!(code, 0, "{out}\n{err}");
    let pid = d.child.id();
    assert!(
        line(&out, "host", "daemon").starts_with(&format!("✔ daemon: a daemon holds the lock (pid {pid})")),
        "{out}"
    );
    // The lock was only tested: a second daemon on the folder is still refused.
    let (code, stderr) = common::run_to_exit(&["--gpu_nic_preset=sim", &uds, "--metrics_address="]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("already serves"), "{stderr}");
}

#[test]
fn gpu_lines_follow_the_gpu_backend() {
    let uds = tempfile::tempdir().unwrap();
    let uds = format!("--uds_path={}", uds.path().display());
    let (code, out, _) = doctor(&["--gpu_nic_preset=sim", "--gpu_backend=host", &uds]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "GPUs", "pools").starts_with("– pools: host memory pools"), "{out}");
    if tcpx_rxdm::gpu::CudaAllocator::driver_present() {
        eprintln!("skipped the no-driver half: this machine has libcuda (the GPU check covers it)");
        return;
    }
    let (code, out, _) = doctor(&["--gpu_nic_preset=sim", "--gpu_backend=cuda", &uds]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "GPUs", "driver").starts_with("✗ driver: libcuda.so not found"), "{out}");
}

/// Runs `tcpx-rxdm ARGS` as a user other than the folder's owner: as
/// `nobody` through setpriv when the tests run as root (root may write
/// anywhere), as this user otherwise. The binary is read from where it is.
fn as_another_user(args: &[&str], ulimit: Option<&str>) -> (i32, String, String) {
    let mut line = String::new();
    if let Some(u) = ulimit {
        line += &format!("ulimit {u} && ");
    }
    line += "exec \"$0\" \"$@\"";
    let mut cmd = if nix::unistd::geteuid().is_root() {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c"]);
        c
    } else {
        let mut c = std::process::Command::new("sh");
        c.arg("-c");
        c
    };
    let out = cmd.arg(line).arg(common::BIN).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// A folder other users may enter but only its owner may write in (`0755`
/// owned by root when root, `0555` of this user otherwise), in a temporary one.
fn not_writable_by_another_user() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let parent = tmp.path().join("run");
    std::fs::create_dir(&parent).unwrap();
    let mode = if nix::unistd::geteuid().is_root() { 0o755 } else { 0o555 };
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(mode)).unwrap();
    (tmp, parent)
}

#[test]
fn a_socket_folder_is_judged_by_whether_this_user_could_make_it_as_the_daemon_would() {
    let (_tmp, parent) = not_writable_by_another_user();
    let uds = format!("--uds_path={}", parent.join("tcpx").display());
    let (code, out, err) = as_another_user(&["doctor", "--gpu_nic_preset=sim", &uds], None);
    assert_eq!(code, 1, "{out}{err}");
    let folder = line(&out, "host", "socket folder");
    assert!(folder.starts_with("✗ socket folder:") && folder.contains("cannot create it"), "{out}");
    assert!(folder.contains("Permission denied") && out.contains("--uds_path it can create"), "{out}");
    assert!(out.contains("verdict: NOT ready"), "{out}");
    // The daemon with the same flags, as the same user, agrees.
    let (code, _, err) = as_another_user(&["--gpu_nic_preset=sim", &uds, "--metrics_address="], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    // A folder it can make (missing parents included) is fine.
    let ok = tempfile::tempdir().unwrap();
    let uds = format!("--uds_path={}", ok.path().join("a/b").display());
    let (code, out, _) = doctor(&["--gpu_nic_preset=sim", &uds]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "host", "socket folder").contains("absent: the daemon creates it"), "{out}");
    assert!(line(&out, "host", "daemon").contains("none running"), "{out}");
}

#[test]
fn a_folder_this_user_cannot_read_is_not_called_free() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("tcpx");
    let d = common::Daemon::start(&[&format!("--uds_path={}", dir.display()), "--metrics_address="]);
    // As root, another user; as a user, its own folder closed to itself.
    if !nix::unistd::geteuid().is_root() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let uds = format!("--uds_path={}", dir.display());
    let (_, out, err) = as_another_user(&["doctor", "--gpu_nic_preset=sim", &uds], None);
    // As root also a folder the other user may not even enter (a root
    // daemon's /run/tcpx of mode 0750 and a group the user is not in).
    let closed = nix::unistd::geteuid().is_root().then(|| {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        as_another_user(&["doctor", "--gpu_nic_preset=sim", &uds], None)
    });
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    drop(d);
    for (out, err) in std::iter::once((out, err)).chain(closed.map(|(_, o, e)| (o, e))) {
        let daemon = line(&out, "host", "daemon");
        assert!(daemon.starts_with("! daemon: cannot tell whether a daemon runs"), "{out}{err}");
        assert!(daemon.contains("permission denied") && !out.contains("none running"), "{out}");
        assert!(out.contains("run doctor as"), "{out}");
        // Nothing else says there is none, the running daemon's section included.
        assert!(!out.contains("no daemon"), "{out}");
        let datapath = line(&out, "datapath (running daemon)", "daemon");
        assert!(datapath.starts_with("– daemon: cannot tell whether a daemon serves"), "{out}");
    }
}

#[test]
fn open_files_are_judged_by_the_hard_limit_the_daemon_raises_to() {
    let (code, out, _) = as_another_user(&["doctor", "--gpu_nic_preset=sim"], Some("-Sn 64"));
    let files = line(&out, "host", "open files");
    assert!(files.starts_with("✔ open files: RLIMIT_NOFILE soft 64"), "{code}: {out}");
    assert!(files.contains("raises the soft limit to the hard one"), "{out}");
    let (_, out, _) =
        as_another_user(&["doctor", "--gpu_nic_preset=sim", "--max_connections=4096"], Some("-n 512"));
    let files = line(&out, "host", "open files");
    assert!(
        files.starts_with("! open files:") && files.contains("512 is below --max_connections 4096"),
        "{out}"
    );
    assert!(out.contains("raise the hard limit to 4352"), "{out}");
}

#[test]
fn tuning_scripts_that_are_not_there_are_named() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let flag = format!("--tuning_script_path={}", dir.path().display());
    let (_, out, _) = doctor(&["--gpu_nic_preset=a3vm", &flag]);
    let tuning = line(&out, "host", "tuning");
    assert!(tuning.starts_with("! tuning:") && tuning.contains("setup.sh or"), "{out}");
    for f in ["setup.sh", "teardown.sh"] {
        std::fs::write(dir.path().join(f), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(dir.path().join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (_, out, _) = doctor(&["--gpu_nic_preset=a3vm", &flag]);
    assert!(line(&out, "host", "tuning").starts_with("✔ tuning:"), "{out}");
}
