//! Structure from fuzz bytes: each byte is a choice (which field, which
//! value from a list of telling ones), so that mutating a byte changes one
//! decision of a well-formed manifest instead of breaking its syntax. The
//! lists hold what the code under test looks for (its volume names, mount
//! paths, variables, the reference daemon) besides ordinary values.

use serde_json::{json, Map, Value};

use crate::inject::{Mode, Nccl, Options, ANNOTATION, DAEMON, LIBRARIES, VERSION};
use crate::nccl::env::{CONFIGMAP_NAME, UNIX_CLIENT_PREFIX};

/// Volume names inject reserves, and others.
const VOLUMES: [&str; 5] = ["tcpx-libraries", "tcpx-socket", "tcpx-sys", "data", "shm"];
/// GKE's device annotation for the daemon container (without `--privileged`).
const DEVICES: &str = "devices.gke.io/container.tcpx-daemon";
/// GKE multi-networking's annotations, and values for the interface list.
const INTERFACES: &str = "networking.gke.io/interfaces";
const NICS: [&str; 4] = [
    r#"[{"interfaceName":"eth0","network":"default"},{"interfaceName":"eth1","network":"vpc1"},{"interfaceName":"eth2","network":"vpc2"},{"interfaceName":"eth3","network":"vpc3"},{"interfaceName":"eth4","network":"vpc4"}]"#,
    r#"[{"interfaceName":"eth0","network":"default"},{"interfaceName":"eth1","network":"vpc1"}]"#,
    r#"[{"interfaceName":"eth0","network":"default"}]"#,
    "[{",
];
/// Shell scripts as a daemon container may run them (`bash -c`): the
/// recipes' form, its variations, and some inject refuses.
const SCRIPTS: [&str; 6] = [
    "/tcpgpudmarxd/build/app/tcpgpudmarxd --gpu_nic_preset a3vm --gpu_shmem_type fd --setup_param \"--verbose 128 2 0\" &\nwhile [ ! -e \"/data/done\" ]; do sleep 10; echo \"sleeping\"; done\n",
    "exec tcpgpudmarxd --uds_path /run/tcpx",
    "tcpx-rxdm --rx_pool_size=1073741824 & until [ -e /run/tcpx/done ]; do :; done",
    "tcpgpudmarxd & while [ ! -e /nowhere/done ]; do sleep 1; done",
    "tcpgpudmarxd | tee /log & while [ ! -e /data/done ]; do sleep 1; done",
    "python train.py; touch /data/done",
];

/// Variables of the NCCL plugin that `--nccl=inline` sets.
const NCCL_VARS: [&str; 4] =
    ["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "NCCL_GPUDIRECTTCPX_CTRL_DEV", "NCCL_ALGO", "NCCL_PROTO"];

/// Choices read from fuzz bytes, zeros once they run out.
pub struct Bytes<'a> {
    data: &'a [u8],
    /// Whether GKE's multi-networking annotations and shell-started daemons
    /// are among the choices. Without, no byte goes to them, so that inputs
    /// built before they were keep building the same documents.
    pub gke: bool,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, gke: false }
    }

    /// With GKE's multi-networking annotations and shell scripts among the choices.
    pub fn with_gke(data: &'a [u8]) -> Self {
        Bytes { data, gke: true }
    }

    pub fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.data.split_first() else { return 0 };
        self.data = rest;
        b
    }

    /// A number below `n` (> 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::from(self.byte()) % n
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    /// Text of up to 31 bytes taken from the input as it is.
    pub fn text(&mut self) -> String {
        let n = self.below(32).min(self.data.len());
        let (t, rest) = self.data.split_at(n);
        self.data = rest;
        String::from_utf8_lossy(t).into_owned()
    }
}

/// Inject's options from one byte: mode, NCCL source, `--privileged`, and
/// one of a few daemon flag sets (the remaining quotient, for the caller).
pub fn options(b: u8) -> (Options, u8) {
    let mut o = Options {
        mode: [Mode::NativeSidecar, Mode::Sidecar, Mode::Node][usize::from(b % 3)],
        nccl: [Nccl::Inline, Nccl::ConfigMap, Nccl::File][usize::from(b / 3 % 3)],
        privileged: b / 9 % 2 == 1,
        ..Options::default()
    };
    let flags: &[&str] = match b / 18 % 4 {
        0 => &[],
        1 => &["--uds_path=/run/tcpx-job"],
        2 => &["--tenant_isolation=enforce", "--rx_pool_size=1073741824"],
        _ => &["--gpu_nic_preset=a3vm", "--setup_param=--verbose 64 1 1"],
    };
    o.daemon_flags = flags.iter().map(|f| f.to_string()).collect();
    (o, b / 72)
}

/// A value from `items`, or (one time in 16) text from the input.
fn word(b: &mut Bytes, items: &[&str]) -> Value {
    match b.below(16) {
        0 => Value::String(b.text()),
        _ => Value::String(b.pick(items).to_string()),
    }
}

/// A scalar of the kinds YAML and JSON manifests hold in odd places.
fn odd(b: &mut Bytes) -> Value {
    b.pick(&[json!(null), json!(true), json!(false), json!(0), json!("x"), json!([]), json!({}), json!(-1)])
}

/// `metadata`: a name, perhaps a namespace, annotations (a record of an
/// injection, valid or not, and GKE's device annotation among them).
fn metadata(b: &mut Bytes) -> Value {
    let mut m = Map::new();
    let key = b.pick(&["name", "generateName"]);
    m.insert(key.into(), word(b, &["train", "train-", "p", "w/x"]));
    if b.below(3) == 0 {
        m.insert("namespace".into(), word(b, &["ml", "default"]));
    }
    let mut ann = Map::new();
    for _ in 0..b.below(4) {
        match b.below(4) {
            0 => drop(ann.insert(ANNOTATION.into(), record(b))),
            1 if b.gke => {
                drop(ann.insert(DEVICES.into(), word(b, &["- path: /dev/nvidia0\n", "", &devices()])))
            }
            1 => drop(ann.insert(DEVICES.into(), word(b, &["- path: /dev/nvidia0\n", ""]))),
            2 if b.gke => {
                ann.insert(INTERFACES.into(), word(b, &NICS));
                if b.below(2) == 0 {
                    ann.insert("networking.gke.io/default-interface".into(), word(b, &["eth0", "eth1"]));
                }
            }
            _ => drop(ann.insert(b.pick(&["team", "x/y"]).into(), word(b, &["a", ""]))),
        }
    }
    if !ann.is_empty() || b.below(8) == 0 {
        m.insert("annotations".into(), Value::Object(ann));
    }
    Value::Object(m)
}

/// GKE's device annotation listing every device the daemon needs.
fn devices() -> String {
    let mut v: String = (0..8).map(|i| format!("- path: /dev/nvidia{i}\n")).collect();
    v.push_str("- path: /dev/nvidiactl\n- path: /dev/nvidia-uvm\n");
    v
}

/// An injection record: a well-formed one (any version, mode, fields) or not.
fn record(b: &mut Bytes) -> Value {
    if b.below(6) == 0 {
        return word(b, &["", "version=1", "mode=node nccl=file", "version=0.1 mode=x nccl=file"]);
    }
    let mut text = format!(
        "version={} mode={} nccl={}",
        b.pick(&[VERSION, "0.1.0"]),
        b.pick(&Mode::NAMES),
        b.pick(&Nccl::NAMES)
    );
    let pod = ["hostNetwork", "dnsPolicy", "dnsPolicy:ClusterFirst", "shareProcessNamespace", "devices"];
    let kept = ["trainer:LD_LIBRARY_PATH", "trainer:envFrom", "c:NCCL_SOCKET_IFNAME"];
    for (key, items) in [("pod", &pod[..]), ("kept", &kept[..])] {
        let n = b.below(4);
        if n > 0 {
            let chosen: Vec<&str> = (0..n).map(|_| b.pick(items)).collect();
            text.push_str(&format!(" {key}={}", chosen.join(",")));
        }
    }
    Value::String(text)
}

/// A container: a GPU workload, the reference daemon, one named like ours, or other.
fn container(b: &mut Bytes) -> Value {
    if b.below(24) == 0 {
        return odd(b);
    }
    let mut c = Map::new();
    c.insert("name".into(), word(b, &["trainer", "worker", "c", DAEMON, "tcpgpudmarxd"]));
    let image =
        ["pytorch:24", "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/tcpgpudmarxd-dev:v2.0.9", "busybox"];
    c.insert("image".into(), word(b, &image));
    if b.gke && b.below(6) == 0 {
        // A shell script: one of the list, now and then with input text after it.
        let mut script = b.pick(&SCRIPTS).to_string();
        if b.below(4) == 0 {
            script.push_str(&b.text());
        }
        let argv = json!([b.pick(&["bash", "/bin/sh"]), "-c", script]);
        c.insert(b.pick(&["command", "args"]).into(), argv);
    } else if b.below(4) == 0 {
        let bins = ["/tcpgpudmarxd/build/app/tcpgpudmarxd", "/bin/sh", "tcpgpudmarxd"];
        let mut argv = vec![json!(b.pick(&bins))];
        for _ in 0..b.below(4) {
            let flags = [
                "--gpu_nic_preset=a3vm",
                "--gpu_shmem_type=fd",
                "--uds_path=/run/tcpx",
                "--setup_param=\\\"--verbose 128 2 0 \\\"",
                "--rx_pool_size=1073741824",
                "--unknown_flag=1",
                "-c",
            ];
            argv.push(word(b, &flags));
        }
        c.insert(b.pick(&["command", "args"]).into(), Value::Array(argv));
    }
    if b.below(4) != 0 {
        let gpus = b.pick(&[
            json!("8"),
            json!(8),
            json!("0"),
            json!(1),
            json!("x"),
            json!(-1),
            json!(0.5),
            json!("1e3"),
        ]);
        let mut res = Map::new();
        res.insert(b.pick(&["limits", "requests"]).into(), json!({ "nvidia.com/gpu": gpus }));
        c.insert("resources".into(), Value::Object(res));
    }
    if b.below(3) == 0 {
        let mut env = Vec::new();
        for _ in 0..b.below(4) {
            env.push(env_var(b));
        }
        c.insert("env".into(), Value::Array(env));
    }
    if b.below(5) == 0 {
        let from = b.pick(&[CONFIGMAP_NAME, "other"]);
        c.insert("envFrom".into(), json!([{ "configMapRef": { "name": from } }]));
    }
    if b.below(3) == 0 {
        let mut mounts = Vec::new();
        for _ in 0..b.below(3) {
            let paths =
                ["/run/tcpx", LIBRARIES, "/data", "/run/tcpx-health", "/dev/shm", "/hostsysfs", "/tmp"];
            let paths = if b.gke { &paths[..] } else { &paths[..6] };
            mounts.push(json!({ "name": word(b, &VOLUMES), "mountPath": word(b, paths) }));
        }
        c.insert("volumeMounts".into(), Value::Array(mounts));
    }
    if b.below(10) == 0 {
        c.insert("restartPolicy".into(), word(b, &["Always", "Never"]));
    }
    Value::Object(c)
}

/// One `env` entry: inject's own variables (with its value or another), or other.
fn env_var(b: &mut Bytes) -> Value {
    let name = match b.below(4) {
        0 => "LD_LIBRARY_PATH",
        1 => UNIX_CLIENT_PREFIX,
        2 => b.pick(&NCCL_VARS),
        _ => b.pick(&["FOO", "NCCL_DEBUG", "PATH"]),
    };
    let value = match b.below(4) {
        0 => json!(LIBRARIES),
        1 => json!(format!("/usr/lib:{LIBRARIES}")),
        2 => json!("/run/tcpx"),
        _ => word(b, &["1", "eth1,eth2,eth3,eth4", "eth0", "Ring", "Simple", ""]),
    };
    match b.below(8) {
        0 => json!({ "name": name, "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }),
        _ => json!({ "name": name, "value": value }),
    }
}

/// A pod template: `{metadata, spec}` (the spec, rarely, not a mapping).
pub fn template(b: &mut Bytes) -> Value {
    let mut t = Map::new();
    t.insert("metadata".into(), metadata(b));
    if b.below(32) == 0 {
        t.insert("spec".into(), odd(b));
        return Value::Object(t);
    }
    let mut spec = Map::new();
    let fields: [(&str, &[Value]); 5] = [
        ("hostNetwork", &[json!(true), json!(false), json!("true"), json!(null)]),
        ("dnsPolicy", &[json!("ClusterFirst"), json!("Default"), json!("ClusterFirstWithHostNet")]),
        ("hostPID", &[json!(true), json!(false)]),
        ("shareProcessNamespace", &[json!(true), json!(false)]),
        ("terminationGracePeriodSeconds", &[json!(30), json!(60), json!("x")]),
    ];
    for (key, values) in fields {
        if b.below(3) == 0 {
            spec.insert(key.into(), b.pick(values));
        }
    }
    if b.below(3) == 0 {
        let mut vols = Vec::new();
        for _ in 0..b.below(3) {
            let name = word(b, &VOLUMES);
            vols.push(match if b.gke { b.below(4) } else { 3 } {
                0 => json!({ "name": name, "hostPath": { "path": "/run/tcpx" } }),
                1 => json!({ "name": name, "emptyDir": null }),
                _ => json!({ "name": name, "emptyDir": {} }),
            });
        }
        spec.insert("volumes".into(), Value::Array(vols));
    }
    for (list, most) in [("initContainers", 2), ("containers", 3)] {
        match b.below(12) {
            0 => drop(spec.insert(list.into(), odd(b))),
            n if n < 4 && list == "initContainers" => {}
            _ => {
                let cs = (0..=b.below(most)).map(|_| container(b)).collect();
                spec.insert(list.into(), Value::Array(cs));
            }
        }
    }
    t.insert("spec".into(), Value::Object(spec));
    Value::Object(t)
}

/// A Pod as the API server sends it to the webhook: with its metadata.
pub fn pod(b: &mut Bytes) -> Value {
    let mut p = template(b);
    let m = p.as_object_mut().expect("a template is a mapping");
    m.insert("apiVersion".into(), json!("v1"));
    m.insert("kind".into(), json!("Pod"));
    p
}

/// A manifest document: a Pod, a workload holding pod templates, a `List`,
/// or a kind without any.
pub fn document(b: &mut Bytes) -> Value {
    let tpl = |b: &mut Bytes| template(b);
    match b.below(8) {
        0 | 1 => pod(b),
        2 => {
            json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": "j" }, "spec": { "template": tpl(b) } })
        }
        3 => {
            json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "d" }, "spec": { "replicas": 2, "template": tpl(b) } })
        }
        4 => json!({ "apiVersion": "batch/v1", "kind": "CronJob", "metadata": { "name": "c" },
                     "spec": { "schedule": "* * * * *", "jobTemplate": { "spec": { "template": tpl(b) } } } }),
        5 => {
            json!({ "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": { "name": "js" },
                     "spec": { "replicatedJobs": [{ "name": "w", "template": { "spec": { "template": tpl(b) } } }] } })
        }
        6 => json!({ "apiVersion": "v1", "kind": "List", "items": [pod(b), pod(b)] }),
        _ => {
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "m" }, "data": { "k": "v" } })
        }
    }
}
