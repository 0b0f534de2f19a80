//! `tcpx-rxdm inject` on GKE's TCPX layouts as users deploy them today:
//! Pods that GKE multi-networking gives the GPU NICs in a network namespace
//! of their own (the reference daemon in them, its Autopilot form, a plain
//! GPU Pod), and the model recipes' daemon started by a `bash -c` script
//! that waits for a job-end file. Golden outputs (rewritten with
//! `TCPX_UPDATE_GOLDEN=1`, validated by `.ci/deploy-lint`), what each must
//! hold checked without inject's code, `--uninject`, injecting again, and
//! the webhook's answer for the same Pods.

mod webhook;

mod manifests;

use manifests::{containers, daemon_flags, docs, golden, mount_at, read, strs};
use std::path::Path;

use serde_norway::Value;
use tcpx_rxdm::config::flags::{Flags, SetupParam};
use tcpx_rxdm::host::tuning::TuningParams;
use tcpx_rxdm::inject::command::transform;
use tcpx_rxdm::inject::webhook::{review, OnError};
use tcpx_rxdm::inject::{Given, Mode, Nccl, Options, ANNOTATION, DAEMON};

/// Options as the command line gives them with only `--mode` named.
fn cli(mode: Mode) -> Options {
    Options { mode, given: Given { mode: true, ..Given::NONE }, ..Options::default() }
}

fn uninject() -> Options {
    Options { uninject: true, ..Options::default() }
}

fn named<'a>(spec: &'a Value, name: &str) -> &'a Value {
    containers(spec)
        .into_iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("{name}"))
}

fn volume<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec["volumes"].as_sequence().unwrap().iter().find(|v| v["name"].as_str() == Some(name)).unwrap()
}

/// What the daemon container of any of these Pods must be: inject's image,
/// not privileged, NET_ADMIN its only capability, the host's /sys read-only
/// and /proc/sys/net, its flags the daemon's own.
fn check_daemon(spec: &Value, mode: Mode) -> Flags {
    let all = containers(spec);
    assert!(
        all.iter().all(|c| !c["image"].as_str().unwrap_or_default().contains("tcpgpudmarxd")),
        "two daemons"
    );
    let d = named(spec, DAEMON);
    let init = spec["initContainers"].as_sequence().is_some_and(|s| s.iter().any(|c| c["name"] == DAEMON));
    assert_eq!(init, mode == Mode::NativeSidecar);
    let sc = &d["securityContext"];
    assert_eq!(sc["privileged"], Value::Bool(false), "{sc:?}");
    assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false), "{sc:?}");
    assert_eq!(strs(sc["capabilities"].get("drop")), ["ALL"]);
    assert_eq!(strs(sc["capabilities"].get("add")), ["NET_ADMIN"]);
    let sys = mount_at(d, "/hostsysfs").expect("/hostsysfs");
    assert_eq!(sys["readOnly"], Value::Bool(true));
    assert_eq!(volume(spec, sys["name"].as_str().unwrap())["hostPath"]["path"], "/sys");
    let proc = mount_at(d, "/hostprocsysfs/net").expect("/hostprocsysfs/net");
    assert_eq!(volume(spec, proc["name"].as_str().unwrap())["hostPath"]["path"], "/proc/sys/net");
    daemon_flags(d)
}

fn annotations(t: &Value) -> &Value {
    &t["metadata"]["annotations"]
}

const MULTI: [&str; 2] = ["networking.gke.io/interfaces", "networking.gke.io/default-interface"];
const DEVICES: &str = "devices.gke.io/container.tcpx-daemon";

/// GKE's current manifest and its Autopilot form: the reference daemon
/// converted, the Pod kept off the host network with its annotations, its
/// device annotation kept, its socket folder the kind it was.
#[test]
fn gkes_multi_networking_pods_are_converted_in_their_own_network_namespace() {
    for (input, mode, socket) in [
        ("gke-multinet-pod", Mode::NativeSidecar, "hostPath"),
        ("gke-multinet-pod", Mode::Sidecar, "hostPath"),
        ("gke-multinet-autopilot-pod", Mode::NativeSidecar, "emptyDir"),
    ] {
        let text = read(&format!("tests/inject/{input}.yaml"));
        let (out, report) = transform(&text, &cli(mode)).unwrap();
        golden(&format!("tests/inject/{input}.{}.yaml", mode.name()), &out);
        let (before, pod) = (&docs(&text)[0], &docs(&out)[0]);
        let spec = &pod["spec"];
        assert!(spec.get("hostNetwork").is_none() && spec.get("dnsPolicy").is_none(), "{input}: {spec:?}");
        for k in MULTI.into_iter().chain([DEVICES]) {
            assert_eq!(annotations(pod)[k], annotations(before)[k], "{input}: {k}");
        }
        let record = annotations(pod)[ANNOTATION].as_str().unwrap();
        assert!(
            record.contains("pod=shareProcessNamespace,terminationGracePeriodSeconds ")
                && !record.contains("devices"),
            "{record}"
        );
        let f = check_daemon(spec, mode);
        assert_eq!((f.gpu_nic_preset.as_str(), f.uds_path.to_str().unwrap()), ("a3vm", "/run/tcpx"));
        // The socket folder stays what it was; the workload finds it at the daemon's folder.
        let sock = volume(spec, "tcpx-socket");
        assert!(sock.get(socket).is_some(), "{input}: {sock:?}");
        if socket == "hostPath" {
            assert_eq!(sock["hostPath"]["path"], "/run/tcpx");
        }
        let w = named(spec, "nccl-test");
        assert_eq!(mount_at(w, "/run/tcpx").unwrap()["name"], "tcpx-socket");
        assert!(mount_at(w, "/tmp").is_none());
        let line = &report[0];
        for says in [
            "\n  layout: multi-networking: the daemon runs in the Pod's network namespace, where eth1–eth4 are (networking.gke.io/interfaces); no hostNetwork\n",
            "\n  converted reference daemon tcpx-daemon (flags carried: --gpu_nic_preset=a3vm --gpu_shmem_type=fd --uds_path=/run/tcpx --setup_param=--verbose 128 2 0;",
            "\n  GPUs: the Pod's own devices.gke.io/container.tcpx-daemon annotation lists every device the daemon needs; kept as it is\n",
        ] {
            assert!(line.contains(says), "{input}: {says:?} not in\n{line}");
        }
        // The Autopilot daemon's requests are kept.
        let requests = &named(spec, DAEMON)["resources"]["requests"];
        match input {
            "gke-multinet-autopilot-pod" => {
                assert_eq!((requests["cpu"].as_str(), requests["memory"].as_str()), (Some("1"), Some("2Gi")))
            }
            _ => assert!(requests.is_null(), "{requests:?}"),
        }
        assert_eq!(transform(&out, &Options { given: Given::NONE, ..cli(mode) }).unwrap().0, out, "{input}");
        let (back, report) = transform(&out, &uninject()).unwrap();
        assert_eq!(docs(&back), docs(&text), "{input} {mode:?}: --uninject");
        assert_eq!(back, transform(&text, &uninject()).unwrap().0, "{input} {mode:?}: byte for byte");
        assert!(report[0].contains("reference daemon tcpx-daemon restored"), "{report:#?}");
    }
}

/// A multi-networking GPU Pod without a daemon gets one in its namespace,
/// with inject's device annotation; a Pod with neither multi-networking nor
/// host network gets the host network, as before, and the report says which.
#[test]
fn a_plain_multi_networking_pod_gets_a_daemon_and_a_plain_pod_the_host_network() {
    let text = read("tests/inject/multinet-plain-pod.yaml");
    let (out, report) = transform(&text, &Options::default()).unwrap();
    golden("tests/inject/multinet-plain-pod.native-sidecar.yaml", &out);
    let (before, pod) = (&docs(&text)[0], &docs(&out)[0]);
    let spec = &pod["spec"];
    assert!(spec.get("hostNetwork").is_none() && spec.get("dnsPolicy").is_none(), "{spec:?}");
    for k in MULTI {
        assert_eq!(annotations(pod)[k], annotations(before)[k], "{k}");
    }
    assert!(annotations(pod)[DEVICES].as_str().unwrap().contains("- path: /dev/nvidia7\n"));
    assert!(annotations(pod)[ANNOTATION]
        .as_str()
        .unwrap()
        .contains("pod=shareProcessNamespace,terminationGracePeriodSeconds,devices"));
    assert_eq!(spec["shareProcessNamespace"], Value::Bool(true));
    let f = check_daemon(spec, Mode::NativeSidecar);
    assert_eq!(f.tenant_isolation.name(), "off", "one Pod, one tenant");
    assert!(volume(spec, "tcpx-socket").get("emptyDir").is_some());
    assert!(report[0].contains("\n  layout: multi-networking: the daemon runs in the Pod's network namespace, where eth1–eth4 are"), "{report:#?}");
    let (back, _) = transform(&out, &uninject()).unwrap();
    // Byte for byte as inject writes the Pod it was given (comments and layout aside).
    assert_eq!(back, transform(&text, &uninject()).unwrap().0);
    assert_eq!(docs(&back), docs(&text));

    // Neither: the host network, said so.
    let plain = text.replace("  annotations:\n", "  labels:\n").replace("networking.gke.io/", "x-team/");
    let (out, report) = transform(&plain, &Options::default()).unwrap();
    assert_eq!(docs(&out)[0]["spec"]["hostNetwork"], Value::Bool(true));
    assert!(report[0].contains("\n  layout: host network: the Pod has no GKE multi-networking annotations, so the daemon runs in the node's network namespace, where the GPU NICs are (hostNetwork: true added)\n"), "{report:#?}");
}

/// The recipes' daemon: `bash -c` starting the reference in the background
/// and waiting for the trainer's job-end file. Converted into inject's
/// daemon, which ends when that file appears, on the same volume.
#[test]
fn the_recipes_shell_started_daemon_keeps_its_job_end_file() {
    const FILE: &str = "/usr/share/workload/workload_terminated";
    let text = read("tests/inject/recipe-jobset.yaml");
    for mode in [Mode::NativeSidecar, Mode::Sidecar] {
        let (out, report) = transform(&text, &cli(mode)).unwrap();
        golden(&format!("tests/inject/recipe-jobset.{}.yaml", mode.name()), &out);
        let got = docs(&out);
        let templates = [
            &got[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
            &got[1]["spec"]["template"],
        ];
        for (t, line) in templates.into_iter().zip(&report) {
            let spec = &t["spec"];
            assert_eq!(spec["hostNetwork"], Value::Bool(true));
            let f = check_daemon(spec, mode);
            assert_eq!(f.shutdown_file().as_deref(), Some(Path::new(FILE)), "{mode:?}");
            assert_eq!(
                f.setup_param,
                SetupParam::Tune(TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 0 })
            );
            let d = named(spec, DAEMON);
            assert!(strs(d.get("args")).contains(&format!("--shutdown_file={FILE}")), "{d:?}");
            // The file's volume: still there, mounted by the daemon and the trainer.
            assert_eq!(mount_at(d, "/usr/share/workload").unwrap()["name"], "workload-terminated-volume");
            assert_eq!(
                mount_at(named(spec, "trainer"), "/usr/share/workload").unwrap()["name"],
                "workload-terminated-volume"
            );
            assert!(volume(spec, "workload-terminated-volume").get("emptyDir").is_some());
            for says in [
                "converted reference daemon tcpd-daemon, started by a bash -c script (flags carried: --gpu_nic_preset=a3vm --gpu_shmem_type=fd --setup_param=--verbose 128 2 0 --shutdown_file=/usr/share/workload/workload_terminated;",
                "reference daemon tcpd-daemon ran privileged: true; inject's daemon does not",
                "job end: tcpd-daemon's script waited for /usr/share/workload/workload_terminated; inject's daemon ends when it appears (--shutdown_file=/usr/share/workload/workload_terminated), volume workload-terminated-volume still mounted at /usr/share/workload",
            ] {
                assert!(line.contains(says), "{says:?} not in\n{line}");
            }
        }
        assert_eq!(transform(&out, &Options { given: Given::NONE, ..cli(mode) }).unwrap().0, out, "{mode:?}");
        let (back, _) = transform(&out, &uninject()).unwrap();
        assert_eq!(docs(&back), docs(&text), "{mode:?}: --uninject");
        assert_eq!(back, transform(&text, &uninject()).unwrap().0, "{mode:?}: byte for byte");
    }
    // With the node-wide daemon the file ends nothing; the trainer keeps its volume.
    let (out, report) = transform(&text, &Options { nccl: Nccl::File, ..cli(Mode::Node) }).unwrap();
    let spec = &docs(&out)[1]["spec"]["template"]["spec"];
    assert!(containers(spec).iter().all(|c| c["name"] != DAEMON && c["name"] != "tcpd-daemon"));
    assert!(mount_at(named(spec, "trainer"), "/usr/share/workload").is_some());
    assert!(report[1].contains("job end: tcpd-daemon's script waited for /usr/share/workload/workload_terminated; the node-wide daemon does not end with a job"), "{report:#?}");
    assert!(!report[1].contains("inject's daemon does not"), "{report:#?}");
}

/// A script of another shape is refused as a shell script: what inject
/// reads and what to do, never a flag it is not.
#[test]
fn a_script_inject_cannot_read_is_refused_as_one() {
    let text = read("tests/inject/recipe-jobset.yaml");
    for (from, to, says) in [
        ("sleep 10; echo \"sleeping\"; done", "sleep 10; done; kill %1", "more follows the loop"),
        ("--setup_param \"--verbose 128 2 0\" &", "--setup_param \"$SETUP\" &", "holds `$` or a backquote"),
        ("while [ ! -e", "until [ ! -e", "holds no `while [ ! -e FILE ]; do …; done` loop"),
        (
            "\"/usr/share/workload/workload_terminated\" ]",
            "\"/var/done\" ]",
            "waits for /var/done, which is on none of its volumes",
        ),
    ] {
        let bad = text.replacen(from, to, 1);
        assert_ne!(bad, text, "{from}");
        let e = transform(&bad, &Options::default()).unwrap_err().to_string();
        assert!(e.starts_with("JobSet/recipe-train: spec.replicatedJobs[workers].template.spec.template.spec.containers[tcpd-daemon]."), "{e}");
        assert!(e.contains(says) && !e.contains("--c"), "{says:?}: {e}");
        if !says.contains("none of its volumes") {
            assert!(
                e.contains(
                    "reference daemon tcpd-daemon is started by a shell script, which inject cannot read"
                ),
                "{e}"
            );
            assert!(e.contains("replace the script with the daemon's command line (command and args), or convert this container by hand"), "{e}");
        }
    }
}

/// Whatever the image, a container without GPUs whose script names the
/// reference is taken for a daemon (refused where unreadable, so that a Pod
/// never runs two); a GPU container's script that names it is the workload's.
#[test]
fn a_script_naming_the_reference_is_a_daemon_only_outside_gpu_containers() {
    let pod = |extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n  - name: trainer\n    \
             image: t\n    command: [bash, -c, 'pgrep tcpgpudmarxd && python train.py']\n    \
             resources: {{limits: {{nvidia.com/gpu: 8}}}}\n{extra}"
        )
    };
    let (out, _) = transform(&pod(""), &Options::default()).unwrap();
    assert!(out.contains("pgrep tcpgpudmarxd"), "the workload's script is left as it is");
    let helper = "  - name: rxdm\n    image: busybox\n    command: [sh, -c, 'tcpgpudmarxd --uds_path /run/tcpx | tee /log']\n";
    let e = transform(&pod(helper), &Options::default()).unwrap_err().to_string();
    assert!(
        e.starts_with("Pod/p: spec.containers[rxdm].command: reference daemon rxdm is started by a shell script, which inject cannot read: it holds `|`"),
        "{e}"
    );
    // Readable, it is converted whatever its image.
    let readable = "  - name: rxdm\n    image: busybox\n    command: [sh, -c, 'exec tcpgpudmarxd --rx_pool_size 1073741824']\n";
    let (out, report) = transform(&pod(readable), &Options::default()).unwrap();
    assert!(report[0].contains("converted reference daemon rxdm, started by a sh -c script (flags carried: --rx_pool_size=1073741824;"), "{report:#?}");
    assert!(!out.contains("name: rxdm\n"), "{out}");
}

/// The job-end file must be on a volume the Pod has, at a path inject's
/// daemon leaves free.
#[test]
fn a_job_end_file_inject_cannot_keep_is_refused_naming_the_volume() {
    let text = read("tests/inject/recipe-jobset.yaml");
    let job = text.split("---\n").nth(1).unwrap();
    let at = "Job/recipe-train-single: spec.template.spec.containers[tcpd-daemon].volumeMounts: ";
    for (from, to, says) in [
        (
            "        - name: workload-terminated-volume\n          emptyDir: {}\n",
            "",
            "reference daemon tcpd-daemon: its script waits for /usr/share/workload/workload_terminated on \
             volume workload-terminated-volume, which the Pod does not have; add the volume (the workload \
             creates the file there)",
        ),
        (
            "/usr/share/workload/workload_terminated\" ]",
            "/usr/local/nvidia/lib64/done\" ]",
            "reference daemon tcpd-daemon: its script waits for /usr/local/nvidia/lib64/done on volume \
             nvidia-install-dir-host at /usr/local/nvidia/lib64, where inject's daemon mounts tcpx-libraries \
             (its own); mount that volume elsewhere in both containers, or convert this container by hand",
        ),
    ] {
        let bad = job.replacen(from, to, 1);
        assert_ne!(bad, job, "{from}");
        let e = transform(&bad, &Options::default()).unwrap_err().to_string();
        assert_eq!(e, format!("{at}{says}"));
    }
}

/// The webhook's answer for each Pod is the command's output.
#[test]
fn the_webhook_gives_the_commands_result() {
    for input in ["gke-multinet-pod", "gke-multinet-autopilot-pod", "multinet-plain-pod"] {
        let text = read(&format!("tests/inject/{input}.yaml"));
        let pod: serde_json::Value = serde_norway::from_str(&text).unwrap();
        let body = webhook::review_of("u", &pod, "CREATE");
        let answer = review(&body, &Options::default(), OnError::Refuse).unwrap();
        let response = &answer["response"];
        assert_eq!(response["allowed"], true, "{input}: {answer}");
        let patch = webhook::base64_decode(response["patch"].as_str().unwrap());
        let mut patched = pod.clone();
        webhook::apply_patch(&mut patched, &serde_json::from_slice(&patch).unwrap());
        // The command on the Pod the API server sent (the same values, in the same order).
        let sent = serde_norway::to_string(&pod).unwrap();
        let cli: serde_json::Value =
            serde_norway::from_str(&transform(&sent, &Options::default()).unwrap().0).unwrap();
        assert_eq!(patched, cli, "{input}");
        assert!(patched["spec"].get("hostNetwork").is_none(), "{input}");
    }
}
