//! Replays every committed fuzz corpus file (`fuzz/corpus/<target>/`) through
//! the same target function libFuzzer drives, on stable: the targets assert
//! their decoders' promises, so a regression input added there fails here.

use std::path::Path;

use tcpx_rxdm::fuzz_targets::{self, TARGETS};

#[test]
fn every_corpus_file_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, _) in TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(files.len() >= 3, "{target}: corpus has {} files", files.len());
        for f in files {
            let data = std::fs::read(&f).unwrap();
            let r = std::panic::catch_unwind(|| fuzz_targets::run(target, &data));
            assert!(r.is_ok(), "{target} failed on {}", f.display());
        }
    }
}

/// The seed corpora reach the decoders' success paths, not only their errors
/// (a corpus of garbage would replay without exercising much).
#[test]
fn seeds_include_inputs_the_decoders_accept() {
    use tcpx_rxdm::config::presets;
    use tcpx_rxdm::wire::frame;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let read = |t: &str, n: &str| std::fs::read(root.join(t).join(n)).unwrap();
    assert!(matches!(frame::parse(&read("frame", "rule_v4")), Ok(Some(_))));
    let body = read("request", "rule_v4");
    let msg: tcpx_rxdm::wire::proto::UnixSocketProto = prost::Message::decode(body.as_slice()).unwrap();
    let Some(tcpx_rxdm::wire::proto::unix_socket_proto::Payload::FlowSteerRuleRequest(r)) = msg.payload
    else {
        panic!("not a rule request")
    };
    assert!(tcpx_rxdm::rules::flow::parse(&r).is_ok());
    let text = String::from_utf8(read("topology", "inline_manual")).unwrap();
    assert!(presets::topology_from_text(&text, "seed").is_ok());
    let addr = read("netlink", "addr_v4");
    assert!(tcpx_rxdm::netlink::rtnl::parse_addr(&addr[1..]).unwrap().is_some());
    let link = read("netlink", "link");
    assert_eq!(tcpx_rxdm::netlink::rtnl::parse_link(&link[1..]).unwrap().name.as_deref(), Some("eth1"));
    // A handed-over state whose table, records and undo log all read back;
    // and the same with a slot used twice, refused.
    use tcpx_rxdm::fuzz_targets::handover_tables;
    assert_eq!(handover_tables(&read("handover", "state_rules")), Some((vec![Ok(6)], true)));
    let (twice, _) = handover_tables(&read("handover", "slot_twice")).unwrap();
    assert!(twice[0].as_ref().unwrap_err().contains("used twice"), "{twice:?}");
    let (cut, _) = handover_tables(&read("handover", "bad_records")).unwrap();
    assert!(cut[0].as_ref().unwrap_err().contains("not a whole number"), "{cut:?}");
}

/// Found by the netlink target: a string set announcing ~1.9 billion strings
/// made the parser allocate 45 GB before reading any. Now it is an error.
#[test]
fn strset_with_a_huge_count_is_malformed_not_an_allocation() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/netlink");
    let data = std::fs::read(root.join("regression-strset-huge-count")).unwrap();
    assert_eq!(data[0] % 12, 5, "selects parse_strset");
    let mut replies = Vec::new();
    let mut b = &data[1..];
    while b.len() >= 2 {
        let n = (u16::from_le_bytes([b[0], b[1]]) as usize).min(b.len() - 2);
        replies.push(b[2..2 + n].to_vec());
        b = &b[2 + n..];
    }
    let err = tcpx_rxdm::nic::ethtool::genl::parse_strset(&replies).unwrap_err();
    assert!(err.to_string().contains("exceeds"), "{err}");
}

/// The seeds of the flow check's socket lookup and of the per-queue counters
/// parse: the lookup finds its socket with its cgroup, the dump gives both
/// queues in order.
#[test]
fn sock_diag_and_qstats_seeds_parse() {
    use tcpx_rxdm::netlink::sock_diag;
    use tcpx_rxdm::nic::queue_stats;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/netlink");
    let answer = std::fs::read(root.join("sock_diag_answer")).unwrap();
    assert_eq!(answer[0], fuzz_targets::SOCK_DIAG);
    let (local, remote) = ("127.0.0.1:5000".parse().unwrap(), "127.0.0.1:40001".parse().unwrap());
    let found = sock_diag::parse_answer(&answer[1..], local, remote).unwrap().expect("the socket");
    assert_eq!((found.state, found.cgroup_id), (1, Some(4242)));

    let dump = std::fs::read(root.join("qstats_dump")).unwrap();
    assert_eq!(dump[0], fuzz_targets::QSTATS);
    let mut replies = Vec::new();
    let mut b = &dump[1..];
    while b.len() >= 2 {
        let n = u16::from_le_bytes([b[0], b[1]]) as usize;
        replies.push(b[2..2 + n].to_vec());
        b = &b[2 + n..];
    }
    assert_eq!(queue_stats::parse_qstats(&replies).unwrap(), [(0, 1234), (9, 5 << 32)]);
}

/// The seeds of the outside inputs reach what their targets check: a review
/// answered with a patch, an injected Pod left alone, a refusal let through
/// as configured, a manifest injected, an env file read whole, requests and
/// command lines that parse.
#[test]
fn seeds_of_the_outside_inputs_reach_their_checks() {
    use tcpx_rxdm::fuzz_targets::grammar::options;
    use tcpx_rxdm::inject::webhook::{review, OnError};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let read = |t: &str, n: &str| std::fs::read(root.join(t).join(n)).unwrap();
    let answer = |name: &str, on_error| {
        let seed = read("webhook", name);
        review(&seed[1..], &options(seed[0]).0, on_error).unwrap()["response"].clone()
    };
    assert!(answer("pod", OnError::Refuse)["patch"].is_string());
    let again = answer("injected_pod", OnError::Refuse);
    assert_eq!((again["allowed"].as_bool(), again.get("patch")), (Some(true), None), "{again}");
    let let_through = answer("refused_allowed", OnError::Allow);
    assert!(let_through["warnings"][0].as_str().unwrap().contains("hostNetwork"), "{let_through}");

    let seed = read("inject", "builtin");
    let text = std::str::from_utf8(&seed[1..]).unwrap();
    let (out, _) = tcpx_rxdm::inject::command::transform(text, &options(seed[0]).0).unwrap();
    assert!(out.contains("tcpx-daemon"), "{out}");

    let vars =
        tcpx_rxdm::nccl::check::parse_env_file(&String::from_utf8(read("envfile", "generated")).unwrap());
    assert_eq!(vars.unwrap().get("NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE").map(String::as_str), Some("1"));

    use tcpx_rxdm::server::status::{parse_request, Ask};
    assert_eq!(parse_request(&read("status", "status")), Ok(Ask::Status));
    assert_eq!(parse_request(&read("status", "flows")), Ok(Ask::Flows));

    let args = |name: &str| -> Vec<String> {
        let seed = read("argv", name);
        let words = seed.split(|&b| b == 0).map(|w| String::from_utf8(w.to_vec()).unwrap());
        std::iter::once("tcpx-rxdm".to_string()).chain(words).collect()
    };
    use tcpx_rxdm::config::flags::Flags;
    assert_eq!(Flags::parse_args(args("a3vm")).unwrap().gpu_nic_preset, "a3vm");
    assert!(Flags::parse_args(args("node_wide")).unwrap().node_wide);
    assert!(Flags::parse_args(args("node_wide_conflict")).is_err());
}

/// The Pods the webhook target builds from bytes reach both answers: Pods
/// patched and Pods refused (bytes from a fixed pseudo-random sequence).
#[test]
fn the_pod_grammar_reaches_patches_and_refusals() {
    use tcpx_rxdm::fuzz_targets::grammar::{pod, Bytes};
    use tcpx_rxdm::inject::webhook::{review, OnError};
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let (mut patched, mut refused) = (0, 0);
    for _ in 0..300 {
        let bytes: Vec<u8> = (0..64)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let object = pod(&mut Bytes::new(&bytes));
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": { "uid": "u", "operation": "CREATE", "namespace": "ml", "kind": { "group": "", "version": "v1", "kind": "Pod" }, "object": object }
        });
        let r = review(body.to_string().as_bytes(), &Default::default(), OnError::Refuse).unwrap();
        patched += usize::from(r["response"].get("patch").is_some());
        refused += usize::from(r["response"]["allowed"] == false);
    }
    // Most byte strings build a Pod the webhook refuses (it injects only a
    // Pod with no record and sound lists); some must still be patched.
    assert!(patched >= 1 && refused >= 20, "patched {patched}, refused {refused} of 300");
}

/// What the webhook target holds a patch to: it applies as the API server
/// applies it, and leaves no Pod less valid than it was.
#[test]
fn the_webhook_checks_catch_a_bad_patch_and_an_invalid_pod() {
    use serde_json::json;
    use tcpx_rxdm::fuzz_targets::kube::{apply_patch, pod_problems};
    let pod = json!({ "metadata": { "name": "p" }, "spec": { "containers": [{ "name": "c" }] } });
    let mut p = pod.clone();
    apply_patch(&mut p, &json!([{ "op": "add", "path": "/metadata/annotations", "value": { "a": "b" } }]))
        .unwrap();
    assert_eq!(p["metadata"]["annotations"]["a"], "b");
    for bad in [
        json!([{ "op": "replace", "path": "/metadata/annotations", "value": {} }]),
        json!([{ "op": "remove", "path": "/status" }]),
        json!([{ "op": "add", "path": "/status/phase", "value": "x" }]),
        json!([{ "op": "move", "path": "/spec", "from": "/x" }]),
    ] {
        assert!(apply_patch(&mut pod.clone(), &bad).is_err(), "{bad}");
    }
    assert!(pod_problems(&pod).is_empty());
    let broken = json!({ "spec": {
        "hostPID": true, "shareProcessNamespace": true,
        "containers": [{ "name": "c", "volumeMounts": [{ "name": "v", "mountPath": "/a" }] }, { "name": "c" }],
    } });
    let problems: Vec<_> = pod_problems(&broken).into_iter().collect();
    assert_eq!(problems.len(), 3, "{problems:?}");
}

/// Found by the inject target: a GPU container mounting a volume named like
/// one inject adds (`tcpx-libraries`, elsewhere) was injected, and injecting
/// again dropped that mount (undoing removes those mounts), so a second run
/// changed the Pod. Now such a mount is refused, naming it.
#[test]
fn a_mount_named_like_an_inject_volume_is_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/inject");
    let data = std::fs::read(root.join("regression-mount-of-inject-volume")).unwrap();
    assert!(data[1] >= 0x80, "a manifest built by the grammar");
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: trainer\n    \
               resources: {limits: {nvidia.com/gpu: 8}}\n    volumeMounts:\n    - {name: tcpx-libraries, mountPath: /opt}\n";
    let err = tcpx_rxdm::inject::command::transform(pod, &Default::default()).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "Pod/p: spec.containers[trainer].volumeMounts[tcpx-libraries]: a mount of a volume inject adds"
        ),
        "{err}"
    );
}

/// Found by the inject target: a GPU container and the reference daemon of
/// one name; converting the reference removed both, the workload with it.
/// The API server refuses such a Pod; now inject does too, naming it.
#[test]
fn two_containers_of_one_name_are_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/inject");
    assert!(std::fs::read(root.join("regression-duplicate-container-names")).unwrap()[1] >= 0x80);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: trainer\n    \
               resources: {limits: {nvidia.com/gpu: 8}}\n  - name: trainer\n    command: [tcpgpudmarxd]\n";
    let err = tcpx_rxdm::inject::command::transform(pod, &Default::default()).unwrap_err().to_string();
    assert!(err.starts_with("Pod/p: spec.containers[trainer]: a second container of this name"), "{err}");
}

/// `fuzz/` builds exactly the targets `cargo test` replays: one binary per
/// target in `fuzz/Cargo.toml`, each handing its bytes to the function of
/// the same name.
#[test]
fn the_fuzz_crate_builds_every_target() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
    let bins: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .map(|b| b.lines().find_map(|l| l.strip_prefix("name = ")).unwrap().trim_matches('"'))
        .collect();
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(bins, names);
    for name in names {
        let main = std::fs::read_to_string(fuzz.join(format!("fuzz_targets/{name}.rs"))).unwrap();
        assert!(main.contains(&format!("tcpx_rxdm::fuzz_targets::{name}(data)")), "{name}: {main}");
    }
}

/// Found by the webhook and inject targets: a list the user left empty
/// (`containers: []` beside a GPU init container) was dropped when the
/// injection was undone, so injecting again changed the Pod and the webhook
/// patched it on every review. Undoing now drops only the lists it empties.
#[test]
fn an_empty_list_the_user_wrote_survives_injecting_again() {
    use tcpx_rxdm::inject::command::transform;
    use tcpx_rxdm::inject::Options;
    let pod =
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  initContainers:\n  - name: trainer\n    \
               resources:\n      limits:\n        nvidia.com/gpu: 8\n  containers: []\n";
    let (once, _) = transform(pod, &Options::default()).unwrap();
    assert!(once.contains("containers: []"), "{once}");
    assert_eq!(transform(&once, &Options::default()).unwrap().0, once);
    let undone = transform(&once, &Options { uninject: true, ..Options::default() }).unwrap().0;
    assert_eq!(undone, pod);
}

/// Found by the webhook target: a GPU container whose name holds a blank
/// went into the injection record, which is then no record inject reads:
/// the injected Pod was refused on the next review. A container name that
/// is no DNS label (the API server's rule) is now refused up front.
#[test]
fn a_container_name_that_is_no_dns_label_is_refused() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: \"my trainer\"\n    \
               resources: {limits: {nvidia.com/gpu: 8}}\n";
    let err = tcpx_rxdm::inject::command::transform(pod, &Default::default()).unwrap_err().to_string();
    assert!(
        err.starts_with("Pod/p: spec.containers[my trainer]: not a container name Kubernetes takes"),
        "{err}"
    );
}

/// Found by the inject target once a converted reference daemon had to come
/// back with `--uninject`: a template whose `metadata` is no mapping (a
/// slip: `name x` without its colon) lost it, replaced by the mapping that
/// holds inject's record. Such a template is now refused, naming the field.
#[test]
fn a_template_whose_metadata_is_no_mapping_is_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/inject");
    assert!(std::fs::read(root.join("regression-metadata-not-a-mapping")).unwrap()[1] < 0x80, "a text seed");
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name p\nspec:\n  containers:\n  - name: trainer\n    \
               resources: {limits: {nvidia.com/gpu: 8}}\n";
    let err = tcpx_rxdm::inject::command::transform(pod, &Default::default()).unwrap_err().to_string();
    assert_eq!(err, "Pod/(no name): metadata: not a mapping");
    let job =
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n    metadata:\n      \
               annotations: [a]\n    spec:\n      containers:\n      - name: trainer\n        \
               resources: {limits: {nvidia.com/gpu: 8}}\n";
    let err = tcpx_rxdm::inject::command::transform(job, &Default::default()).unwrap_err().to_string();
    assert_eq!(err, "Job/j: spec.template.metadata.annotations: not a mapping");
}

/// Found by the inject target: a node-mode record on a template whose GPU
/// container mounted a volume of inject's socket name at the libraries'
/// folder; injecting again kept that folder as the socket folder, and the
/// GPU containers mounted two volumes there. A socket folder where inject
/// mounts another of its volumes is refused, naming the flag.
#[test]
fn a_socket_folder_where_inject_mounts_another_volume_is_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/inject");
    assert!(std::fs::read(root.join("regression-socket-folder-on-the-libraries")).unwrap()[1] >= 0x80);
    let job = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: trainer\n    \
               resources: {limits: {nvidia.com/gpu: 8}}\n";
    let opts = tcpx_rxdm::inject::Options {
        daemon_flags: vec!["--uds_path=/usr/local/nvidia/lib64".into()],
        ..Default::default()
    };
    let err = tcpx_rxdm::inject::command::transform(job, &opts).unwrap_err().to_string();
    assert_eq!(
        err,
        "--uds_path=/usr/local/nvidia/lib64: where inject mounts its volume tcpx-libraries in the GPU \
         containers; choose another socket folder"
    );
}
