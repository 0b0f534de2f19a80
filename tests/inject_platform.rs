//! `inject --platform=gpu-operator` and the MIG refusals, through the
//! command, its library entry point and the webhook: the runtime class, the
//! daemon's NVIDIA variables, no GKE host path, the NCCL plugin's folder from
//! the image or the node; Pods asking for MIG instances or pinned to GKE's
//! GPU partitions refused with the field named.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use serde::Deserialize as _;
use serde_norway::Value;
use tcpx_rxdm::inject::command::transform;
use tcpx_rxdm::inject::platform::{Platform, PluginDir};
use tcpx_rxdm::inject::webhook::{review, OnError};
use tcpx_rxdm::inject::{Mode, Nccl, Options, DAEMON};

const POD: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: train
spec:
  containers:
  - name: trainer
    image: my/nccl:1
    resources:
      limits:
        nvidia.com/gpu: 8
";

fn inject(args: &[&str], input: &str) -> (i32, String, String) {
    let mut child = Command::new(common::BIN)
        .arg("inject")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A refused option exits before reading: the pipe may be closed already.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn operator(plugin: PluginDir) -> Platform {
    Platform::GpuOperator(Some(plugin))
}

fn containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"].iter().filter_map(|l| spec.get(*l)?.as_sequence()).flatten().collect()
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    c.get("env")?.as_sequence()?.iter().find(|e| e["name"].as_str() == Some(name))?.get("value")?.as_str()
}

fn mount<'a>(c: &'a Value, at: &str) -> Option<&'a Value> {
    c.get("volumeMounts")?.as_sequence()?.iter().find(|m| m["mountPath"].as_str() == Some(at))
}

fn volume<'a>(spec: &'a Value, name: &str) -> Option<&'a Value> {
    spec.get("volumes")?.as_sequence()?.iter().find(|v| v["name"].as_str() == Some(name))
}

/// Every pod spec of a document (any mapping holding `containers`).
fn specs(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Mapping(m) => {
            if v.get("containers").is_some_and(Value::is_sequence) {
                out.push(v.clone());
            }
            m.values().for_each(|x| specs(x, out));
        }
        Value::Sequence(s) => s.iter().for_each(|x| specs(x, out)),
        _ => {}
    }
}

/// What an operator Pod must hold, checked without inject's code.
fn check_operator_spec(spec: &Value, mode: Mode, libraries: Option<&str>) {
    assert_eq!(spec["runtimeClassName"], "nvidia", "{spec:?}");
    let text = serde_norway::to_string(spec).unwrap();
    assert!(!text.contains("/home/kubernetes"), "a GKE host path:\n{text}");
    let daemon = containers(spec).into_iter().find(|c| c["name"].as_str() == Some(DAEMON));
    assert_eq!(daemon.is_some(), mode != Mode::Node);
    if let Some(d) = daemon {
        assert_eq!(env(d, "NVIDIA_VISIBLE_DEVICES"), Some("all"));
        let caps: Vec<&str> = env(d, "NVIDIA_DRIVER_CAPABILITIES").unwrap().split(',').collect();
        assert!(caps.contains(&"compute") && caps.contains(&"utility"), "{caps:?}");
        // libcuda comes from the runtime, not from a mounted folder.
        assert!(env(d, "LD_LIBRARY_PATH").is_none() && mount(d, "/usr/local/nvidia/lib64").is_none());
        assert!(mount(d, "/hostsysfs").is_some());
    }
    let gpu = containers(spec).into_iter().find(|c| c["name"].as_str() != Some(DAEMON)).unwrap();
    assert_eq!(env(gpu, "LD_LIBRARY_PATH"), libraries);
}

#[test]
fn gpu_operator_output_in_every_mode_has_the_runtime_class_and_no_gke_path() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/inject/builtin.yaml")).unwrap();
    for mode in [Mode::NativeSidecar, Mode::Sidecar, Mode::Node] {
        let o = Options {
            mode,
            nccl: Nccl::File,
            platform: operator(PluginDir::Image("/opt/tcpx/lib".into())),
            ..Options::default()
        };
        let (out, report) = transform(&text, &o).unwrap();
        let mut injected = Vec::new();
        for d in docs(&out) {
            specs(&d, &mut injected);
        }
        let injected: Vec<&Value> = injected.iter().filter(|s| s.get("runtimeClassName").is_some()).collect();
        assert_eq!(injected.len(), 8, "{mode:?}: {report:#?}");
        for spec in injected {
            check_operator_spec(spec, mode, Some("/opt/tcpx/lib"));
            // The plugin is in the image: no library volume at all.
            assert!(volume(spec, "tcpx-libraries").is_none());
        }
        assert!(report.iter().any(|l| l.lines().next().unwrap().ends_with(", gpu-operator)")), "{report:#?}");
        // Idempotent, and --uninject gives the input back.
        assert_eq!(transform(&out, &o).unwrap().0, out, "{mode:?}");
        let back = transform(&out, &Options { uninject: true, ..o.clone() }).unwrap().0;
        assert_eq!(docs(&back), docs(&text), "{mode:?}");
    }
}

#[test]
fn the_plugin_from_a_node_folder_is_mounted_read_only_for_the_gpu_containers() {
    let (code, out, err) =
        inject(&["--platform=gpu-operator", "--nccl-plugin", "host:/opt/tcpx/lib64", "--nccl=file"], POD);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("injected: native-sidecar (file nccl, 1 GPU container, gpu-operator)"), "{err}");
    let pod = &docs(&out)[0];
    let spec = &pod["spec"];
    check_operator_spec(spec, Mode::NativeSidecar, Some("/usr/local/nvidia/lib64"));
    let v = volume(spec, "tcpx-libraries").expect("the plugin's folder");
    assert_eq!(v["hostPath"]["path"], "/opt/tcpx/lib64");
    assert_eq!(v["hostPath"]["type"], "Directory");
    let m = mount(&spec["containers"][0], "/usr/local/nvidia/lib64").expect("mounted in the GPU container");
    assert_eq!((&m["name"], &m["readOnly"]), (&Value::from("tcpx-libraries"), &Value::Bool(true)));

    // Not privileged: NET_ADMIN, and no GKE device annotation (the runtime
    // gives the devices of NVIDIA_VISIBLE_DEVICES).
    let (code, out, err) = inject(&["--platform=gpu-operator"], POD);
    assert_eq!(code, 0, "{err}");
    let pod = &docs(&out)[0];
    assert_eq!(pod["spec"]["initContainers"][0]["securityContext"]["capabilities"]["add"][0], "NET_ADMIN");
    let ann = pod["metadata"]["annotations"].as_mapping().unwrap();
    assert!(!ann.keys().any(|k| k.as_str().unwrap().starts_with("devices.gke.io")), "{ann:?}");
}

#[test]
fn a_runtime_class_the_pod_names_is_kept_and_left_on_uninject() {
    let pod = POD.replace("spec:\n", "spec:\n  runtimeClassName: nvidia-cdi\n");
    let o = Options {
        platform: operator(PluginDir::Image("/usr/local/nvidia/lib64".into())),
        ..Options::default()
    };
    let (out, _) = transform(&pod, &o).unwrap();
    assert_eq!(docs(&out)[0]["spec"]["runtimeClassName"], "nvidia-cdi");
    let back = transform(&out, &Options { uninject: true, ..o }).unwrap().0;
    assert_eq!(docs(&back), docs(&pod));
}

#[test]
fn bad_platform_options_exit_2_naming_the_option() {
    for (args, says) in [
        (vec!["--platform=eks"], "invalid value 'eks' for '--platform <PLATFORM>'"),
        (vec!["--nccl-plugin=host:/x"], "--nccl-plugin: goes with --platform=gpu-operator"),
        (vec!["--platform=gpu-operator", "--nccl-plugin=lib"], "--nccl-plugin: invalid value \"lib\""),
        (vec!["--platform"], "a value is required for '--platform <PLATFORM>'"),
    ] {
        let (code, out, err) = inject(&args, POD);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty() && err.contains(says), "{args:?}: {err}");
    }
    let (code, out, _) = inject(&["--help"], "");
    assert_eq!(code, 0);
    assert!(
        out.contains("--platform") && out.contains("--nccl-plugin") && out.contains("nvidia.com/mig-"),
        "{out}"
    );
}

#[test]
fn mig_requests_and_gke_partitions_are_refused_naming_mig() {
    let mig = POD.replace("nvidia.com/gpu: 8", "nvidia.com/mig-1g.10gb: 1");
    let (code, out, err) = inject(&[], &mig);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    assert!(
        err.contains(
            "Pod/train: spec.containers[trainer].resources.limits[nvidia.com/mig-1g.10gb]: a MIG instance"
        ),
        "{err}"
    );
    assert!(err.contains("whole GPUs") && err.contains("nothing written"), "{err}");

    let pinned = POD
        .replace("spec:\n", "spec:\n  nodeSelector:\n    cloud.google.com/gke-gpu-partition-size: 1g.10gb\n");
    for platform in ["gke", "gpu-operator"] {
        let (code, _, err) = inject(&[&format!("--platform={platform}")], &pinned);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("spec.nodeSelector[cloud.google.com/gke-gpu-partition-size]: \"1g.10gb\""),
            "{err}"
        );
        assert!(err.contains("MIG"), "{err}");
    }
    // In a Job's template, the path says where.
    let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n    spec:\n      \
               containers: [{name: trainer, image: i, resources: {limits: {nvidia.com/mig-1g.10gb: 1}}}]\n";
    let e = transform(job, &Options::default()).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "Job/j: spec.template.spec.containers[trainer].resources.limits[nvidia.com/mig-1g.10gb]"
        ),
        "{e}"
    );
    // --uninject still works on a template that asks for MIG (nothing to refuse).
    assert!(transform(&mig, &Options { uninject: true, ..Options::default() }).is_ok());
}

/// An AdmissionReview for `pod` (YAML).
fn admission(pod: &str) -> Vec<u8> {
    let object: serde_json::Value = serde_norway::from_str(pod).unwrap();
    let r = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "ml", "object": object},
    });
    serde_json::to_vec(&r).unwrap()
}

#[test]
fn the_webhook_takes_the_platform_and_refuses_mig() {
    let argv = ["tcpx-rxdm", "inject", "serve", "--on-error=refuse", "--platform=gpu-operator"]
        .into_iter()
        .chain(["--nccl-plugin=image:/opt/nccl"])
        .map(String::from);
    let cfg = match tcpx_rxdm::cli::parse(argv) {
        Ok(tcpx_rxdm::cli::Invocation::InjectServe(cfg)) => cfg,
        Ok(_) => panic!("not inject serve"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(cfg.inject.platform, operator(PluginDir::Image("/opt/nccl".into())));
    let answer = review(&admission(POD), &cfg.inject, OnError::Refuse).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    let patch: serde_json::Value = {
        let b64 = answer["response"]["patch"].as_str().unwrap();
        let abc = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let vals: Vec<u32> = b64
            .bytes()
            .filter(|b| *b != b'=')
            .map(|b| abc.iter().position(|x| *x == b).unwrap() as u32)
            .collect();
        let mut raw = Vec::new();
        for c in vals.chunks(4) {
            let n = c.iter().enumerate().fold(0, |acc, (i, v)| acc | v << (18 - 6 * i));
            raw.extend(n.to_be_bytes()[1..c.len()].iter());
        }
        serde_json::from_slice(&raw).unwrap()
    };
    // The patch adds what inject adds, path by path.
    let added = |path: &str| {
        patch
            .as_array()
            .unwrap()
            .iter()
            .find(|op| op["op"] == "add" && op["path"] == path)
            .map(|op| &op["value"])
    };
    assert_eq!(added("/spec/runtimeClassName"), Some(&serde_json::json!("nvidia")), "{patch}");
    assert_eq!(added("/spec/containers/0/env").unwrap()[0]["value"], "/opt/nccl", "{patch}");
    assert!(!patch.to_string().contains("/home/kubernetes"), "{patch}");

    let mig = POD.replace("nvidia.com/gpu: 8", "nvidia.com/mig-3g.40gb: 1");
    let denied = review(&admission(&mig), &cfg.inject, OnError::Refuse).unwrap();
    assert_eq!(denied["response"]["allowed"], false);
    let msg = denied["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("Pod/ml/train: spec.containers[trainer].resources.limits[nvidia.com/mig-3g.40gb]"),
        "{msg}"
    );
    assert!(msg.contains("MIG"), "{msg}");
    let warned = review(&admission(&mig), &cfg.inject, OnError::Allow).unwrap();
    assert_eq!(warned["response"]["allowed"], true);
    assert!(warned["response"]["warnings"][0].as_str().unwrap().contains("MIG"));
}

#[test]
fn without_a_plugin_folder_the_images_library_path_is_left_alone() {
    // No LD_LIBRARY_PATH: none is added, and no library volume.
    let (code, out, err) = inject(&["--platform=gpu-operator", "--nccl=file"], POD);
    assert_eq!(code, 0, "{err}");
    let spec = &docs(&out)[0]["spec"];
    check_operator_spec(spec, Mode::NativeSidecar, None);
    assert!(volume(spec, "tcpx-libraries").is_none());
    // One of the Pod's own, whatever it holds, is kept, and stays on --uninject.
    let own = POD.replace(
        "    resources:\n",
        "    env:\n    - name: LD_LIBRARY_PATH\n      value: /opt/conda/lib\n    resources:\n",
    );
    let o = Options { platform: Platform::GpuOperator(None), nccl: Nccl::File, ..Options::default() };
    let (out, _) = transform(&own, &o).unwrap();
    check_operator_spec(&docs(&out)[0]["spec"], Mode::NativeSidecar, Some("/opt/conda/lib"));
    assert_eq!(transform(&out, &o).unwrap().0, out, "idempotent");
    let back = transform(&out, &Options { uninject: true, ..o }).unwrap().0;
    assert_eq!(docs(&back), docs(&own));
}

/// Injecting again without --platform keeps the GPU Operator and its
/// plugin folder (the record says which); naming --platform changes it.
#[test]
fn injecting_again_keeps_the_platform_of_the_record() {
    let (code, once, err) =
        inject(&["--platform=gpu-operator", "--nccl-plugin=host:/opt/tcpx/lib64", "--nccl=file"], POD);
    assert_eq!(code, 0, "{err}");
    assert!(once.contains("platform=gpu-operator,host:/opt/tcpx/lib64"), "{once}");
    let (code, again, err) = inject(&[], &once);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again, once);
    assert!(err.contains("already injected"), "{err}");
    let (code, gke, err) = inject(&["--platform=gke"], &once);
    assert_eq!(code, 0, "{err}");
    let spec = &docs(&gke)[0]["spec"];
    assert!(spec.get("runtimeClassName").is_none(), "{gke}");
    assert_eq!(
        volume(spec, "tcpx-libraries").unwrap()["hostPath"]["path"],
        "/home/kubernetes/bin/nvidia/lib64"
    );
}
