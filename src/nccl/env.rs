//! The environment itself: which variables, their values for this node and
//! daemon, why each is set, and the three output forms (a sourceable shell
//! file, JSON, a Kubernetes ConfigMap).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::bindings::{self, NicCpus};
use super::sysfs::NodeView;
use super::NcclError;

pub const SOCKET_IFNAME: &str = "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME";
pub const CTRL_DEV: &str = "NCCL_GPUDIRECTTCPX_CTRL_DEV";
pub const TX_BINDINGS: &str = "NCCL_GPUDIRECTTCPX_TX_BINDINGS";
pub const RX_BINDINGS: &str = "NCCL_GPUDIRECTTCPX_RX_BINDINGS";
pub const UNIX_CLIENT_PREFIX: &str = "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX";
pub const REPORT_LIFECYCLE: &str = "NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE";

/// The longest socket folder (`UNIX_CLIENT_PREFIX`) the NCCL plugin can use;
/// the daemon's `--uds_path` is held to the same limit.
pub const MAX_PREFIX_LEN: usize = crate::config::flags::UDS_PATH_MAX;

/// The ConfigMap's name in `--format=configmap`.
pub const CONFIGMAP_NAME: &str = "tcpx-nccl-env";

/// Settings that do not depend on the node: the values the public GKE and
/// Slurm profiles for GPUDirect-TCPX share, each with why.
const FIXED: &[(&str, &str, &str)] = &[
    (
        "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS",
        "500000",
        "how long the plugin waits for the daemon to install a connection's steering rule",
    ),
    (
        "NCCL_GPUDIRECTTCPX_FORCE_ACK",
        "0",
        "no ACK forced per receive: TCP's own ACK pacing, as the profiles set",
    ),
    (
        "NCCL_GPUDIRECTTCPX_TX_COMPLETION_NANOSLEEP",
        "1000",
        "send-completion polling sleeps 1 us between polls rather than spinning",
    ),
    ("NCCL_CROSS_NIC", "0", "each ring keeps to one NIC, the one beside its GPUs"),
    ("NCCL_ALGO", "Ring", "ring collectives, the algorithm the public profiles run over TCPX"),
    ("NCCL_PROTO", "Simple", "the Simple protocol, as in the public profiles: data moves in large chunks"),
    ("NCCL_NSOCKS_PERTHREAD", "4", "four sockets per connection thread spread a flow over the NIC's queues"),
    ("NCCL_SOCKET_NTHREADS", "1", "one thread per connection drives those four sockets"),
    ("NCCL_DYNAMIC_CHUNK_SIZE", "524288", "512 KiB chunks, the public profiles' size"),
    ("NCCL_P2P_NET_CHUNKSIZE", "524288", "512 KiB chunks for point-to-point over the network"),
    ("NCCL_P2P_PCI_CHUNKSIZE", "524288", "512 KiB chunks for point-to-point over PCIe"),
    ("NCCL_P2P_NVL_CHUNKSIZE", "1048576", "1 MiB chunks for point-to-point over NVLink"),
    ("NCCL_BUFFSIZE", "4194304", "4 MiB buffers per channel: eight 512 KiB chunks"),
    ("NCCL_NET_GDR_LEVEL", "PIX", "GPUDirect only between a GPU and a NIC under the same PCIe switch"),
    ("NCCL_P2P_PXN_LEVEL", "0", "no PXN: each GPU sends through its own NIC, never through another GPU's"),
];

/// One variable: its name, value, and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Var {
    pub name: String,
    pub value: String,
    pub why: String,
}

/// The generated environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NcclEnv {
    pub vars: Vec<Var>,
    /// Each NIC's NUMA node and CPUs, as the bindings were computed (empty
    /// when they were left out).
    #[serde(skip)]
    pub nics: Vec<NicCpus>,
    /// What was left out on this node, and why: one line each, printed as
    /// comments.
    pub notes: Vec<String>,
}

/// The socket folder as the plugin will see it, refused when the plugin
/// cannot use it (relative, or longer than [`MAX_PREFIX_LEN`]).
pub fn prefix(uds_path: &Path) -> Result<String, NcclError> {
    let text = uds_path.to_string_lossy();
    let text = match text.trim_end_matches('/') {
        "" => "/".to_string(),
        t => t.to_string(),
    };
    if !text.starts_with('/') {
        return Err(NcclError::RelativePrefix(text));
    }
    if text.len() > MAX_PREFIX_LEN {
        return Err(NcclError::PrefixTooLong { len: text.len(), path: text });
    }
    Ok(text)
}

/// The control NIC: the first interface outside the topology backed by a
/// device (eth0 on GKE, enp0s12 on Slurm images); failing that, the first
/// one outside the topology other than loopback.
pub fn control_nic(view: &dyn NodeView, managed: &[String]) -> Result<String, NcclError> {
    let others: Vec<(String, bool)> =
        view.interfaces().into_iter().filter(|(n, _)| !managed.contains(n) && n != "lo").collect();
    others
        .iter()
        .find(|(_, device)| *device)
        .or_else(|| others.first())
        .map(|(n, _)| n.clone())
        .ok_or(NcclError::NoControlNic)
}

/// Builds the environment for the TCPX NICs `ifnames` (topology order) and
/// the socket folder `uds_path`. Only a socket folder the plugin cannot use
/// is an error; what the node cannot tell (too few cores to keep TX and RX
/// apart, an unknown NUMA layout, no host NIC) leaves those variables out,
/// which the plugin accepts, with a note saying why.
pub fn generate(view: &dyn NodeView, ifnames: &[String], uds_path: &Path) -> Result<NcclEnv, NcclError> {
    let prefix = prefix(uds_path)?;
    let mut notes = Vec::new();
    let mut vars =
        vec![var(SOCKET_IFNAME, ifnames.join(","), "the TCPX data NICs, in the daemon's topology order")];
    match control_nic(view, ifnames) {
        Ok(ctrl) => vars.extend([
            var(CTRL_DEV, ctrl.clone(), "the plugin's control connections go over the host NIC"),
            var("NCCL_SOCKET_IFNAME", ctrl, "NCCL's bootstrap and socket traffic stay on the host NIC too"),
        ]),
        Err(e) => notes.push(format!(
            "{CTRL_DEV} and NCCL_SOCKET_IFNAME left out: {e}; the plugin and NCCL pick an interface themselves"
        )),
    }
    let nics = match bindings::compute(view, ifnames) {
        Ok(nics) => {
            let side = |pick: fn(&NicCpus) -> &BTreeSet<u32>| {
                bindings::format(
                    &nics.iter().map(|n| (n.ifname.clone(), pick(n).clone())).collect::<Vec<_>>(),
                )
            };
            vars.extend([
                var(TX_BINDINGS, side(|n| &n.tx), "send threads on cores of each NIC's NUMA node"),
                var(
                    RX_BINDINGS,
                    side(|n| &n.rx),
                    "receive threads on other cores of the same node, never the TX ones",
                ),
            ]);
            nics
        }
        Err(e) => {
            notes.push(format!(
                "{TX_BINDINGS} and {RX_BINDINGS} left out: {e}; the plugin's threads run on any CPU"
            ));
            Vec::new()
        }
    };
    vars.extend([
        var(
            UNIX_CLIENT_PREFIX,
            prefix,
            "this daemon's socket folder; the plugin's default, /tmp, finds no daemon",
        ),
        var(REPORT_LIFECYCLE, "1".into(), "register with the daemon, so that it sees the job start and end"),
    ]);
    vars.extend(FIXED.iter().map(|(n, v, w)| var(n, v.to_string(), w)));
    Ok(NcclEnv { vars, nics, notes })
}

fn var(name: &str, value: String, why: &str) -> Var {
    Var { name: name.to_string(), value, why: why.to_string() }
}

impl NcclEnv {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.iter().find(|v| v.name == name).map(|v| v.value.as_str())
    }

    /// A file for `. FILE`: one commented `export` per variable.
    pub fn to_env(&self) -> String {
        let mut out = String::from(
            "# NCCL settings for GPUDirect-TCPX through tcpx-rxdm on this node, from\n\
             # `tcpx-rxdm nccl-env`. Load them with `. FILE` before starting the job.\n",
        );
        for n in &self.notes {
            let _ = writeln!(out, "# Note: {n}.");
        }
        for v in &self.vars {
            let _ = write!(out, "# {}\nexport {}={}\n", v.why, v.name, shell_quote(&v.value));
        }
        out
    }

    /// `{"variables": [{"name", "value", "why"}, …]}`, in order.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "variables": self.vars });
        if !self.notes.is_empty() {
            v["notes"] = serde_json::json!(self.notes);
        }
        v
    }

    /// A ConfigMap whose data is the environment, for a container's `envFrom`.
    pub fn to_configmap(&self) -> String {
        let mut out = String::from(
            "# NCCL settings for GPUDirect-TCPX through tcpx-rxdm, from `tcpx-rxdm nccl-env\n\
             # --format=configmap`. Use it with `envFrom: [{configMapRef: {name: tcpx-nccl-env}}]`.\n",
        );
        for n in &self.notes {
            let _ = writeln!(out, "# Note: {n}.");
        }
        let _ = write!(out, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {CONFIGMAP_NAME}\ndata:\n");
        for v in &self.vars {
            let _ = write!(out, "  # {}\n  {}: {}\n", v.why, v.name, yaml_quote(&v.value));
        }
        out
    }
}

/// The value as one shell word: bare when it holds only characters no shell
/// treats specially, else in single quotes.
pub fn shell_quote(v: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_,./:-=+@%".contains(c);
    if !v.is_empty() && v.chars().all(plain) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', r"'\''"))
    }
}

/// A YAML double-quoted scalar: ConfigMap data values must be strings, and
/// unquoted `0` or `1` would be numbers.
fn yaml_quote(v: &str) -> String {
    serde_json::to_string(v).expect("a string serialises")
}

#[cfg(test)]
mod tests {
    use super::super::sysfs::FakeNode;
    use super::*;

    fn a3() -> FakeNode {
        FakeNode::a3_highgpu_8g()
    }

    fn ifs() -> Vec<String> {
        FakeNode::a3_ifnames()
    }

    #[test]
    fn every_variable_has_a_reason_and_the_node_values_are_right() {
        let env = generate(&a3(), &ifs(), Path::new("/run/tcpx/")).unwrap();
        assert_eq!(env.get(SOCKET_IFNAME), Some("eth1,eth2,eth3,eth4"));
        assert_eq!(env.get(CTRL_DEV), Some("eth0"));
        assert_eq!(env.get(UNIX_CLIENT_PREFIX), Some("/run/tcpx"));
        assert_eq!(env.get(REPORT_LIFECYCLE), Some("1"));
        assert!(env.vars.iter().all(|v| !v.why.is_empty() && !v.why.contains('\n')));
        let names: BTreeSet<_> = env.vars.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names.len(), env.vars.len(), "a variable is listed twice");
    }

    #[test]
    fn the_prefix_limit_is_the_plugins() {
        let ok = format!("/{}", "a".repeat(MAX_PREFIX_LEN - 1));
        assert_eq!(prefix(Path::new(&ok)).unwrap().len(), MAX_PREFIX_LEN);
        let long = format!("/{}", "a".repeat(MAX_PREFIX_LEN));
        assert!(matches!(prefix(Path::new(&long)), Err(NcclError::PrefixTooLong { len: 77, .. })));
        assert!(matches!(prefix(Path::new("run/tcpx")), Err(NcclError::RelativePrefix(_))));
        assert!(matches!(generate(&a3(), &ifs(), Path::new(&long)), Err(NcclError::PrefixTooLong { .. })));
    }

    #[test]
    fn the_control_nic_is_a_device_outside_the_topology() {
        let mut node = a3();
        node.interfaces.insert(0, ("docker0".into(), false));
        node.interfaces.insert(0, ("lo".into(), false));
        assert_eq!(control_nic(&node, &ifs()).unwrap(), "eth0");
        let bare = FakeNode::smt2(1, 52).nic("eth1", None);
        assert!(matches!(control_nic(&bare, &ifs()[..1]), Err(NcclError::NoControlNic)));
        let mut veth = bare.clone();
        veth.interfaces.push(("veth0".into(), false));
        assert_eq!(control_nic(&veth, &ifs()[..1]).unwrap(), "veth0");
    }

    #[test]
    fn shell_and_yaml_forms_quote_what_needs_it() {
        assert_eq!(shell_quote("eth1,eth2"), "eth1,eth2");
        assert_eq!(shell_quote("eth1:1-2;eth2:3"), "'eth1:1-2;eth2:3'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        let env = generate(&a3(), &ifs(), Path::new("/run/tcpx")).unwrap();
        let cm = env.to_configmap();
        assert!(cm.contains("  NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE: \"1\"\n"), "{cm}");
        let text = env.to_env();
        assert!(text.contains("export NCCL_GPUDIRECTTCPX_TX_BINDINGS='eth1:8-21,112-125;"), "{text}");
    }
}
