//! Identifying a connection's client process: the lease it already has, or
//! a new one whose tenant is read off the caller's thread, on the runtime's
//! blocking pool, once per process, waited for a bounded time. A process
//! that exits before its tenant is read is nobody (see `opener`).

use std::num::NonZeroU32;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::opener::Opener;
use super::{Client, ClientTracker, Lease, ProcKey};

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

/// Who a connection's client is, once found.
enum Who {
    /// A watched process.
    Lease(Arc<Lease>),
    /// Not tracked, or the kernel cannot say.
    Nobody,
    /// The process that opened the connection has exited: nobody, whoever
    /// sends on the connection now.
    OpenerExited,
}

/// What a tenant read came to, for the connections waiting on it.
#[derive(Clone)]
pub(super) enum Read {
    Lease(Arc<Lease>),
    /// The process exited before its tenant was read.
    Exited,
    /// No reader was free in time, or the read failed.
    Failed,
}

/// What finding a connection's process came to.
enum Found {
    Now(Who),
    /// Its tenant is being read: the outcome comes on this channel.
    Reading(watch::Receiver<Option<Read>>),
}

/// Waits at most `limit` for the read behind `rx`.
async fn wait_for_read(mut rx: watch::Receiver<Option<Read>>, limit: Duration) -> Result<Who, IdentifyError> {
    match tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await {
        Ok(Ok(read)) => outcome((*read).clone()),
        Ok(Err(_)) => Err(IdentifyError::Busy),
        Err(_) => Err(IdentifyError::TimedOut),
    }
}

/// A finished read as the client it found (`None`: not finished yet).
fn outcome(read: Option<Read>) -> Result<Who, IdentifyError> {
    match read {
        Some(Read::Lease(l)) => Ok(Who::Lease(l)),
        Some(Read::Exited) => Ok(Who::OpenerExited),
        Some(Read::Failed) => Err(IdentifyError::Busy),
        None => Err(IdentifyError::TimedOut),
    }
}

impl ClientTracker {
    /// Who is at the other end of `sock`: the process that opened it (its
    /// visible pid, its tenant and, where its rules go away with it
    /// (`--leases`), its lease), while that process lives. Called on a
    /// thread of its own (the rule endpoints' I/O threads): a tenant still
    /// to be read is read on the runtime's blocking pool, and waited for at
    /// most [`IDENTIFY_TIMEOUT`].
    pub fn who(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Client, IdentifyError> {
        Ok(self.client_of(self.find(sock)?))
    }

    /// [`Self::who`] for a task on the runtime: it waits without holding a worker.
    pub async fn who_async(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Client, IdentifyError> {
        let who = match self.begin(sock, Some(tokio::runtime::Handle::current())) {
            Found::Now(who) => who,
            Found::Reading(rx) => wait_for_read(rx, self.timeout).await?,
        };
        Ok(self.client_of(who))
    }

    fn client_of(&self, who: Who) -> Client {
        match who {
            Who::Lease(lease) => Client {
                pid: lease.pid,
                tenant: lease.tenant.clone(),
                lease: self.policy.reclaim.then(|| lease.clone()),
                process: Some(lease),
                opener_exited: false,
            },
            Who::Nobody => Client::default(),
            Who::OpenerExited => Client { opener_exited: true, ..Client::default() },
        }
    }

    /// The lease of the process that opened `sock` (`None`: not tracked,
    /// it cannot be told, or it has exited); its watch starts here if it is
    /// new. On a runtime thread, or without a runtime, a tenant is read right here.
    pub fn identify(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Option<Arc<Lease>>, IdentifyError> {
        Ok(match self.find(sock)? {
            Who::Lease(l) => Some(l),
            Who::Nobody | Who::OpenerExited => None,
        })
    }

    fn find(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Who, IdentifyError> {
        let pool = match tokio::runtime::Handle::try_current() {
            Ok(_) => None,
            Err(_) => self.runtime.clone(),
        };
        match self.begin(sock, pool.clone()) {
            Found::Now(who) => Ok(who),
            Found::Reading(rx) => match pool {
                Some(rt) => rt.block_on(wait_for_read(rx, self.timeout)),
                // Read inline, or by another caller not done yet.
                None => outcome(rx.borrow().clone()),
            },
        }
    }

    /// The lease of the process that opened `sock`, or how to wait for it. A
    /// tenant to read is read on `pool`'s blocking threads, or inline without one.
    fn begin(self: &Arc<Self>, sock: BorrowedFd<'_>, pool: Option<tokio::runtime::Handle>) -> Found {
        if !self.policy.track {
            return Found::Now(Who::Nobody);
        }
        let (pidfd, key, pid) = match self.opener(sock) {
            Opener::Known(l) => return Found::Now(Who::Lease(l)),
            Opener::New { pidfd, key, pid } => (pidfd, key, pid),
            Opener::Gone => return Found::Now(Who::OpenerExited),
            Opener::Unseen(uid) => {
                self.no_lease(uid);
                return Found::Now(Who::Nobody);
            }
        };
        if !self.tenants.checks() {
            return Found::Now(Who::Lease(self.record(key, pidfd, pid, None)));
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
                let read = self.read_tenant(key, pidfd, pid);
                self.read_done(key, &tx, read);
            }
        }
        Found::Reading(rx)
    }

    /// Reads the tenant of the process behind `pidfd` and, unless it has
    /// exited meanwhile, records its lease.
    fn read_tenant(self: &Arc<Self>, key: ProcKey, pidfd: OwnedFd, pid: Option<NonZeroU32>) -> Read {
        match self.find_tenant(&pidfd, pid) {
            Ok(tenant) => Read::Lease(self.record(key, pidfd, pid, tenant)),
            Err(_) => Read::Exited,
        }
    }

    /// Reads a tenant on a blocking thread, once one of [`READ_SLOTS`] is
    /// free, and records the lease; the readers waiting hear of it on `tx`.
    async fn read_on_pool(
        self: Arc<Self>,
        key: ProcKey,
        pidfd: OwnedFd,
        pid: Option<NonZeroU32>,
        tx: watch::Sender<Option<Read>>,
    ) {
        let started = std::time::Instant::now();
        let read = match tokio::time::timeout(self.timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => {
                let me = self.clone();
                let read = tokio::task::spawn_blocking(move || {
                    let _slot = slot;
                    #[cfg(test)]
                    std::thread::sleep(me.read_delay);
                    me.read_tenant(key, pidfd, pid)
                });
                read.await.unwrap_or(Read::Failed)
            }
            _ => {
                tracing::warn!(
                    pid = pid.map_or(0, NonZeroU32::get),
                    slots = READ_SLOTS,
                    "cannot read a client's tenant: every reader is busy (stuck on other clients' files?); \
                     its request gets UNAVAILABLE"
                );
                Read::Failed
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
        self.read_done(key, &tx, read);
    }

    fn read_done(&self, key: ProcKey, tx: &watch::Sender<Option<Read>>, read: Read) {
        self.table.lock().expect("lease table lock").reading.remove(&key);
        tx.send_replace(Some(read));
    }
}
