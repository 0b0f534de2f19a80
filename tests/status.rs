//! `tcpx-rxdm status` against a running sim daemon whose HTTP endpoints are
//! off (`--metrics_address=`): everything goes through the socket folder.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{run_bin, wait_until, Daemon};
use tcpx_rxdm::wire::client;

/// The sim daemon without HTTP, ready.
fn start(extra: &[&str]) -> Daemon {
    no_http(extra).ready()
}

/// The sim daemon without HTTP, not waited for.
fn no_http(extra: &[&str]) -> Daemon {
    let mut args = vec!["--metrics_address="];
    args.extend(extra);
    Daemon::spawn(&args, &[])
}

/// Installs 10.1.0.2:`src_port` → `dst`:5000 on `gpu`.
fn install(d: &Daemon, src_port: i32, gpu: &str, dst: &str) {
    let mut c = d.client("rx_rule_manager");
    let reply =
        c.request(&client::rule_request(1, ("10.1.0.2", src_port), (dst, 5000), Some(gpu), None)).unwrap();
    assert_eq!(client::raw_bytes(&reply), Some(&b"Ok."[..]), "{reply:?}");
}

/// `tcpx-rxdm status ARGS`: (exit code, stdout, stderr).
fn status(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["status"];
    all.extend(args);
    run_bin(&all)
}

#[test]
fn status_and_flows_show_installed_rules_without_http() {
    let d = start(&[]);
    for port in [40001, 40002, 40003] {
        install(&d, port, "0000:04:00.0", "192.168.1.2");
    }
    install(&d, 40004, "0000:0b:00.0", "192.168.2.2");

    let (code, out, err) = status(&[&d.uds_arg()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.lines().next().unwrap().contains(": ready, up "), "{out}");
    assert!(out.contains("eth1: 3 rules, 99997 of 100000 slots free; by queue 8:"), "{out}");
    assert!(out.contains("eth2: 1 rules, 99999 of 100000 slots free"), "{out}");
    assert!(out.contains("eth3: 0 rules"), "{out}");
    assert!(out.contains("0000:04:00.0 (eth1, queues 8,9,10,11): 64.0 MiB"), "{out}");
    assert!(out.contains("recent errors\n  none"), "{out}");

    let (code, out, _) = status(&["--json", &d.uds_arg()]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ready"], true);
    let eth1 = &v["nics"][0];
    assert_eq!(
        (eth1["ifname"].as_str(), eth1["rules"].as_u64(), eth1["slots_free"].as_u64()),
        (Some("eth1"), Some(3), Some(99997))
    );
    let by_queue = eth1["rules_by_queue"].as_array().unwrap();
    assert_eq!(by_queue.iter().map(|e| e["rules"].as_u64().unwrap()).sum::<u64>(), 3);
    let queues: Vec<u64> = by_queue.iter().map(|e| e["queue"].as_u64().unwrap()).collect();
    assert_eq!(queues, (8..16).collect::<Vec<_>>(), "every GPU queue listed in order, also empty ones");
    assert_eq!(v["nics"][1]["rules"], 1);
    let client_rules: u64 =
        v["clients"].as_array().unwrap().iter().map(|c| c["rules"].as_u64().unwrap()).sum();
    assert_eq!(client_rules, 4);
    assert_eq!(v["pools"].as_array().unwrap().len(), 8);
    assert_eq!(v["pools"][0]["size_bytes"], 64 << 20);
    assert_eq!(v["recent_errors"], serde_json::json!([]));

    let (code, out, _) = status(&["flows", &d.uds_arg()]);
    assert_eq!(code, 0);
    assert_eq!(out.matches("Filter: ").count(), 4, "{out}");
    assert!(out.contains("eth1: 3 rules, 100000 slots"), "{out}");
    assert!(out.contains("\tSrc IP addr: 10.1.0.2 mask: 0.0.0.0\n\tDest IP addr: 192.168.1.2 mask: 0.0.0.0\n\tSrc port: 40001 mask: 0x0\n\tDest port: 5000 mask: 0x0\n\tAction: Direct to queue "), "{out}");
    assert!(out.contains("\tGPU: 0000:0b:00.0"), "{out}");

    let (code, out, _) = status(&[&d.uds_arg(), "flows", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nics"][0]["rules"].as_array().unwrap().len(), 3);
    assert_eq!(v["nics"][1]["rules"][0]["src"], "10.1.0.2:40004");
}

#[test]
fn malformed_requests_get_an_error_reply_and_the_socket_has_the_endpoint_mode() {
    let d = start(&["--socket_mode=0600"]);
    let path = d.dir.path().join("rxdm_status");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let cases = [
        (&b"hello\n"[..], "unknown request \"hello\""),
        (b"status", "incomplete request \"status\" (no newline)"),
        (b"\xff\xfe\n", "the request is not UTF-8 text"),
    ];
    for (request, reply) in cases {
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        assert!(v["error"].as_str().unwrap().starts_with(reply), "{body}");
    }
    // The daemon still answers a good request afterwards.
    let (code, _, err) = status(&[&d.uds_arg()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn no_daemon_and_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = status(&[&format!("--uds_path={}", dir.path().display())]);
    assert_eq!(code, 1);
    assert!(err.contains("no daemon answers") && err.contains("rxdm_status"), "{err}");
    // A flag value in the next word, then a positional word.
    let (code, _, err) = status(&["--uds_path", &dir.path().display().to_string(), "flows"]);
    assert_eq!(code, 1);
    assert!(err.contains("no daemon answers"), "{err}");
    let (code, _, err) = status(&["rules", &format!("--uds_path={}", dir.path().display())]);
    assert_eq!(code, 2);
    assert!(err.contains("rules"), "{err}");
    let (code, _, err) = status(&["--uds_pth=/x"]);
    assert_eq!(code, 2);
    assert!(err.contains("--uds_pth"), "{err}");
}

#[test]
fn flows_larger_than_a_frame_arrive_whole() {
    let d = start(&[]);
    let mut c = d.client("rx_rule_manager");
    let n = 700;
    for port in 0..n {
        let req = client::rule_request(
            1,
            ("10.1.0.2", 20000 + port),
            ("192.168.3.2", 5000),
            Some("0000:84:00.0"),
            None,
        );
        assert_eq!(client::raw_bytes(&c.request(&req).unwrap()), Some(&b"Ok."[..]));
    }
    let (code, out, err) = status(&["flows", "--json", &d.uds_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.len() > 64 << 10, "only {} bytes: not past one 64 KiB frame", out.len());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let eth3 = v["nics"].as_array().unwrap().iter().find(|n| n["ifname"] == "eth3").unwrap();
    assert_eq!(eth3["rules"].as_array().unwrap().len(), n as usize);
}

#[test]
fn status_answers_not_ready_while_startup_finishes() {
    // Every private-flag change takes 500 ms: enabling header split on four
    // NICs, one after another, after the status socket opened keeps startup
    // going for 4 s, against one status call. (Priming makes the same
    // changes, before the socket opens, so a held call would hold it shut.)
    let d = no_http(&["--sim_delay=set_priv_flag:500"]);
    let sock = d.dir.path().join("rxdm_status");
    wait_until(Duration::from_secs(20), || sock.exists());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (code, out, err) = status(&["--json", &d.uds_arg()]);
    assert_eq!(code, 1, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ready"], false, "{out}");
    loop {
        let (code, out, _) = status(&[&d.uds_arg()]);
        if code == 0 {
            assert!(out.contains(": ready, up "), "{out}");
            break;
        }
        assert!(out.contains("NOT ready"), "{out}");
        assert!(std::time::Instant::now() < deadline, "never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `tcpx-rxdm ARGS` as uid/gid `id` (no groups), through setpriv; needs root.
fn as_uid(id: u32, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new("setpriv")
        .args([&format!("--reuid={id}"), &format!("--regid={id}"), "--clear-groups", "--", common::BIN])
        .args(args)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
#[ignore = "needs root: runs the daemon and the commands as other users"]
fn a_user_the_daemon_does_not_serve_is_told_who_runs_it() {
    use std::os::unix::fs::PermissionsExt;
    common::require_root("setpriv to other users");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A daemon run by root, asked by nobody: root is named.
    let d = start(&[]);
    let uds = d.uds_arg();
    let (code, err) = as_uid(65534, &["status", &uds]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("permission denied") && err.contains("run it as root, who owns"), "{err}");
    assert!(err.contains(&format!("`sudo tcpx-rxdm status {uds}`")), "{err}");
    drop(d);
    // A daemon run by nobody, asked by another user: nobody is named, not root.
    let dir = tmp.path().join("tcpx");
    let folder = format!("--uds_path={}", dir.display());
    let prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"];
    let d = Daemon::spawn_under(&prefix, &[&folder, "--metrics_address="], &[]).ready();
    for command in ["status", "upgrade"] {
        let (code, err) = as_uid(65533, &[command, &folder]);
        assert_eq!(code, 1, "{command}: {err}");
        assert!(
            err.contains("run it as the daemon's user, nobody (uid 65534), who owns"),
            "{command}: {err}"
        );
        assert!(err.contains(&format!("`sudo -u nobody tcpx-rxdm {command} {folder}`")), "{command}: {err}");
        assert!(!err.contains("root"), "{command}: {err}");
    }
    drop(d);
}

/// Every tenant's clients, pids and flows go to the node's operator only: a
/// capability-less root process with the socket folder mounted read-only
/// gets counts and readiness, no pid, no flow; a process on the node's
/// loopback, as nobody, gets no `/debug/*` (off); the operator, everything.
#[test]
#[ignore = "needs root: a mount namespace, setpriv to drop capabilities and to become nobody"]
fn other_tenants_flows_pids_and_cgroups_are_the_operators_alone() {
    common::require_root("mount namespace, setpriv");
    let d = start(&["--leases", "--metrics_address=127.0.0.1:0", "--debug_endpoints=off"]);
    install(&d, 40001, "0000:04:00.0", "192.168.1.2");
    let me = std::process::id();
    let folder = d.dir.path().display().to_string();

    // The operator (this test: root with every capability).
    let (code, out, err) = status(&["--json", &d.uds_arg()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["clients"][0]["pid"], me, "{v}");
    let (code, flows, _) = status(&["flows", "--json", &d.uds_arg()]);
    assert_eq!(code, 0);
    assert!(flows.contains("10.1.0.2"), "{flows}");

    // Root without capabilities, the folder mounted read-only at a place of its own.
    let script = format!(
        "set -e; m=$(mktemp -d); mount --bind {folder} $m; mount -o remount,bind,ro $m; \
         exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- {bin} status $1 --json --uds_path=$m",
        bin = common::BIN
    );
    let as_workload = |what: &str| {
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh", what])
            .output()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (out, err) = as_workload("");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!(v["ready"], true, "{v}");
    assert!(v["clients"].is_null() && v["tenants"].is_null() && v["recent_errors"].is_null(), "{v}");
    assert!(v["hidden"].as_str().unwrap().contains("node's operator only"), "{v}");
    assert!(!out.contains(&format!("{me}")) || v["pid"] == me, "a client pid shown: {out}");
    assert_eq!(v["nics"][0]["rules"], 1, "counts stay: {v}");
    let (out, err) = as_workload("flows");
    assert!(!out.contains("10.1.0.2") && !out.contains("192.168.1.2"), "{out}");
    assert!(err.contains("every tenant's flows are the node operator's to read"), "{out}\n{err}");

    // Nobody on the node's loopback: /debug/* is off.
    let url = format!("http://{}/debug/flows", d.http());
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "curl",
            "-s",
            "-w",
            "\n%{http_code}",
            &url,
        ])
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.ends_with("\n404"), "{body}");
    assert!(!body.contains("10.1.0.2") && body.contains("--debug_endpoints=local"), "{body}");
}
