//! `tcpx-rxdm inject` on manifests of every kind it knows, in each mode:
//! golden outputs (rewritten with `TCPX_UPDATE_GOLDEN=1`), what each output
//! must hold, idempotence, `--uninject`, migration of the reference daemon,
//! and the deploy/ Jobs, which are inject's output for plain Jobs.
//! `.ci/deploy-lint` validates the golden files against the Kubernetes
//! schemas and the JobSet CRD.

mod manifests;

use manifests::{containers, daemon_flags, docs, golden, mount_at, path, read, strs};
use std::path::PathBuf;

use serde_norway::Value;
use tcpx_rxdm::config::flags::{Flags, SetupParam};
use tcpx_rxdm::host::tuning::TuningParams;
use tcpx_rxdm::inject::command::transform;
use tcpx_rxdm::inject::{machine, Given, Mode, Nccl, Options, ANNOTATION, DAEMON};

fn opts(mode: Mode, nccl: Nccl) -> Options {
    Options { mode, nccl, ..Options::default() }
}

fn run(text: &str, o: &Options) -> String {
    transform(text, o).unwrap_or_else(|e| panic!("refused: {e}")).0
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

fn is_gpu(c: &Value) -> bool {
    c.get("resources")
        .and_then(|r| r.get("limits").or(r.get("requests")))
        .and_then(|l| l.get("nvidia.com/gpu"))
        .is_some()
}

fn env_of<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    c.get("env")?.as_sequence()?.iter().find(|e| e["name"].as_str() == Some(name))?.get("value")?.as_str()
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
                for privileged in [false, true] {
                    let o = Options { privileged, ..opts(mode, nccl) };
                    let injected = run(&text, &o);
                    assert_ne!(injected, plain);
                    let back = run(&injected, &Options { uninject: true, ..Options::default() });
                    assert_eq!(back, plain, "{input} {mode:?} {nccl:?} privileged={privileged}");
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

/// Options as the command line gives them when none is named: each keeps
/// the earlier injection's value.
fn again() -> Options {
    Options { given: Given::NONE, ..Options::default() }
}

/// What a new user brings: a JobSet with a CPU-only coordinator, a Pod with
/// a tcpx-rxdm daemon written by hand, a Service.
#[test]
fn a_new_users_manifests_get_tcpx_where_gpus_are_and_a_hand_written_daemon_is_converted() {
    let text = read("tests/inject/walk.yaml");
    let (out, report) = transform(&text, &Options { given: again().given, ..Options::default() }).unwrap();
    golden("tests/inject/walk.native-sidecar.yaml", &out);
    let (plain, got) = (docs(&text), docs(&out));
    // The coordinator requests no GPU: left as it is, and said so.
    let coordinator = |d: &Value| d["spec"]["replicatedJobs"][0].clone();
    assert_eq!(coordinator(&got[0]), coordinator(&plain[0]));
    assert!(report[0].ends_with("[coordinator].template.spec.template: no container requests nvidia.com/gpu; left as it is (TCPX goes only to GPU containers)"), "{report:#?}");
    check_template(
        &got[0]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"],
        Mode::NativeSidecar,
        Nccl::Inline,
    );
    // The hand-written daemon: converted, its flags and its image kept, one daemon left.
    let pod = &got[1];
    check_template(pod, Mode::NativeSidecar, Nccl::Inline);
    assert_eq!(containers(&pod["spec"]).len(), 2, "{pod:?}");
    let d = &pod["spec"]["initContainers"][0];
    assert_eq!(d["image"], "registry.example/ml/tcpx-rxdm:0.1.0");
    let f = daemon_flags(d);
    assert_eq!(f.tenant_isolation.name(), "audit");
    // The level as the daemon names it.
    assert!(strs(d.get("args")).contains(&"--log_level=warn".to_string()), "{d:?}");
    assert!(!f.monitor_shutdown, "a native sidecar never ends on its clients' behalf");
    let line = &report[2];
    for says in [
        "Pod/hand-written: injected: native-sidecar",
        "converted hand-written tcpx-rxdm daemon rxdm (flags carried: --uds_path=/run/tcpx --tenant_isolation=audit --log_level=Warning; left to inject's --mode: --nomonitor_shutdown; volumes removed: sockets; --uninject brings it back)",
    ] {
        assert!(line.contains(says), "{says:?} not in {line}");
    }
    // Its NET_ADMIN-only daemon stays unprivileged, without a word about it.
    assert!(!line.contains("privileged: true"), "{line}");
    let sc = &d["securityContext"];
    assert_eq!(
        (&sc["privileged"], &sc["capabilities"]["add"][0]),
        (&Value::Bool(false), &Value::from("NET_ADMIN"))
    );
    // Again: nothing changes; --uninject gives the input back, the hand-written daemon included.
    assert_eq!(transform(&out, &again()).unwrap().0, out);
    let (back, report) = transform(&out, &Options { uninject: true, ..again() }).unwrap();
    assert_eq!(docs(&back), plain);
    assert!(report.iter().any(|l| l.starts_with("Pod/hand-written: removed (0.1.0 native-sidecar injection); hand-written tcpx-rxdm daemon rxdm restored")), "{report:#?}");
}

/// Each shipped manifest is inject's output: injecting it again, with no
/// option, changes nothing; nor does injecting again what any mode made of it.
#[test]
fn running_inject_again_changes_no_shipped_manifest_in_any_mode() {
    let dir = path("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let (out, report) = transform(&text, &again()).unwrap();
        assert_eq!(docs(&out), docs(&text), "{}: {report:#?}", f.display());
        assert!(report.iter().all(|l| !l.contains("injected:") && !l.contains("updated")), "{report:#?}");
        for mode in MODES {
            let explicit =
                Options { mode, given: Given { mode: true, ..again().given }, ..Options::default() };
            let once = transform(&text, &explicit).unwrap().0;
            let (twice, report) = transform(&once, &again()).unwrap();
            assert_eq!(twice, once, "{} {mode:?}: {report:#?}", f.display());
        }
    }
}

/// Without --mode, a template keeps the mode (and NCCL source) of its record;
/// with it, the mode changes and the report says so.
#[test]
fn the_recorded_mode_stays_unless_mode_is_given() {
    let text = read("tests/inject/plain-classic-sidecar-job.yaml");
    let sidecar = transform(&text, &opts(Mode::Sidecar, Nccl::File)).unwrap().0;
    let (kept, report) = transform(&sidecar, &again()).unwrap();
    assert_eq!(kept, sidecar);
    assert!(report[0].ends_with("already injected (0.1.0, sidecar); unchanged"), "{report:#?}");
    let explicit = Options {
        mode: Mode::NativeSidecar,
        given: Given { mode: true, ..Given::NONE },
        ..Options::default()
    };
    let (native, report) = transform(&sidecar, &explicit).unwrap();
    assert_eq!(native, transform(&text, &opts(Mode::NativeSidecar, Nccl::File)).unwrap().0);
    assert!(report[0].contains("updated from 0.1.0 sidecar: native-sidecar (file nccl, 1 GPU container); mode sidecar → native-sidecar (--mode)"), "{report:#?}");
    // The daemon's flags, image and requests of the first run stay too.
    let first = Options {
        image: "registry.example/tcpx-rxdm:9".into(),
        cpu: Some("500m".into()),
        privileged: true,
        daemon_flags: vec!["--rx_pool_size=1073741824".into()],
        ..opts(Mode::Sidecar, Nccl::ConfigMap)
    };
    let once = transform(&text, &first).unwrap().0;
    assert_eq!(transform(&once, &again()).unwrap().0, once);
}

/// A template an inject from before least privilege wrote (its daemon
/// privileged: true, that inject's default) gets the unprivileged daemon
/// when injected again, and the report says so; `--privileged` keeps the old
/// daemon, is recorded, and is kept by later runs without options.
#[test]
fn upgrade_from_a_privileged_injection_drops_privileged_unless_asked() {
    let old = read("tests/inject/privileged-job.yaml");
    let again = Options { given: Given::NONE, ..Options::default() };
    let (out, report) = transform(&old, &again).unwrap();
    golden("tests/inject/privileged-job.native-sidecar.yaml", &out);
    assert!(
        report[0].contains("; the daemon is no longer privileged: only the capabilities it needs, the GPUs through the platform's device mechanism (--privileged keeps privileged: true)"),
        "{report:#?}"
    );
    let tpl = &docs(&out)[0]["spec"]["template"];
    let sc = &tpl["spec"]["initContainers"][0]["securityContext"];
    assert_eq!(sc["privileged"], Value::Bool(false));
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert!(tpl["metadata"]["annotations"]["devices.gke.io/container.tcpx-daemon"].is_string());
    assert_eq!(transform(&out, &again).unwrap().0, out, "not idempotent");

    let asked =
        Options { privileged: true, given: Given { privileged: true, ..Given::NONE }, ..again.clone() };
    let (kept, report) = transform(&old, &asked).unwrap();
    assert!(report[0].contains("privileged daemon (--privileged)"), "{report:#?}");
    let tpl = &docs(&kept)[0]["spec"]["template"];
    assert_eq!(tpl["spec"]["initContainers"][0]["securityContext"], docs("privileged: true")[0]);
    assert!(tpl["metadata"]["annotations"][ANNOTATION].as_str().unwrap().contains(" privileged=yes "));
    assert!(tpl["metadata"]["annotations"].get("devices.gke.io/container.tcpx-daemon").is_none());
    assert_eq!(transform(&kept, &again).unwrap().0, kept, "--privileged not kept by a run without options");
    let unasked = Options { privileged: false, given: Given { privileged: true, ..Given::NONE }, ..again };
    let back = transform(&kept, &unasked).unwrap().0;
    assert_eq!(docs(&back)[0]["spec"]["template"], docs(&out)[0]["spec"]["template"]);
}

/// A converted daemon comes back with --uninject; a record written before
/// inject kept one says it cannot give one back, and what to do.
#[test]
fn uninject_gives_a_converted_reference_back_or_says_why_it_cannot() {
    let custom = guide()
        .replace("        - /run/tcpx\n", "        - /run/tcpx\n        - --tenant_isolation=enforce\n");
    for mode in [Mode::NativeSidecar, Mode::Sidecar, Mode::Node] {
        let (out, report) = transform(&custom, &opts(mode, Nccl::Inline)).unwrap();
        if mode != Mode::Node {
            // --tenant_isolation is tcpx-rxdm's own: carried over, not refused.
            assert!(report[0].contains("--tenant_isolation=enforce"), "{report:#?}");
            let d =
                containers(&docs(&out)[0]["spec"]).into_iter().find(|c| c["name"] == DAEMON).unwrap().clone();
            assert_eq!(daemon_flags(&d).tenant_isolation.name(), "enforce");
        }
        let (back, report) = transform(&out, &Options { uninject: true, ..Options::default() }).unwrap();
        assert_eq!(docs(&back), docs(&custom), "{mode:?}");
        assert!(report[0].contains("injection); reference daemon tcpx-daemon restored\n"), "{report:#?}");
    }
    // A record without converted= (an earlier inject's) on a converted Pod.
    let out = run(&guide(), &Options::default());
    let mut pod = docs(&out).remove(0);
    let ann = pod["metadata"]["annotations"].as_mapping_mut().unwrap();
    ann.remove("tcpx-rxdm.io/converted");
    let rec = ann.get_mut(ANNOTATION).unwrap();
    *rec = Value::String(rec.as_str().unwrap().replace(" converted=yes", ""));
    let old = serde_norway::to_string(&pod).unwrap();
    let (back, report) =
        tcpx_rxdm::inject::command::transform_all(&old, &Options { uninject: true, ..Options::default() })
            .unwrap();
    assert!(!back.contains("tcpgpudmarxd"), "{back}");
    let warning = &report[0].done.warnings[0];
    assert!(
        warning.contains("written by an earlier inject, which did not keep a daemon it converted")
            && warning.contains("copy them back from the original manifest"),
        "{warning}"
    );
    // converted=yes without what it kept: refused, nothing changed.
    let lost = out.replace("tcpx-rxdm.io/converted:", "x-team/notes:");
    let e = transform(&lost, &Options { uninject: true, ..Options::default() }).unwrap_err().to_string();
    assert!(e.contains("metadata.annotations[tcpx-rxdm.io/converted]: the daemon this injection converted cannot be given back: the annotation is missing"), "{e}");
}

/// The probe follows --metrics_address: HTTP on its port where the kubelet
/// reaches it, else the daemon asked in its container; the report says which.
#[test]
fn the_probe_follows_the_metrics_address() {
    let text = read("tests/inject/plain-native-sidecar-job.yaml");
    for (mode, address, key, says) in [
        (Mode::NativeSidecar, "0.0.0.0:9999", "startupProbe", "startupProbe GET /readyz on port 9999"),
        (Mode::Sidecar, "[::]:9999", "readinessProbe", "readinessProbe GET /readyz on port 9999"),
        (
            Mode::NativeSidecar,
            "127.0.0.1:9999",
            "startupProbe",
            "127.0.0.1:9999 is loopback, which the kubelet cannot reach",
        ),
        (Mode::Sidecar, "", "readinessProbe", "--metrics_address is empty: the daemon serves no HTTP"),
    ] {
        let o =
            Options { daemon_flags: vec![format!("--metrics_address={address}")], ..opts(mode, Nccl::File) };
        let (out, report) = transform(&text, &o).unwrap();
        assert!(report[0].contains(says), "{address}: {report:#?}");
        let job = &docs(&out)[0];
        let d = containers(&job["spec"]["template"]["spec"])
            .into_iter()
            .find(|c| c["name"] == DAEMON)
            .unwrap()
            .clone();
        let probe = &d[key];
        match address {
            "0.0.0.0:9999" | "[::]:9999" => {
                assert_eq!(probe["httpGet"]["port"], Value::Number(9999.into()));
                assert_eq!(d["livenessProbe"]["httpGet"]["port"], Value::Number(9999.into()));
            }
            _ => {
                assert_eq!(
                    strs(probe["exec"].get("command")),
                    ["/usr/local/bin/tcpx-rxdm", "status", "mine", "--uds_path=/run/tcpx"]
                );
                assert!(d.get("livenessProbe").is_none());
            }
        }
        let ports = d.get("ports").map(|p| p[0]["containerPort"].clone());
        assert_eq!(ports, (!address.is_empty()).then(|| Value::Number(9999.into())), "{address}");
        assert_eq!(transform(&out, &o).unwrap().0, out, "{address}");
    }
}

/// A Pod asking for part of a node's GPUs gets the whole node's daemon:
/// said plainly, with what to do.
#[test]
fn a_pod_asking_for_part_of_the_node_is_warned_that_its_daemon_takes_every_nic() {
    let text =
        read("tests/inject/plain-native-sidecar-job.yaml").replace("nvidia.com/gpu: 8", "nvidia.com/gpu: 4");
    let (_, applied) = tcpx_rxdm::inject::command::transform_all(&text, &Options::default()).unwrap();
    let w = &applied[0].done.warnings;
    assert_eq!(w.len(), 1, "{w:?}");
    for says in [
        "asks for 4 of the 8 GPUs",
        "two such Pods on one node would clash over the NICs and port 9467",
        "--mode=node",
    ] {
        assert!(w[0].contains(says), "{says:?}: {w:?}");
    }
    let node = Options { mode: Mode::Node, ..Options::default() };
    assert!(tcpx_rxdm::inject::command::transform_all(&text, &node).unwrap().1[0].done.warnings.is_empty());
}
