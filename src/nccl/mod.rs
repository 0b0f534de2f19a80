//! The NCCL plugin's settings for this node and daemon: `tcpx-rxdm
//! nccl-env` prints them, `nccl-env --check` (and `doctor`) compares an
//! environment with them, and the daemon writes them to
//! `<uds_path>/nccl.env` once ready.
//!
//! - [`cpus`]: the kernel's CPU list form.
//! - [`sysfs`]: what is read of the node (NUMA node per NIC, CPUs per node,
//!   SMT siblings, interfaces), behind [`NodeView`].
//! - [`bindings`]: the rule that picks each NIC's TX and RX CPUs.
//! - [`mod@env`]: the variables, their reasons, and the output forms.
//! - [`check`]: an environment against them.
//! - [`mod@file`]: the daemon's `nccl.env`, written atomically.
//! - [`machine`]: machine profiles, the node seen without sysfs.
//! - [`command`]: the `nccl-env` subcommand.

pub mod bindings;
pub mod check;
pub mod command;
pub mod cpus;
pub mod env;
pub mod file;
pub mod machine;
pub mod sysfs;

#[cfg(test)]
mod check_tests;

use std::collections::BTreeMap;
use std::path::Path;

pub use check::{Expect, Problem, ProblemKind};
pub use env::NcclEnv;
pub use sysfs::{FakeNode, NodeView, Sysfs};

use crate::types::topology::Topology;

/// Why the settings could not be worked out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NcclError {
    #[error("--uds_path {path} is {len} characters; the NCCL plugin takes a socket folder of at most {max}", max = env::MAX_PREFIX_LEN)]
    PrefixTooLong { path: String, len: usize },
    #[error("--uds_path {0} is relative; the NCCL plugin needs an absolute socket folder")]
    RelativePrefix(String),
    #[error("no CPU list in sysfs (devices/system/node/node*/cpulist or devices/system/cpu/online)")]
    NoCpuInfo,
    #[error("{ifname} is on NUMA node {node}, which sysfs does not list")]
    NoSuchNode { ifname: String, node: u32 },
    #[error("sysfs does not say which of the {nodes} NUMA nodes {ifname} is on (device/numa_node)")]
    NumaUnknown { ifname: String, nodes: usize },
    #[error("NUMA node {node} has {cores} cores; the TX and RX bindings need at least 4")]
    TooFewCores { node: u32, cores: usize },
    #[error("no control NIC: no interface outside the topology besides lo")]
    NoControlNic,
}

impl NcclError {
    /// Whether the error is in the flags (exit 2) rather than the node (exit 1).
    pub fn is_flag_error(&self) -> bool {
        matches!(self, NcclError::PrefixTooLong { .. } | NcclError::RelativePrefix(_))
    }
}

/// The settings for `topo`'s NICs and the socket folder `uds_path`, the node
/// read through `view`.
pub fn generate(view: &dyn NodeView, topo: &Topology, uds_path: &Path) -> Result<NcclEnv, NcclError> {
    env::generate(view, &ifnames(topo), uds_path)
}

/// The topology's NIC names, in order.
pub fn ifnames(topo: &Topology) -> Vec<String> {
    topo.nics.iter().map(|n| n.ifname.clone()).collect()
}

/// The result of a check, for text and JSON output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    pub ok: bool,
    pub prefix: String,
    pub nics: Vec<String>,
    pub problems: Vec<Problem>,
    /// What could not be checked, and why (e.g. the NUMA layout unknown).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Checks `vars` against `topo`, `uds_path` and the node seen through `view`.
/// Parts the node cannot tell (NUMA layout) are left out, with a note.
pub fn check_env(
    view: &dyn NodeView,
    topo: &Topology,
    uds_path: &Path,
    vars: &BTreeMap<String, String>,
) -> CheckReport {
    let names = ifnames(topo);
    let mut notes = Vec::new();
    let prefix = env::prefix(uds_path).unwrap_or_else(|e| {
        notes.push(e.to_string());
        uds_path.to_string_lossy().trim_end_matches('/').to_string()
    });
    let nics = bindings::compute(view, &names).unwrap_or_else(|e| {
        notes.push(format!("NUMA placement of the bindings not checked: {e}"));
        Vec::new()
    });
    let generated = env::generate(view, &names, uds_path).ok();
    let expect = Expect { ifnames: &names, prefix: &prefix, nics: &nics, generated: generated.as_ref() };
    let problems = check::check(vars, &expect);
    CheckReport { ok: problems.is_empty(), prefix, nics: names, problems, notes }
}

impl CheckReport {
    /// One line per problem, each with its fix; a last line with the verdict.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for p in &self.problems {
            let _ = writeln!(out, "✗ {}: {}", p.variable, p.message);
            if let Some(fix) = &p.fix {
                let _ = writeln!(out, "    → {}={}", p.variable, env::shell_quote(fix));
            } else if p.unset {
                let _ = writeln!(out, "    → unset {} (left out of the settings for this node)", p.variable);
            }
        }
        for n in &self.notes {
            let _ = writeln!(out, "! {n}");
        }
        if self.ok {
            let _ = writeln!(
                out,
                "ok: the NCCL settings match this daemon ({}, {})",
                self.nics.join(","),
                self.prefix
            );
        } else {
            let n = self.problems.len();
            let _ = writeln!(
                out,
                "{n} problem{} with the NCCL settings; `tcpx-rxdm nccl-env` prints the right ones",
                if n == 1 { "" } else { "s" }
            );
        }
        out
    }
}

/// The variables of the current process that the check looks at (any
/// `NCCL_*`), and whether any of the plugin's own is set.
pub fn process_env() -> (BTreeMap<String, String>, bool) {
    let vars: BTreeMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("NCCL_")).collect();
    let any = vars.keys().any(|k| k.starts_with("NCCL_GPUDIRECTTCPX_"));
    (vars, any)
}
