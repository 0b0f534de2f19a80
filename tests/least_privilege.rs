//! Least privilege, checked against `SECURITY.md`'s table (*Privileges*):
//! every daemon container on Kubernetes (the shipped manifests, what
//! `inject` writes in both sidecar modes on both platforms, its golden files
//! and the webhook's golden Pod) is not privileged, drops every capability
//! and adds only its mode's set from the table, cannot escalate, has a
//! read-only root and a seccomp profile, and writes no host path but the
//! socket folder and `/proc/sys/net`. The table itself names every
//! capability the code knows, and its sets are the ones the code and the
//! systemd unit use. `tests/privileges.rs` shows by test what each is for.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_json::Value;
use tcpx_rxdm::caps::Cap;
use tcpx_rxdm::config::flags::Flags;
use tcpx_rxdm::inject::command::transform;
use tcpx_rxdm::inject::platform::Platform;
use tcpx_rxdm::inject::{daemon, Mode, Nccl, Options};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// What a mode may add: the capabilities it always needs, and those it
/// needs only with some flag (`only with ...`).
#[derive(Debug, Default)]
struct Allowed {
    required: BTreeSet<String>,
    optional: BTreeSet<String>,
}

/// The table's two columns: per Pod and node-wide.
struct Table {
    per_pod: Allowed,
    node_wide: Allowed,
    named: BTreeSet<String>,
}

/// The rows of the first table under `## Privileges` in SECURITY.md.
fn table() -> Table {
    let doc = read("SECURITY.md");
    let start = doc.find("\n## Privileges\n").expect("SECURITY.md: no `## Privileges` section");
    let section = &doc[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let rows: Vec<Vec<String>> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    assert!(rows.len() >= 4, "SECURITY.md: the Privileges table has too few rows: {rows:?}");
    let mut t = Table { per_pod: Allowed::default(), node_wide: Allowed::default(), named: BTreeSet::new() };
    for row in rows {
        let name = row[0].trim_matches('`');
        let cap = Cap::from_name(name)
            .unwrap_or_else(|| panic!("SECURITY.md: {name} is no capability the code knows"));
        let short = cap.short_name().to_string();
        t.named.insert(short.clone());
        for (cell, allowed) in [(&row[1], &mut t.per_pod), (&row[2], &mut t.node_wide)] {
            match cell.as_str() {
                "yes" => allowed.required.insert(short.clone()),
                "no" => false,
                c if c.starts_with("only ") => allowed.optional.insert(short.clone()),
                c => panic!("SECURITY.md: {name}: {c:?} is none of yes, no, only ..."),
            };
        }
    }
    t
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str()).map(String::from).collect()
}

/// Checks the daemon container `c` of the pod spec `pod` (named `place` in
/// failures) against `allowed`.
fn check_daemon(place: &str, pod: &Value, c: &Value, allowed: &Allowed) {
    let sc = &c["securityContext"];
    assert!(matches!(sc["privileged"], Value::Null | Value::Bool(false)), "{place}: privileged");
    assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false), "{place}: allowPrivilegeEscalation");
    assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"], "{place}: capabilities.drop");
    let add: BTreeSet<String> = strs(&sc["capabilities"]["add"]).into_iter().collect();
    let missing: Vec<_> = allowed.required.difference(&add).collect();
    assert!(missing.is_empty(), "{place}: adds {add:?}, lacks {missing:?} of the table's");
    let extra: Vec<_> =
        add.iter().filter(|a| !allowed.required.contains(*a) && !allowed.optional.contains(*a)).collect();
    assert!(extra.is_empty(), "{place}: adds {extra:?}, which the table does not give its mode");
    assert_eq!(sc["readOnlyRootFilesystem"], Value::Bool(true), "{place}: readOnlyRootFilesystem");
    let seccomp = sc["seccompProfile"]["type"].as_str();
    assert!(matches!(seccomp, Some("RuntimeDefault" | "Localhost")), "{place}: seccompProfile {seccomp:?}");
    // Host paths: written only where it must write (its socket folder and
    // /proc/sys/net), read-only everywhere else.
    let mut argv = vec!["tcpx-rxdm".to_string()];
    argv.extend(strs(&c["command"]).into_iter().skip(1));
    argv.extend(strs(&c["args"]));
    let argv: Vec<String> = argv.into_iter().map(|a| a.replace(['\\', '"'], "")).collect();
    let flags = Flags::parse_args(argv).unwrap_or_else(|e| panic!("{place}: {e}"));
    let volumes = pod["volumes"].as_array().unwrap();
    for m in c["volumeMounts"].as_array().unwrap() {
        let v = volumes.iter().find(|v| v["name"] == m["name"]).unwrap_or_else(|| panic!("{place}: {m}"));
        let Some(host) = v["hostPath"]["path"].as_str() else { continue };
        let at = Path::new(m["mountPath"].as_str().unwrap());
        let writable = m["readOnly"] != Value::Bool(true);
        let may_write = host == "/proc/sys/net" || at == flags.uds_path;
        assert!(!writable || may_write, "{place}: the host's {host} is mounted writable at {}", at.display());
        assert!(host != "/proc/sys" && host != "/proc", "{place}: the host's {host}, not only /proc/sys/net");
    }
}

/// The daemon containers (`tcpx-daemon`) of every pod template in `docs`,
/// each with its pod spec and a name for failures.
fn daemons(file: &str, docs: &[Value]) -> Vec<(String, Value, Value)> {
    fn walk(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) => {
                if m.get("spec").and_then(|s| s.get("containers")).is_some() {
                    out.push((at.clone(), v["spec"].clone()));
                }
                m.iter().for_each(|(k, x)| walk(x, format!("{at}.{k}"), out));
            }
            Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| walk(x, format!("{at}[{i}]"), out)),
            _ => {}
        }
    }
    let mut pods = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        walk(d, format!("{file}#{i}"), &mut pods);
    }
    let mut out = Vec::new();
    for (at, pod) in pods {
        for list in ["containers", "initContainers"] {
            for c in pod[list].as_array().into_iter().flatten().filter(|c| c["name"] == "tcpx-daemon") {
                out.push((format!("{at} {list}[tcpx-daemon]"), pod.clone(), c.clone()));
            }
        }
    }
    out
}

fn is_node_wide(c: &Value) -> bool {
    strs(&c["args"]).iter().any(|a| a == "--node_wide")
}

fn check_file(file: &str, text: &str, t: &Table) -> usize {
    let found = daemons(file, &yaml_docs(text));
    for (place, pod, c) in &found {
        let allowed = if is_node_wide(c) { &t.node_wide } else { &t.per_pod };
        check_daemon(place, pod, c, allowed);
    }
    found.len()
}

#[test]
fn the_table_names_every_capability_and_its_sets_are_the_codes_and_the_units() {
    let t = table();
    let all: BTreeSet<String> = Cap::ALL.iter().map(|c| c.short_name().to_string()).collect();
    assert_eq!(t.named, all, "SECURITY.md's table and tcpx_rxdm::caps name different capabilities");
    // Per Pod: what inject gives a daemon with its default flags.
    let flags = Flags::parse_args(["tcpx-rxdm".to_string()]).unwrap();
    let inject: BTreeSet<String> =
        daemon::capabilities(&flags).iter().map(|c| c.short_name().to_string()).collect();
    assert_eq!(inject, t.per_pod.required, "inject's capabilities for a Pod's daemon");
    // Node-wide: the systemd unit's bounding set.
    let unit = read("deploy/systemd/tcpx-rxdm.service");
    let bounding: BTreeSet<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit's CapabilityBoundingSet=")
        .split_whitespace()
        .map(|c| Cap::from_name(c).unwrap_or_else(|| panic!("{c}")).short_name().to_string())
        .collect();
    assert_eq!(bounding, t.node_wide.required, "the unit's bounding set");
    assert!(t.per_pod.required.is_subset(&t.node_wide.required));
}

#[test]
fn every_shipped_daemon_container_is_unprivileged() {
    let t = table();
    let mut files = Vec::new();
    for dir in ["deploy/kubernetes", "deploy/kubernetes/gpu-operator"] {
        for e in std::fs::read_dir(repo(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                files.push(format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()));
            }
        }
    }
    let (mut pods, mut node) = (0, 0);
    for f in &files {
        let text = read(f);
        pods += check_file(f, &text, &t);
        node += daemons(f, &yaml_docs(&text)).iter().filter(|(_, _, c)| is_node_wide(c)).count();
    }
    assert_eq!((pods, node), (5, 2), "daemon containers (node-wide among them) in {files:?}");
}

#[test]
fn every_daemon_inject_writes_is_unprivileged_in_both_modes_on_both_platforms() {
    let t = table();
    let input = read("tests/inject/builtin.yaml");
    for mode in [Mode::NativeSidecar, Mode::Sidecar] {
        for platform in [Platform::Gke, Platform::GpuOperator(None)] {
            for nccl in [Nccl::Inline, Nccl::File] {
                let o = Options { mode, nccl, platform: platform.clone(), ..Options::default() };
                let (out, _) = transform(&input, &o).unwrap();
                let n = check_file(&format!("inject {mode:?} {platform:?} {nccl:?}"), &out, &t);
                assert!(n >= 5, "{n} daemons");
                // The GPUs through the platform's device mechanism.
                for d in yaml_docs(&out).iter().filter(|d| d["kind"] == "Pod") {
                    let devices = &d["metadata"]["annotations"]["devices.gke.io/container.tcpx-daemon"];
                    assert_eq!(devices.is_string(), platform == Platform::Gke, "{mode:?} {platform:?}");
                    if platform != Platform::Gke {
                        assert_eq!(d["spec"]["runtimeClassName"], "nvidia");
                    }
                }
            }
        }
    }
    // An HTTP port below 1024 adds NET_BIND_SERVICE (and only that).
    let o = Options { daemon_flags: vec!["--metrics_address=0.0.0.0:80".into()], ..Options::default() };
    let out = transform(&input, &o).unwrap().0;
    check_file("inject --metrics_address=0.0.0.0:80", &out, &t);
    assert!(out.contains("- NET_BIND_SERVICE\n"), "{out}");
}

#[test]
fn inject_golden_files_and_the_webhooks_pod_are_unprivileged() {
    let t = table();
    let mut n = 0;
    for e in std::fs::read_dir(repo("tests/inject")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        // Inject's outputs: `<input>.<mode>.yaml`, and the webhook's Pod.
        let output = name.ends_with(".native-sidecar.yaml") || name.ends_with(".sidecar.yaml");
        if output || name == "webhook-pod.yaml" {
            n += check_file(&format!("tests/inject/{name}"), &std::fs::read_to_string(&p).unwrap(), &t);
        }
    }
    assert!(n >= 20, "only {n} daemon containers in the golden files");
}
