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
            "Job/train: spec.template.spec.hostNetwork: false, and the Pod has no GKE multi-networking \
             (networking.gke.io/interfaces): its own network namespace holds no GPU NIC",
        ),
        (
            job_with("      hostNetwork: false\n", ""),
            "Remove the field or set it true (the daemon then runs in the node's network namespace), or give \
             the Pod the GPU NICs through networking.gke.io/interfaces",
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
    for kind in ["CronJob", "JobSet", "PyTorchJob", "MPIJob", "TrainingRuntime", "--uninject", "--privileged"]
    {
        assert!(out.contains(kind), "--help does not mention {kind}");
    }
}

#[test]
fn options_reach_the_daemon_container_and_the_pod() {
    let args = [
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
    let sc = &d["securityContext"];
    assert_eq!(sc["capabilities"]["add"][0], "NET_ADMIN");
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert_eq!(sc["privileged"], Value::Bool(false));
    assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false));
    assert_eq!(sc["readOnlyRootFilesystem"], Value::Bool(true));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
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

/// The documents of a YAML stream.
fn docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn several_files_a_folder_and_stdin_are_read_in_order_as_kubectl_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("more")).unwrap();
    std::fs::write(d.join("b-web.yml"), NO_GPU).unwrap();
    std::fs::write(d.join("a-train.yaml"), JOB).unwrap();
    std::fs::write(d.join("README.md"), "not a manifest").unwrap();
    std::fs::write(
        d.join("more/svc.json"),
        r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}"#,
    )
    .unwrap();
    let p = |f: &str| d.join(f).display().to_string();
    let kinds = |out: &str| -> Vec<String> {
        docs(out).iter().map(|v| v["kind"].as_str().unwrap().to_string()).collect()
    };
    // Two -f: both, in the order given, one stream.
    let (code, out, err) = inject(&["-f", &p("b-web.yml"), "-f", &p("a-train.yaml")], "");
    assert_eq!(code, 0, "{err}");
    assert_eq!(kinds(&out), ["Deployment", "Job"]);
    assert!(out.contains("\n---\n"), "{out}");
    // A folder: its manifests in name order; its subfolders with -R.
    let (code, out, err) = inject(&["-f", &p("")], "");
    assert_eq!((code, kinds(&out)), (0, vec!["Job".to_string(), "Deployment".to_string()]), "{err}");
    let (_, out, _) = inject(&["-R", "-f", &p("")], "");
    assert_eq!(kinds(&out), ["Job", "Deployment", "Service"]);
    // `-` is stdin, among files.
    let (code, out, err) = inject(&["-f", &p("b-web.yml"), "-f", "-"], JOB);
    assert_eq!((code, kinds(&out)), (0, vec!["Deployment".to_string(), "Job".to_string()]), "{err}");
    // What cannot be read is named, and nothing is written.
    for (args, code, says) in [
        (
            vec!["-f".to_string(), p("a-train.yaml"), "-f".into(), p("missing.yaml")],
            1,
            "missing.yaml: no such file or folder",
        ),
        (vec!["-f".into(), p("more/empty")], 1, "no such file or folder"),
        (vec!["-f".into(), "-".into(), "-f".into(), "-".into()], 2, "-f -: stdin is given twice"),
        (
            vec!["-f".into(), "https://example.com/job.yaml".into()],
            2,
            "curl -fsSL https://example.com/job.yaml | tcpx-rxdm inject -f -",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (got, out, err) = inject(&args, "");
        assert_eq!((got, out.as_str()), (code, ""), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    std::fs::create_dir(d.join("empty")).unwrap();
    let (code, _, err) = inject(&["-f", &p("empty")], "");
    assert_eq!(code, 1);
    assert!(
        err.contains("a folder with no .yaml, .yml or .json file (-R reads its subfolders too)"),
        "{err}"
    );
    // A refusal in the second file names it.
    std::fs::write(d.join("more/bad.yaml"), job_with("      hostNetwork: false\n", "")).unwrap();
    let (code, out, err) = inject(&["-f", &p("a-train.yaml"), "-f", &p("more/bad.yaml")], "");
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(
        err.contains(&format!("{}: Job/train: spec.template.spec.hostNetwork: false", p("more/bad.yaml"))),
        "{err}"
    );
}

#[test]
fn inject_checks_its_own_values_and_the_daemons_flags_naming_each() {
    for (args, says) in [
        (&["--image="][..], "invalid value '' for '--image <IMAGE>': empty; name the daemon's image"),
        (&["--image=Registry/TCPX:1"][..], "the repository Registry/TCPX holds 'R'"),
        (&["--daemon-memory=1GB"][..], "invalid value '1GB' for '--daemon-memory <QUANTITY>': not a Kubernetes quantity (bytes take no B); did you mean 1Gi (binary, 1024-based) or 1G (decimal)?"),
        (&["--daemon-cpu=lots"][..], "invalid value 'lots' for '--daemon-cpu <QUANTITY>': not a Kubernetes quantity of CPU"),
        (&["--log_level=verbose"][..], "invalid value 'verbose' for '--log_level"),
        (&["--log_level=info,tcpx_rxdm=debug", "--mode=sidecar"][..], "invalid value 'info,tcpx_rxdm=debug' for '--log_level"),
        (&["--show_version"][..], "--show_version: prints the version and exits"),
        (&["--takeover"][..], "--takeover: an upgrade hands a running daemon's NICs"),
        (&["--after_handover=wait"][..], "--after_handover: an upgrade"),
        (&["--monitor_shutdown"][..], "--monitor_shutdown: a native sidecar that exits is started again by the kubelet"),
        (&["--gpu_nic_preset=manual", "--nccl=file"][..], "--gpu_nic_preset=manual needs --gpu_nic_topology or --gpu_nic_topology_proto"),
        (&["--gpu_nic_preset=/etc/tcpx/a.textproto"][..], "a preset file is read on the node, so inject cannot write the NCCL settings for it"),
        (&["serve", "--on-error=allow", "--log_level=loud"][..], "invalid value 'loud' for '--log_level"),
    ] {
        let (code, out, err) = inject(args, JOB);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: want {says:?}, got {err}");
    }
    // Good values of the same: taken, `warning` written as the daemon names it, a
    // preset file kept for the node.
    let (code, out, err) = inject(
        &[
            "--daemon-memory=1Gi",
            "--daemon-cpu=0.5",
            "--log_level=warning",
            "--nccl=file",
            "--gpu_nic_preset=/etc/tcpx/a.textproto",
        ],
        JOB,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("- --gpu_nic_preset=/etc/tcpx/a.textproto") && out.contains("- --log_level=warn\n"),
        "{out}"
    );
}

#[test]
fn the_report_says_what_was_added_beyond_the_daemon_container() {
    let (code, _, err) = inject(&["--image=registry.example/tcpx-rxdm:1"], JOB);
    assert_eq!(code, 0, "{err}");
    for says in [
        "Job/train spec.template: injected: native-sidecar (inline nccl, 1 GPU container)\n",
        "\n  pod: set hostNetwork: true, dnsPolicy: ClusterFirstWithHostNet, shareProcessNamespace: true, terminationGracePeriodSeconds: 60\n",
        "\n  daemon: init container tcpx-daemon (restartPolicy: Always), image registry.example/tcpx-rxdm:1, not privileged: capability NET_ADMIN only, a read-only root, seccomp RuntimeDefault, the GPUs through GKE's device annotation; startupProbe GET /readyz on port 9467, livenessProbe GET /healthz\n",
        "\n  volumes: tcpx-libraries (host /home/kubernetes/bin/nvidia/lib64), tcpx-sys (host /sys), tcpx-proc-sys (host /proc/sys/net), tcpx-socket (emptyDir)\n",
        "\n  trainer: env LD_LIBRARY_PATH, 22 NCCL variables; mounts /usr/local/nvidia/lib64 (read-only), /run/tcpx\n",
    ] {
        assert!(err.contains(says), "{says:?} not in\n{err}");
    }
    let (_, _, err) = inject(&["--privileged", "--mode=sidecar", "--metrics_address=127.0.0.1:9999"], JOB);
    assert!(
        err.contains("injected: sidecar (inline nccl, 1 GPU container, privileged daemon (--privileged))"),
        "{err}"
    );
    assert!(
        err.contains("spec.template: --privileged: the daemon runs privileged: true, with every capability"),
        "{err}"
    );
    assert!(err.contains("privileged: true (--privileged); readinessProbe runs `tcpx-rxdm status mine` in the container (the daemon's HTTP address 127.0.0.1:9999 is loopback, which the kubelet cannot reach); no livenessProbe"), "{err}");
    // What --uninject took out, line by line.
    let (_, once, _) = inject(&[], JOB);
    let (code, _, err) = inject(&["--uninject"], &once);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("Job/train spec.template: removed (0.1.0 native-sidecar injection)\n  daemon: container tcpx-daemon removed\n  pod: removed hostNetwork, dnsPolicy, shareProcessNamespace, terminationGracePeriodSeconds (each while it held inject's value)\n  volumes removed: tcpx-libraries, tcpx-sys, tcpx-proc-sys, tcpx-socket\n  trainer: inject's variables and mounts removed"), "{err}");
}

const MIXED_JOBSET: &str = "\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: mixed
spec:
  replicatedJobs:
  - name: coordinator
    template:
      spec:
        template:
          spec:
            containers:
            - name: coordinator
              image: python:3.12-slim
  - name: workers
    template:
      spec:
        template:
          spec:
            containers:
            - name: trainer
              image: nvcr.io/nvidia/pytorch:24.05-py3
              resources:
                limits:
                  nvidia.com/gpu: 8
";

#[test]
fn require_gpu_takes_a_jobset_with_a_cpu_coordinator_and_refuses_an_object_with_no_gpu_at_all() {
    let (code, out, err) = inject(&["--require-gpu"], MIXED_JOBSET);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "[coordinator].template.spec.template: no container requests nvidia.com/gpu; left as it is"
        ),
        "{err}"
    );
    assert!(!err.contains("nvidia.com/gpu: 8"), "no advice to give the coordinator GPUs: {err}");
    assert_eq!(
        docs(&out)[0]["spec"]["replicatedJobs"][0],
        docs(MIXED_JOBSET)[0]["spec"]["replicatedJobs"][0]
    );
    let (code, out, err) = inject(&["--require-gpu"], &format!("{MIXED_JOBSET}---\n{NO_GPU}"));
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.contains("Deployment/web: no pod template has a container that requests nvidia.com/gpu (--require-gpu); nothing written"), "{err}");
    // The node-wide daemon's own DaemonSet is no workload: nothing to inject, not an error.
    let ds =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes/daemonset.yaml"))
            .unwrap();
    let (code, _, err) = inject(&["--require-gpu"], &ds);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("runs a TCPX daemon itself (container tcpx-daemon)")
            && err.contains("inject --mode=node"),
        "{err}"
    );
    assert!(!err.contains("nothing was injected"), "{err}");
}

#[test]
fn injecting_again_keeps_the_recorded_mode_unless_mode_is_given() {
    let (_, sidecar, _) =
        inject(&["--mode=sidecar", "--nccl=file", "--image=registry.example/tcpx-rxdm:1"], JOB);
    let (code, again, err) = inject(&[], &sidecar);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again, sidecar);
    assert!(err.contains("Job/train spec.template: already injected (0.1.0, sidecar); unchanged"), "{err}");
    assert!(!err.contains("docker build"), "the image was chosen the first time: {err}");
    let (code, native, err) = inject(&["--mode=native-sidecar"], &sidecar);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("updated from 0.1.0 sidecar: native-sidecar (file nccl, 1 GPU container); mode sidecar → native-sidecar (--mode)"), "{err}");
    assert_eq!(
        doc(&native)["spec"]["template"]["spec"]["initContainers"][0]["image"],
        "registry.example/tcpx-rxdm:1"
    );
    // One request given again changes that one; the other stays.
    let (_, sized, _) = inject(&["--daemon-cpu=1", "--daemon-memory=1Gi"], JOB);
    let (code, resized, err) = inject(&["--daemon-cpu=2"], &sized);
    assert_eq!(code, 0, "{err}");
    let requests = &doc(&resized)["spec"]["template"]["spec"]["initContainers"][0]["resources"]["requests"];
    assert_eq!((requests["cpu"].as_str(), requests["memory"].as_str()), (Some("2"), Some("1Gi")));
}

/// A multi-networking Pod inject cannot write a daemon for is refused,
/// naming the annotation or field and what to do.
#[test]
fn gke_multi_networking_that_cannot_work_is_refused_saying_why() {
    let with = |annotations: &str, pod: &str| {
        JOB.replace(
            "  template:\n    spec:\n",
            &format!("  template:\n    metadata:\n      annotations:\n{annotations}    spec:\n{pod}"),
        )
    };
    let nics = |names: &[&str]| {
        let items: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{{\"interfaceName\":\"{n}\",\"network\":\"n{i}\"}}"))
            .collect();
        format!("        networking.gke.io/interfaces: '[{}]'\n", items.join(","))
    };
    let all = nics(&["eth0", "eth1", "eth2", "eth3", "eth4"]);
    let at = "Job/train: spec.template.";
    let short = "        devices.gke.io/container.tcpx-daemon: \"- path: /dev/nvidia0\\n\"\n";
    for (args, input, says) in [
        (
            &[][..],
            with("        networking.gke.io/default-interface: eth0\n", ""),
            "metadata.annotations[networking.gke.io/default-interface]: set without \
             networking.gke.io/interfaces, which gives the Pod its GPU NICs; add it, or remove this annotation",
        ),
        (
            &[],
            with(&all, "      hostNetwork: true\n"),
            "spec.hostNetwork: true, beside GKE multi-networking (networking.gke.io/interfaces), which gives a \
             Pod interfaces of its own network namespace and none on the host network; remove hostNetwork",
        ),
        (
            &["--mode=node"],
            with(&all, ""),
            "metadata.annotations[networking.gke.io/interfaces]: GKE multi-networking puts the GPU NICs in the \
             Pod's own network namespace, where the node-wide daemon (--mode=node) cannot reach them; use \
             --mode=native-sidecar or --mode=sidecar",
        ),
        (&[], with("        networking.gke.io/interfaces: eth1\n", ""), "\"eth1\" is not a JSON list of {\"interfaceName\""),
        (&[], with(&nics(&["eth0"]), ""), "gives the Pod no interface beside its default one (eth0), so no GPU NIC"),
        (&[], with(&nics(&["eth0", "eth1", "eth1"]), ""), "names eth1 twice"),
        (
            &[],
            with(&nics(&["eth0", "eth1", "eth2"]), ""),
            "metadata.annotations[networking.gke.io/interfaces]: gives the Pod eth1, eth2, but the daemon's NICs \
             (--gpu_nic_preset=a3vm) include eth3, eth4, which it would not find in the Pod's network namespace",
        ),
        (
            &[],
            with(&format!("{all}{short}"), ""),
            "metadata.annotations[devices.gke.io/container.tcpx-daemon]: lists no /dev/nvidia1, /dev/nvidia2",
        ),
    ] {
        let (code, out, err) = inject(args, &input);
        assert_eq!((code, out.as_str()), (1, ""), "{says}: {err}");
        let field = says.starts_with("metadata") || says.starts_with("spec");
        let want = if field { format!("{at}{says}") } else { says.to_string() };
        assert!(err.contains(&want), "want {want:?}, got {err}");
    }
    // The same Pod with every interface and device: injected, kept off the host network.
    let (code, out, err) = inject(&[], &with(&all, ""));
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("hostNetwork"), "{out}");
    assert!(
        err.contains(
            "layout: multi-networking: the daemon runs in the Pod's network namespace, where eth1–eth4 are"
        ),
        "{err}"
    );
    // With --privileged a short device annotation is the Pod's business.
    assert_eq!(inject(&["--privileged"], &with(&format!("{all}{short}"), "")).0, 0);
}

#[test]
fn a_bare_file_an_empty_input_and_a_daemon_without_gpus_are_said_plainly() {
    let (code, out, err) = inject(&["job.yaml"], "");
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.contains("job.yaml: input files go after -f, as with kubectl (`tcpx-rxdm inject -f job.yaml`)"),
        "{err}"
    );
    let (code, _, err) = inject(&["sreve"], "");
    assert_eq!(code, 2);
    assert!(err.contains("no command sreve (inject has one: serve)"), "{err}");
    let (code, out, err) = inject(&[], "# nothing here\n");
    assert_eq!((code, out.as_str()), (0, ""));
    assert!(err.contains("stdin: no Kubernetes documents; nothing written"), "{err}");
    // A hand-written daemon beside a workload that asks for no GPU: nothing
    // wired, and the reason is the workload's missing request.
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: rxdm\n    \
               image: registry.example/tcpx-rxdm:1\n  - name: trainer\n    image: t\n";
    let (code, out, err) = inject(&[], pod);
    assert_eq!(code, 0, "{err}");
    assert_eq!(docs(&out), docs(pod));
    assert!(err.contains("Pod/p: runs a TCPX daemon (container rxdm), but no container requests nvidia.com/gpu; left as it is. The container that runs NCCL must request GPUs"), "{err}");
}

/// `--unprivileged`, which scripts from before least privilege pass, still
/// works and changes nothing (it is the default now); with `--privileged`
/// it is a usage error naming both.
#[test]
fn the_old_unprivileged_flag_is_the_default_and_conflicts_with_privileged() {
    let (code, plain, _) = inject(&[], JOB);
    let (old_code, old, _) = inject(&["--unprivileged"], JOB);
    assert_eq!((code, old_code), (0, 0));
    assert_eq!(old, plain);
    assert!(plain.contains("privileged: false"), "{plain}");
    let (code, _, err) = inject(&["--unprivileged", "--privileged"], JOB);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--unprivileged") && err.contains("--privileged"), "{err}");
}
