//! What a workload is: what the daemon's budgets are counted by
//! (`--max_rules_per_tenant`, the turns of the rule path, the IPv6 repair
//! queues, the tenant readers, audit's flow checks) and whose rules a client
//! may remove. A job is rarely one cgroup: a Pod has a cgroup per container,
//! a Slurm job one per step and task. Were each cgroup counted on its own, a
//! job would get a budget per cgroup, and 13 steps would fill a NIC.
//!
//! Decided once per client process, where its tenant is read, from its
//! cgroup path as `/proc/<pid>/cgroup` shows it. Walking the path from the
//! root, the first component that names one of these ends the workload's
//! part of the path:
//! - a Kubernetes Pod: `…kubepods[-<qos>]-pod<uid>.slice` (systemd driver;
//!   the uid's dashes as underscores; any prefix, such as kind's
//!   `kubelet-`), or `pod<uid>` right below `kubepods` (a guaranteed Pod)
//!   or `kubepods/<qos>` (cgroupfs driver). Its containers, the sandbox
//!   and whatever they make below them are the Pod;
//! - a Slurm job: `job_<N>` (cgroup v2: `slurmstepd.scope/job_<N>`, with
//!   its `step_*`, `user` and `task_*` cgroups below);
//! - a systemd unit: a `*.service` or `*.scope`, the outermost one: a
//!   service with the cgroups it makes, a user's whole service manager
//!   (`user@<uid>.service`), a login session, a container started as a
//!   scope. A `slurmstepd.scope` followed by `job_<N>` is Slurm's, and the
//!   job is the workload;
//! - else the process's own cgroup.
//!
//! The outermost one, because a workload may make cgroups below its own (a
//! delegated subtree: a user's service manager, a Slurm job): whatever it
//! calls them, they lie below the component that already decided, so they
//! never make a workload of their own. The daemon's own ancestors, hidden
//! from it by a cgroup namespace (`/..` in the path), are not the
//! workload's to make, and decide nothing.
//!
//! `--workload_cgroup_depth=N` replaces these layouts: the first N levels
//! of the path name the workload (a process higher up is its own).
//!
//! A workload's id is its cgroup folder's inode, its cgroup id, found under
//! the daemon's cgroup2 mount. Where that folder is not there (a daemon in
//! a cgroup namespace of its own sees other cgroups as `/../…`), the id is
//! a number made from the path, with bit 63 set so that it never equals a
//! cgroup id. Where the path cannot be read (a process whose pid the daemon
//! cannot see, named only by the cgroup id of its pidfd), the process's
//! own cgroup is its workload.

use std::num::NonZeroU32;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// How workloads are told from cgroup paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rule {
    /// The layouts of Kubernetes, Slurm and systemd (see the module's notes).
    #[default]
    Layouts,
    /// The first N levels of the path (`--workload_cgroup_depth=N`).
    Depth(NonZeroU32),
}

impl Rule {
    /// From `--workload_cgroup_depth` (0: the layouts).
    pub fn from_depth(depth: u32) -> Rule {
        NonZeroU32::new(depth).map_or(Rule::Layouts, Rule::Depth)
    }
}

/// What a workload is, for its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A Kubernetes Pod, by its uid.
    Pod(String),
    /// A Slurm job, by its id.
    SlurmJob(String),
    /// A systemd unit, by its name.
    Unit(String),
    /// The first levels of the path (`--workload_cgroup_depth`).
    Levels,
    /// The process's own cgroup.
    Cgroup,
}

/// A client process's workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Its cgroup folder's inode (a cgroup id), or a number made from its
    /// path with bit 63 set ([`is_cgroup_id`]).
    pub id: u64,
    /// Its cgroup's path, as `/proc/<pid>/cgroup` shows it, where known.
    pub path: Option<String>,
    pub kind: Kind,
}

impl Workload {
    /// The process's own cgroup `id` (at `path`) as its workload.
    pub fn cgroup(id: u64, path: Option<String>) -> Workload {
        Workload { id, path, kind: Kind::Cgroup }
    }

    /// The workload of a process whose pid the daemon cannot see: the
    /// kernel names its cgroup by id only (its pidfd), so that cgroup.
    pub fn hidden(cgroup_id: u64) -> Workload {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::info!(
                cgroup_id,
                "a client's pid is not visible to the daemon, so neither is its cgroup's path: its workload is \
                 its own cgroup (said once)"
            );
        }
        Workload::cgroup(cgroup_id, None)
    }

    /// How refusals, logs and `status` name it.
    pub fn name(&self) -> String {
        match &self.kind {
            Kind::Pod(uid) => format!("pod {uid}"),
            Kind::SlurmJob(id) => format!("slurm job {id}"),
            Kind::Unit(unit) => unit.clone(),
            Kind::Levels | Kind::Cgroup => {
                self.path.clone().unwrap_or_else(|| format!("cgroup id {}", self.id))
            }
        }
    }
}

/// Whether a workload's `id` is a cgroup id (not one made from its path).
pub fn is_cgroup_id(id: u64) -> bool {
    id >> 63 == 0
}

/// The workload's part of cgroup path `path` under `rule`, and what it is.
pub fn part(path: &str, rule: Rule) -> (&str, Kind) {
    // Each component with the offset where it ends.
    let mut comps: Vec<(&str, usize)> = Vec::new();
    let mut at = 0;
    for c in path.split('/') {
        at += c.len();
        if !c.is_empty() {
            comps.push((c, at));
        }
        at += 1;
    }
    let upto = |i: usize| &path[..comps[i].1];
    match rule {
        // A path outside the daemon's cgroup namespace: its levels cannot be
        // counted from the root.
        Rule::Depth(_) if comps.iter().any(|(c, _)| *c == "..") => (path, Kind::Cgroup),
        Rule::Depth(n) => match n.get() as usize {
            n if comps.len() >= n => (upto(n - 1), Kind::Levels),
            _ => (path, Kind::Cgroup),
        },
        Rule::Layouts => {
            for (i, &(c, _)) in comps.iter().enumerate() {
                let above = |k: usize| i.checked_sub(k).map(|j| comps[j].0);
                if let Some(uid) = systemd_pod(c).or_else(|| cgroupfs_pod(c, above(1), above(2))) {
                    return (upto(i), Kind::Pod(uid));
                }
                if let Some(job) = slurm_job(c) {
                    return (upto(i), Kind::SlurmJob(job.into()));
                }
                if let Some(unit) = c.strip_suffix(".service").or_else(|| c.strip_suffix(".scope")) {
                    let stepd = unit == "slurmstepd" || unit.ends_with("_slurmstepd");
                    match comps.get(i + 1).and_then(|(next, _)| slurm_job(next)).filter(|_| stepd) {
                        Some(job) => return (upto(i + 1), Kind::SlurmJob(job.into())),
                        None if !unit.is_empty() => return (upto(i), Kind::Unit(c.into())),
                        None => {}
                    }
                }
            }
            (path, Kind::Cgroup)
        }
    }
}

/// The Pod uid a systemd driver's slice names (`kubepods-burstable-pod<uid>.slice`).
fn systemd_pod(c: &str) -> Option<String> {
    let (above, pod) = c.strip_suffix(".slice")?.rsplit_once("-pod")?;
    let kubepods = above.split('-').any(|w| w == "kubepods");
    let uid_like = !pod.is_empty() && pod.chars().all(|ch| ch.is_ascii_hexdigit() || ch == '_');
    (kubepods && uid_like).then(|| pod.replace('_', "-"))
}

/// The Pod uid a cgroupfs driver's `pod<uid>` names, right below `kubepods`
/// or a QoS class's cgroup below it.
fn cgroupfs_pod(c: &str, parent: Option<&str>, grandparent: Option<&str>) -> Option<String> {
    let pod = c.strip_prefix("pod")?;
    let uid_like = !pod.is_empty() && pod.chars().all(|ch| ch.is_ascii_hexdigit() || ch == '-');
    let placed = match parent {
        Some("kubepods") => true,
        Some("burstable" | "besteffort") => grandparent == Some("kubepods"),
        _ => false,
    };
    (uid_like && placed).then(|| pod.to_string())
}

/// The job id a Slurm job's cgroup (`job_<N>`) names.
fn slurm_job(c: &str) -> Option<&str> {
    c.strip_prefix("job_").filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The workload of a process in cgroup `cgroup_id`, whose path is `path`
/// where it could be read, with cgroup2 mounted at `mount`.
pub fn resolve(cgroup_id: u64, path: Option<&str>, rule: Rule, mount: Option<&Path>) -> Workload {
    let Some(path) = path else { return Workload::cgroup(cgroup_id, None) };
    let (part, kind) = part(path, rule);
    if part == path || kind == Kind::Cgroup {
        return Workload { id: cgroup_id, path: Some(path.to_string()), kind };
    }
    // The mount shows these paths only if the process's own folder there is
    // its cgroup (not, say, a cgroup namespace's root mounted by the daemon).
    let inode = |p: &str| {
        let p = p.strip_prefix('/')?;
        let inside = !p.split('/').any(|c| c == "..");
        inside.then(|| std::fs::metadata(mount?.join(p)).ok().map(|m| m.ino())).flatten()
    };
    let id = match inode(path) == Some(cgroup_id) {
        true => inode(part),
        false => None,
    };
    let id = id.unwrap_or_else(|| {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::info!(
                path,
                mount = ?mount,
                "a client's cgroup is not found under the daemon's cgroup2 mount (a cgroup namespace of \
                 the daemon's own?): its workload is told by its cgroup path (said once)"
            );
        }
        path_id(part)
    });
    Workload { id, path: Some(part.to_string()), kind }
}

/// A number for the workload at `part`, the same for every process of it:
/// FNV-1a of the path (fixed, unlike the standard library's hasher, so the
/// number is the same in every run), with bit 63 set.
pub fn path_id(part: &str) -> u64 {
    let hash =
        part.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash | 1 << 63
}

/// The cgroup2 mount point in `mounts` (the text of `/proc/self/mounts`).
pub fn cgroup2_mount(mounts: &str) -> Option<std::path::PathBuf> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| std::path::PathBuf::from(f[1]))
    })
}

#[cfg(test)]
mod tests;
