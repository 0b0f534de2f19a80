//! Client processes and their leases.
//!
//! The NCCL plugin removes a rule only when its connection closes normally: a
//! crashed or killed job removes nothing, and its IPv6 uninstalls never match
//! (it hands the kernel a too-short address buffer). So the daemon watches the
//! processes themselves. Each connection that installs a rule, fetches a pool
//! or registers is tied to its client process; one pidfd per process is
//! watched on the runtime, and when it turns readable (the process exited) the
//! process's rules are removed through the normal per-NIC rule threads.
//!
//! Identifying the process, best first:
//! 1. `SO_PEERPIDFD` (Linux 6.5+): a pidfd for the peer even when it lives in
//!    a pid namespace the daemon cannot see (a sidecar pod);
//! 2. `SO_PEERCRED` + `pidfd_open` where the pid is visible;
//! 3. otherwise no lease: logged once per user, counted.
//!
//! One process, one watch: on pidfs kernels (6.9+) every pidfd of a process
//! has the same inode number; elsewhere the visible pid identifies it. On
//! 6.5–6.8 with an invisible pid nothing identifies the process across
//! connections, so each such connection keeps its own watch.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use foldhash::HashMap;
use nix::errno::Errno;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, watch};

use super::access::TenantPolicy;
#[cfg(test)]
use super::peer::kernel_has_peer_pidfd;
use super::peer::{peer_pidfd, pidfd_open, pidfs_inode};
use super::tenant::{self, Tenant};
use super::{credentials, Client};
use crate::metrics::Metrics;

/// A client process the daemon watches.
#[derive(Debug)]
pub struct Lease {
    id: NonZeroU32,
    /// Its pid as the daemon sees it, if visible.
    pub pid: Option<NonZeroU32>,
    key: ProcKey,
    alive: AtomicBool,
    /// Its tenant, found when the process was first seen (tenant isolation on).
    pub tenant: Option<Arc<Tenant>>,
    /// A duplicate of the watched pidfd, handed on by a takeover.
    pidfd: Option<OwnedFd>,
}

impl Lease {
    /// The lease's number, recorded with each rule it owns.
    pub fn id(&self) -> NonZeroU32 {
        self.id
    }

    /// False once the process has exited: then no rule may be booked for it.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

/// What tells one process from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ProcKey {
    /// The pidfs inode number: unique per process.
    Inode(u64),
    /// The pid in the daemon's namespace: unique while the process lives.
    Pid(u32),
    /// Nothing identifies it: a watch of its own.
    Unique(u64),
}

/// Client processes seen so far and alive now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCount {
    pub seen_any: bool,
    pub alive: usize,
}

/// How leases are used, from the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Watch client processes at all (`--leases`, `--shutdown_when_all_clients_exited`
    /// or tenant isolation).
    pub track: bool,
    /// Remove an exited process's rules (`--leases`).
    pub reclaim: bool,
}

#[derive(Default)]
struct Table {
    by_key: HashMap<ProcKey, Arc<Lease>>,
    /// Visible pids of live leases, for the one-syscall fast path.
    by_pid: HashMap<u32, Arc<Lease>>,
    next_id: u32,
    next_unique: u64,
    /// Users already told that their connections get no lease.
    warned_uids: HashSet<u32>,
}

/// The registry of watched client processes.
pub struct ClientTracker {
    policy: LeasePolicy,
    table: Mutex<Table>,
    count: watch::Sender<ClientCount>,
    /// Leases whose process exited, for the reaper that removes their rules.
    exits: mpsc::UnboundedSender<NonZeroU32>,
    metrics: Arc<Metrics>,
    /// Where `SO_PEERPIDFD` is missing (pre-6.5), it is not asked again.
    no_peer_pidfd: AtomicBool,
    watches: AtomicU64,
    pidfds: AtomicU64,
    /// The runtime the watches run on: connections are also identified on
    /// threads outside it (the rule endpoints' I/O threads).
    runtime: Option<tokio::runtime::Handle>,
    /// Tenant isolation: whether to find each process's tenant, and how.
    tenants: Arc<TenantPolicy>,
}

impl ClientTracker {
    /// The tracker and the receiving end of exited leases. Called on the
    /// runtime that is to watch the client processes.
    pub fn new(
        policy: LeasePolicy,
        metrics: Arc<Metrics>,
        tenants: Arc<TenantPolicy>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<NonZeroU32>) {
        let (exits, rx) = mpsc::unbounded_channel();
        let t = ClientTracker {
            policy,
            table: Mutex::new(Table::default()),
            count: watch::Sender::new(ClientCount::default()),
            exits,
            metrics,
            no_peer_pidfd: AtomicBool::new(false),
            watches: AtomicU64::new(0),
            pidfds: AtomicU64::new(0),
            runtime: tokio::runtime::Handle::try_current().ok(),
            tenants,
        };
        (Arc::new(t), rx)
    }

    pub fn policy(&self) -> LeasePolicy {
        self.policy
    }

    /// Follows the number of live client processes.
    pub fn subscribe(&self) -> watch::Receiver<ClientCount> {
        self.count.subscribe()
    }

    /// How many pidfd watches were started (one per process where it can be told apart).
    pub fn watches_started(&self) -> u64 {
        self.watches.load(Ordering::Relaxed)
    }

    /// How many pidfds were taken to identify peers (the slow path).
    pub fn pidfds_opened(&self) -> u64 {
        self.pidfds.load(Ordering::Relaxed)
    }

    /// Who is at the other end of `sock`: the process's visible pid and,
    /// where its rules go away with it (`--leases`), its lease.
    pub fn who(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Client {
        match self.identify(sock) {
            Some(lease) => Client {
                pid: lease.pid,
                tenant: lease.tenant.clone(),
                lease: self.policy.reclaim.then_some(lease),
            },
            None => Client::default(),
        }
    }

    /// Finds or starts the watch of the process at the other end of `sock`.
    pub fn identify(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Option<Arc<Lease>> {
        if !self.policy.track {
            return None;
        }
        let cred = credentials(sock);
        let pid = cred.and_then(|c| c.pid);
        // Fast path: a visible pid already watched (its watch has not fired,
        // so the pid still names the same process).
        if let Some(p) = pid {
            let t = self.table.lock().expect("lease table lock");
            if let Some(l) = t.by_pid.get(&p.get()).filter(|l| l.alive()) {
                return Some(l.clone());
            }
        }
        let pidfd = match self.peer_pidfd(sock) {
            Some(fd) => fd,
            None => match pid.map(|p| pidfd_open(p.get())) {
                Some(Ok(fd)) => fd,
                _ => {
                    self.no_lease(cred.map(|c| c.uid).unwrap_or(u32::MAX));
                    return None;
                }
            },
        };
        self.pidfds.fetch_add(1, Ordering::Relaxed);
        let key = match (pidfs_inode(&pidfd), pid) {
            (Some(ino), _) => ProcKey::Inode(ino),
            (None, Some(p)) => ProcKey::Pid(p.get()),
            (None, None) => ProcKey::Unique(0),
        };
        if let Some(l) = self.lookup(key) {
            return Some(l); // the new pidfd closes here
        }
        // Read outside the table's lock: it costs a few system calls.
        let tenant = self.tenants.checks().then(|| self.find_tenant(&pidfd, pid)).flatten();
        let lease = {
            let mut t = self.table.lock().expect("lease table lock");
            let key = match key {
                ProcKey::Unique(_) => {
                    t.next_unique += 1;
                    ProcKey::Unique(t.next_unique)
                }
                k => k,
            };
            // Another connection of the same process may have won the race.
            if let Some(l) = t.by_key.get(&key).filter(|l| l.alive()) {
                return Some(l.clone());
            }
            t.next_id = t.next_id.checked_add(1).unwrap_or(1);
            let id = NonZeroU32::new(t.next_id).expect("ids start at 1");
            let pidfd = pidfd.try_clone().ok();
            let lease = Arc::new(Lease { id, pid, key, alive: AtomicBool::new(true), tenant, pidfd });
            t.by_key.insert(key, lease.clone());
            if let Some(p) = pid {
                t.by_pid.insert(p.get(), lease.clone());
            }
            self.publish(t.by_key.len());
            lease
        };
        self.watches.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(lease = lease.id, pid = ?pid, key = ?lease.key, "watching client process");
        self.spawn_watch(pidfd, lease.clone());
        Some(lease)
    }

    fn find_tenant(&self, pidfd: &OwnedFd, pid: Option<NonZeroU32>) -> Option<Arc<Tenant>> {
        use std::os::fd::AsFd;
        let p = &self.tenants;
        let found = tenant::identify(pidfd.as_fd(), pid.map(|p| p.get()), &p.devices, p.cgroup2.as_deref());
        match &found {
            Some(t) => {
                p.saw(t);
                tracing::debug!(pid = ?pid, tenant = %t.name(), net = ?t.net.as_ref().map(|n| n.inode), "client tenant");
            }
            None => tracing::debug!(pid = ?pid, "client tenant unknown"),
        }
        found.map(Arc::new)
    }

    fn lookup(&self, key: ProcKey) -> Option<Arc<Lease>> {
        let t = self.table.lock().expect("lease table lock");
        t.by_key.get(&key).filter(|l| l.alive()).cloned()
    }

    fn publish(&self, alive: usize) {
        self.metrics.leases.clients.set(alive as i64);
        self.count.send_replace(ClientCount { seen_any: true, alive });
    }

    fn peer_pidfd(&self, sock: BorrowedFd<'_>) -> Option<OwnedFd> {
        if self.no_peer_pidfd.load(Ordering::Relaxed) {
            return None;
        }
        match peer_pidfd(sock) {
            Ok(fd) => Some(fd),
            Err(Errno::ENOPROTOOPT) => {
                tracing::info!("this kernel has no SO_PEERPIDFD (Linux 6.5+): clients in other pid namespaces get no lease");
                self.no_peer_pidfd.store(true, Ordering::Relaxed);
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "SO_PEERPIDFD failed");
                None
            }
        }
    }

    fn no_lease(&self, uid: u32) {
        self.metrics.leases.connections_without_lease.inc();
        let first = self.table.lock().expect("lease table lock").warned_uids.insert(uid);
        if first {
            tracing::warn!(
                uid,
                "client process cannot be identified (pid namespace not visible and no SO_PEERPIDFD): \
                 its rules stay until it removes them; share the pod's process namespace or use Linux 6.5+"
            );
        }
    }

    fn spawn_watch(self: &Arc<Self>, pidfd: OwnedFd, lease: Arc<Lease>) {
        let tracker = self.clone();
        let watch = async move {
            // SAFETY: the AsyncFd takes ownership of `pidfd`, so the descriptor
            // stays open and names the same pidfd for the AsyncFd's whole life.
            match unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) } {
                // A pidfd turns readable when its process exits.
                Ok(fd) => {
                    let _ = fd.readable().await;
                }
                Err(e) => {
                    tracing::warn!(lease = lease.id, error = %e, "cannot watch client pidfd; treating it as exited")
                }
            }
            tracker.exited(&lease);
        };
        match &self.runtime {
            Some(rt) => drop(rt.spawn(watch)),
            None => drop(tokio::spawn(watch)),
        }
    }

    fn exited(&self, lease: &Lease) {
        lease.alive.store(false, Ordering::Release);
        let alive = {
            let mut t = self.table.lock().expect("lease table lock");
            if t.by_key.get(&lease.key).is_some_and(|l| l.id == lease.id) {
                t.by_key.remove(&lease.key);
            }
            if let Some(p) = lease.pid {
                if t.by_pid.get(&p.get()).is_some_and(|l| l.id == lease.id) {
                    t.by_pid.remove(&p.get());
                }
            }
            t.by_key.len()
        };
        self.publish(alive);
        tracing::debug!(lease = lease.id, pid = ?lease.pid, "client process exited");
        if self.policy.reclaim {
            let _ = self.exits.send(lease.id);
        }
    }
}

#[path = "leases_handover.rs"]
mod handover;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::UnixStream;
    use std::process::Command;
    use std::time::Duration;

    fn tracker(track: bool, reclaim: bool) -> (Arc<ClientTracker>, mpsc::UnboundedReceiver<NonZeroU32>) {
        ClientTracker::new(
            LeasePolicy { track, reclaim },
            Arc::new(Metrics::new()),
            Arc::new(TenantPolicy::off()),
        )
    }

    #[tokio::test]
    async fn one_watch_per_process_across_connections() {
        let (t, _rx) = tracker(true, true);
        let pairs: Vec<_> = (0..5).map(|_| UnixStream::pair().unwrap()).collect();
        let leases: Vec<_> = pairs.iter().map(|(a, _)| t.identify(a.as_fd()).expect("lease")).collect();
        assert!(leases.iter().all(|l| l.id == leases[0].id), "same process, same lease");
        assert_eq!(leases[0].pid.map(|p| p.get()), Some(std::process::id()));
        assert_eq!(t.watches_started(), 1);
        assert_eq!(t.pidfds_opened(), 1, "later connections of a visible pid take the fast path");
        assert_eq!(*t.subscribe().borrow(), ClientCount { seen_any: true, alive: 1 });
        assert_eq!(t.metrics.leases.clients.get(), 1);
        let c = t.who(pairs[0].0.as_fd());
        assert_eq!(c.lease.as_ref().map(|l| l.id()), Some(leases[0].id));
        assert!(c.lease.is_some_and(|l| l.alive()));
    }

    #[tokio::test]
    async fn exit_of_the_peer_process_releases_its_lease() {
        let (t, mut exits) = tracker(true, true);
        // The peer must be another process: a child that connects, then exits.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut client = Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import socket,time; s=socket.socket(socket.AF_UNIX); s.connect({:?}); time.sleep(0.3)",
                path.display().to_string()
            ))
            .spawn()
            .unwrap();
        let (conn, _) = listener.accept().unwrap();
        let lease = t.identify(conn.as_fd()).expect("lease for the child");
        assert_eq!(lease.pid.map(|p| p.get()), Some(client.id()));
        assert!(lease.alive());
        client.wait().unwrap();
        let id = tokio::time::timeout(Duration::from_secs(5), exits.recv()).await.unwrap().unwrap();
        assert_eq!(id, lease.id);
        assert!(!lease.alive());
        assert_eq!(*t.subscribe().borrow(), ClientCount { seen_any: true, alive: 0 });
    }

    #[tokio::test]
    async fn tracking_off_identifies_nobody() {
        let (t, _rx) = tracker(false, false);
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(t.identify(a.as_fd()).is_none());
        assert_eq!(*t.subscribe().borrow(), ClientCount::default());
    }

    #[tokio::test]
    async fn tracking_without_reclaim_gives_no_lease_to_rules() {
        let (t, _rx) = tracker(true, false);
        let (a, _b) = UnixStream::pair().unwrap();
        let c = t.who(a.as_fd());
        assert!(c.pid.is_some());
        assert!(c.lease.is_none());
        assert_eq!(t.subscribe().borrow().alive, 1);
    }

    /// `(major, minor)` of the running kernel.
    fn kernel_version() -> (u32, u32) {
        let release = nix::sys::utsname::uname().unwrap().release().to_string_lossy().into_owned();
        let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok());
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    #[test]
    fn peer_pidfd_is_there_exactly_from_linux_6_5() {
        assert_eq!(kernel_has_peer_pidfd(), kernel_version() >= (6, 5), "kernel {:?}", kernel_version());
        if kernel_has_peer_pidfd() {
            let (a, _b) = UnixStream::pair().unwrap();
            let fd = peer_pidfd(a.as_fd()).unwrap();
            let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
            assert!(fdinfo.contains(&format!("Pid:\t{}", std::process::id())), "{fdinfo}");
        }
    }
}
