//! Refusing MIG: GPUDirect-TCPX needs whole GPUs, so a pod template whose
//! containers ask for MIG instances (`nvidia.com/mig-<profile>`, the GPU
//! Operator's "mixed" strategy) or that is pinned to GKE's GPU partitions
//! (`cloud.google.com/gke-gpu-partition-size` in its node selector or its
//! required node affinity) is refused, naming the field.

use serde_norway::Value;

use super::{name_of, InjectError};

/// Resource names of MIG instances start with this.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// The node label of GKE's GPU partitions.
pub const GKE_PARTITION_LABEL: &str = "cloud.google.com/gke-gpu-partition-size";

const WHY: &str = "GPUDirect-TCPX needs whole GPUs, not MIG instances";

/// The container lists, init containers first.
const LISTS: [&str; 2] = ["initContainers", "containers"];

/// Refuses `spec` (a pod spec) if it asks for MIG. `object` and `at` (the
/// template's path) name the field.
pub fn refuse(spec: &Value, object: &str, at: &str) -> Result<(), InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    for list in LISTS {
        for c in spec.get(list).and_then(Value::as_sequence).into_iter().flatten() {
            for kind in ["limits", "requests"] {
                let res = c.get("resources").and_then(|r| r.get(kind)).and_then(Value::as_mapping);
                let mig = res
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, _)| k.as_str())
                    .find(|k| k.starts_with(MIG_RESOURCE_PREFIX));
                if let Some(name) = mig {
                    return Err(err(
                        format!("spec.{list}[{}].resources.{kind}[{name}]", name_of(c)),
                        format!("a MIG instance; {WHY}: ask for nvidia.com/gpu on nodes without MIG"),
                    ));
                }
            }
        }
    }
    if let Some(size) = spec.get("nodeSelector").and_then(|n| n.get(GKE_PARTITION_LABEL)) {
        let size = size.as_str().map(|v| format!("{v:?}")).unwrap_or_else(|| "set".into());
        return Err(err(
            format!("spec.nodeSelector[{GKE_PARTITION_LABEL}]"),
            format!("{size}: pins the Pod to GKE's MIG partitions; {WHY}: use a node pool without gpu-partition-size"),
        ));
    }
    let terms = spec
        .get("affinity")
        .and_then(|a| a.get("nodeAffinity"))
        .and_then(|n| n.get("requiredDuringSchedulingIgnoredDuringExecution"))
        .and_then(|r| r.get("nodeSelectorTerms"))
        .and_then(Value::as_sequence);
    for (i, term) in terms.into_iter().flatten().enumerate() {
        for e in term.get("matchExpressions").and_then(Value::as_sequence).into_iter().flatten() {
            let key = e.get("key").and_then(Value::as_str);
            let op = e.get("operator").and_then(Value::as_str);
            if key == Some(GKE_PARTITION_LABEL) && matches!(op, Some("In" | "Exists")) {
                return Err(err(
                    format!(
                        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
                    ),
                    format!("{GKE_PARTITION_LABEL} {}: pins the Pod to GKE's MIG partitions; {WHY}", op.unwrap_or_default()),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> Value {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn mig_requests_and_partition_pins_are_refused_naming_the_field() {
        let e = refuse(
            &spec("containers: [{name: c, resources: {limits: {nvidia.com/mig-1g.10gb: 1}}}]"),
            "Pod/p",
            "",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "Pod/p: spec.containers[c].resources.limits[nvidia.com/mig-1g.10gb]: a MIG instance"
            ),
            "{e}"
        );
        let e = refuse(
            &spec("nodeSelector: {cloud.google.com/gke-gpu-partition-size: 1g.5gb}\ncontainers: [{name: c}]"),
            "Job/j",
            "spec.template.",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("Job/j: spec.template.spec.nodeSelector[cloud.google.com/gke-gpu-partition-size]: \"1g.5gb\": pins"), "{e}");
        assert!(e.contains("MIG"), "{e}");
        let affinity = "affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: cloud.google.com/gke-gpu-partition-size, operator: Exists}]}]}}}";
        assert!(refuse(&spec(affinity), "Pod/p", "")
            .unwrap_err()
            .to_string()
            .contains("nodeSelectorTerms[0]"));
    }

    #[test]
    fn whole_gpus_and_excluded_partitions_pass() {
        let ok = "nodeSelector: {cloud.google.com/gke-accelerator: nvidia-h100-80gb}\n\
                  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: cloud.google.com/gke-gpu-partition-size, operator: DoesNotExist}]}]}}}\n\
                  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 8}}}]";
        assert_eq!(refuse(&spec(ok), "Pod/p", ""), Ok(()));
    }
}
