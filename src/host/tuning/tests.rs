//! Host tuning over fabricated procfs/sysfs trees and scripts (no privileges
//! needed; the netns tests cover the real kernel).

use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;

const NO_ROUTES: TuningParams = TuningParams { initcwnd: 0, rto_min_ms: 0, quickack: 0 };

fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (p, v) in files {
        let path = dir.path().join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, v).unwrap();
    }
    dir
}

fn read(dir: &Path, p: &str) -> String {
    fs::read_to_string(dir.join(p)).unwrap()
}

#[test]
fn params_map_to_metrics_and_script_args() {
    let p = TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 0 };
    assert_eq!(p.route_metrics(), vec![(RTAX_INITCWND, 128), (RTAX_RTO_MIN, 2)]);
    assert_eq!(p.script_args(), ["--verbose", "128", "2", "0"]);
    assert!(NO_ROUTES.route_metrics().is_empty());
}

#[test]
fn sysctls_applied_saved_and_restored() {
    let proc_ = tree(&[
        ("sys/net/ipv4/tcp_mtu_probing", "1\n"),
        ("sys/net/ipv4/tcp_slow_start_after_idle", "0\n"), // already right: untouched
        ("sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n"),
        ("sys/net/ipv4/tcp_wmem", "4096\t16384\t4194304\n"),
        ("sys/net/ipv4/tcp_no_metrics_save", "0\n"),
        ("sys/net/core/somaxconn", "8192\n"), // already ≥ 4096: untouched
        ("sys/net/ipv4/tcp_max_syn_backlog", "128\n"),
    ]);
    let sys = tree(&[("module/tcp_cubic/parameters/hystart_detect", "3\n")]);
    let plan = TuningPlan::Native { procfs_root: proc_.path().into(), sysfs_root: sys.path().into() };
    let (mut t, errors) = HostTuning::apply(&NO_ROUTES, &plan);
    assert!(errors.is_empty(), "{errors:?}");
    let p = proc_.path();
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "0");
    assert_eq!(read(p, "sys/net/ipv4/tcp_slow_start_after_idle"), "0\n");
    assert_eq!(read(p, "sys/net/ipv4/tcp_rmem"), "4096 1048576 15728640");
    assert_eq!(read(p, "sys/net/ipv4/tcp_wmem"), "4096 1048576 67108864");
    assert_eq!(read(p, "sys/net/ipv4/tcp_no_metrics_save"), "1");
    assert_eq!(read(p, "sys/net/core/somaxconn"), "8192\n");
    assert_eq!(read(p, "sys/net/ipv4/tcp_max_syn_backlog"), "4096");
    assert_eq!(read(sys.path(), "module/tcp_cubic/parameters/hystart_detect"), "2");

    t.restore().unwrap();
    assert!(t.is_restored());
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "1");
    assert_eq!(read(p, "sys/net/ipv4/tcp_rmem"), "4096 131072 6291456");
    assert_eq!(read(p, "sys/net/ipv4/tcp_max_syn_backlog"), "128");
    assert_eq!(read(sys.path(), "module/tcp_cubic/parameters/hystart_detect"), "3");
    // Idempotent: nothing left to do, nothing written.
    fs::write(p.join("sys/net/ipv4/tcp_mtu_probing"), "7").unwrap();
    t.restore().unwrap();
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "7");
}

#[test]
fn missing_knobs_are_skipped_not_created_and_proc_sys_mounts_work() {
    // A `/proc/sys` mount (like /hostprocsysfs) with only one knob; no cubic module.
    let procsys = tree(&[("net/ipv4/tcp_mtu_probing", "2")]);
    let sys = tempfile::tempdir().unwrap();
    assert_eq!(sysctl_dir(procsys.path()), procsys.path());
    assert_eq!(sysctl_dir(Path::new("/proc")), Path::new("/proc/sys"));
    let plan = TuningPlan::Native { procfs_root: procsys.path().into(), sysfs_root: sys.path().into() };
    let (mut t, errors) = HostTuning::apply(&NO_ROUTES, &plan);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(read(procsys.path(), "net/ipv4/tcp_mtu_probing"), "0");
    assert!(!procsys.path().join("net/core/somaxconn").exists());
    assert!(!sys.path().join("module/tcp_cubic/parameters/hystart_detect").exists());
    drop(t.restore());
    assert_eq!(read(procsys.path(), "net/ipv4/tcp_mtu_probing"), "2");
}

#[test]
fn unwritable_knob_is_reported_and_the_rest_still_applied() {
    let proc_ = tree(&[("sys/net/ipv4/tcp_mtu_probing", "1"), ("sys/net/ipv4/tcp_no_metrics_save", "0")]);
    // A directory where a file should be: reading fails with something other than NotFound.
    fs::create_dir_all(proc_.path().join("sys/net/ipv4/tcp_rmem")).unwrap();
    let plan = TuningPlan::Native { procfs_root: proc_.path().into(), sysfs_root: proc_.path().into() };
    let (mut t, errors) = HostTuning::apply(&NO_ROUTES, &plan);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("tcp_rmem"), "{}", errors[0]);
    assert_eq!(read(proc_.path(), "sys/net/ipv4/tcp_no_metrics_save"), "1");
    t.restore().unwrap();
    assert_eq!(read(proc_.path(), "sys/net/ipv4/tcp_no_metrics_save"), "0");
}

#[test]
fn scripts_run_at_apply_and_restore() {
    // Both scenarios in one test: scripts are written then executed, and a
    // concurrent fork elsewhere in this process could make exec see them busy.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = |name: &str, body: &str| {
        let p = dir.path().join(name);
        fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    };
    script("setup.sh", &format!("echo setup \"$@\" >> {}", log.display()));
    script("teardown.sh", &format!("echo teardown \"$@\" >> {}", log.display()));
    let params = TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 0 };
    let plan = TuningPlan::Script { dir: dir.path().into(), args: params.script_args() };
    let (mut t, errors) = HostTuning::apply(&params, &plan);
    assert!(errors.is_empty(), "{errors:?}");
    t.restore().unwrap();
    t.restore().unwrap();
    assert_eq!(fs::read_to_string(&log).unwrap(), "setup --verbose 128 2 0\nteardown\n");

    // A failing setup is reported; teardown still runs (setup may have half-applied).
    script("setup.sh", "echo boom >&2; exit 3");
    fs::remove_file(&log).unwrap();
    let (mut t, errors) = HostTuning::apply(&params, &plan);
    assert_eq!(errors.len(), 1);
    let msg = errors[0].to_string();
    assert!(msg.contains("setup.sh") && msg.contains("boom") && msg.contains('3'), "{msg}");
    drop(t.restore());
    assert_eq!(fs::read_to_string(&log).unwrap(), "teardown\n");
    // A missing script is an error, not a panic.
    let plan = TuningPlan::Script { dir: dir.path().join("nope"), args: vec![] };
    let (mut t, errors) = HostTuning::apply(&params, &plan);
    assert_eq!(errors.len(), 1);
    assert_eq!(t.restore().unwrap_err().len(), 1);
}

#[test]
fn an_undo_log_handed_to_a_successor_restores_the_same() {
    let proc_ =
        tree(&[("sys/net/ipv4/tcp_mtu_probing", "1\n"), ("sys/net/ipv4/tcp_max_syn_backlog", "128\n")]);
    let sys = tree(&[]);
    let plan = TuningPlan::Native { procfs_root: proc_.path().into(), sysfs_root: sys.path().into() };
    let (t, _) = HostTuning::apply(&NO_ROUTES, &plan);
    let p = proc_.path();
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "0");
    // The first daemon goes away without restoring; its successor restores.
    let handed_on = t.to_wire();
    std::mem::forget(t);
    let mut handed = HostTuning::from_wire(handed_on.clone()).unwrap();
    handed.restore().unwrap();
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "1");
    assert_eq!(read(p, "sys/net/ipv4/tcp_max_syn_backlog"), "128");
    let mut short = handed_on;
    short.routes.push(crate::wire::handover::Route { header: vec![0; 4], attrs: vec![] });
    let err = HostTuning::from_wire(short).unwrap_err();
    assert_eq!(err, "the host tuning's undo log: a route header of 4 bytes, not 12");
}

#[test]
fn a_handed_log_restores_nothing_when_dropped_until_armed() {
    let proc_ = tree(&[("sys/net/ipv4/tcp_mtu_probing", "1\n")]);
    let sys = tree(&[]);
    let plan = TuningPlan::Native { procfs_root: proc_.path().into(), sysfs_root: sys.path().into() };
    let (t, _) = HostTuning::apply(&NO_ROUTES, &plan);
    let p = proc_.path();
    let handed_on = t.to_wire();
    std::mem::forget(t);
    // A successor that gives up before the commit: the serving daemon's tuning stays.
    drop(HostTuning::from_wire(handed_on.clone()).unwrap());
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "0");
    // Once committed, dropping restores (the safety net of the daemon's own).
    let mut handed = HostTuning::from_wire(handed_on.clone()).unwrap();
    handed.arm();
    drop(handed);
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "1");
    // The daemon's own tuning is armed from the start.
    let (t, _) = HostTuning::apply(&NO_ROUTES, &plan);
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "0");
    drop(t);
    assert_eq!(read(p, "sys/net/ipv4/tcp_mtu_probing"), "1");
}

/// A Pod's `/proc/sys` mount holding every sysctl, and a host sysfs with cubic.
fn pod_trees() -> (tempfile::TempDir, tempfile::TempDir) {
    let procsys = tree(&[
        ("net/ipv4/tcp_mtu_probing", "1\n"),
        ("net/ipv4/tcp_slow_start_after_idle", "1\n"),
        ("net/ipv4/tcp_rmem", "4096\t131072\t6291456\n"),
        ("net/ipv4/tcp_wmem", "4096\t16384\t4194304\n"),
        ("net/ipv4/tcp_no_metrics_save", "0\n"),
        ("net/core/somaxconn", "128\n"),
        ("net/ipv4/tcp_max_syn_backlog", "128\n"),
    ]);
    let sys = tree(&[("module/tcp_cubic/parameters/hystart_detect", "3\n")]);
    (procsys, sys)
}

#[test]
fn a_pod_tunes_its_namespace_knobs_and_leaves_host_wide_ones_to_the_node() {
    let (procsys, sys) = pod_trees();
    let plan = |host_sysfs| TuningPlan::Pod {
        procfs_root: procsys.path().into(),
        sysfs_root: sys.path().into(),
        host_procfs: true,
        host_sysfs,
    };
    let (mut t, errors) = HostTuning::apply(&NO_ROUTES, &plan(false));
    // Only cubic's parameter, host-wide, without the host's sysfs given.
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].left_alone(), "{}", errors[0]);
    let text = errors[0].to_string();
    assert!(
        text.contains("hystart_detect left alone: host-wide") && text.contains("the node's to set"),
        "{text}"
    );
    let p = procsys.path();
    assert_eq!(read(p, "net/ipv4/tcp_rmem"), "4096 1048576 15728640");
    assert_eq!(read(p, "net/core/somaxconn"), "4096");
    assert_eq!(read(sys.path(), "module/tcp_cubic/parameters/hystart_detect"), "3\n");
    t.restore().unwrap();
    assert_eq!(read(p, "net/ipv4/tcp_rmem"), "4096 131072 6291456");
    assert_eq!(read(p, "net/core/somaxconn"), "128");

    // The host's sysfs given (and writable): cubic's parameter is set and put back.
    let (mut t, errors) = HostTuning::apply(&NO_ROUTES, &plan(true));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(read(sys.path(), "module/tcp_cubic/parameters/hystart_detect"), "2");
    t.restore().unwrap();
    assert_eq!(read(sys.path(), "module/tcp_cubic/parameters/hystart_detect"), "3");
}

#[test]
fn a_knob_the_pod_lacks_or_refuses_is_left_alone_and_the_rest_applied() {
    let (procsys, sys) = pod_trees();
    let p = procsys.path();
    // Absent from this namespace (host-wide on some kernels).
    fs::remove_file(p.join("net/ipv4/tcp_wmem")).unwrap();
    // Refused: a file that no one may open for writing, root included.
    fs::remove_file(p.join("net/ipv4/tcp_rmem")).unwrap();
    std::os::unix::fs::symlink("/sys/kernel/uevent_seqnum", p.join("net/ipv4/tcp_rmem")).unwrap();
    let plan = TuningPlan::Pod {
        procfs_root: p.into(),
        sysfs_root: sys.path().into(),
        host_procfs: true,
        host_sysfs: true,
    };
    let (mut t, errors) = HostTuning::apply(&NO_ROUTES, &plan);
    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(text.len(), 2, "{text:?}");
    assert!(errors.iter().all(TuningError::left_alone), "{text:?}");
    assert!(text[0].contains("tcp_rmem left alone: refused here"), "{}", text[0]);
    assert!(text[0].contains("root (uid 0) or CAP_NET_ADMIN may write it"), "{}", text[0]);
    assert!(text[1].contains("tcp_wmem left alone: not present here"), "{}", text[1]);
    assert!(!p.join("net/ipv4/tcp_wmem").exists(), "a missing knob was created");
    assert_eq!(read(p, "net/ipv4/tcp_no_metrics_save"), "1");
    t.restore().unwrap();
    assert_eq!(read(p, "net/ipv4/tcp_no_metrics_save"), "0");
}

#[test]
fn knobs_say_whose_they_are() {
    let (procsys, sys) = pod_trees();
    let states = knob_states(procsys.path(), sys.path());
    assert_eq!(states.len(), 8);
    for k in &states {
        let net = k.path.starts_with(procsys.path().join("net"));
        assert_eq!(k.scope == Scope::Namespace, net, "{k:?}");
    }
    assert_eq!(states.iter().filter(|k| k.scope == Scope::Host).count(), 1);
}
