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
//! The client of a connection is the process that opened it, as the kernel
//! recorded it then, and only while that process lives (see `opener`):
//! 1. `SO_PEERPIDFD` (Linux 6.5+): a pidfd of that very process, even when it
//!    lives in a pid namespace the daemon cannot see. If it has exited (it
//!    may have passed the connection on), nobody is the client;
//! 2. before 6.5, the pid `SO_PEERCRED` recorded, which may name another
//!    process by now: the process holding that pid is the client only while
//!    it holds the connection's other end (`unix_diag`);
//! 3. otherwise no lease: logged once per user, counted.
//!
//! One process, one watch: on pidfs kernels (6.9+) every pidfd of a process
//! has the same inode number, which no other process ever gets, so the
//! table is keyed by it and a known process costs one `getsockopt` and one
//! `fstat`. Elsewhere a pid identifies a process that has not been reaped,
//! so a lease found by pid counts only once its process is shown to be the
//! connection's. On 6.5–6.8 with an invisible pid nothing identifies the
//! process across connections, so each such connection keeps its own watch.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use foldhash::HashMap;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, watch};

use super::access::TenantPolicy;
use super::tenant::{self, Tenant, Unread};
use crate::metrics::Metrics;
use crate::netlink::sock_diag::SockDiag;
use crate::pidfd::Pidfd;

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
    /// A duplicate of the watched pidfd: handed on by a takeover, and what
    /// shows that a pid still names this process; closed when it exits.
    pidfd: Mutex<Option<Pidfd>>,
    /// Its network namespace without a tenant (isolation off), opened when
    /// a request first needs it (an IPv6 flow to repair).
    net: OnceLock<Option<tenant::NetNs>>,
}

impl Lease {
    /// The lease's number, recorded with each rule it owns.
    pub fn id(&self) -> NonZeroU32 {
        self.id
    }

    /// Whether every connection of its process gets this lease. Not where
    /// nothing tells the process across connections (`ProcKey::Unique`):
    /// there each connection has a lease of its own, and a rule's lease
    /// says nothing of which process asks on another connection.
    pub fn names_process(&self) -> bool {
        !matches!(self.key, ProcKey::Unique(_))
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
            self.with_pidfd(|pidfd| {
                let dir = self.pid.and_then(|p| tenant::proc_dir(pidfd, p.get()).ok());
                let net = tenant::open_net(pidfd, dir.as_ref().map(|d| d.as_fd()));
                // Opened after it exited: it may not be its, and nothing pins it beyond this.
                net.filter(|_| !pidfd.exited() && self.alive())
            })?
        };
        self.net.get_or_init(open).as_ref()
    }

    fn new(
        id: NonZeroU32,
        pid: Option<NonZeroU32>,
        key: ProcKey,
        tenant: Option<Arc<Tenant>>,
        pidfd: Option<Pidfd>,
    ) -> Lease {
        let pidfd = Mutex::new(pidfd);
        Lease { id, pid, key, alive: AtomicBool::new(true), tenant, pidfd, net: OnceLock::new() }
    }

    /// `f` on the lease's pidfd, while the process has not been seen to exit.
    fn with_pidfd<T>(&self, f: impl FnOnce(&Pidfd) -> T) -> Option<T> {
        self.pidfd.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(f)
    }
}

/// What tells one process from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ProcKey {
    /// The pidfs inode number: unique per process, for good.
    Inode(u64),
    /// The pid in the daemon's namespace: unique only until the process is
    /// reaped, so a lease found by it must be shown to be the caller's.
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
    next_id: u32,
    next_unique: u64,
    /// Users already told that their connections get no lease.
    warned_uids: HashSet<u32>,
    /// Processes whose tenant is being read, and where the outcome will come.
    reading: HashMap<ProcKey, Arc<ReadSlot>>,
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
    /// Without `SO_PEERPIDFD`: a `unix_diag` socket of the daemon's own
    /// namespace, which names the client end of a connection.
    unix_diag: Mutex<Option<SockDiag>>,
    watches: AtomicU64,
    pidfds: AtomicU64,
    /// How many client processes were seen to exit: a thread's cache that
    /// saw fewer lets go of its exited entries when next used.
    exited_count: AtomicU64,
    /// The runtime the watches run on: connections are also identified on
    /// threads outside it (the rule endpoints' I/O threads).
    runtime: Option<tokio::runtime::Handle>,
    /// Tenant isolation: whether to find each process's tenant, and how.
    tenants: Arc<TenantPolicy>,
    /// The threads that read new processes' tenants.
    readers: Readers,
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
        if policy.track && !crate::pidfd::proc_is_own_pid_namespace() {
            tracing::info!(
                "/proc shows another pid namespace's pids than this daemon's own: a connection's client is \
                 named by the kernel's pidfd of its opener, never by a pid it is known by"
            );
        }
        let (exits, rx) = mpsc::unbounded_channel();
        let t = ClientTracker {
            policy,
            table: Mutex::new(Table::default()),
            count: watch::Sender::new(ClientCount::default()),
            exits,
            metrics,
            no_peer_pidfd: AtomicBool::new(false),
            unix_diag: Mutex::new(None),
            watches: AtomicU64::new(0),
            exited_count: AtomicU64::new(0),
            pidfds: AtomicU64::new(0),
            runtime: tokio::runtime::Handle::try_current().ok(),
            tenants,
            readers: Readers::default(),
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

    /// How many processes were looked at beyond the table (the slow path).
    pub fn pidfds_opened(&self) -> u64 {
        self.pidfds.load(Ordering::Relaxed)
    }

    /// Records the lease of a process found for the first time and starts its watch.
    fn record(
        self: &Arc<Self>,
        key: ProcKey,
        pidfd: Pidfd,
        pid: Option<NonZeroU32>,
        tenant: Option<Arc<Tenant>>,
    ) -> Arc<Lease> {
        let lease = {
            let mut t = self.table.lock().expect("lease table lock");
            // Another connection of the same process may have won the race.
            if let Some(l) = t.by_key.get(&key).filter(|l| l.alive() && same_process(l, &pidfd)) {
                return l.clone();
            }
            t.next_id = t.next_id.checked_add(1).unwrap_or(1);
            let id = NonZeroU32::new(t.next_id).expect("ids start at 1");
            let keep = pidfd.try_clone().ok();
            let lease = Arc::new(Lease::new(id, pid, key, tenant, keep));
            t.by_key.insert(key, lease.clone());
            self.publish(t.by_key.len());
            lease
        };
        self.watches.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(lease = lease.id, pid = ?pid, key = ?lease.key, "watching client process");
        self.spawn_watch(pidfd.into_owned(), lease.clone());
        lease
    }

    /// The tenant of the process behind `pidfd` (`pid`: its pid, as the
    /// pidfd gave it), `None` where it cannot be told; `Err` when the
    /// process exited before the read ended.
    fn find_tenant(&self, pidfd: &Pidfd, pid: Option<NonZeroU32>) -> Result<Option<Arc<Tenant>>, Exited> {
        let p = &self.tenants;
        #[cfg(test)]
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pid = pid.map(NonZeroU32::get);
        match tenant::identify(pidfd, pid, &p.devices, p.cgroup2.as_deref(), p.workloads) {
            Ok(t) => {
                p.saw(&t);
                let (workload, cgroup) = (t.name(), t.cgroup.as_deref().unwrap_or("?"));
                tracing::debug!(pid, %workload, cgroup, net = ?t.net.as_ref().map(|n| n.inode), "client tenant");
                Ok(Some(Arc::new(t)))
            }
            Err(Unread::Unknown) => {
                tracing::debug!(pid, "client tenant unknown");
                Ok(None)
            }
            Err(Unread::Exited) => {
                tracing::debug!(pid, "client process exited while its tenant was read");
                Err(Exited)
            }
        }
    }

    /// The live lease under `key`; a lease found by pid only if
    /// `is_it(lease)` shows it is the caller's process.
    fn lookup(&self, key: ProcKey, is_it: impl FnOnce(&Lease) -> bool) -> Option<Arc<Lease>> {
        let found = {
            let t = self.table.lock().expect("lease table lock");
            t.by_key.get(&key).filter(|l| l.alive()).cloned()?
        };
        match key {
            ProcKey::Inode(_) => Some(found),
            ProcKey::Pid(_) => is_it(&found).then_some(found),
            ProcKey::Unique(_) => None,
        }
    }

    fn publish(&self, alive: usize) {
        self.metrics.leases.clients.set(alive as i64);
        self.count.send_replace(ClientCount { seen_any: true, alive });
    }

    fn no_lease(&self, uid: u32) {
        self.metrics.leases.connections_without_lease.inc();
        let first = self.table.lock().expect("lease table lock").warned_uids.insert(uid);
        if first {
            tracing::warn!(
                uid,
                "client process cannot be identified (pid namespace not visible and no SO_PEERPIDFD, or \
                 unix_diag unavailable): its rules stay until it removes them; share the pod's process \
                 namespace or use Linux 6.5+"
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
        // Nothing of the process is kept past its end: its pidfd, and the
        // handles and flow checks' sockets that pin its network namespace,
        // close now, whoever still holds the lease (a thread's cache).
        drop(lease.pidfd.lock().unwrap_or_else(|p| p.into_inner()).take());
        self.exited_count.fetch_add(1, Ordering::Release);
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
            t.by_key.len()
        };
        self.publish(alive);
        tracing::debug!(lease = lease.id, pid = ?lease.pid, "client process exited");
        if self.policy.reclaim {
            let _ = self.exits.send(lease.id);
        }
    }
}

/// The process a pidfd names exited before its tenant was read to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exited;

/// Whether `lease` is the process behind `pidfd`, which was found to hold
/// the pid of the lease's key: both unreaped now means both hold that pid
/// now, and only one process can. (An inode key names one process anyway.)
fn same_process(lease: &Lease, pidfd: &Pidfd) -> bool {
    match lease.key {
        ProcKey::Inode(_) => true,
        ProcKey::Pid(_) => lease.with_pidfd(Pidfd::unreaped).unwrap_or(false) && pidfd.unreaped(),
        ProcKey::Unique(_) => false,
    }
}

mod cache;
mod handover;
mod identify;
mod opener;
mod readers;
pub use cache::ClientCache;
use identify::ReadSlot;
pub use identify::{Asked, IdentifyError, PendingClient, IDENTIFY_TIMEOUT};
use readers::Readers;

#[cfg(test)]
mod tests;
