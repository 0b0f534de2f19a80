//! The files for NVIDIA GPU Operator clusters: the node-wide DaemonSet's
//! variant in deploy/kubernetes/gpu-operator/ (the same DaemonSet as
//! ../daemonset.yaml but for the operator's differences; built with
//! kustomize where kubectl is at hand) and the dashboard's DCGM panels beside
//! the per-queue receive rate. `.ci/deploy-lint` validates the built variant
//! against the Kubernetes schemas; `.ci/monitoring-check` parses every
//! dashboard query with promtool.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize as _;
use serde_json::{json, Value};
use tcpx_rxdm::config::flags::Flags;

const BASE: &str = "deploy/kubernetes/daemonset.yaml";
const VARIANT_DIR: &str = "deploy/kubernetes/gpu-operator";

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn read_docs(rel: &str) -> Vec<Value> {
    yaml_docs(&std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

fn daemonset(docs: &[Value]) -> Value {
    let ds: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "DaemonSet").collect();
    assert_eq!(ds.len(), 1, "one DaemonSet");
    ds[0].clone()
}

/// Removes the item named `name` (by `key`) from the list at `list`.
fn remove_named(list: &mut Value, key: &str, name: &str) {
    let items = list.as_array_mut().unwrap();
    let before = items.len();
    items.retain(|i| i[key] != name);
    assert_eq!(items.len(), before - 1, "{name} not in the base");
}

/// What every build of the variant must hold, checked field by field.
fn check_operator_daemonset(ds: &Value) {
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"nvidia.com/gpu.present": "true"}));
    assert_eq!(pod["runtimeClassName"], "nvidia");
    let tolerations = pod["tolerations"].as_array().unwrap();
    assert!(
        tolerations.iter().any(|t| t["key"] == "nvidia.com/gpu" && t["effect"] == "NoSchedule"),
        "{tolerations:?}"
    );
    let text = ds.to_string();
    assert!(!text.contains("/home/kubernetes") && !text.contains("cloud.google.com"), "{text}");
    let c = &pod["containers"][0];
    let env: Vec<(&str, &str)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert!(env.contains(&("NVIDIA_VISIBLE_DEVICES", "all")), "{env:?}");
    assert!(env.contains(&("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")), "{env:?}");
    assert!(!env.iter().any(|(n, _)| *n == "LD_LIBRARY_PATH"), "{env:?}");
    // The daemon's command line is one our parser takes, node-wide.
    let mut argv = vec!["tcpx-rxdm".to_string()];
    argv.extend(c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()));
    let flags = Flags::parse_args(argv).unwrap();
    assert!(flags.node_wide && flags.leases);
    // No container port: on the host network it is a host port, which the old
    // Pod of a rollout holds. ../podmonitor.yaml writes the daemon's port into
    // each target's address instead.
    assert!(c["ports"].is_null(), "{c}");
    let port = flags.metrics_address.0.expect("HTTP on").port();
    let pm = read_docs("deploy/kubernetes/podmonitor.yaml").remove(0);
    let relabelings = pm["spec"]["podMetricsEndpoints"][0]["relabelings"].as_array().unwrap();
    let address: Vec<&Value> = relabelings.iter().filter(|r| r["targetLabel"] == "__address__").collect();
    assert!(!address.is_empty());
    for r in address {
        assert!(r["replacement"].as_str().unwrap().ends_with(&format!(":{port}")), "{r}");
    }
}

#[test]
fn the_variant_is_the_node_daemonset_with_the_operators_differences() {
    let base = daemonset(&read_docs(BASE));
    let variant = daemonset(&read_docs(&format!("{VARIANT_DIR}/daemonset.yaml")));
    check_operator_daemonset(&variant);

    // The base, changed as the variant's header says, is the variant: any
    // other difference (a flag, a probe) means one of the two was left behind.
    let mut want = base.clone();
    // GKE's device annotation: the operator's runtime gives the GPUs instead.
    want["spec"]["template"]["metadata"].as_object_mut().unwrap().remove("annotations");
    let pod = &mut want["spec"]["template"]["spec"];
    pod["runtimeClassName"] = json!("nvidia");
    pod["nodeSelector"] = json!({"nvidia.com/gpu.present": "true"});
    remove_named(&mut pod["volumes"], "name", "libraries");
    let c = &mut pod["containers"][0];
    remove_named(&mut c["env"], "name", "LD_LIBRARY_PATH");
    let env = c["env"].as_array_mut().unwrap();
    env.push(json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}));
    env.push(json!({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}));
    remove_named(&mut c["volumeMounts"], "mountPath", "/usr/local/nvidia/lib64");
    assert_eq!(variant, want);

    // Its kustomization renders that file with the image tag of ../.
    let k = read_docs(&format!("{VARIANT_DIR}/kustomization.yaml")).remove(0);
    let top = read_docs("deploy/kubernetes/kustomization.yaml").remove(0);
    assert_eq!(k["resources"], json!(["daemonset.yaml"]));
    assert_eq!(k["images"], top["images"]);
    assert_eq!(k["labels"], top["labels"]);
}

/// kubectl (its built-in kustomize): on the PATH, or where .ci/lib/tools.sh installs it.
fn kubectl() -> Option<PathBuf> {
    let venv = repo("target/ci-venv/bin/kubectl");
    if venv.is_file() {
        return Some(venv);
    }
    let found =
        Command::new("kubectl").args(["version", "--client"]).output().is_ok_and(|o| o.status.success());
    found.then(|| PathBuf::from("kubectl"))
}

#[test]
fn the_variant_builds_with_kustomize() {
    let Some(kubectl) = kubectl() else {
        // Under CI (.ci/run installs kubectl before the tests) nothing passes by skipping.
        let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false" | "no"));
        assert!(!ci, "no kubectl to build {VARIANT_DIR}, and CI is set: .ci/lib/tools.sh installs it");
        eprintln!(
            "SKIPPED: no kubectl here to build {VARIANT_DIR} (.ci/lib/tools.sh installs one: \
             source it and run ci_tools)"
        );
        return;
    };
    let out = Command::new(&kubectl).arg("kustomize").arg(repo(VARIANT_DIR)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs = yaml_docs(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(docs.len(), 1, "{docs:?}");
    let ds = daemonset(&docs);
    check_operator_daemonset(&ds);
    let tag = &read_docs("deploy/kubernetes/kustomization.yaml")[0]["images"][0]["newTag"];
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("tcpx-rxdm:{}", tag.as_str().unwrap())
    );
    assert_eq!(ds["metadata"]["labels"]["app.kubernetes.io/part-of"], "tcpx-rxdm");
    // ../podmonitor.yaml finds its Pods.
    let pm = read_docs("deploy/kubernetes/podmonitor.yaml").remove(0);
    for (k, v) in pm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], v, "the PodMonitor selects {k}={v}");
    }
}

#[test]
fn the_documented_library_search_order_is_the_codes() {
    let text = std::fs::read_to_string(repo("deploy/README.md")).unwrap();
    let section = text.split("### Where the daemon finds the driver\n").nth(1).expect("the section");
    let section = section.split("\n#").next().unwrap();
    // The numbered list: the loader first, then one folder per item.
    let items: Vec<&str> = section.lines().filter(|l| l.starts_with(|c: char| c.is_ascii_digit())).collect();
    assert!(items[0].contains("dynamic loader"), "{items:?}");
    let folders: Vec<String> =
        items[1..].iter().map(|l| l.split('`').nth(1).expect("a folder in backticks").to_string()).collect();
    let code: Vec<String> =
        tcpx_rxdm::gpu::driver_lib::search_dirs().iter().map(|d| d.display().to_string()).collect();
    // The docs name the x86_64 folder (and say so for Arm).
    let code: Vec<String> = code.iter().map(|d| d.replace("aarch64-linux-gnu", "x86_64-linux-gnu")).collect();
    assert_eq!(folders, code);
}

/// Every `expr` of a panel.
fn exprs(panel: &Value) -> Vec<String> {
    panel["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect()
}

fn panel_with<'a>(panels: &'a [Value], metric: &str) -> &'a Value {
    let found: Vec<&Value> = panels.iter().filter(|p| exprs(p).iter().any(|e| e.contains(metric))).collect();
    assert_eq!(found.len(), 1, "panels querying {metric}");
    found[0]
}

#[test]
fn the_dashboard_shows_dcgm_beside_the_queue_receive_rate() {
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("deploy/monitoring/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    let panels = dash["panels"].as_array().unwrap();
    let queues = panel_with(panels, "tcpx_rxdm_queue_rx_bytes_total");
    let pcie = panel_with(panels, "DCGM_FI_PROF_PCIE_RX_BYTES");
    let util = panel_with(panels, "DCGM_FI_DEV_GPU_UTIL{");
    // Per GPU: the series keep the GPU (and its node).
    for p in [pcie, util] {
        for e in exprs(p) {
            assert!(e.contains("by (Hostname, gpu)") && e.contains("$gpu_node"), "{e}");
        }
    }
    assert_eq!(pcie["fieldConfig"]["defaults"]["unit"], "Bps");
    assert_eq!(util["fieldConfig"]["defaults"]["unit"], "percent");
    // Side by side: the same row, the PCIe panel right after the queue panel.
    let (q, g) = (&queues["gridPos"], &pcie["gridPos"]);
    assert_eq!((&q["y"], &q["h"]), (&g["y"], &g["h"]));
    assert_eq!(g["x"].as_u64().unwrap(), q["x"].as_u64().unwrap() + q["w"].as_u64().unwrap());

    // The variable the DCGM panels filter on exists and lists DCGM's nodes.
    let vars = dash["templating"]["list"].as_array().unwrap();
    let node = vars.iter().find(|v| v["name"] == "gpu_node").expect("a gpu_node variable");
    assert!(node["definition"].as_str().unwrap().contains("DCGM_FI_DEV_GPU_UTIL"));
    // No two panels share an id or overlap on the grid.
    let mut ids: Vec<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let cells: Vec<(u64, u64, u64, u64)> = panels
        .iter()
        .map(|p| {
            let g = &p["gridPos"];
            let n = |k: &str| g[k].as_u64().unwrap();
            (n("x"), n("y"), n("w"), n("h"))
        })
        .collect();
    for (i, a) in cells.iter().enumerate() {
        assert!(a.0 + a.2 <= 24, "panel {} is wider than the grid", panels[i]["title"]);
        for (j, b) in cells.iter().enumerate().skip(i + 1) {
            let apart = a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0 || a.1 + a.3 <= b.1 || b.1 + b.3 <= a.1;
            assert!(apart, "panels {} and {} overlap", panels[i]["title"], panels[j]["title"]);
        }
    }
}
