//! `tcpx-rxdm nccl-env` as a black box on fabricated sysfs trees: the
//! a3-highgpu-8g layout (GKE and Slurm interface names) and a3-highgpu-4g
//! give exactly the expected environment, the three output forms agree,
//! and `--check` finds each known mistake and passes the generated file.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use common::sysfs::*;
use common::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_tcpx-rxdm");

/// The corrected published a3-highgpu-8g bindings.
const TX_8G: &str = "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177";
const RX_8G: &str = "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191";

/// Runs the binary with `args` and only `env` of the NCCL variables; returns (code, stdout, stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NCCL_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), s(&out.stdout), s(&out.stderr))
}

/// a3-highgpu-8g: 208 vCPUs on two NUMA nodes, eth1/eth2 on node 0, eth3/eth4 on node 1.
fn a3_8g() -> FakeSysfs {
    let fs = a3_highgpu_8g();
    fs.gce_cpus(2, 52).numa_node("eth0", 0);
    for (nic, node) in [("eth1", 0), ("eth2", 0), ("eth3", 1), ("eth4", 1)] {
        fs.numa_node(nic, node);
    }
    fs
}

/// The same machine as a Slurm image names its interfaces.
fn a3_8g_slurm() -> FakeSysfs {
    let fs = FakeSysfs::new();
    a3_block(&fs, "0000:00:01.0", 0x04, "enp6s0");
    a3_block(&fs, "0000:00:02.0", 0x0a, "enp12s0");
    a3_block(&fs, "0000:80:01.0", 0x84, "enp134s0");
    a3_block(&fs, "0000:80:02.0", 0x8a, "enp140s0");
    fs.pci("pci0000:00/0000:00:0c.0", GVNIC).nic("enp0s12", "pci0000:00/0000:00:0c.0");
    fs.virtual_if("lo").virtual_if("docker0");
    fs.gce_cpus(2, 52);
    for (nic, node) in [("enp0s12", 0), ("enp6s0", 0), ("enp12s0", 0), ("enp134s0", 1), ("enp140s0", 1)] {
        fs.numa_node(nic, node);
    }
    fs
}

/// a3-highgpu-4g: 104 vCPUs on one NUMA node, GPU NICs eth1 and eth2, whose
/// devices report no node (-1), as on single-node VMs.
fn a3_4g() -> FakeSysfs {
    let fs = FakeSysfs::new();
    a3_block(&fs, "0000:00:01.0", 0x04, "eth1");
    a3_block(&fs, "0000:00:02.0", 0x0a, "eth2");
    fs.pci("pci0000:00/0000:00:04.0", GVNIC).nic("eth0", "pci0000:00/0000:00:04.0");
    fs.virtual_if("lo");
    fs.gce_cpus(1, 52);
    for nic in ["eth0", "eth1", "eth2"] {
        fs.numa_node(nic, -1);
    }
    fs
}

fn a3vm_text() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/a3vm.textproto")).unwrap()
}

fn slurm_topology() -> String {
    let mut t = a3vm_text();
    for (a, b) in [("eth1", "enp6s0"), ("eth2", "enp12s0"), ("eth3", "enp134s0"), ("eth4", "enp140s0")] {
        t = t.replace(&format!("\"{a}\""), &format!("\"{b}\""));
    }
    t
}

/// The first two NICs of a3vm: four GPUs on eth1 and eth2.
fn topology_4g() -> String {
    let t = a3vm_text();
    let cut = t.match_indices("gpu_rxq_configs {").nth(2).unwrap().0;
    format!("{}rss_set_size: 8\ntcpd_queue_size: 8\n", &t[..cut])
}

fn golden(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)).unwrap()
}

/// `export NAME=VALUE` lines of an env file, quotes removed.
fn exports(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.trim_matches('\'').to_string())
        })
        .collect()
}

fn sysfs_arg(fs: &FakeSysfs) -> String {
    format!("--sysfs_root={}", fs.root().display())
}

#[test]
fn a3_highgpu_8g_gives_the_published_profile_exactly() {
    let fs = a3_8g();
    let (code, out, err) = run(&["nccl-env", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs)], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, golden("nccl-a3-highgpu-8g.env"));
    let v = exports(&out);
    assert_eq!(v["NCCL_GPUDIRECTTCPX_TX_BINDINGS"], TX_8G);
    assert_eq!(v["NCCL_GPUDIRECTTCPX_RX_BINDINGS"], RX_8G);
    assert_eq!(v["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"], "eth1,eth2,eth3,eth4");
    assert_eq!(v["NCCL_GPUDIRECTTCPX_CTRL_DEV"], "eth0");
    assert_eq!(v["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"], "/run/tcpx");
    assert_eq!(v["NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE"], "1");
    // Every variable comes with a one-line reason just above it.
    let lines: Vec<&str> = out.lines().collect();
    for (i, l) in lines.iter().enumerate().filter(|(_, l)| l.starts_with("export ")) {
        assert!(lines[i - 1].starts_with("# ") && lines[i - 1].len() > 10, "{l} has no reason");
    }
}

#[test]
fn slurm_interface_names_give_the_same_bindings() {
    let fs = a3_8g_slurm();
    let topo = format!("--gpu_nic_topology_proto={}", slurm_topology());
    let (code, out, err) = run(
        &["nccl-env", "--gpu_nic_preset=manual", &topo, "--uds_path=/run/tcpx-4242", &sysfs_arg(&fs)],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v = exports(&out);
    let rename = |s: &str| {
        s.replace("eth1:", "enp6s0:")
            .replace("eth2:", "enp12s0:")
            .replace("eth3:", "enp134s0:")
            .replace("eth4:", "enp140s0:")
    };
    assert_eq!(v["NCCL_GPUDIRECTTCPX_TX_BINDINGS"], rename(TX_8G));
    assert_eq!(v["NCCL_GPUDIRECTTCPX_RX_BINDINGS"], rename(RX_8G));
    assert_eq!(v["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"], "enp6s0,enp12s0,enp134s0,enp140s0");
    assert_eq!(v["NCCL_GPUDIRECTTCPX_CTRL_DEV"], "enp0s12");
    assert_eq!(v["NCCL_SOCKET_IFNAME"], "enp0s12");
    assert_eq!(v["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"], "/run/tcpx-4242");
}

#[test]
fn a3_highgpu_4g_gives_its_golden_file_exactly() {
    let fs = a3_4g();
    let topo = format!("--gpu_nic_topology_proto={}", topology_4g());
    let (code, out, err) = run(&["nccl-env", "--gpu_nic_preset=manual", &topo, &sysfs_arg(&fs)], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, golden("nccl-a3-highgpu-4g.env"));
    let v = exports(&out);
    assert_eq!(v["NCCL_GPUDIRECTTCPX_TX_BINDINGS"], "eth1:8-21,60-73;eth2:8-21,60-73");
    assert_eq!(v["NCCL_GPUDIRECTTCPX_RX_BINDINGS"], "eth1:22-35,74-87;eth2:22-35,74-87");
}

#[test]
fn json_and_configmap_forms_hold_the_same_values() {
    let fs = a3_8g();
    let base = ["nccl-env", "--gpu_nic_preset=a3vm"];
    let sys = sysfs_arg(&fs);
    let env = exports(&run(&[&base[..], &[sys.as_str()]].concat(), &[]).1);
    let (code, json, err) = run(&[&base[..], &[sys.as_str(), "--format=json"]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    let vars = j["variables"].as_array().unwrap();
    let from_json: BTreeMap<String, String> = vars
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v["value"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(from_json, env);
    assert!(vars.iter().all(|v| !v["why"].as_str().unwrap().is_empty()));
    let (code, cm, err) = run(&[&base[..], &[sys.as_str(), "--format", "configmap"]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_norway::Value = serde_norway::from_str(&cm).unwrap();
    assert_eq!(doc["kind"], "ConfigMap");
    assert_eq!(doc["metadata"]["name"], "tcpx-nccl-env");
    let data: BTreeMap<String, String> = serde_norway::from_value(doc["data"].clone()).unwrap();
    assert_eq!(data, env);
}

#[test]
fn a_socket_folder_too_long_for_the_plugin_is_refused() {
    let fs = a3_8g();
    let ok = format!("--uds_path=/{}", "d".repeat(75));
    assert_eq!(run(&["nccl-env", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs), &ok], &[]).0, 0);
    let long = format!("--uds_path=/{}", "d".repeat(76));
    let (code, out, err) = run(&["nccl-env", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs), &long], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("--uds_path") && err.contains("77 characters") && err.contains("at most 76"),
        "{err}"
    );
    assert!(out.is_empty());
}

#[test]
fn bad_options_exit_2_naming_the_option() {
    let fs = a3_8g();
    for (args, needle) in [
        (vec!["--format=yaml"], "--format"),
        (vec!["--env-file=/x"], "--env-file"),
        (vec!["--check", "--format=configmap"], "--format"),
        (vec!["--leases"], "--leases is a daemon flag"),
        (vec!["--bogus"], "--bogus"),
        (vec!["--check", "--env-file=/nonexistent/nccl.env"], "--env-file"),
    ] {
        let mut all = vec!["nccl-env", "--gpu_nic_preset=a3vm"];
        let sys = sysfs_arg(&fs);
        all.push(&sys);
        all.extend(args.iter().copied());
        let (code, _, err) = run(&all, &[]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `nccl-env --check` on the a3-highgpu-8g fixture with the golden file
/// changed by `edit`; returns (code, the JSON report).
fn check_file(edit: impl Fn(String) -> String) -> (i32, serde_json::Value) {
    let fs = a3_8g();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nccl.env");
    std::fs::write(&file, edit(golden("nccl-a3-highgpu-8g.env"))).unwrap();
    let env_file = format!("--env-file={}", file.display());
    let (code, out, err) =
        run(&["nccl-env", "--check", "--json", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs), &env_file], &[]);
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    (code, report)
}

fn kinds(report: &serde_json::Value) -> Vec<(String, String)> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["variable"].as_str().unwrap().to_string(), p["kind"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn check_passes_the_generated_file() {
    let (code, report) = check_file(|s| s);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["ok"], true);
    assert_eq!(kinds(&report), []);
}

/// A change made to the golden file.
type Edit = Box<dyn Fn(String) -> String>;

#[test]
fn check_finds_each_known_mistake() {
    let published_rx = RX_8G.replace("126-139", "124-139");
    let cases: Vec<(Edit, (&str, &str))> = vec![
        (
            Box::new(move |s: String| s.replace(RX_8G, &published_rx)),
            ("NCCL_GPUDIRECTTCPX_RX_BINDINGS", "tx_rx_overlap"),
        ),
        (
            Box::new(|s: String| s.replace("PREFIX=/run/tcpx", "PREFIX=/tmp")),
            ("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "wrong_prefix"),
        ),
        (
            Box::new(|s: String| s.replace("IFNAME=eth1,eth2,eth3,eth4", "IFNAME=eth1,eth2,eth3")),
            ("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "missing_ifname"),
        ),
        (
            Box::new(|s: String| s.replace("IFNAME=eth1,eth2,eth3,eth4", "IFNAME=eth1,eth2,eth3,eth4,eth5")),
            ("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "unmanaged_ifname"),
        ),
        (
            Box::new(|s: String| s.replace("REPORT_LIFECYCLE=1", "REPORT_LIFECYCLE=0")),
            ("NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE", "lifecycle_off"),
        ),
        (
            Box::new(|s: String| s.replace("eth3:60-73,164-177", "eth3:8-21,112-125")),
            ("NCCL_GPUDIRECTTCPX_TX_BINDINGS", "wrong_numa_node"),
        ),
    ];
    for (edit, (var, kind)) in cases {
        let (code, report) = check_file(edit);
        assert_eq!(code, 1, "{var} {kind}: {report}");
        assert_eq!(report["ok"], false);
        let found = kinds(&report);
        assert!(
            !found.is_empty() && found.iter().all(|(v, k)| v == var && k == kind),
            "{var} {kind}: {found:?}"
        );
        // The fix is the generated value.
        assert!(report["problems"][0]["fix"].is_string(), "{report}");
    }
}

#[test]
fn check_reads_the_process_environment_and_prints_fixes() {
    let fs = a3_8g();
    let vars = exports(&golden("nccl-a3-highgpu-8g.env"));
    let mut env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, out, err) = run(&["nccl-env", "--check", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs)], &env);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("ok: "), "{out}");
    env.retain(|(k, _)| *k != "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX");
    let (code, out, _) = run(&["nccl-env", "--check", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs)], &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("✗ NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX: not set: the plugin looks in /tmp"),
        "{out}"
    );
    assert!(out.contains("    → NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=/run/tcpx\n"), "{out}");
}

#[test]
fn the_daemon_writes_the_file_once_ready_and_removes_it_at_shutdown() {
    use std::os::unix::fs::MetadataExt;
    let fs = a3_8g();
    let sys = sysfs_arg(&fs);
    let mut d = Daemon::start(&[&sys]);
    let path = d.dir.path().join("nccl.env");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}; log:\n{}", d.log().join("\n")));
    // The same as the command prints for the daemon's flags (sim NICs are named eth1..eth4).
    let uds = format!("--uds_path={}", d.dir.path().display());
    let (code, out, err) = run(&["nccl-env", "--gpu_nic_preset=sim", &sys, &uds], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(text, out);
    let v = exports(&text);
    assert_eq!(v["NCCL_GPUDIRECTTCPX_TX_BINDINGS"], TX_8G);
    assert_eq!(v["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"], d.dir.path().display().to_string());
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o640);
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait_exit(std::time::Duration::from_secs(10)).code(), Some(0));
    assert!(!path.exists(), "nccl.env left behind");
}

#[test]
fn a_daemon_on_a_node_it_cannot_read_still_writes_the_file_and_says_what_is_left_out() {
    let empty = tempfile::tempdir().unwrap();
    let sys = format!("--sysfs_root={}", empty.path().display());
    let d = Daemon::start(&[&sys]);
    let text = std::fs::read_to_string(d.dir.path().join("nccl.env"))
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", d.log().join("\n")));
    let v = exports(&text);
    // What the node cannot tell is left out, each with a comment saying why.
    for left_out in ["NCCL_GPUDIRECTTCPX_TX_BINDINGS", "NCCL_GPUDIRECTTCPX_CTRL_DEV"] {
        assert!(!v.contains_key(left_out), "{text}");
        assert!(text.lines().any(|l| l.starts_with("# Note: ") && l.contains(left_out)), "{text}");
    }
    assert_eq!(v["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"], d.dir.path().display().to_string());
    assert_eq!(v["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"], "eth1,eth2,eth3,eth4");
    assert!(d.log().iter().any(|l| l.contains("NCCL settings written")), "{:?}", d.log());
}

/// A two-core machine (one NUMA node, no SMT), as on a developer's VM or a
/// CI runner, with the a3vm NICs on it.
fn two_cores() -> FakeSysfs {
    let fs = a3_4g();
    std::fs::write(fs.root().join("devices/system/node/node0/cpulist"), "0-1\n").unwrap();
    fs
}

#[test]
fn a_two_core_machine_gets_settings_without_bindings_and_a_comment_saying_why() {
    let fs = two_cores();
    let (code, out, err) = run(&["nccl-env", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs)], &[]);
    assert_eq!(code, 0, "{err}");
    let v = exports(&out);
    assert!(
        !v.contains_key("NCCL_GPUDIRECTTCPX_TX_BINDINGS")
            && !v.contains_key("NCCL_GPUDIRECTTCPX_RX_BINDINGS")
    );
    let note = out.lines().find(|l| l.starts_with("# Note: ")).unwrap_or_else(|| panic!("no note: {out}"));
    assert!(
        note.contains("TX_BINDINGS") && note.contains("2 cores") && note.contains("at least 4"),
        "{note}"
    );
    assert!(err.contains("note:") && err.contains("2 cores"), "{err}");
    assert_eq!(v["NCCL_GPUDIRECTTCPX_CTRL_DEV"], "eth0");
    // The file sourced as is passes the check, on the same node.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nccl.env");
    std::fs::write(&file, &out).unwrap();
    let env_file = format!("--env-file={}", file.display());
    let (code, out, err) =
        run(&["nccl-env", "--check", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs), &env_file], &[]);
    assert_eq!(code, 0, "{out}{err}");
    // JSON says the same, in a field of its own.
    let (code, out, _) = run(&["nccl-env", "--json", "--gpu_nic_preset=a3vm", &sysfs_arg(&fs)], &[]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(j["notes"][0].as_str().unwrap().contains("2 cores"), "{j}");
}

#[test]
fn a_machine_profile_gives_its_settings_on_any_machine() {
    // This node has two cores; the profile has the a3-highgpu-8g layout.
    let fs = two_cores();
    let (code, out, err) = run(&["nccl-env", "--machine=a3-highgpu-8g"], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, golden("nccl-a3-highgpu-8g.env"));
    // The profile names the NICs too, so auto needs no sysfs; a profile and a sysfs root do not go together.
    let (code, _, err) = run(&["nccl-env", "--machine=a3-highgpu-8g", &sysfs_arg(&fs)], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--machine") && err.contains("--sysfs_root"), "{err}");
    let (code, _, err) = run(&["nccl-env", "--machine=a2-highgpu-8g"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("a3-highgpu-8g"), "the known profiles are listed: {err}");
    // --check against the profile gives the value to use for each finding.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nccl.env");
    std::fs::write(
        &file,
        golden("nccl-a3-highgpu-8g.env").replace("REPORT_LIFECYCLE=1", "REPORT_LIFECYCLE=0"),
    )
    .unwrap();
    let env_file = format!("--env-file={}", file.display());
    let (code, out, _) = run(&["nccl-env", "--check", "--machine=a3-highgpu-8g", &env_file], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("    → NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE=1\n"), "{out}");
}

#[test]
fn a_missing_env_file_is_the_error_reported_before_any_discovery() {
    // No preset: discovery on this machine would fail; the file's absence is the cause to name.
    let empty = tempfile::tempdir().unwrap();
    let sys = format!("--sysfs_root={}", empty.path().display());
    let (code, _, err) = run(&["nccl-env", "--check", "--env-file=nope.env", &sys], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--env-file nope.env") && err.contains("No such file"), "{err}");
    assert!(!err.contains("discover"), "{err}");
    // Without the file, discovery's failure is the cause, with how to name the machine instead.
    let (code, _, err) = run(&["nccl-env", &sys], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("discovery") && err.contains("--machine=a3-highgpu-8g"), "{err}");
}

/// `doctor --json` on sim NICs over the a3-highgpu-8g fixture with `env`;
/// returns its "NCCL settings" checks as (name, status).
fn doctor_nccl(env: &[(&str, &str)]) -> Vec<(String, String)> {
    let fs = a3_8g();
    // doctor only reads: the folder need not exist.
    let uds = "--uds_path=/run/tcpx-doctor-test";
    let (_, out, err) = run(&["doctor", "--json", "--gpu_nic_preset=sim", &sysfs_arg(&fs), uds], env);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["section"] == "NCCL settings")
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["status"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn doctor_checks_the_nccl_settings_when_they_are_set() {
    assert_eq!(doctor_nccl(&[]), [("environment".to_string(), "skip".to_string())]);
    let vars = exports(&golden("nccl-a3-highgpu-8g.env"));
    let env: Vec<(&str, &str)> = vars
        .iter()
        .filter(|(k, _)| *k != "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut ok = env.clone();
    ok.push(("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "/run/tcpx-doctor-test"));
    assert_eq!(doctor_nccl(&ok), [("environment".to_string(), "pass".to_string())]);
    let mut with_tmp = env.clone();
    with_tmp.push(("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "/tmp"));
    assert_eq!(
        doctor_nccl(&with_tmp),
        [("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX".to_string(), "fail".to_string())]
    );
}

#[test]
fn the_kubernetes_workloads_source_the_daemons_file_and_set_nothing_by_hand() {
    for rel in ["tcpx-daemon-sidecar.yaml", "native-sidecar-job.yaml", "nccl-allgather.yaml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes").join(rel);
        let text = std::fs::read_to_string(&path).unwrap();
        let job = serde_norway::Deserializer::from_str(&text)
            .map(|d| <serde_norway::Value as serde::Deserialize>::deserialize(d).unwrap())
            .find(|d| d["kind"] == "Job")
            .unwrap();
        let pod = &job["spec"]["template"]["spec"];
        let workload =
            &pod["containers"].as_sequence().unwrap().iter().find(|c| c["name"] != "tcpx-daemon").unwrap();
        let script: Vec<&str> =
            workload["command"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let script = script.join(" ");
        assert!(script.contains(". /run/tcpx/nccl.env"), "{rel}: {script}");
        let mounted =
            workload["volumeMounts"].as_sequence().unwrap().iter().any(|m| m["mountPath"] == "/run/tcpx");
        assert!(mounted, "{rel}: /run/tcpx not mounted");
        for e in workload["env"].as_sequence().unwrap() {
            let name = e["name"].as_str().unwrap();
            assert!(!name.starts_with("NCCL_GPUDIRECTTCPX_"), "{rel}: {name} set by hand");
        }
    }
}
