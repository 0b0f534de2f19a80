//! Identifying a connection's client process: the lease it already has, or
//! a new one whose tenant is read off the caller's thread, on the runtime's
//! blocking pool, once per process, waited for a bounded time.

use std::num::NonZeroU32;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{credentials, pidfd_open, pidfs_inode, Client, ClientTracker, Lease, ProcKey};

/// How long a connection waits for its client's tenant to be read.
pub const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(2);
/// Tenants read at once, at most, each on a blocking thread: a read that
/// hangs (a client's files on a mount that does not answer) holds one.
pub(super) const READ_SLOTS: usize = 16;

/// Why a connection's client could not be told in time. Its request gets
/// UNAVAILABLE: asking again waits for the same read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    #[error(
        "the daemon could not read this client's tenant (its cgroup, open files and network namespace) \
         within {} s; try again",
        IDENTIFY_TIMEOUT.as_secs()
    )]
    TimedOut,
    #[error("the daemon could not read this client's tenant: every reader is busy; try again")]
    Busy,
}

/// What finding a connection's process came to.
enum Found {
    /// Known already, or just recorded.
    Lease(Arc<Lease>),
    /// Its tenant is being read: the lease comes on this channel (`Some(None)`: the read failed).
    Reading(watch::Receiver<Option<Option<Arc<Lease>>>>),
    /// Not tracked, or it cannot be told.
    Nobody,
}

/// Waits at most `limit` for the read behind `rx`.
async fn wait_for_read(
    mut rx: watch::Receiver<Option<Option<Arc<Lease>>>>,
    limit: Duration,
) -> Result<Option<Arc<Lease>>, IdentifyError> {
    match tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await {
        Ok(Ok(read)) => {
            let read: Option<Option<Arc<Lease>>> = (*read).clone();
            read.flatten().map(Some).ok_or(IdentifyError::Busy)
        }
        Ok(Err(_)) => Err(IdentifyError::Busy),
        Err(_) => Err(IdentifyError::TimedOut),
    }
}

impl ClientTracker {
    /// Who is at the other end of `sock`: the process's visible pid and,
    /// where its rules go away with it (`--leases`), its lease. Called on a
    /// thread of its own (the rule endpoints' I/O threads): a tenant still to
    /// be read is read on the runtime's blocking pool, and waited for at most
    /// [`IDENTIFY_TIMEOUT`].
    pub fn who(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Client, IdentifyError> {
        Ok(self.client_of(self.identify(sock)?))
    }

    /// [`Self::who`] for a task on the runtime: it waits without holding a worker.
    pub async fn who_async(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Client, IdentifyError> {
        let lease = match self.begin(sock, Some(tokio::runtime::Handle::current())) {
            Found::Lease(l) => Some(l),
            Found::Nobody => None,
            Found::Reading(rx) => wait_for_read(rx, self.timeout).await?,
        };
        Ok(self.client_of(lease))
    }

    fn client_of(&self, lease: Option<Arc<Lease>>) -> Client {
        match lease {
            Some(lease) => Client {
                pid: lease.pid,
                tenant: lease.tenant.clone(),
                lease: self.policy.reclaim.then(|| lease.clone()),
                process: Some(lease),
            },
            None => Client::default(),
        }
    }

    /// Finds or starts the watch of the process at the other end of `sock`
    /// (`None`: not tracked, or it cannot be told). On a runtime thread, or
    /// without a runtime, a tenant is read right here.
    pub fn identify(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Option<Arc<Lease>>, IdentifyError> {
        let pool = match tokio::runtime::Handle::try_current() {
            Ok(_) => None,
            Err(_) => self.runtime.clone(),
        };
        match self.begin(sock, pool.clone()) {
            Found::Lease(l) => Ok(Some(l)),
            Found::Nobody => Ok(None),
            Found::Reading(rx) => match pool {
                Some(rt) => rt.block_on(wait_for_read(rx, self.timeout)),
                // Read inline, or by another caller not done yet.
                None => rx.borrow().clone().flatten().map(Some).ok_or(IdentifyError::TimedOut),
            },
        }
    }

    /// The lease of the process at the other end of `sock`, or how to wait
    /// for it. A tenant to read is read on `pool`'s blocking threads, or
    /// inline without one.
    fn begin(self: &Arc<Self>, sock: BorrowedFd<'_>, pool: Option<tokio::runtime::Handle>) -> Found {
        if !self.policy.track {
            return Found::Nobody;
        }
        let cred = credentials(sock);
        let pid = cred.and_then(|c| c.pid);
        // Fast path: a visible pid already watched (its watch has not fired,
        // so the pid still names the same process).
        if let Some(p) = pid {
            let t = self.table.lock().expect("lease table lock");
            if let Some(l) = t.by_pid.get(&p.get()).filter(|l| l.alive()) {
                return Found::Lease(l.clone());
            }
        }
        let pidfd = match self.peer_pidfd(sock) {
            Some(fd) => fd,
            None => match pid.map(|p| pidfd_open(p.get())) {
                Some(Ok(fd)) => fd,
                _ => {
                    self.no_lease(cred.map(|c| c.uid).unwrap_or(u32::MAX));
                    return Found::Nobody;
                }
            },
        };
        self.pidfds.fetch_add(1, Ordering::Relaxed);
        let key = match (pidfs_inode(&pidfd), pid) {
            (Some(ino), _) => ProcKey::Inode(ino),
            (None, Some(p)) => ProcKey::Pid(p.get()),
            (None, None) => {
                let mut t = self.table.lock().expect("lease table lock");
                t.next_unique += 1;
                ProcKey::Unique(t.next_unique)
            }
        };
        if let Some(l) = self.lookup(key) {
            return Found::Lease(l); // the new pidfd closes here
        }
        if !self.tenants.checks() {
            return Found::Lease(self.record(key, pidfd, pid, None));
        }
        // Its tenant: read once per process, off the caller's thread where it can be.
        let tx = {
            let mut t = self.table.lock().expect("lease table lock");
            if let Some(rx) = t.reading.get(&key) {
                return Found::Reading(rx.clone()); // another connection of it started the read
            }
            let (tx, rx) = watch::channel(None);
            t.reading.insert(key, rx);
            tx
        };
        let rx = tx.subscribe();
        match pool {
            Some(rt) => drop(rt.spawn(self.clone().read_on_pool(key, pidfd, pid, tx))),
            None => {
                let tenant = self.find_tenant(&pidfd, pid);
                let lease = self.record(key, pidfd, pid, tenant);
                self.read_done(key, &tx, Some(lease));
            }
        }
        Found::Reading(rx)
    }

    /// Reads a tenant on a blocking thread, once one of [`READ_SLOTS`] is
    /// free, and records the lease; the readers waiting hear of it on `tx`.
    async fn read_on_pool(
        self: Arc<Self>,
        key: ProcKey,
        pidfd: OwnedFd,
        pid: Option<NonZeroU32>,
        tx: watch::Sender<Option<Option<Arc<Lease>>>>,
    ) {
        let started = std::time::Instant::now();
        let lease = match tokio::time::timeout(self.timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => {
                let me = self.clone();
                let read = tokio::task::spawn_blocking(move || {
                    let _slot = slot;
                    #[cfg(test)]
                    std::thread::sleep(me.read_delay);
                    let tenant = me.find_tenant(&pidfd, pid);
                    me.record(key, pidfd, pid, tenant)
                });
                read.await.ok()
            }
            _ => {
                tracing::warn!(
                    pid = pid.map_or(0, NonZeroU32::get),
                    slots = READ_SLOTS,
                    "cannot read a client's tenant: every reader is busy (stuck on other clients' files?); \
                     its request gets UNAVAILABLE"
                );
                None
            }
        };
        let took = started.elapsed();
        if took > self.timeout {
            tracing::warn!(
                pid = pid.map_or(0, NonZeroU32::get),
                took_ms = took.as_millis() as u64,
                "reading a client's tenant was slow: its connection was answered UNAVAILABLE meanwhile"
            );
        }
        self.read_done(key, &tx, lease);
    }

    fn read_done(
        &self,
        key: ProcKey,
        tx: &watch::Sender<Option<Option<Arc<Lease>>>>,
        lease: Option<Arc<Lease>>,
    ) {
        self.table.lock().expect("lease table lock").reading.remove(&key);
        tx.send_replace(Some(lease));
    }
}
