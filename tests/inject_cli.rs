//! `tcpx-rxdm inject` as a command: refused input (exit 1, nothing on
//! stdout, the object and field named), bad options (exit 2, the option
//! named), the options users ask for, `--help`, stdin and files.

use std::io::Write as _;
use std::process::{Command, Stdio};

use serde::Deserialize as _;
use serde_norway::Value;

/// Runs `tcpx-rxdm inject ARGS` with `input` on stdin: (code, stdout, stderr).
fn inject(args: &[&str], input: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tcpx-rxdm"))
        .arg("inject")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Refused options end the command before it reads: a closed pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap(), text(out.stdout), text(out.stderr))
}

fn doc(text: &str) -> Value {
    Value::deserialize(serde_norway::Deserializer::from_str(text).next().unwrap()).unwrap()
}

const JOB: &str = "\
apiVersion: batch/v1
kind: Job
metadata:
  name: train
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: nvcr.io/nvidia/pytorch:24.05-py3
        resources:
          limits:
            nvidia.com/gpu: 8
";

/// JOB with `line` added to the pod spec (indented for it) or the trainer.
fn job_with(pod_line: &str, trainer_lines: &str) -> String {
    let mut t =
        JOB.replace("      restartPolicy: Never\n", &format!("      restartPolicy: Never\n{pod_line}"));
    t.push_str(trainer_lines);
    t
}

#[test]
fn refused_input_names_object_and_field_exits_1_and_writes_nothing() {
    let cases = [
        ("not: [yaml".to_string(), "not YAML"),
        (
            job_with("      hostNetwork: false\n", ""),
            "Job/train: spec.template.spec.hostNetwork: false; inject runs the daemon in the node's network namespace",
        ),
        (
            job_with("      hostNetwork: false\n", ""),
            "It does not write Pods that get their NICs through GKE multi-networking",
        ),
        (
            job_with("      volumes:\n      - name: tcpx-socket\n        emptyDir: {}\n", ""),
            "Job/train: spec.template.spec.volumes[tcpx-socket]: a volume of a name inject gives its own",
        ),
        (
            job_with("", "      - name: tcpx-daemon\n        image: busybox\n"),
            "Job/train: spec.template.spec.containers[tcpx-daemon]: a container of the name inject gives its \
             daemon, which inject did not write (the template has no tcpx-rxdm.io/injected record) and which \
             runs neither tcpx-rxdm nor tcpgpudmarxd (image busybox). If it is a TCPX daemon you wrote, remove \
             it and run inject again",
        ),
        (
            job_with("", "        env:\n        - name: NCCL_ALGO\n          value: Tree\n"),
            "Job/train: spec.template.spec.containers[trainer].env[NCCL_ALGO]: \"Tree\" conflicts with the NCCL setting inject adds, \"Ring\"",
        ),
        (
            job_with("", "        env:\n        - name: LD_LIBRARY_PATH\n          value: /opt/lib\n"),
            "Job/train: spec.template.spec.containers[trainer].env[LD_LIBRARY_PATH]: does not hold /usr/local/nvidia/lib64",
        ),
        (
            job_with("", "        volumeMounts:\n        - name: scratch\n          mountPath: /run/tcpx\n"),
            "Job/train: spec.template.spec.containers[trainer].volumeMounts[scratch]: volume scratch is mounted \
             at /run/tcpx, where inject mounts the daemon's socket folder (its volume tcpx-socket). If a TCPX \
             daemon you wrote serves that folder, remove its container, this mount and the volume",
        ),
    ];
    for (input, want) in cases {
        // A good document first: nothing of it may be written either.
        let (code, out, err) = inject(&[], &format!("{JOB}---\n{input}"));
        assert_eq!(code, 1, "{want}: {err}");
        assert_eq!(out, "", "{want}: something was written");
        assert!(err.contains(want) && err.contains("nothing written"), "want {want:?}, got {err}");
    }
    // With the conflicting setting gone, the same Job is accepted.
    let fine = job_with("", "        env:\n        - name: NCCL_ALGO\n          value: Ring\n");
    assert_eq!(inject(&[], &fine).0, 0);
}

#[test]
fn bad_options_exit_2_naming_the_option() {
    for (args, want) in [
        (&["--mode=sidecars"][..], "invalid value 'sidecars' for '--mode <MODE>'"),
        (&["--nccl", "env"][..], "invalid value 'env' for '--nccl <SOURCE>'"),
        (&["--machine=a2-highgpu-8g"][..], "invalid value 'a2-highgpu-8g' for '--machine <TYPE>'"),
        (&["--frobnicate"][..], "unexpected argument '--frobnicate'"),
        (&["--rx_pool_size=lots"][..], "rx_pool_size"),
        (&["--mode=node", "--tenant_isolation=enforce"][..], "--tenant_isolation: with --mode=node"),
        (&["--node_wide"][..], "--node_wide"),
        (&["serve"][..], "required arguments were not provided:\n  --on-error <POLICY>"),
        (&["serve", "--on-error=maybe"][..], "invalid value 'maybe' for '--on-error <POLICY>'"),
        (
            &["serve", "--on-error=allow", "--listen=localhost"][..],
            "invalid value 'localhost' for '--listen <ADDR>'",
        ),
        (&["serve", "--on-error=allow", "--mode=pod"][..], "invalid value 'pod' for '--mode <MODE>'"),
        (&["serve", "--on-error=allow", "--node_wide"][..], "--node_wide"),
    ] {
        let (code, out, err) = inject(args, JOB);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(out, "");
        assert!(err.contains(want), "{args:?}: want {want:?}, got {err}");
    }
}

#[test]
fn help_says_comments_are_lost_and_lists_the_kinds() {
    let (code, out, _) = inject(&["--help"], "");
    assert_eq!(code, 0);
    assert!(out.contains("Comments and formatting of the input are lost"), "{out}");
    for kind in
        ["CronJob", "JobSet", "PyTorchJob", "MPIJob", "TrainingRuntime", "--uninject", "--unprivileged"]
    {
        assert!(out.contains(kind), "--help does not mention {kind}");
    }
}

#[test]
fn options_reach_the_daemon_container_and_the_pod() {
    let args = [
        "--unprivileged",
        "--image=registry.example/tcpx-rxdm:9.9",
        "--daemon-cpu=500m",
        "--daemon-memory",
        "1Gi",
        "--tenant_isolation=enforce",
        "--rx_pool_size",
        "2147483648",
        "--uds_path=/run/tcpx-a",
        "--nccl=configmap",
    ];
    let (code, out, err) = inject(&args, JOB);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("Job/train spec.template: injected: native-sidecar (configmap nccl, 1 GPU container)"),
        "{err}"
    );
    let job = doc(&out);
    let tpl = &job["spec"]["template"];
    let d = &tpl["spec"]["initContainers"][0];
    assert_eq!(d["image"], "registry.example/tcpx-rxdm:9.9");
    assert_eq!(d["securityContext"]["capabilities"]["add"][0], "NET_ADMIN");
    assert!(d["securityContext"].get("privileged").is_none());
    assert_eq!(d["resources"]["requests"]["cpu"], "500m");
    assert_eq!(d["resources"]["requests"]["memory"], "1Gi");
    let args: Vec<&str> = d["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for want in ["--tenant_isolation=enforce", "--rx_pool_size=2147483648", "--uds_path=/run/tcpx-a"] {
        assert!(args.contains(&want), "{args:?}");
    }
    assert_eq!(args.iter().filter(|a| a.starts_with("--uds_path")).count(), 1, "{args:?}");
    let devices = tpl["metadata"]["annotations"]["devices.gke.io/container.tcpx-daemon"].as_str().unwrap();
    assert!(devices.contains("- path: /dev/nvidia7\n") && devices.contains("/dev/nvidiactl"), "{devices}");
    let w = &tpl["spec"]["containers"][0];
    assert_eq!(w["envFrom"][0]["configMapRef"]["name"], tcpx_rxdm::nccl::env::CONFIGMAP_NAME);
    assert!(w["volumeMounts"].as_sequence().unwrap().iter().any(|m| m["mountPath"] == "/run/tcpx-a"));

    // The default image is this build's own name and version.
    let (_, out, _) = inject(&[], JOB);
    let image = &doc(&out)["spec"]["template"]["spec"]["initContainers"][0]["image"];
    assert_eq!(image.as_str(), Some(format!("tcpx-rxdm:{}", env!("CARGO_PKG_VERSION")).as_str()));
}

#[test]
fn reads_a_file_or_stdin_and_reports_every_object() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("job.yaml");
    std::fs::write(&f, format!("{JOB}---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s\n")).unwrap();
    let (code, from_file, err) = inject(&["-f", f.to_str().unwrap()], "");
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("Job/train spec.template: injected") && err.contains("Service/s: no pod template"),
        "{err}"
    );
    let (_, from_stdin, _) = inject(&["-f", "-"], &std::fs::read_to_string(&f).unwrap());
    assert_eq!(from_file, from_stdin);
    let (code, _, err) = inject(&["-f", "/nonexistent/job.yaml"], "");
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/job.yaml"), "{err}");
}

const NO_GPU: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  template:
    spec:
      containers:
      - name: nginx
        image: nginx
";

#[test]
fn a_template_without_a_gpu_container_is_said_to_get_nothing() {
    let (code, out, err) = inject(&[], NO_GPU);
    assert_eq!(code, 0, "{err}");
    assert_eq!(doc(&out), doc(NO_GPU), "a template without GPUs changed");
    assert!(
        err.contains(
            "Deployment/web spec.template: no container requests nvidia.com/gpu; left as it is (TCPX goes \
             only to GPU containers)"
        ),
        "{err}"
    );
    assert!(err.contains("nothing was injected") && err.contains("--require-gpu"), "{err}");
    assert!(!err.contains("already injected"), "{err}");
    // No daemon went in, so no word about its image.
    assert!(!err.contains("docker build"), "{err}");

    // With a GPU Job beside it: one template has TCPX, the other is named.
    let (code, _, err) = inject(&[], &format!("{JOB}---\n{NO_GPU}"));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 pod template(s) left as they are"), "{err}");

    // --require-gpu makes it an error: exit 1, nothing written, the template named.
    let (code, out, err) = inject(&["--require-gpu"], &format!("{JOB}---\n{NO_GPU}"));
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains(
            "Deployment/web: no pod template has a container that requests nvidia.com/gpu (--require-gpu)"
        ),
        "{err}"
    );
    assert!(err.contains("nothing written"), "{err}");
    assert_eq!(inject(&["--require-gpu"], JOB).0, 0);
}

#[test]
fn already_injected_only_where_the_annotation_says_so_and_the_default_image_is_explained() {
    let (code, once, err) = inject(&[], JOB);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("Job/train spec.template: injected: "), "{err}");
    // The default image: named, with how to build and push it.
    let image = format!("tcpx-rxdm:{}", env!("CARGO_PKG_VERSION"));
    assert!(err.contains(&image) && err.contains("docker build") && err.contains("docker push"), "{err}");
    assert!(err.contains("--image="), "{err}");
    let (code, _, err) = inject(&[], &once);
    assert_eq!(code, 0);
    assert!(err.contains("Job/train spec.template: already injected"), "{err}");
    // A chosen image is not explained.
    let (_, _, err) = inject(&["--image=registry.example/tcpx-rxdm:1"], JOB);
    assert!(!err.contains("docker build"), "{err}");
    // A template that lost its GPU limit loses the injection, and says so.
    let without = once.replace("nvidia.com/gpu: 8", "cpu: 8");
    let (code, out, err) = inject(&[], &without);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("no container requests nvidia.com/gpu any more") && err.contains("injection removed"),
        "{err}"
    );
    assert!(!out.contains("tcpx-daemon"), "{out}");
}
