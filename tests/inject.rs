//! `tcpx-rxdm inject` on manifests of every kind it knows, in each mode:
//! golden outputs (rewritten with `TCPX_UPDATE_GOLDEN=1`), what each output
//! must hold, idempotence, `--uninject`, migration of the reference daemon,
//! and the deploy/ Jobs, which are inject's output for plain Jobs.
//! `.ci/deploy-lint` validates the golden files against the Kubernetes
//! schemas and the JobSet CRD.

use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_norway::Value;
use tcpx_rxdm::config::flags::{Flags, SetupParam};
use tcpx_rxdm::host::tuning::TuningParams;
use tcpx_rxdm::inject::command::transform;
use tcpx_rxdm::inject::{machine, Mode, Nccl, Options, ANNOTATION, DAEMON};

fn path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn opts(mode: Mode, nccl: Nccl) -> Options {
    Options { mode, nccl, ..Options::default() }
}

fn run(text: &str, o: &Options) -> String {
    transform(text, o).unwrap_or_else(|e| panic!("refused: {e}")).0
}

/// Compares with the golden file, or rewrites it.
fn golden(rel: &str, got: &str) {
    if std::env::var_os("TCPX_UPDATE_GOLDEN").is_some() {
        std::fs::write(path(rel), got).unwrap();
    }
    let want = read(rel);
    assert!(want == got, "{rel} differs from inject's output (TCPX_UPDATE_GOLDEN=1 rewrites it):\n{got}");
}

const MODES: [Mode; 3] = [Mode::NativeSidecar, Mode::Sidecar, Mode::Node];
const NCCLS: [Nccl; 3] = [Nccl::Inline, Nccl::ConfigMap, Nccl::File];

/// Every pod template of a document, by a walk that does not share inject's
/// table of kinds: any mapping holding `spec.containers`.
fn templates(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Mapping(m) => {
            if v.get("spec").and_then(|s| s.get("containers")).is_some() {
                out.push(v.clone());
            }
            m.values().for_each(|x| templates(x, out));
        }
        Value::Sequence(s) => s.iter().for_each(|x| templates(x, out)),
        _ => {}
    }
}

fn containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_sequence))
        .flatten()
        .collect()
}

fn is_gpu(c: &Value) -> bool {
    c.get("resources")
        .and_then(|r| r.get("limits").or(r.get("requests")))
        .and_then(|l| l.get("nvidia.com/gpu"))
        .is_some()
}

fn env_of<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    c.get("env")?.as_sequence()?.iter().find(|e| e["name"].as_str() == Some(name))?.get("value")?.as_str()
}

fn mount_at<'a>(c: &'a Value, at: &str) -> Option<&'a Value> {
    c.get("volumeMounts")?.as_sequence()?.iter().find(|m| m["mountPath"].as_str() == Some(at))
}

fn strs(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The daemon's flags as our parser reads its command line.
fn daemon_flags(c: &Value) -> Flags {
    let mut argv = strs(c.get("command"));
    if argv.is_empty() {
        argv.push("tcpx-rxdm".into());
    }
    argv.extend(strs(c.get("args")));
    Flags::parse_args(argv.clone()).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

/// What every injected template must hold, checked without inject's code.
fn check_template(t: &Value, mode: Mode, nccl: Nccl) {
    let spec = &t["spec"];
    assert_eq!(spec["hostNetwork"], Value::Bool(true));
    let daemons: Vec<&Value> =
        containers(spec).into_iter().filter(|c| c["name"].as_str() == Some(DAEMON)).collect();
    assert_eq!(daemons.len(), usize::from(mode != Mode::Node), "{t:?}");
    let uds = match daemons.first() {
        Some(d) => {
            let f = daemon_flags(d);
            assert_eq!(
                f.setup_param,
                SetupParam::Tune(TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 0 })
            );
            let init = spec["initContainers"]
                .as_sequence()
                .is_some_and(|s| s.iter().any(|c| c["name"].as_str() == Some(DAEMON)));
            assert_eq!(init, mode == Mode::NativeSidecar);
            if mode == Mode::NativeSidecar {
                assert_eq!(d["restartPolicy"], "Always");
                assert_eq!(d["startupProbe"]["httpGet"]["path"], "/readyz");
            }
            assert!(mount_at(d, "/hostsysfs").is_some());
            f.uds_path.to_str().unwrap().to_string()
        }
        None => "/run/tcpx".to_string(),
    };
    let ann = t["metadata"]["annotations"][ANNOTATION].as_str().unwrap();
    assert!(
        ann.contains(&format!("mode={}", mode.name())) && ann.contains(&format!("nccl={}", nccl.name())),
        "{ann}"
    );
    for c in containers(spec).into_iter().filter(|c| is_gpu(c)) {
        let name = c["name"].as_str().unwrap();
        assert_eq!(env_of(c, "LD_LIBRARY_PATH"), Some("/usr/local/nvidia/lib64"), "{name}");
        let sock = mount_at(c, &uds).unwrap_or_else(|| panic!("{name}: no socket folder"));
        assert_eq!(sock["readOnly"].as_bool().unwrap_or(false), mode == Mode::Node);
        let prefix = env_of(c, "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX");
        assert_eq!(prefix, (nccl == Nccl::Inline).then_some(uds.as_str()), "{name}");
        let from = c.get("envFrom").map(|e| e[0]["configMapRef"]["name"].clone());
        assert_eq!(from, (nccl == Nccl::ConfigMap).then(|| Value::String("tcpx-nccl-env".into())), "{name}");
    }
}

#[test]
fn every_kind_in_every_mode_matches_its_golden_file_and_holds_the_wiring() {
    for input in ["builtin", "crd"] {
        let text = read(&format!("tests/inject/{input}.yaml"));
        let plain = docs(&text);
        for mode in MODES {
            let (out, report) = transform(&text, &opts(mode, Nccl::Inline)).unwrap();
            golden(&format!("tests/inject/{input}.{}.yaml", mode.name()), &out);
            let got = docs(&out);
            assert_eq!(got.len(), plain.len());
            let mut injected = 0;
            for (before, after) in plain.iter().zip(&got) {
                let (mut tb, mut ta) = (vec![], vec![]);
                templates(before, &mut tb);
                templates(after, &mut ta);
                assert_eq!(tb.len(), ta.len());
                if tb.is_empty() {
                    assert_eq!(before, after, "a document without a pod template changed");
                }
                for (b, a) in tb.iter().zip(&ta) {
                    if containers(&b["spec"]).iter().any(|c| is_gpu(c)) {
                        check_template(a, mode, Nccl::Inline);
                        injected += 1;
                        // Containers without GPUs are as they were.
                        for c in containers(&b["spec"]).into_iter().filter(|c| !is_gpu(c)) {
                            assert!(containers(&a["spec"]).contains(&c), "{c:?} changed");
                        }
                    } else {
                        assert_eq!(b, a, "a template without GPU containers changed");
                    }
                }
            }
            // builtin: Pod, Job, CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet, the List's Pod.
            // crd: two replicated jobs, two PyTorchJob roles, the MPIJob worker, the runtime's job.
            assert_eq!(injected, if input == "builtin" { 8 } else { 6 }, "{input} {mode:?}");
            assert_eq!(report.iter().filter(|l| l.contains(": injected: ")).count(), injected, "{report:#?}");
        }
    }
}

#[test]
fn the_inline_settings_are_the_generators_for_the_machine() {
    let o = opts(Mode::NativeSidecar, Nccl::Inline);
    let out = docs(&run(&read("tests/inject/builtin.yaml"), &o));
    let flags =
        Flags::parse_args(["x", "--gpu_nic_preset=a3vm", "--uds_path=/run/tcpx"].map(String::from)).unwrap();
    let env = machine::nccl_env(machine::DEFAULT, &flags).unwrap();
    let c = &out[0]["spec"]["containers"][0];
    for v in &env.vars {
        assert_eq!(env_of(c, &v.name), Some(v.value.as_str()), "{}", v.name);
    }
    // The user's own setting beside them is kept.
    assert_eq!(env_of(&out[1]["spec"]["template"]["spec"]["containers"][0], "NCCL_DEBUG"), Some("INFO"));
}

#[test]
fn injecting_twice_changes_nothing_and_a_new_mode_or_version_replaces_the_old() {
    for input in ["builtin", "crd"] {
        let text = read(&format!("tests/inject/{input}.yaml"));
        for mode in MODES {
            for nccl in NCCLS {
                let once = run(&text, &opts(mode, nccl));
                let (twice, report) = transform(&once, &opts(mode, nccl)).unwrap();
                assert_eq!(once, twice, "{input} {mode:?} {nccl:?}");
                assert!(report.iter().all(|l| !l.contains("injected:")), "{report:#?}");
                let other = opts(MODES[(mode as usize + 1) % 3], Nccl::Inline);
                assert_eq!(run(&once, &other), run(&text, &other), "switching from {mode:?}");
            }
        }
    }
    // An older version's record is replaced in place.
    let text = read("tests/inject/builtin.yaml");
    let now = run(&text, &Options::default());
    let old = now.replace("version=0.1.0", "version=0.0.9");
    assert_ne!(old, now);
    let (again, report) = transform(&old, &Options::default()).unwrap();
    assert_eq!(again, now);
    assert!(report[0].contains("updated from 0.0.9"), "{report:#?}");
}

#[test]
fn uninject_removes_exactly_what_inject_added() {
    for input in ["builtin", "crd", "kept"] {
        let text =
            if input == "kept" { KEPT.to_string() } else { read(&format!("tests/inject/{input}.yaml")) };
        let plain = run(&text, &Options { uninject: true, ..Options::default() });
        assert_eq!(docs(&plain), docs(&text), "a round trip of a plain manifest changed it");
        for mode in MODES {
            for nccl in NCCLS {
                for unprivileged in [false, true] {
                    let o = Options { unprivileged, ..opts(mode, nccl) };
                    let injected = run(&text, &o);
                    assert_ne!(injected, plain);
                    let back = run(&injected, &Options { uninject: true, ..Options::default() });
                    assert_eq!(back, plain, "{input} {mode:?} {nccl:?} unprivileged={unprivileged}");
                }
            }
        }
    }
}

/// A Pod that already has some of what inject adds: those stay on uninject;
/// and one with the API server's default DNS policy, which comes back.
const KEPT: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: kept
  annotations:
    team: ml
spec:
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  terminationGracePeriodSeconds: 120
  containers:
  - name: main
    image: nvcr.io/nvidia/pytorch:24.05-py3
    env:
    - name: LD_LIBRARY_PATH
      value: /usr/local/nvidia/lib64:/opt/lib
    - name: NCCL_ALGO
      value: Ring
    envFrom:
    - configMapRef:
        name: tcpx-nccl-env
    resources:
      limits:
        nvidia.com/gpu: 8
---
apiVersion: v1
kind: Pod
metadata:
  name: defaulted
spec:
  dnsPolicy: ClusterFirst
  containers:
  - name: main
    image: nvcr.io/nvidia/pytorch:24.05-py3
    resources:
      limits:
        nvidia.com/gpu: 8
";

#[test]
fn the_deploy_jobs_are_injects_output_for_plain_jobs() {
    for (plain, mode, file) in [
        ("plain-native-sidecar-job.yaml", Mode::NativeSidecar, "deploy/kubernetes/native-sidecar-job.yaml"),
        ("plain-classic-sidecar-job.yaml", Mode::Sidecar, "deploy/kubernetes/tcpx-daemon-sidecar.yaml"),
        ("plain-nccl-allgather-job.yaml", Mode::NativeSidecar, "deploy/kubernetes/nccl-allgather.yaml"),
    ] {
        let out = run(&read(&format!("tests/inject/{plain}")), &opts(mode, Nccl::File));
        let job = docs(&read(file)).into_iter().find(|d| d["kind"] == "Job").unwrap();
        assert_eq!(docs(&out), [job], "{file} is not what `tcpx-rxdm inject` writes for {plain}");
    }
}

fn guide() -> String {
    read("tests/inject/gke-guide-pod.yaml")
}

#[test]
fn the_gke_guide_pod_is_migrated_to_one_daemon_with_its_flags() {
    for mode in [Mode::NativeSidecar, Mode::Sidecar] {
        let (out, report) = transform(&guide(), &opts(mode, Nccl::Inline)).unwrap();
        golden(&format!("tests/inject/gke-guide-pod.{}.yaml", mode.name()), &out);
        assert!(report[0].contains("converted reference daemon tcpx-daemon"), "{report:#?}");
        let pod = &docs(&out)[0];
        check_template(pod, mode, Nccl::Inline);
        let all = containers(&pod["spec"]);
        assert!(all.iter().all(|c| !c["image"].as_str().unwrap().contains("tcpgpudmarxd")), "two daemons");
        let d = all.iter().find(|c| c["name"].as_str() == Some(DAEMON)).unwrap();
        let f = daemon_flags(d);
        assert_eq!((f.gpu_nic_preset.as_str(), f.uds_path.to_str().unwrap()), ("a3vm", "/run/tcpx"));
        // The old volumes are gone; the workload no longer looks in /tmp.
        let vols: Vec<&str> = pod["spec"]["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert!(vols.iter().all(|v| v.starts_with("tcpx-")), "{vols:?}");
        let w = all.iter().find(|c| c["name"].as_str() == Some("nccl-test")).unwrap();
        assert!(mount_at(w, "/tmp").is_none());
        assert_eq!(run(&out, &opts(mode, Nccl::Inline)), out, "not idempotent after migration");
    }
    // Flags that mean the same are carried: a pool size and another socket folder.
    let custom = guide().replace(
        "        - /run/tcpx\n",
        "        - /run/tcpx-a\n        - --rx_pool_size\n        - \"1073741824\"\n",
    );
    let pod = &docs(&run(&custom, &Options::default()))[0];
    let f = daemon_flags(&pod["spec"]["initContainers"][0]);
    assert_eq!((f.uds_path.to_str().unwrap(), f.rx_pool_size), ("/run/tcpx-a", 1073741824));
    assert_eq!(
        env_of(&pod["spec"]["containers"][0], "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"),
        Some("/run/tcpx-a")
    );
}

#[test]
fn a_reference_daemon_that_cannot_be_converted_is_refused_by_name() {
    let unknown = guide().replace(
        "        - --setup_param\n",
        "        - --gpu_nic_topology=/conf/topo.pb\n        - --setup_param\n",
    );
    let e = transform(&unknown, &Options::default()).unwrap_err().to_string();
    assert!(
        e.contains("Pod/tcpx-guide-example")
            && e.contains("containers[tcpx-daemon]")
            && e.contains("--gpu_nic_topology"),
        "{e}"
    );
    let text = guide();
    let i = text.find("    - name: nccl-test").unwrap();
    let second =
        text[text.find("    - name: tcpx-daemon").unwrap()..i].replace("name: tcpx-daemon", "name: rxdm-2");
    let two = format!("{}{second}{}", &text[..i], &text[i..]);
    let e = transform(&two, &Options::default()).unwrap_err().to_string();
    assert!(
        e.contains("containers[rxdm-2]")
            && e.contains("a second TCPX daemon (besides reference daemon tcpx-daemon)"),
        "{e}"
    );
}

#[test]
fn a_pod_asking_for_more_gpus_than_the_machine_has_is_refused_with_the_count() {
    let job = |gpus: &str| {
        "\
apiVersion: batch/v1
kind: Job
metadata:
  name: big
spec:
  template:
    spec:
      containers:
      - name: a
        image: i
        resources:
          limits:
            nvidia.com/gpu: GPUS
      - name: b
        image: i
        resources:
          limits:
            nvidia.com/gpu: 8
"
        .replace("GPUS", gpus)
    };
    for (mode, nccl) in [(Mode::NativeSidecar, Nccl::Inline), (Mode::Node, Nccl::File)] {
        let e = transform(&job("8"), &opts(mode, nccl)).unwrap_err().to_string();
        assert_eq!(
            e,
            "Job/big: spec.template.spec: asks for 16 GPUs (nvidia.com/gpu, over 2 containers); \
             machine type a3-highgpu-8g has 8, so no node can run it"
        );
    }
    // A quantity with a suffix counts as what it means.
    assert!(transform(&job("'1k'"), &Options::default())
        .unwrap_err()
        .to_string()
        .contains("asks for 1008 GPUs"));
    assert!(transform(&job("0"), &Options::default()).is_ok());
}

#[test]
fn a_record_undoes_only_what_inject_sets_and_only_while_it_holds_inject_s_value() {
    let text = read("tests/inject/builtin.yaml");
    let injected = run(&text, &Options::default());
    let plain = run(&text, &Options { uninject: true, ..Options::default() });
    // A field the author changed after inject set it is the author's now.
    let changed =
        injected.replacen("terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: 90", 1);
    assert_ne!(changed, injected);
    let back = run(&changed, &Options { uninject: true, ..Options::default() });
    assert_eq!(back.matches("terminationGracePeriodSeconds: 90").count(), 1, "{back}");
    assert_eq!(docs(&back).len(), docs(&plain).len());
    // A record naming fields inject never sets is refused, not followed.
    for forged in ["pod=securityContext,runtimeClassName", "pod=hostPID:true"] {
        let text = injected.replacen("pod=", &format!("{forged},"), 1);
        let e = transform(&text, &Options { uninject: true, ..Options::default() }).unwrap_err().to_string();
        assert!(
            e.contains("which inject never sets") && e.contains("not a record this version reads"),
            "{e}"
        );
    }
}

/// A converted reference daemon's flags stay when the output is injected
/// again: the reference is gone by then, so they are read back from inject's
/// own daemon container.
#[test]
fn flags_carried_from_a_reference_daemon_survive_injecting_again() {
    let pod = "apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
  - name: trainer
    image: t
    resources: {limits: {nvidia.com/gpu: 8}}
  - name: rxdm
    image: tcpgpudmarxd-dev:v2.0.9
    command: [/tcpgpudmarxd/build/app/tcpgpudmarxd, --rx_pool_size=1073741824, --setup_param, '\\\"--verbose 128 4 0 \\\"']
";
    for mode in [Mode::NativeSidecar, Mode::Sidecar] {
        let once = run(pod, &opts(mode, Nccl::File));
        assert!(once.contains("--rx_pool_size=1073741824"), "{mode:?}: carried\n{once}");
        assert!(once.contains("128 4 0"), "{mode:?}: carried\n{once}");
        let twice = run(&once, &opts(mode, Nccl::File));
        assert_eq!(docs(&twice), docs(&once), "{mode:?}: injecting again changed the Pod");
    }
}
