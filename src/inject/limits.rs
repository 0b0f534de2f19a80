//! What a Pod may ask for. A Pod that asks for more GPUs than a node of
//! the machine type has is never scheduled: inject refuses it with the
//! count rather than wiring it. Each GPU container asks for at least one
//! GPU, so this also bounds the GPU containers inject changes (eight on
//! a3-highgpu-8g), and with them what it adds; the containers it reads are
//! bounded too.

use serde_norway::Value;

use super::{machine, InjectError, GPU_RESOURCE};

/// Containers and init containers of a GPU Pod together, at most. No real
/// Pod comes near; it bounds the work per Pod.
pub const MAX_CONTAINERS: usize = 100;

/// A Kubernetes quantity as a number: `8`, `"8"`, `"1e3"`, `"2k"`, `"1Ki"`,
/// `"500m"`. `None`: not a quantity (or not finite).
pub fn quantity(v: &Value) -> Option<f64> {
    let q = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(t) => {
            let t = t.trim();
            t.parse::<f64>().ok().or_else(|| {
                // Binary suffixes first: `Ki` must not be read as `K` and `i`.
                const SUFFIXES: [(&str, f64); 15] = [
                    ("Ki", 1024.0),
                    ("Mi", 1048576.0),
                    ("Gi", 1073741824.0),
                    ("Ti", 1099511627776.0),
                    ("Pi", 1125899906842624.0),
                    ("Ei", 1152921504606846976.0),
                    ("n", 1e-9),
                    ("u", 1e-6),
                    ("m", 1e-3),
                    ("k", 1e3),
                    ("M", 1e6),
                    ("G", 1e9),
                    ("T", 1e12),
                    ("P", 1e15),
                    ("E", 1e18),
                ];
                SUFFIXES.iter().find_map(|(s, f)| Some(t.strip_suffix(s)?.parse::<f64>().ok()? * f))
            })
        }
        _ => None,
    };
    q.filter(|x| x.is_finite())
}

/// The GPUs one container asks for (`nvidia.com/gpu`, the larger of its
/// limit and request), as a count rounded up; 0 where it asks for none.
pub fn gpus(c: &Value) -> u64 {
    let asked = ["limits", "requests"]
        .iter()
        .filter_map(|k| c.get("resources")?.get(*k)?.get(GPU_RESOURCE).and_then(quantity))
        .fold(0.0_f64, f64::max);
    // `as` saturates: an absurd count stays absurd rather than wrapping.
    asked.ceil() as u64
}

fn list<'a>(spec: &'a Value, key: &str) -> &'a [Value] {
    spec.get(key).and_then(Value::as_sequence).map(Vec::as_slice).unwrap_or_default()
}

/// The GPUs a Pod needs at once, counted as the scheduler counts them: its
/// containers and its sidecar init containers (`restartPolicy: Always`)
/// together, or one plain init container with the sidecars started before
/// it, whichever is more.
pub fn pod_gpus(spec: &Value) -> u64 {
    let mut sidecars = 0_u64;
    let mut init_peak = 0_u64;
    for c in list(spec, "initContainers") {
        let n = gpus(c);
        if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            sidecars = sidecars.saturating_add(n);
        } else {
            init_peak = init_peak.max(sidecars.saturating_add(n));
        }
    }
    let running = list(spec, "containers").iter().map(gpus).fold(sidecars, u64::saturating_add);
    running.max(init_peak)
}

/// Checks a pod spec that asks for GPUs against the bounds: at most
/// [`MAX_CONTAINERS`] containers, and no more GPUs than a node of
/// `machine` has. Returns the GPUs it asks for (0: none, nothing checked).
/// `object` and `at` name the field in errors.
pub fn check(spec: &Value, machine: &str, object: &str, at: &str) -> Result<u64, InjectError> {
    let asked = pod_gpus(spec);
    if asked == 0 {
        return Ok(0);
    }
    if let Some(has) = machine::gpus(machine).filter(|has| asked > *has) {
        let asking: usize = ["initContainers", "containers"]
            .iter()
            .map(|l| list(spec, l).iter().filter(|c| gpus(c) > 0).count())
            .sum();
        return Err(InjectError::field(
            object,
            format!("{at}spec"),
            format!(
                "asks for {asked} GPUs ({GPU_RESOURCE}, over {asking} container{}); machine type {machine} has {has}, so no node can run it",
                if asking == 1 { "" } else { "s" }
            ),
        ));
    }
    let containers = list(spec, "initContainers").len() + list(spec, "containers").len();
    if containers > MAX_CONTAINERS {
        return Err(InjectError::field(
            object,
            format!("{at}spec"),
            format!(
                "{containers} containers and init containers; inject handles at most {MAX_CONTAINERS} in a GPU Pod"
            ),
        ));
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> Value {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        let q = |y: &str| quantity(&serde_norway::from_str::<Value>(y).unwrap());
        assert_eq!(q("8"), Some(8.0));
        assert_eq!(q("'8'"), Some(8.0));
        assert_eq!(q("' 2 '"), Some(2.0));
        assert_eq!(q("'1e3'"), Some(1000.0));
        assert_eq!(q("'2k'"), Some(2000.0));
        assert_eq!(q("'1Ki'"), Some(1024.0));
        assert_eq!(q("'500m'"), Some(0.5));
        assert_eq!(q("'1E'"), Some(1e18));
        assert_eq!(q("'many'"), None);
        assert_eq!(q("'inf'"), None);
        assert_eq!(q("true"), None);
    }

    #[test]
    fn a_pod_counts_its_containers_and_sidecars_together_and_init_containers_apart() {
        let s = spec(
            "
initContainers:
- {name: prep, resources: {limits: {nvidia.com/gpu: 4}}}
- {name: side, restartPolicy: Always, resources: {limits: {nvidia.com/gpu: 1}}}
- {name: late, resources: {requests: {nvidia.com/gpu: '6'}}}
containers:
- {name: a, resources: {limits: {nvidia.com/gpu: 2}}}
- {name: b, resources: {limits: {nvidia.com/gpu: '0.5'}}}
- {name: c}
",
        );
        // Running: 2 + 1 (rounded up) + the sidecar's 1 = 4; `late` runs
        // beside the sidecar: 7.
        assert_eq!(pod_gpus(&s), 7);
        assert_eq!(gpus(&s["containers"][2]), 0);
        // The larger of limit and request.
        let c = spec("{resources: {limits: {nvidia.com/gpu: 1}, requests: {nvidia.com/gpu: 3}}}");
        assert_eq!(gpus(&c), 3);
        assert_eq!(gpus(&spec("{resources: {limits: {nvidia.com/gpu: '1e30'}}}")), u64::MAX);
    }

    #[test]
    fn more_gpus_than_the_machine_has_is_refused_with_the_count() {
        let s = spec(
            "containers:\n- {name: a, resources: {limits: {nvidia.com/gpu: 8}}}\n- {name: b, resources: {limits: {nvidia.com/gpu: 8}}}\n",
        );
        let e = check(&s, machine::DEFAULT, "Pod/ml/p", "").unwrap_err().to_string();
        assert_eq!(
            e,
            "Pod/ml/p: spec: asks for 16 GPUs (nvidia.com/gpu, over 2 containers); machine type a3-highgpu-8g has 8, so no node can run it"
        );
        let eight = spec("containers:\n- {name: a, resources: {limits: {nvidia.com/gpu: 8}}}\n");
        assert_eq!(check(&eight, machine::DEFAULT, "Pod/p", "").unwrap(), 8);
        // No GPUs: nothing is checked, however many containers.
        let many: Vec<Value> = (0..500).map(|i| spec(&format!("{{name: c{i}}}"))).collect();
        let mut plain = serde_norway::Mapping::new();
        plain.insert("containers".into(), Value::Sequence(many.clone()));
        assert_eq!(check(&Value::Mapping(plain.clone()), machine::DEFAULT, "Pod/p", "").unwrap(), 0);
        // With one GPU among them: too many containers.
        let mut with_gpu = many;
        with_gpu.push(spec("{name: g, resources: {limits: {nvidia.com/gpu: 1}}}"));
        plain.insert("containers".into(), Value::Sequence(with_gpu));
        let e = check(&Value::Mapping(plain), machine::DEFAULT, "Job/j", "spec.template.").unwrap_err();
        assert!(e.to_string().starts_with("Job/j: spec.template.spec: 501 containers"), "{e}");
    }
}
