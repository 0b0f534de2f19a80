//! The watched client processes through a takeover: each lease is handed on
//! with its number, its pidfd and its tenant, so that the successor watches
//! the same processes and reclaims their rules when they exit.

use std::num::NonZeroU32;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::{ClientTracker, Lease, ProcKey};
use crate::handover::{FdList, FdSet};
use crate::identity::tenant::{NetNs, Tenant};
use crate::pidfd::Pidfd;
use crate::wire::handover as wire;

impl ClientTracker {
    /// Every live lease, with its fds added to `fds`, and the next lease number.
    pub fn handover(&self, fds: &mut FdList) -> std::io::Result<(Vec<wire::Lease>, u32)> {
        let t = self.table.lock().expect("lease table lock");
        let mut out = Vec::with_capacity(t.by_key.len());
        for l in t.by_key.values().filter(|l| l.alive()) {
            // Its pidfd first: a lease whose process has just exited is not handed on.
            let Some(pidfd) = l.with_pidfd(|p| fds.push(p.as_fd())) else { continue };
            let pidfd = pidfd?;
            let (key_kind, key) = match l.key {
                ProcKey::Inode(i) => (wire::KeyKind::PidfsInode, i),
                ProcKey::Pid(p) => (wire::KeyKind::Pid, p.into()),
                ProcKey::Unique(u) => (wire::KeyKind::Unique, u),
            };
            let tenant = match &l.tenant {
                Some(tn) => Some(wire::Tenant {
                    cgroup_id: tn.cgroup_id,
                    cgroup: tn.cgroup.clone(),
                    gpus: tn.gpu_bits(),
                    netns_fd: tn.net.as_ref().and_then(|n| n.with_fd(|fd| fds.push(fd))).transpose()?,
                    netns_inode: tn.net.as_ref().map_or(0, |n| n.inode),
                    workload: Some(tn.workload.id),
                }),
                None => None,
            };
            out.push(wire::Lease {
                id: l.id.get(),
                pid: l.pid.map_or(0, NonZeroU32::get),
                pidfd,
                key_kind: key_kind.into(),
                key,
                tenant,
            });
        }
        Ok((out, t.next_id))
    }

    /// The workload ids the rules of the daemon handing over `leases`
    /// record as their tenants (its workloads, or its cgroups before there
    /// were workloads), each mapped to that workload's id as this daemon
    /// tells it: the rules it adopts are rewritten with them
    /// (`NicRules::retenant`), so that their processes remove them and the
    /// quota counts them as before. A rule whose process is gone keeps
    /// its id.
    pub fn handed_workloads(&self, leases: &[wire::Lease]) -> foldhash::HashMap<u64, u64> {
        let mut ids = foldhash::HashMap::default();
        for tn in leases.iter().filter_map(|l| l.tenant.as_ref()) {
            let now = self.tenants.workload_of(tn.cgroup_id, tn.cgroup.as_deref()).id;
            ids.insert(tn.cgroup_id, now);
            if let Some(then) = tn.workload {
                ids.insert(then, now);
            }
        }
        ids
    }

    /// Watches the processes of leases handed on by the daemon this one took
    /// over from, under the same numbers. Called on the runtime.
    pub fn adopt(
        self: &Arc<Self>,
        leases: &[wire::Lease],
        next_id: u32,
        fds: &mut FdSet,
    ) -> Result<usize, String> {
        let mut watches: Vec<(OwnedFd, Arc<Lease>)> = Vec::with_capacity(leases.len());
        for w in leases {
            let id = NonZeroU32::new(w.id).ok_or("a lease numbered 0")?;
            let key = match wire::KeyKind::try_from(w.key_kind) {
                Ok(wire::KeyKind::PidfsInode) => ProcKey::Inode(w.key),
                Ok(wire::KeyKind::Pid) => {
                    ProcKey::Pid(u32::try_from(w.key).map_err(|_| "a pid key out of range")?)
                }
                Ok(wire::KeyKind::Unique) => ProcKey::Unique(w.key),
                Ok(wire::KeyKind::Unset) | Err(_) => {
                    return Err(format!("lease {id}: unknown key kind {}", w.key_kind))
                }
            };
            let pidfd = fds.take(w.pidfd, "lease pidfd")?;
            let tenant = match &w.tenant {
                Some(tn) => {
                    let net = fds.take_opt(tn.netns_fd, "tenant network namespace")?;
                    let net = net.map(|fd| NetNs::new(tn.netns_inode, fd));
                    // Its workload as this daemon tells it: the daemon handing
                    // over may be of a version that kept none, or see other paths.
                    let workload = self.tenants.workload_of(tn.cgroup_id, tn.cgroup.as_deref());
                    let t = Tenant::from_parts(tn.cgroup_id, tn.cgroup.clone(), workload, tn.gpus, net);
                    self.tenants.saw(&t);
                    Some(Arc::new(t))
                }
                None => None,
            };
            let keep = pidfd.try_clone().ok().map(Pidfd::from_owned);
            let lease = Arc::new(Lease::new(id, NonZeroU32::new(w.pid), key, tenant, keep));
            watches.push((pidfd, lease));
        }
        let n = watches.len();
        {
            let mut t = self.table.lock().expect("lease table lock");
            t.next_id = t.next_id.max(next_id);
            if let Some(u) = watches
                .iter()
                .filter_map(|(_, l)| match l.key {
                    ProcKey::Unique(u) => Some(u),
                    _ => None,
                })
                .max()
            {
                t.next_unique = t.next_unique.max(u);
            }
            for (_, l) in &watches {
                t.by_key.insert(l.key, l.clone());
            }
            self.publish(t.by_key.len());
        }
        for (pidfd, lease) in watches {
            self.spawn_watch(pidfd, lease);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{LeasePolicy, TenantPolicy};
    use crate::metrics::Metrics;
    use std::time::Duration;

    #[tokio::test]
    async fn a_lease_handed_on_keeps_its_number_and_its_watch() {
        let new = || {
            ClientTracker::new(
                LeasePolicy { track: true, reclaim: true },
                Arc::new(Metrics::new()),
                Arc::new(TenantPolicy::off()),
            )
        };
        let (old, _old_exits) = new();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect({:?}); sys.stdin.read()",
                path.display().to_string()
            ))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (conn, _) = listener.accept().unwrap();
        let lease = old.identify(conn.as_fd()).unwrap().unwrap();
        let mut list = FdList::default();
        let (leases, next) = old.handover(&mut list).unwrap();
        assert_eq!((leases.len(), next), (1, lease.id().get()));
        let (successor, mut exits) = new();
        let mut set = FdSet::new(list.fds().iter().map(|f| f.try_clone().unwrap()).collect());
        assert_eq!(successor.adopt(&leases, next, &mut set).unwrap(), 1);
        // The same process is the same lease there, and a new one gets a new number.
        let again = successor.identify(conn.as_fd()).unwrap().unwrap();
        assert_eq!(again.id(), lease.id());
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(successor.identify(a.as_fd()).unwrap().unwrap().id() > lease.id());
        drop(child.stdin.take());
        child.wait().unwrap();
        let id = tokio::time::timeout(Duration::from_secs(5), exits.recv()).await.unwrap().unwrap();
        assert_eq!(id, lease.id(), "the successor saw the process exit");
        assert!(successor.adopt(&leases, next, &mut set).unwrap_err().contains("missing or named twice"));
    }

    #[test]
    fn rules_handed_over_are_mapped_to_the_workload_this_daemon_tells() {
        use crate::config::flags::TenantIsolation;
        use crate::identity::tenant::GpuDevices;
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let (job, task) = ("system.slice/slurmstepd.scope/job_42", "step_0/user/task_0");
        std::fs::create_dir_all(root.path().join(job).join(task)).unwrap();
        let ino = |p: &std::path::Path| std::fs::metadata(root.path().join(p)).unwrap().ino();
        let (job_id, task_id) = (ino(job.as_ref()), ino(&std::path::Path::new(job).join(task)));
        let mode = TenantIsolation::Enforce;
        let tenants = TenantPolicy::new(mode, 10, GpuDevices::default(), Some(root.path().into()), None);
        let policy = LeasePolicy { track: true, reclaim: true };
        let (tracker, _) = ClientTracker::new(policy, Arc::new(Metrics::new()), Arc::new(tenants));
        let lease = |workload| wire::Lease {
            tenant: Some(wire::Tenant {
                cgroup_id: task_id,
                cgroup: Some(format!("/{job}/{task}")),
                workload,
                ..Default::default()
            }),
            ..Default::default()
        };
        // A daemon from before workloads recorded the task's cgroup id; a
        // later one the workload's id as it told it (in a cgroup namespace
        // of its own, say, a number made from the path it saw).
        let ids = tracker.handed_workloads(&[lease(None), lease(Some(77))]);
        assert_eq!(ids.get(&task_id), Some(&job_id));
        assert_eq!(ids.get(&77), Some(&job_id));
        assert_eq!(ids.len(), 2);
    }
}
