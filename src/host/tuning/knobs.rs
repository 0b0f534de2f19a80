//! The files native tuning sets: a few TCP sysctls and cubic's
//! `hystart_detect`, with their targets and whose they are.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy)]
pub(super) enum Target {
    Exact(&'static str),
    AtLeast(u64),
}

/// Whose value a knob holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Scope {
    /// The network namespace's: a sysctl under `net/` that each namespace
    /// has its own of. `/proc/sys/net` shows the namespace of the process
    /// that opens it, even through a mount of the host's `/proc/sys`.
    Namespace,
    /// The whole host's: a module parameter, a sysctl outside `net/`, or a
    /// `net/` one a namespace other than the host's lacks (host-wide on that
    /// kernel).
    Host,
}

/// The sysctls, relative to the sysctl directory (`/proc/sys`).
const SYSCTLS: [(&str, Target); 7] = [
    ("net/ipv4/tcp_mtu_probing", Target::Exact("0")),
    ("net/ipv4/tcp_slow_start_after_idle", Target::Exact("0")),
    ("net/ipv4/tcp_rmem", Target::Exact("4096 1048576 15728640")),
    ("net/ipv4/tcp_wmem", Target::Exact("4096 1048576 67108864")),
    ("net/ipv4/tcp_no_metrics_save", Target::Exact("1")),
    ("net/core/somaxconn", Target::AtLeast(4096)),
    ("net/ipv4/tcp_max_syn_backlog", Target::Exact("4096")),
];
/// Relative to the sysfs root.
const HYSTART_DETECT: (&str, Target) = ("module/tcp_cubic/parameters/hystart_detect", Target::Exact("2"));

/// `/proc/sys` under `procfs_root`: `<root>/sys` for a procfs mount, `<root>`
/// itself when it is a mount of `/proc/sys`, or a folder holding a mount of
/// its `net` (the Kubernetes manifests mount the host's `/proc/sys/net` at
/// `/hostprocsysfs/net`; the GKE guide, all of `/proc/sys` at `/hostprocsysfs`).
pub fn sysctl_dir(procfs_root: &Path) -> PathBuf {
    if procfs_root.join("sys/net").is_dir() || !procfs_root.join("net").is_dir() {
        procfs_root.join("sys")
    } else {
        procfs_root.to_path_buf()
    }
}

/// Which tree a knob is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tree {
    ProcSys,
    Sysfs,
}

/// One file native tuning sets.
#[derive(Debug, Clone)]
pub(super) struct Knob {
    pub path: PathBuf,
    pub target: Target,
    pub scope: Scope,
    pub tree: Tree,
}

/// Every file native tuning sets, under these roots, with its target and
/// whose it is (by where it lives: `net/` sysctls are the namespace's).
pub(super) fn knobs(procfs_root: &Path, sysfs_root: &Path) -> impl Iterator<Item = Knob> {
    let sys = sysctl_dir(procfs_root);
    let files = SYSCTLS.iter().map(move |(p, v)| {
        let scope = if p.starts_with("net/") { Scope::Namespace } else { Scope::Host };
        Knob { path: sys.join(p), target: *v, scope, tree: Tree::ProcSys }
    });
    let (p, target) = HYSTART_DETECT;
    let hystart = Knob { path: sysfs_root.join(p), target, scope: Scope::Host, tree: Tree::Sysfs };
    files.chain(std::iter::once(hystart))
}

/// One host knob the native tuning sets: where it lives, what it holds now
/// (`None`: the file does not exist here) and what the daemon would write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnobState {
    pub path: PathBuf,
    pub current: Option<String>,
    /// The target as text (`"0"`, `">= 4096"`).
    pub want: String,
    /// Whether the current value already meets the target.
    pub ok: bool,
    pub scope: Scope,
}

/// Reads (never writes) every sysctl and module parameter native tuning sets.
pub fn knob_states(procfs_root: &Path, sysfs_root: &Path) -> Vec<KnobState> {
    knobs(procfs_root, sysfs_root)
        .map(|Knob { path, target, scope, .. }| {
            let current = std::fs::read_to_string(&path).ok().map(|s| normalize(&s));
            let (want, ok) = match target {
                Target::Exact(v) => (v.to_string(), current.as_deref() == Some(v)),
                Target::AtLeast(min) => (
                    format!(">= {min}"),
                    current.as_deref().and_then(|c| c.parse::<u64>().ok()).is_some_and(|c| c >= min),
                ),
            };
            KnobState { path, current, want, ok, scope }
        })
        .collect()
}

pub(super) fn normalize(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}
