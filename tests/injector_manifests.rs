//! deploy/kubernetes/injector/: the pieces agree with each other (names,
//! ports, paths, the certificate's Secret and DNS names), the injector's
//! arguments are accepted by `inject serve`, it gets no API access, and the
//! webhook's selectors pick labelled Pods and namespaces but never the
//! daemon's own Pods or the injector's; the NetworkPolicy lets only the API
//! server's sources reach the server's port, and the kustomization applies
//! every file. `.ci/deploy-lint` validates the built-in kinds against the
//! Kubernetes schemas.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize as _;
use serde_norway::Value;

fn docs(rel: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(d: &'a [Value], kind: &str) -> &'a Value {
    d.iter().find(|x| x["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// matchExpressions (In / NotIn) against labels.
fn selects(sel: &Value, labels: &BTreeMap<&str, &str>) -> bool {
    sel["matchExpressions"].as_sequence().unwrap().iter().all(|e| {
        let values: Vec<&str> = e["values"].as_sequence().unwrap().iter().map(s).collect();
        let has = labels.get(s(&e["key"])).is_some_and(|v| values.contains(v));
        match s(&e["operator"]) {
            "In" => has,
            "NotIn" => !has,
            op => panic!("operator {op} not evaluated here"),
        }
    })
}

#[test]
fn the_injector_pieces_fit_together_and_get_no_api_access() {
    let inj = docs("deploy/kubernetes/injector/injector.yaml");
    let cert = docs("deploy/kubernetes/injector/certificate.yaml");
    let hook = &docs("deploy/kubernetes/injector/webhook.yaml")[0];
    let (dep, svc, sa) = (find(&inj, "Deployment"), find(&inj, "Service"), find(&inj, "ServiceAccount"));
    let ns = s(&find(&inj, "Namespace")["metadata"]["name"]);
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];

    // The arguments are the server's own, parsed as it parses them.
    let args: Vec<String> = c["args"].as_sequence().unwrap().iter().map(|a| s(a).to_string()).collect();
    assert_eq!(&args[..2], ["inject", "serve"]);
    let argv = std::iter::once("tcpx-rxdm".to_string()).chain(args.iter().cloned());
    let cfg = match tcpx_rxdm::cli::parse(argv) {
        Ok(tcpx_rxdm::cli::Invocation::InjectServe(cfg)) => cfg,
        other => panic!("{args:?}: not inject serve: {other:?}"),
    };
    assert_eq!(u64::from(cfg.listen.port()), c["ports"][0]["containerPort"].as_u64().unwrap());
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], c["ports"][0]["containerPort"]);

    // TLS: the Certificate's Secret is what the Deployment mounts where --tls-cert points.
    let certificate = find(&cert, "Certificate");
    let secret = s(&certificate["spec"]["secretName"]);
    let vol = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == secret)
        .expect("TLS Secret mounted");
    let mount = c["volumeMounts"].as_sequence().unwrap().iter().find(|m| m["name"] == vol["name"]).unwrap();
    assert_eq!(cfg.cert.parent().unwrap(), Path::new(s(&mount["mountPath"])));
    let dns = format!("{}.{ns}.svc", s(&svc["metadata"]["name"]));
    assert!(certificate["spec"]["dnsNames"].as_sequence().unwrap().iter().any(|d| s(d) == dns), "{dns}");
    assert_eq!(
        s(&hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]),
        format!("{}/{}", s(&certificate["metadata"]["namespace"]), s(&certificate["metadata"]["name"]))
    );

    // No API access: no token, no roles anywhere in the folder.
    assert_eq!(sa["automountServiceAccountToken"], false);
    assert_eq!(pod["automountServiceAccountToken"], false);
    for d in inj.iter().chain(&cert) {
        assert!(!s(&d["kind"]).contains("Role"), "{:?}", d["kind"]);
    }
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);

    for w in hook["webhooks"].as_sequence().unwrap() {
        let name = s(&w["name"]);
        let to = &w["clientConfig"]["service"];
        assert_eq!((s(&to["name"]), s(&to["namespace"])), (s(&svc["metadata"]["name"]), ns), "{name}");
        assert_eq!(to["port"], svc["spec"]["ports"][0]["port"], "{name}");
        assert_eq!(s(&to["path"]), "/mutate");
        assert!(
            ["Fail", "Ignore"].contains(&s(&w["failurePolicy"])),
            "{name}: failurePolicy must be explicit"
        );
        // A Pod carrying inject's record is left as it is: a second call changes nothing.
        assert_eq!(w["reinvocationPolicy"], "Never");
        for rule in w["rules"].as_sequence().unwrap() {
            assert_eq!(rule["operations"], serde_norway::Value::from(vec!["CREATE"]), "{name}");
        }
        // The API server waits longer than the server takes for a request.
        let timeout = w["timeoutSeconds"].as_u64().unwrap();
        assert!(timeout <= 30 && timeout as f64 > cfg.timeout.as_secs_f64(), "{name}: {timeout}");
    }
}

#[test]
fn the_selectors_pick_labelled_pods_and_namespaces_only() {
    let hook = &docs("deploy/kubernetes/injector/webhook.yaml")[0];
    let webhooks = hook["webhooks"].as_sequence().unwrap();
    let called = |ns: &BTreeMap<&str, &str>, pod: &BTreeMap<&str, &str>| {
        webhooks.iter().any(|w| selects(&w["namespaceSelector"], ns) && selects(&w["objectSelector"], pod))
    };
    let ns = |name: &'static str, inject: Option<&'static str>| {
        let mut m = BTreeMap::from([("kubernetes.io/metadata.name", name)]);
        if let Some(v) = inject {
            m.insert("tcpx-rxdm.io/inject", v);
        }
        m
    };
    let on = BTreeMap::from([("tcpx-rxdm.io/inject", "enabled")]);
    let off = BTreeMap::from([("tcpx-rxdm.io/inject", "disabled")]);
    let plain = BTreeMap::new();
    assert!(called(&ns("ml", None), &on));
    assert!(!called(&ns("ml", None), &plain));
    assert!(called(&ns("ml", Some("enabled")), &plain));
    assert!(!called(&ns("ml", Some("enabled")), &off));
    assert!(!called(&ns("kube-system", Some("enabled")), &on));
    assert!(!called(&ns("tcpx-injector", Some("enabled")), &on));
    // The daemon's own Pods, by the labels deploy/ gives them, even when labelled.
    for rel in ["deploy/kubernetes/daemonset.yaml", "deploy/kubernetes/native-sidecar-job.yaml"] {
        let d = &docs(rel)[0];
        let labels = d["spec"]["template"]["metadata"]["labels"].as_mapping().unwrap();
        let mut pod: BTreeMap<&str, &str> = labels.iter().map(|(k, v)| (s(k), s(v))).collect();
        pod.insert("tcpx-rxdm.io/inject", "enabled");
        assert!(!called(&ns("ml", Some("enabled")), &pod), "{rel}");
    }
}

#[test]
fn only_the_api_servers_sources_reach_the_port_and_every_file_is_applied() {
    let inj = docs("deploy/kubernetes/injector/injector.yaml");
    let policy = &docs("deploy/kubernetes/injector/networkpolicy.yaml")[0];
    let dep = find(&inj, "Deployment");
    let ns = s(&find(&inj, "Namespace")["metadata"]["name"]);
    assert_eq!(policy["kind"], "NetworkPolicy");
    assert_eq!(s(&policy["metadata"]["namespace"]), ns);
    let spec = &policy["spec"];
    // It selects the injector's Pods, by labels its template has.
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    let selected = spec["podSelector"]["matchLabels"].as_mapping().unwrap();
    assert!(!selected.is_empty());
    for (k, v) in selected {
        assert_eq!(&labels[s(k)], v, "{k:?}");
    }
    // Ingress only, and every rule names its sources and the server's port:
    // a rule without `from` or `ports` would let every Pod in.
    assert_eq!(spec["policyTypes"], Value::from(vec!["Ingress"]));
    let port = &dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"];
    let rules = spec["ingress"].as_sequence().unwrap();
    assert!(!rules.is_empty());
    for rule in rules {
        let ports = rule["ports"].as_sequence().expect("a rule without ports opens every port");
        assert!(ports.iter().all(|p| &p["port"] == port && p["protocol"] == "TCP"), "{ports:?}");
        let from = rule["from"].as_sequence().expect("a rule without from admits every source");
        assert!(!from.is_empty());
        for peer in from {
            if let Some(block) = peer.get("ipBlock") {
                // The control plane's range, filled in by the user: never everything.
                let cidr = s(&block["cidr"]);
                assert!(!cidr.ends_with("/0") || block.get("except").is_some(), "{cidr}");
            } else {
                // Konnectivity's agents: Pods of kube-system, by their label.
                assert_eq!(
                    s(&peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]),
                    "kube-system"
                );
                assert_eq!(s(&peer["podSelector"]["matchLabels"]["k8s-app"]), "konnectivity-agent");
            }
        }
    }

    // `kubectl apply -k` applies every manifest of the folder.
    let k = &docs("deploy/kubernetes/injector/kustomization.yaml")[0];
    let listed: std::collections::BTreeSet<String> =
        k["resources"].as_sequence().unwrap().iter().map(|r| s(r).to_string()).collect();
    let on_disk: std::collections::BTreeSet<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/injector"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
            .collect();
    assert_eq!(listed, on_disk);
}
