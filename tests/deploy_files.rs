//! The deployment files in deploy/ and the Dockerfile, read as their tools
//! read them: every daemon command line they hold must be accepted by our
//! flag parser, and the pieces around it (mounts, probes, job end, socket
//! folder, NCCL environment) must agree with those flags.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
use tcpx_rxdm::config::flags::{Flags, SetupParam};
use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::host::tuning::TuningParams;

const OUR_BIN: &str = "/usr/local/bin/tcpx-rxdm";
const REFERENCE_BIN: &str = "/tcpgpudmarxd/build/app/tcpgpudmarxd";
const TUNE: SetupParam = SetupParam::Tune(TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 0 });

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every document of a YAML file.
fn yaml_docs(rel: &str) -> Vec<Value> {
    let text = read(rel);
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn doc_of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

fn pod_spec(doc: &Value) -> &Value {
    match doc["kind"].as_str() {
        Some("Pod") => &doc["spec"],
        _ => &doc["spec"]["template"]["spec"],
    }
}

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().expect("string item").to_string()).collect())
        .unwrap_or_default()
}

/// The daemon container and whether it is an init container.
fn daemon_container(pod: &Value) -> (&Value, bool) {
    for (list, init) in [("containers", false), ("initContainers", true)] {
        if let Some(c) = pod[list].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == "tcpx-daemon")) {
            return (c, init);
        }
    }
    panic!("no tcpx-daemon container");
}

fn workload_containers(pod: &Value) -> Vec<&Value> {
    pod["containers"].as_array().unwrap().iter().filter(|c| c["name"] != "tcpx-daemon").collect()
}

/// The daemon's argv as the container runtime builds it: `command` replaces the
/// image's ENTRYPOINT, `args` its CMD.
fn container_argv(c: &Value) -> Vec<String> {
    let mut argv = str_list(&c["command"]);
    if argv.is_empty() {
        argv.push(OUR_BIN.to_string());
    }
    argv.extend(str_list(&c["args"]));
    argv
}

fn parse(argv: &[String], what: &str) -> Flags {
    assert!(argv[0] == OUR_BIN || argv[0] == REFERENCE_BIN, "{what}: runs {}", argv[0]);
    Flags::parse_args(argv.iter().cloned()).unwrap_or_else(|e| panic!("{what}: {argv:?} rejected: {e}"))
}

fn env_map(c: &Value) -> BTreeMap<String, String> {
    c["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// mountPath -> volume name.
fn mounts(c: &Value) -> BTreeMap<String, String> {
    c["volumeMounts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    (m["mountPath"].as_str().unwrap().to_string(), m["name"].as_str().unwrap().to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn volume<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("volume {name}"))
}

fn metrics_port(f: &Flags) -> u16 {
    f.metrics_address.0.expect("HTTP endpoints on").port()
}

const DAEMON_MANIFESTS: [&str; 4] = [
    "deploy/kubernetes/tcpx-daemon-sidecar.yaml",
    "deploy/kubernetes/native-sidecar-job.yaml",
    "deploy/kubernetes/daemonset.yaml",
    "deploy/kubernetes/nccl-allgather.yaml",
];

/// Checks shared by every manifest that runs the daemon; returns its flags.
fn check_daemon_pod(rel: &str, pod: &Value) -> Flags {
    let (c, _) = daemon_container(pod);
    let flags = parse(&container_argv(c), rel);
    assert_eq!(flags.setup_param, TUNE, "{rel}");

    // Host mounts where the daemon looks for them, and the driver libraries.
    let m = mounts(c);
    // /sys is only read; of /proc/sys only net is written (host tuning).
    for (path, host, read_only) in
        [("/hostsysfs", "/sys", true), ("/hostprocsysfs/net", "/proc/sys/net", false)]
    {
        let vol = volume(pod, m.get(path).unwrap_or_else(|| panic!("{rel}: {path} not mounted")));
        assert_eq!(vol["hostPath"]["path"], host, "{rel}: {path}");
        let mount = c["volumeMounts"].as_array().unwrap().iter().find(|v| v["mountPath"] == path).unwrap();
        assert_eq!(mount["readOnly"].as_bool().unwrap_or(false), read_only, "{rel}: {path}");
    }
    assert!(m.contains_key("/usr/local/nvidia/lib64"), "{rel}: driver libraries not mounted");
    assert!(env_map(c)["LD_LIBRARY_PATH"].split(':').any(|p| p == "/usr/local/nvidia/lib64"), "{rel}");

    // The socket folder is a mount, and each workload sees the same volume at the
    // same path, with the NCCL plugin pointed at it.
    let uds = flags.uds_path.to_str().unwrap();
    let sock_vol = m.get(uds).unwrap_or_else(|| panic!("{rel}: {uds} is not a mount"));
    for w in workload_containers(pod) {
        assert_eq!(mounts(w).get(uds), Some(sock_vol), "{rel}: {} does not mount {uds}", w["name"]);
        if let Some(prefix) = env_map(w).get("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX") {
            assert_eq!(prefix, uds, "{rel}");
        }
    }

    // Probes go to the HTTP port the flags open.
    let port = metrics_port(&flags);
    let mut probes = 0;
    for p in ["startupProbe", "readinessProbe", "livenessProbe"] {
        if c[p].is_object() {
            probes += 1;
            if let Some(cmd) = c[p]["exec"]["command"].as_array() {
                // Readiness asked in the Pod: its own daemon serves the folder.
                let words: Vec<&str> = cmd.iter().filter_map(|w| w.as_str()).collect();
                assert_eq!(words[1..3], ["status", "mine"], "{rel} {p}");
                assert_eq!(p, "readinessProbe", "{rel}");
                let uds = format!("--uds_path={}", flags.uds_path.display());
                assert!(words.contains(&uds.as_str()), "{rel} {p}: {words:?}");
                continue;
            }
            assert_eq!(c[p]["httpGet"]["port"], port, "{rel} {p}");
            let path = c[p]["httpGet"]["path"].as_str().unwrap();
            assert!(["/readyz", "/healthz"].contains(&path), "{rel} {p}: {path}");
        }
    }
    assert!(probes > 0, "{rel}: no probe");
    flags
}

#[test]
fn every_kubernetes_daemon_command_line_is_accepted() {
    for rel in DAEMON_MANIFESTS {
        let docs = yaml_docs(rel);
        let workloads: Vec<&Value> = docs
            .iter()
            .filter(|d| ["Job", "DaemonSet", "Pod"].contains(&d["kind"].as_str().unwrap()))
            .collect();
        assert_eq!(workloads.len(), 1, "{rel}");
        let flags = check_daemon_pod(rel, pod_spec(workloads[0]));
        assert_eq!(flags.uds_path, Path::new("/run/tcpx"), "{rel}");
        // The DaemonSet declares no port (`no_daemonset_that_surges_asks_for_a_host_port`
        // says why). A Job keeps the daemon's: on the host network it keeps a
        // second Pod whose daemon needs the same port off the node, and a Job
        // has no surge Pod for it to block.
        let ports = &daemon_container(pod_spec(workloads[0])).0["ports"];
        if workloads[0]["kind"] == "DaemonSet" {
            assert!(ports.is_null(), "{rel}: the DaemonSet declares ports {ports}");
        } else {
            assert_eq!(ports[0]["containerPort"], metrics_port(&flags), "{rel}");
        }
    }
}

#[test]
fn classic_sidecar_is_a_drop_in_and_ends_the_job() {
    let rel = "deploy/kubernetes/tcpx-daemon-sidecar.yaml";
    let docs = yaml_docs(rel);
    let job = doc_of_kind(&docs, "Job");
    let pod = pod_spec(job);
    let (c, init) = daemon_container(pod);
    assert!(!init);
    // The reference's command line, word for word, is the start of ours.
    let argv = container_argv(c);
    assert_eq!(argv[0], REFERENCE_BIN);
    assert_eq!(argv[argv.len() - str_list(&c["args"]).len() - 1], r#"\"--verbose 128 2 0 \""#);
    assert_eq!(volume(pod, "tcpx-socket")["hostPath"]["path"], "/run/tcpx");
    assert_eq!(volume(pod, "tcpx-libraries")["hostPath"]["path"], "/home/kubernetes/bin/nvidia/lib64");

    let flags = parse(&argv, rel);
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["shareProcessNamespace"], true);
    // Job end: the workload touches the shutdown file; clients leaving is the fallback.
    let shutdown = flags.shutdown_file().expect("--shutdown_file on");
    assert!(flags.shutdown_when_all_clients_exited);
    let workload = workload_containers(pod)[0];
    let script = str_list(&workload["command"]).join(" ");
    assert!(script.contains(&format!("touch {}", shutdown.display())), "{script}");
    // Readiness from the health file the daemon writes, on a volume both see.
    let health = &env_map(c)["HEALTH_CHECK_LOG_FILE"];
    assert!(script.contains(health.as_str()), "{script}");
    // It greps for "...complete", which the reference's ready line and ours share.
    assert!(script.contains(READY_LINE.trim_end_matches("d.")), "{script}");
    let health_dir = Path::new(health).parent().unwrap().to_str().unwrap();
    assert_eq!(mounts(workload).get(health_dir), mounts(c).get(health_dir));
}

#[test]
fn native_sidecars_gate_the_workload_on_readyz() {
    for rel in ["deploy/kubernetes/native-sidecar-job.yaml", "deploy/kubernetes/nccl-allgather.yaml"] {
        let docs = yaml_docs(rel);
        let pod = pod_spec(doc_of_kind(&docs, "Job"));
        let (c, init) = daemon_container(pod);
        assert!(init, "{rel}: not an init container");
        assert_eq!(c["restartPolicy"], "Always", "{rel}");
        let flags = parse(&container_argv(c), rel);
        assert_eq!(c["startupProbe"]["httpGet"]["path"], "/readyz", "{rel}");
        assert_eq!(c["startupProbe"]["httpGet"]["port"], metrics_port(&flags), "{rel}");
        // The kubelet stops the daemon; a client leaving must not (it would be restarted).
        assert!(!flags.monitor_shutdown, "{rel}");
        assert_eq!(pod["shareProcessNamespace"], true, "{rel}");
        assert_eq!(pod["restartPolicy"], "Never", "{rel}");
    }
}

#[test]
fn daemonset_keeps_leases_on_and_podmonitor_finds_it() {
    let docs = yaml_docs("deploy/kubernetes/daemonset.yaml");
    let ds = doc_of_kind(&docs, "DaemonSet");
    let pod = pod_spec(ds);
    let (c, _) = daemon_container(pod);
    let flags = parse(&container_argv(c), "daemonset");
    assert!(flags.leases && !flags.monitor_shutdown);
    // Node-wide: no workload Pod can end it through the shared folder or a signal.
    assert!(flags.node_wide && flags.shutdown_file().is_none());
    // Late NICs are waited for within the startup probe's allowance.
    let probe = &c["startupProbe"];
    let allowance = probe["periodSeconds"].as_u64().unwrap() * probe["failureThreshold"].as_u64().unwrap();
    assert!(!flags.wait_for_nics.is_zero() && flags.wait_for_nics.as_secs() + 20 <= allowance);
    // Leases across Pods on kernels before 6.5 need the host's pid namespace.
    assert_eq!(pod["hostPID"], true);
    // Rolling updates are takeovers: the new Pod starts beside the old one and
    // takes over; the old one waits for its SIGTERM rather than exit and be
    // restarted (and take the node back).
    use tcpx_rxdm::config::flags::{AfterHandover, Takeover};
    assert_eq!(flags.takeover, Takeover::Auto);
    assert_eq!(flags.after_handover, AfterHandover::Wait);
    let rolling = &ds["spec"]["updateStrategy"];
    assert_eq!(rolling["type"], "RollingUpdate");
    assert_eq!(rolling["rollingUpdate"]["maxSurge"], 1);
    assert_eq!(rolling["rollingUpdate"]["maxUnavailable"], 0);
    // The probes share the node's port with the old daemon: the new Pod must
    // stay ready for longer than a takeover may take before the old one goes.
    let min_ready = ds["spec"]["minReadySeconds"].as_u64().expect("minReadySeconds");
    assert!(min_ready >= 2 * flags.takeover_timeout.as_secs(), "minReadySeconds {min_ready}");
    for r in ["cpu", "memory"] {
        assert!(c["resources"]["requests"][r].is_string(), "no {r} request");
    }
    assert!(c["resources"]["limits"]["memory"].is_string());

    let pm = doc_of_kind(&yaml_docs("deploy/kubernetes/podmonitor.yaml"), "PodMonitor").clone();
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let selector = pm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(&labels[k], v, "PodMonitor selects {k}={v}, the DaemonSet's Pods do not carry it");
    }
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    check_podmonitor_endpoint(&endpoints[0], metrics_port(&flags));
}

/// The PodMonitor's endpoint scrapes `port` on the Pod's IP. The DaemonSet
/// declares no port for it to name, so its relabelings write the address:
/// Prometheus gives a Pod without ports one target with the Pod's IP and no
/// port.
fn check_podmonitor_endpoint(endpoint: &Value, port: u16) {
    assert_eq!(endpoint["path"], "/metrics");
    // A port by name or number would match no target of a Pod without ports.
    for by in ["port", "targetPort", "portNumber"] {
        assert!(endpoint[by].is_null(), "the endpoint selects a declared port by {by}: {endpoint}");
    }
    let relabelings = endpoint["relabelings"].as_array().expect("relabelings");
    let address: Vec<&Value> = relabelings.iter().filter(|r| r["targetLabel"] == "__address__").collect();
    // One for an IPv4 address, one that puts an IPv6 address in brackets.
    assert_eq!(address.len(), 2, "{endpoint}");
    let written = |ip: &str| {
        // Prometheus anchors the regex: the one rule whose regex takes the
        // address writes it (the two are told apart by a colon).
        let mut out = ip.to_string();
        for r in &address {
            assert_eq!(r["sourceLabels"], serde_json::json!(["__meta_kubernetes_pod_ip"]), "{r}");
            assert!(r["action"].is_null() || r["action"] == "replace", "{r}");
            let takes = match r["regex"].as_str() {
                Some("([^:]+)") => !ip.contains(':'),
                Some("(.+:.+)") => ip.contains(':'),
                other => panic!("a regex this test does not know: {other:?}"),
            };
            if takes {
                out = r["replacement"].as_str().unwrap().replace("${1}", ip);
            }
        }
        out
    };
    assert_eq!(written("10.0.0.7"), format!("10.0.0.7:{port}"));
    assert_eq!(written("fd00::7"), format!("[fd00::7]:{port}"));
    // The old and the new Pod of a rollout reach the node's one daemon at
    // the same address: without the Pod's own labels their targets are one.
    let drops = relabelings.iter().find(|r| r["action"] == "labeldrop").expect("a labeldrop");
    assert_eq!(drops["regex"], "pod|container");
}

/// Why the rolling update of `ds` (a DaemonSet) could never start, if it
/// could not: its Pods are on the host network, a rollout starts the new Pod
/// beside the old one (`maxSurge` other than 0), and a container asks for a
/// host port (on the host network every `containerPort` is one). The
/// scheduler places no Pod where another holds its host port, so the new Pod
/// stays Pending on every node. `.ci/lib/surge-ports.py` is the same check
/// for `.ci/deploy-lint` (the kustomize build, inject's output).
fn surge_blocked_by_host_ports(ds: &Value) -> Option<String> {
    let pod = pod_spec(ds);
    if pod["hostNetwork"] != true {
        return None;
    }
    let strategy = &ds["spec"]["updateStrategy"];
    if strategy["type"].as_str().unwrap_or("RollingUpdate") != "RollingUpdate" {
        return None;
    }
    // Absent, 0 and "0%" are no surge (the default is 0).
    let surge = &strategy["rollingUpdate"]["maxSurge"];
    let zero = surge.is_null()
        || surge.as_u64() == Some(0)
        || surge.as_str().is_some_and(|s| s.trim_end_matches('%').parse::<u64>() == Ok(0));
    if zero {
        return None;
    }
    let ports: Vec<String> = ["containers", "initContainers"]
        .iter()
        .flat_map(|list| pod[*list].as_array().into_iter().flatten())
        .flat_map(|c| {
            c["ports"].as_array().into_iter().flatten().filter_map(move |p| {
                let port = p.get("hostPort").or_else(|| p.get("containerPort"))?;
                Some(format!("{} port {port}", c["name"].as_str().unwrap_or("?")))
            })
        })
        .collect();
    (!ports.is_empty()).then(|| {
        format!(
            "DaemonSet {}: hostNetwork with maxSurge {surge}, and {} (a host port on the host network): \
             the surge Pod can never be placed beside the old one; declare no port",
            ds["metadata"]["name"],
            ports.join(", ")
        )
    })
}

/// Every YAML file under `dir`, in subfolders too.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(path);
        }
    }
}

/// The DaemonSets among `docs` (a `List`'s items too).
fn daemonsets(docs: Vec<Value>) -> Vec<Value> {
    docs.into_iter()
        .flat_map(|d| match d["kind"].as_str() {
            Some("List") => d["items"].as_array().cloned().unwrap_or_default(),
            _ => vec![d],
        })
        .filter(|d| d["kind"] == "DaemonSet")
        .collect()
}

#[test]
fn no_daemonset_that_surges_asks_for_a_host_port() {
    let mut files = Vec::new();
    yaml_files(&repo("deploy"), &mut files);
    let mut checked = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(repo("")).unwrap().display().to_string();
        for ds in daemonsets(yaml_docs(&rel)) {
            assert_eq!(surge_blocked_by_host_ports(&ds), None, "{rel}");
            checked.push(rel.clone());
        }
    }
    // Both node-wide DaemonSets were read, and they do surge.
    for rel in ["deploy/kubernetes/daemonset.yaml", "deploy/kubernetes/gpu-operator/daemonset.yaml"] {
        assert!(checked.iter().any(|c| c == rel), "{rel} not checked: {checked:?}");
        let ds = doc_of_kind(&yaml_docs(rel), "DaemonSet").clone();
        assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 1, "{rel}");
    }
    // kustomize's build of the GPU Operator variant, where kubectl is at hand
    // (.ci/lib/tools.sh installs it; .ci/run does before the tests, and
    // under CI nothing passes by skipping).
    let kubectl = repo("target/ci-venv/bin/kubectl");
    let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false" | "no"));
    assert!(kubectl.is_file() || !ci, "no {} and CI is set: .ci/lib/tools.sh installs it", kubectl.display());
    if kubectl.is_file() {
        let out =
            Command::new(&kubectl).arg("kustomize").arg(repo("deploy/kubernetes/gpu-operator")).output();
        let out = out.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let docs: Vec<Value> = serde_norway::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect();
        let built = daemonsets(docs);
        assert_eq!(built.len(), 1);
        assert_eq!(surge_blocked_by_host_ports(&built[0]), None, "kustomize build");
    }
}

#[test]
fn the_surge_check_refuses_a_host_port_that_blocks_the_rollout() {
    let ds = |surge: &str, host_network: bool, strategy: &str, ports: &str| -> Value {
        let text = format!(
            "kind: DaemonSet\nmetadata: {{name: d}}\nspec:\n  updateStrategy:\n    type: {strategy}\n    \
             rollingUpdate: {{maxSurge: {surge}, maxUnavailable: 0}}\n  template:\n    spec:\n      \
             hostNetwork: {host_network}\n      containers:\n        - name: c\n          ports: {ports}\n"
        );
        serde_norway::from_str(&text).unwrap()
    };
    let container_port = "[{name: metrics, containerPort: 9467}]";
    for (surge, ports) in [("1", container_port), ("25%", container_port), ("1", "[{hostPort: 80}]")] {
        let why = surge_blocked_by_host_ports(&ds(surge, true, "RollingUpdate", ports));
        let why = why.unwrap_or_else(|| panic!("maxSurge {surge} with {ports} passed"));
        assert!(why.contains("DaemonSet \"d\"") && why.contains("c port"), "{why}");
    }
    // An init container's port counts as well.
    let mut init = ds("1", true, "RollingUpdate", "[]");
    init["spec"]["template"]["spec"]["initContainers"] =
        serde_json::json!([{"name": "sidecar", "ports": [{"containerPort": 9467}]}]);
    assert!(surge_blocked_by_host_ports(&init).unwrap().contains("sidecar port 9467"));
    // No surge, no host network, no rolling update, or no port: nothing blocks.
    for fine in [
        ds("0", true, "RollingUpdate", container_port),
        ds("\"0%\"", true, "RollingUpdate", container_port),
        ds("1", false, "RollingUpdate", container_port),
        ds("1", true, "OnDelete", container_port),
        ds("1", true, "RollingUpdate", "[]"),
    ] {
        assert_eq!(surge_blocked_by_host_ports(&fine), None, "{fine}");
    }
    // The shipped DaemonSet with its old port back is refused.
    let mut old = doc_of_kind(&yaml_docs("deploy/kubernetes/daemonset.yaml"), "DaemonSet").clone();
    old["spec"]["template"]["spec"]["containers"][0]["ports"] =
        serde_json::json!([{"name": "metrics", "containerPort": 9467}]);
    assert!(surge_blocked_by_host_ports(&old).is_some());
}

#[test]
fn nccl_job_runs_two_ranks_with_the_tcpx_environment() {
    let docs = yaml_docs("deploy/kubernetes/nccl-allgather.yaml");
    let job = doc_of_kind(&docs, "Job");
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    assert_eq!(job["spec"]["completions"], 2);
    assert_eq!(job["spec"]["parallelism"], 2);
    let pod = pod_spec(job);
    let svc = doc_of_kind(&docs, "Service");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(pod["subdomain"], svc["metadata"]["name"]);
    let cm = doc_of_kind(&docs, "ConfigMap");
    assert!(cm["data"]["allgather.py"].as_str().unwrap().contains("all_gather_into_tensor"));

    let nccl = workload_containers(pod)[0];
    let argv = str_list(&nccl["command"]);
    let script = argv.last().unwrap();
    let host0 = format!(
        "--master_addr={}-0.{}",
        job["metadata"]["name"].as_str().unwrap(),
        svc["metadata"]["name"].as_str().unwrap()
    );
    assert!(script.contains(&host0), "{script}");
    assert!(script.contains("--node_rank=${JOB_COMPLETION_INDEX}"), "{script}");
    // The NCCL settings come from the file the daemon writes in its socket folder,
    // sourced before torchrun; none is written here by hand to contradict it.
    let (daemon, _) = daemon_container(pod);
    let uds = parse(&container_argv(daemon), "nccl-allgather").uds_path;
    assert!(script.starts_with(&format!(". {}/nccl.env && exec torchrun ", uds.display())), "{script}");
    let env = env_map(nccl);
    assert_eq!(env.get("LD_LIBRARY_PATH").map(String::as_str), Some("/usr/local/nvidia/lib64"));
    let by_hand: Vec<&String> =
        env.keys().filter(|k| k.starts_with("NCCL_") && !k.starts_with("NCCL_DEBUG")).collect();
    assert!(by_hand.is_empty(), "set by hand: {by_hand:?}");
    assert_eq!(nccl["resources"]["limits"]["nvidia.com/gpu"], 8);
}

#[test]
fn kustomization_lists_every_manifest() {
    let k = yaml_docs("deploy/kubernetes/kustomization.yaml").remove(0);
    let listed: BTreeSet<String> = str_list(&k["resources"]).into_iter().collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(repo("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk);
    // The image every manifest uses is the one the kustomization retags.
    let image = k["images"][0]["name"].as_str().unwrap();
    for rel in DAEMON_MANIFESTS {
        let docs = yaml_docs(rel);
        let w = docs.iter().find(|d| d["spec"]["template"].is_object()).unwrap();
        let (c, _) = daemon_container(pod_spec(w));
        assert_eq!(c["image"].as_str().unwrap().split(':').next(), Some(image), "{rel}");
    }
}

/// `[Section]` -> key -> values (a key may repeat).
fn unit_file(rel: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section = String::new();
    for line in read(rel).lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("{rel}: {line}"));
        out.entry(section.clone()).or_default().entry(k.to_string()).or_default().push(v.to_string());
    }
    out
}

#[test]
fn systemd_unit_command_line_and_socket_folder_agree() {
    let unit = unit_file("deploy/systemd/tcpx-rxdm.service");
    let svc = &unit["Service"];
    let one = |k: &str| svc.get(k).and_then(|v| v.last()).unwrap_or_else(|| panic!("no {k}=")).as_str();
    assert_eq!(one("Type"), "notify");
    // `$VAR` words expand to nothing unless set in /etc/default/tcpx-rxdm.
    let argv: Vec<String> =
        one("ExecStart").split_whitespace().filter(|w| !w.starts_with('$')).map(String::from).collect();
    let flags = parse(&argv, "ExecStart");
    // Node-wide: no client can end it.
    assert!(flags.node_wide);
    assert!(!flags.monitor_shutdown);
    assert_eq!(flags.shutdown_file(), None);
    assert!(!flags.shutdown_when_all_clients_exited);
    assert_eq!(flags.uds_path, Path::new("/run").join(one("RuntimeDirectory")));
    // The group that owns the runtime folder also owns the sockets, and may enter
    // the folder, but not write it (no replacing the daemon's sockets).
    assert_eq!(flags.socket_group.as_deref(), Some(one("Group")));
    let dir_mode = u32::from_str_radix(one("RuntimeDirectoryMode"), 8).unwrap();
    assert_eq!(dir_mode & 0o070, 0o050, "group cannot enter the socket folder, or may write it");
    assert_eq!(dir_mode & 0o007, 0, "socket folder open to everyone");
    // The extra arguments come last, so that they override the unit's flags.
    assert_eq!(one("ExecStart").split_whitespace().last(), Some("$TCPX_RXDM_ARGS"));
    let extra: Vec<String> = argv.iter().cloned().chain(["--gpu_nic_preset=sim".to_string()]).collect();
    assert_eq!(parse(&extra, "ExecStart + TCPX_RXDM_ARGS").gpu_nic_preset, "sim");
    // Late NICs are waited for, within the start timeout.
    let secs = |k: &str| one(k).trim_end_matches('s').parse::<u64>().unwrap_or_else(|_| panic!("{k}="));
    assert!(!flags.wait_for_nics.is_zero());
    assert!(flags.wait_for_nics.as_secs() + 30 <= secs("TimeoutStartSec"), "no time left to prime NICs");
    // The restart loop is bounded: StartLimitBurst starts always fit in the interval,
    // even when each start runs until TimeoutStartSec.
    let unit_sec = &unit["Unit"];
    let unit_one = |k: &str| unit_sec[k].last().unwrap().parse::<u64>().unwrap();
    let (interval, burst) = (unit_one("StartLimitIntervalSec"), unit_one("StartLimitBurst"));
    assert!(burst >= 2);
    assert!(
        (burst - 1) * (secs("RestartSec") + secs("TimeoutStartSec")) < interval,
        "the start limit never trips"
    );
    // Documentation= names files the install steps install.
    let install = read("deploy/README.md");
    for doc in unit_sec["Documentation"].iter().flat_map(|v| v.split_whitespace()) {
        let path = doc.strip_prefix("file:").unwrap_or_else(|| panic!("{doc}: not a file: URL"));
        assert!(
            install.lines().any(|l| l.starts_with("install ") && l.split_whitespace().any(|w| w == path)),
            "{path} is not installed by deploy/README.md's steps"
        );
    }
    assert_eq!(flags.socket_mode & 0o060, 0o060);
    // Hardening leaves what the daemon needs.
    assert!(one("CapabilityBoundingSet").split_whitespace().any(|c| c == "CAP_NET_ADMIN"));
    assert_ne!(svc.get("ProtectKernelTunables").and_then(|v| v.last()).map(String::as_str), Some("yes"));
    assert_ne!(svc.get("PrivateDevices").and_then(|v| v.last()).map(String::as_str), Some("yes"));
    let env = svc["Environment"].join(" ");
    assert!(env.contains("LD_LIBRARY_PATH=/usr/local/nvidia/lib64"), "{env}");
    // `systemctl reload` is an upgrade by takeover: `upgrade` on the daemon's
    // folder, done well within the reload's time limit (TimeoutStartSec).
    assert_eq!(one("ExecReload"), format!("{OUR_BIN} upgrade --uds_path=/run/tcpx"));
    let reload = one("ExecReload").split_whitespace().skip(1).map(String::from).collect::<Vec<_>>();
    let upgrade = match tcpx_rxdm::cli::parse(std::iter::once("tcpx-rxdm".to_string()).chain(reload)) {
        Ok(tcpx_rxdm::cli::Invocation::Upgrade(o)) => o,
        other => panic!("ExecReload is not an upgrade: {other:?}"),
    };
    assert_eq!(upgrade.uds_path, flags.uds_path);
    assert!(upgrade.timeout.as_secs() + 30 <= secs("TimeoutStartSec"), "the reload times out first");
    // The old daemon names its successor itself; stop waits for whichever is main.
    assert_eq!(one("NotifyAccess"), "main");
    assert!(one("ExecStop").contains("kill -TERM \"$$MAINPID\""), "{}", one("ExecStop"));
    // The group exists once sysusers.d ran.
    let sysusers = read("deploy/systemd/tcpx-rxdm.sysusers");
    assert!(sysusers.lines().any(|l| l.split_whitespace().take(2).eq(["g", one("Group")])), "{sysusers}");
}

/// No settings file: the defaults in common.sh.
const NO_CONF: (&str, &str) = ("TCPX_SLURM_CONF", "/nonexistent/slurm.conf");
fn slurm_prolog_argv(env: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = Command::new(repo("deploy/slurm/prolog.sh"));
    cmd.env_clear().env("PATH", std::env::var("PATH").unwrap()).env("TCPX_PRINT_ARGS", "1").envs([NO_CONF]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect()
}

#[test]
fn slurm_prolog_command_line_is_accepted() {
    let argv = slurm_prolog_argv(&[("SLURM_JOB_ID", "4242"), ("SLURM_JOB_GID", "1000")]);
    let flags = parse(&argv, "prolog.sh");
    assert_eq!(flags.uds_path, Path::new("/run/tcpx-4242"));
    assert!(!flags.monitor_shutdown, "a job's second step would find no daemon");
    assert_eq!(flags.socket_group.as_deref(), Some("1000"));
    assert_eq!(flags.metrics_address.0, None, "HTTP off by default: jobs never compete for a port");

    // Overrides, as the live test uses them.
    let argv = slurm_prolog_argv(&[
        ("SLURM_JOB_ID", "7"),
        ("TCPX_RXDM_BIN", OUR_BIN),
        ("TCPX_UDS_PATH", "/tmp/x/tcpx-7"),
        ("TCPX_HTTP", ""),
        ("TCPX_PRESET", "sim"),
        ("TCPX_EXTRA_ARGS", "--log_format=json --max_connections=64"),
    ]);
    let flags = parse(&argv, "prolog.sh with overrides");
    assert_eq!(flags.uds_path, Path::new("/tmp/x/tcpx-7"));
    assert_eq!(flags.metrics_address.0, None);
    assert_eq!(flags.gpu_nic_preset, "sim");
    assert_eq!(flags.max_connections, 64);
    assert_eq!(flags.socket_group, None);

    // The task prolog points NCCL at the same folder.
    let task_prolog = repo("deploy/slurm/task-prolog.sh");
    let out = Command::new(task_prolog).env("SLURM_JOB_ID", "4242").envs([NO_CONF]).output().unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "export NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=/run/tcpx-4242\n"
    );

    // No job id: a clear error, not a daemon on /run/tcpx-.
    let out = Command::new(repo("deploy/slurm/prolog.sh")).env_remove("SLURM_JOB_ID").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SLURM_JOB_ID"));
}

#[test]
fn scripts_wait_for_the_daemons_ready_line() {
    // Shell scripts cannot import the constant: their copies must match it.
    assert!(read("tests/gpu/check.sh").contains(&format!("grep -q '{READY_LINE}'")));
    let common = read("deploy/slurm/common.sh");
    assert!(common.contains(&format!("TCPX_READY_LINE=\"{READY_LINE}\"")), "{common}");
    assert!(read("deploy/slurm/prolog.sh").contains("\"$TCPX_READY_LINE\""));
}

#[test]
fn dockerfile_entrypoint_and_cmd_are_accepted() {
    let text = read("Dockerfile");
    let json_after = |key: &str| -> Vec<String> {
        let line = text.lines().rev().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key}"));
        serde_json::from_str(line[key.len()..].trim())
            .unwrap_or_else(|e| panic!("{key} is not exec form: {e}"))
    };
    let mut argv = json_after("ENTRYPOINT");
    assert_eq!(argv, [OUR_BIN]);
    argv.extend(json_after("CMD"));
    parse(&argv, "Dockerfile");

    // The runtime stage: no shell step, the library path, both binary paths.
    let runtime = text.rsplit("\nFROM ").next().unwrap();
    assert!(!runtime.lines().any(|l| l.starts_with("RUN ")), "the runtime stage must not need a shell");
    assert!(runtime.contains("ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64"));
    assert!(text.contains(&format!("ln -s {OUR_BIN} /out{REFERENCE_BIN}")));
    assert!(text.contains(&format!("/out{OUR_BIN}")));
    assert!(text.contains("cargo build --release --locked"));
    assert!(runtime.contains("org.opencontainers.image.licenses=\"Apache-2.0\""));
}
