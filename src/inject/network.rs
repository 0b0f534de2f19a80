//! Which network namespace the daemon runs in: where the Pod's GPU NICs
//! are. A Pod that GKE multi-networking gives the GPU NICs (the annotation
//! [`INTERFACES`]) has them in a network namespace of its own, and stays
//! there: its daemon runs beside the workload in that namespace. Any other
//! Pod runs on the node's network (`hostNetwork: true`, set where the Pod
//! does not say), where the GPU NICs are otherwise.

use serde_norway::Value;

use super::daemon::DaemonFlags;
use super::{machine, pod_flags, show, show_str, InjectError, Mode};
use crate::config::presets;

/// GKE multi-networking: the Pod's interfaces, a JSON list of
/// `{"interfaceName": …, "network": …}`.
pub const INTERFACES: &str = "networking.gke.io/interfaces";
/// GKE multi-networking: the interface of the Pod's default route.
pub const DEFAULT_INTERFACE: &str = "networking.gke.io/default-interface";

/// Where the daemon runs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// The node's network namespace; `set`: inject sets `hostNetwork: true`.
    Node { set: bool },
    /// The Pod's own namespace, holding these interfaces beside the default one.
    Pod { nics: Vec<String> },
}

impl Layout {
    /// The report's line: which layout, and why.
    pub fn describe(&self) -> String {
        match self {
            Layout::Pod { nics } => format!(
                "layout: multi-networking: the daemon runs in the Pod's network namespace, where {} are \
                 ({INTERFACES}); no hostNetwork",
                list(nics)
            ),
            Layout::Node { set: true } => "layout: host network: the Pod has no GKE multi-networking \
                 annotations, so the daemon runs in the node's network namespace, where the GPU NICs are \
                 (hostNetwork: true added)"
                .into(),
            Layout::Node { set: false } => {
                "layout: host network: the Pod runs in the node's network namespace (its own hostNetwork: \
                 true), where the GPU NICs are"
                    .into()
            }
        }
    }
}

/// `eth1–eth4` for a run of `ethN`, else the names joined.
fn list(nics: &[String]) -> String {
    let numbers: Option<Vec<u32>> = nics.iter().map(|n| n.strip_prefix("eth")?.parse().ok()).collect();
    match numbers {
        Some(n) if n.len() > 2 && n.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("eth{}–eth{}", n[0], n[n.len() - 1])
        }
        _ => nics.join(", "),
    }
}

/// What a Linux interface name may be (as GKE takes `interfaceName`).
fn ifname(n: &str) -> bool {
    (1..=15).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// The layout of a pod template, or why inject cannot write one for it.
pub fn layout(
    annotations: Option<&Value>,
    spec: &Value,
    mode: Mode,
    object: &str,
    at: &str,
) -> Result<Layout, InjectError> {
    let err = |field: String, why: String| InjectError::field(object, format!("{at}{field}"), why);
    let host = match spec.get("hostNetwork") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => return Err(err("spec.hostNetwork".into(), format!("{} is not a boolean", show(v)))),
    };
    let ann = |k: &str| annotations.and_then(|a| a.get(k));
    let field = |k: &str| format!("metadata.annotations[{k}]");
    let Some(k) = [INTERFACES, DEFAULT_INTERFACE].into_iter().find(|k| ann(k).is_some()) else {
        if host == Some(false) {
            return Err(err(
                "spec.hostNetwork".into(),
                format!(
                    "false, and the Pod has no GKE multi-networking ({INTERFACES}): its own network \
                     namespace holds no GPU NIC. Remove the field or set it true (the daemon then runs in \
                     the node's network namespace), or give the Pod the GPU NICs through {INTERFACES}"
                ),
            ));
        }
        return Ok(Layout::Node { set: host.is_none() });
    };
    if host == Some(true) {
        return Err(err(
            "spec.hostNetwork".into(),
            format!(
                "true, beside GKE multi-networking ({k}), which gives a Pod interfaces of its own network \
                 namespace and none on the host network; remove hostNetwork (inject keeps the Pod in its own \
                 namespace, the GPU NICs there), or the multi-networking annotations"
            ),
        ));
    }
    if mode == Mode::Node {
        return Err(err(
            field(k),
            "GKE multi-networking puts the GPU NICs in the Pod's own network namespace, where the \
             node-wide daemon (--mode=node) cannot reach them; use --mode=native-sidecar or --mode=sidecar, \
             which run a daemon in the Pod"
                .into(),
        ));
    }
    let bad = |why: String| err(field(INTERFACES), why);
    let text = match ann(INTERFACES) {
        Some(Value::String(t)) => t,
        Some(v) => return Err(bad(format!("{} is not a text (a JSON list)", show(v)))),
        None => {
            return Err(err(
                field(DEFAULT_INTERFACE),
                format!(
                    "set without {INTERFACES}, which gives the Pod its GPU NICs; add it, or remove this \
                     annotation"
                ),
            ))
        }
    };
    let shape = "is not a JSON list of {\"interfaceName\": …, \"network\": …}, as GKE reads it";
    let items: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| bad(format!("{} {shape} ({e})", show_str(text))))?;
    let default = match ann(DEFAULT_INTERFACE) {
        None => "eth0",
        Some(v) => {
            v.as_str().ok_or_else(|| err(field(DEFAULT_INTERFACE), format!("{} is not a text", show(v))))?
        }
    };
    let mut nics = Vec::new();
    for item in &items {
        let name = item.get("interfaceName").and_then(serde_json::Value::as_str);
        match name {
            Some(n) if !ifname(n) => {
                return Err(bad(format!(
                    "{} is no interface name (1 to 15 letters, digits, '-', '_', '.')",
                    show_str(n)
                )))
            }
            Some(n) if n == default => {}
            Some(n) if nics.iter().any(|x| x == n) => return Err(bad(format!("names {n} twice"))),
            Some(n) => nics.push(n.to_string()),
            None => return Err(bad(format!("an item without interfaceName: it {shape}"))),
        }
    }
    if nics.is_empty() {
        return Err(bad(format!(
            "gives the Pod no interface beside its default one ({default}), so no GPU NIC; list the GPU \
             NICs' networks (eth1 to eth4 on a3-highgpu-8g)"
        )));
    }
    Ok(Layout::Pod { nics })
}

/// In the Pod's own namespace the daemon finds only the interfaces the
/// Pod was given: those of its topology must be among them, where the
/// topology is known off the node (a preset by name, a manual one).
pub fn check_nics(
    layout: &Layout,
    flags: &DaemonFlags,
    machine_type: &str,
    object: &str,
    at: &str,
) -> Result<(), InjectError> {
    let Layout::Pod { nics } = layout else { return Ok(()) };
    if flags.preset_file.is_some() {
        return Ok(());
    }
    let mut parsed = flags.parsed.clone();
    if parsed.gpu_nic_preset == "auto" {
        parsed.gpu_nic_preset = machine::preset(machine_type).unwrap_or("auto").to_string();
    }
    if pod_flags::topology(&parsed).is_err() || ["auto", "a6"].contains(&parsed.gpu_nic_preset.as_str()) {
        return Ok(());
    }
    let Ok((topo, _)) = presets::resolve_topology(&parsed) else { return Ok(()) };
    let missing: Vec<String> =
        topo.nics.iter().map(|n| n.ifname.clone()).filter(|n| !nics.contains(n)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(InjectError::field(
        object,
        format!("{at}metadata.annotations[{INTERFACES}]"),
        format!(
            "gives the Pod {}, but the daemon's NICs (--gpu_nic_preset={}) include {}, which it would not \
             find in the Pod's network namespace; add their networks to the annotation, or give the daemon \
             the Pod's NICs (--gpu_nic_preset=manual --gpu_nic_topology_proto=…)",
            list(nics),
            parsed.gpu_nic_preset,
            missing.join(", ")
        ),
    ))
}

/// The `tcpx-socket` volume of the kind `kept` is (the volume a converted
/// daemon had at its socket folder): an emptyDir or a host path, with its
/// fields; `None` for another kind.
pub fn socket_volume(kept: &Value) -> Option<Value> {
    let (kind, source) = ["emptyDir", "hostPath"].into_iter().find_map(|k| Some((k, kept.get(k)?)))?;
    let source = match source {
        Value::Null => Value::Mapping(Default::default()),
        Value::Mapping(_) => source.clone(),
        _ => return None,
    };
    let mut m = serde_norway::Mapping::new();
    m.insert(Value::from("name"), Value::from("tcpx-socket"));
    m.insert(Value::from(kind), source);
    Some(Value::Mapping(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_eth_names_is_written_as_a_range() {
        let names = |ns: &[&str]| ns.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(list(&names(&["eth1", "eth2", "eth3", "eth4"])), "eth1–eth4");
        assert_eq!(list(&names(&["eth1", "eth3", "eth4"])), "eth1, eth3, eth4");
        assert_eq!(list(&names(&["eth1", "eth2"])), "eth1, eth2");
        assert_eq!(list(&names(&["gpu0", "gpu1", "gpu2"])), "gpu0, gpu1, gpu2");
        assert!(ifname("eth1") && ifname("gpu-nic_0.1") && !ifname("") && !ifname("a/b"));
        assert!(!ifname("an-interface-name"));
    }
}
