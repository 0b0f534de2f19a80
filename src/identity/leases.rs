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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use foldhash::HashMap;
use nix::errno::Errno;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, watch, Semaphore};

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
    /// Its network namespace without a tenant (isolation off), opened when
    /// a request first needs it (an IPv6 flow to repair).
    net: OnceLock<Option<tenant::NetNs>>,
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

    /// Its network namespace: its tenant's, else opened now (once) from its
    /// pidfd. `None` where neither can be had.
    pub fn netns(&self) -> Option<&tenant::NetNs> {
        if let Some(t) = &self.tenant {
            return t.net.as_ref();
        }
        let open = || {
            use std::os::fd::AsFd;
            let net = tenant::open_net(self.pidfd.as_ref()?.as_fd(), self.pid.map(NonZeroU32::get));
            // Opened after it exited: nothing pins it beyond this.
            net.filter(|_| self.alive())
        };
        self.net.get_or_init(open).as_ref()
    }

    fn new(
        id: NonZeroU32,
        pid: Option<NonZeroU32>,
        key: ProcKey,
        tenant: Option<Arc<Tenant>>,
        pidfd: Option<OwnedFd>,
    ) -> Lease {
        Lease { id, pid, key, alive: AtomicBool::new(true), tenant, pidfd, net: OnceLock::new() }
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
    /// Processes whose tenant is being read, and where the lease will come.
    reading: HashMap<ProcKey, watch::Receiver<Option<Option<Arc<Lease>>>>>,
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
    /// Tenant reads under way, at most [`READ_SLOTS`].
    slots: Arc<Semaphore>,
    /// How long a connection waits for its client's tenant.
    timeout: Duration,
    /// Added to every tenant read on the pool: a slow read, for tests.
    #[cfg(test)]
    read_delay: Duration,
    /// Tenants read so far.
    #[cfg(test)]
    reads: AtomicU64,
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
            slots: Arc::new(Semaphore::new(READ_SLOTS)),
            timeout: IDENTIFY_TIMEOUT,
            #[cfg(test)]
            read_delay: Duration::ZERO,
            #[cfg(test)]
            reads: AtomicU64::new(0),
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

    /// Records the lease of a process found for the first time and starts its watch.
    fn record(
        self: &Arc<Self>,
        key: ProcKey,
        pidfd: OwnedFd,
        pid: Option<NonZeroU32>,
        tenant: Option<Arc<Tenant>>,
    ) -> Arc<Lease> {
        let lease = {
            let mut t = self.table.lock().expect("lease table lock");
            // Another connection of the same process may have won the race.
            if let Some(l) = t.by_key.get(&key).filter(|l| l.alive()) {
                return l.clone();
            }
            t.next_id = t.next_id.checked_add(1).unwrap_or(1);
            let id = NonZeroU32::new(t.next_id).expect("ids start at 1");
            let keep = pidfd.try_clone().ok();
            let lease = Arc::new(Lease::new(id, pid, key, tenant, keep));
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
        lease
    }

    fn find_tenant(&self, pidfd: &OwnedFd, pid: Option<NonZeroU32>) -> Option<Arc<Tenant>> {
        use std::os::fd::AsFd;
        let p = &self.tenants;
        #[cfg(test)]
        self.reads.fetch_add(1, Ordering::Relaxed);
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
        // Its flow checks' sockets pin its network namespace: they go now.
        if let Some(net) = lease.tenant.as_ref().and_then(|t| t.net.as_ref()) {
            net.release();
        }
        if let Some(net) = lease.net.get().and_then(Option::as_ref) {
            net.release();
        }
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
#[path = "leases_identify.rs"]
mod identify;
use identify::READ_SLOTS;
pub use identify::{IdentifyError, IDENTIFY_TIMEOUT};

#[cfg(test)]
#[path = "leases_tests.rs"]
mod tests;
