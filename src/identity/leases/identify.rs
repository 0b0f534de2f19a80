//! Identifying a connection's client process: the lease it already has, or
//! a new one whose tenant is read off the caller's thread, by the tenant
//! readers (`readers`), once per process. A caller that serves others
//! (a rule I/O thread, a runtime task) never waits for a read: it is told
//! the read is under way, and its `Waker` is woken when the read ends. A
//! process that exits before its tenant is read is nobody (see `opener`).

use std::num::NonZeroU32;
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::cache::ClientCache;
use super::opener::Opener;
use super::{ClientTracker, Lease, ProcKey};
use crate::identity::{Client, ClientInfo};

/// How long a connection waits for its client's tenant to be read.
pub const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(2);

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
    #[error(
        "the daemon could not read this client's tenant: too many new processes of this tenant wait to be \
         read, or every reader is busy; try again"
    )]
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
    /// No reader could take it, or the read failed.
    Failed,
}

/// A tenant read under way: its outcome once it ends, and who waits for it.
#[derive(Default)]
pub(super) struct ReadSlot {
    done: OnceLock<Read>,
    waiters: Mutex<Vec<Waker>>,
    /// The process read, as its pidfd gave its pid (for the log).
    pid: Option<NonZeroU32>,
    /// A connection waited its limit for it before it ended: it ran long.
    pub(super) slow: AtomicBool,
}

impl ReadSlot {
    /// Records the outcome and wakes everyone waiting for it.
    pub(super) fn finish(&self, read: Read) {
        let _ = self.done.set(read);
        // Taken after the outcome is set: a waiter that registers later sees it.
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|p| p.into_inner()));
        for w in waiters {
            w.wake();
        }
    }

    /// The outcome, or `None` with `waker` to be woken when it comes.
    fn poll(&self, waker: &Waker) -> Option<Read> {
        if let Some(r) = self.done.get() {
            return Some(r.clone());
        }
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = self.done.get() {
            return Some(r.clone());
        }
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        None
    }
}

/// A connection's client, asked without waiting ([`ClientTracker::ask`]).
pub enum Asked {
    /// Known now, or known not to be told in time.
    Now(Result<Client, IdentifyError>),
    /// Its process is new and its tenant is being read: the waker given is
    /// woken when the read ends; then [`ClientTracker::pending`] tells.
    Reading(PendingClient),
}

/// A client whose tenant is being read.
pub struct PendingClient {
    slot: Arc<ReadSlot>,
    /// When the connection stops waiting ([`IDENTIFY_TIMEOUT`] after it asked).
    pub deadline: Instant,
}

/// What finding a connection's process came to.
enum Found {
    Now(Who),
    /// From the caller's cache.
    Cached(Client),
    /// Its tenant is being read.
    Reading(Arc<ReadSlot>),
}

/// A finished read as the client it found.
fn outcome(read: Read) -> Result<Who, IdentifyError> {
    match read {
        Read::Lease(l) => Ok(Who::Lease(l)),
        Read::Exited => Ok(Who::OpenerExited),
        Read::Failed => Err(IdentifyError::Busy),
    }
}

/// Wakes a thread parked in [`wait_blocking`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits on this thread, at most until `deadline`, for the read behind
/// `slot`; `None` once the deadline passed.
fn wait_blocking(slot: &ReadSlot, deadline: Instant) -> Option<Read> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    loop {
        if let Some(r) = slot.poll(&waker) {
            return Some(r);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}

impl ClientTracker {
    /// Who is at the other end of `sock`, without waiting: the process that
    /// opened it (its visible pid, its tenant and, where its rules go away
    /// with it (`--leases`), its lease), while that process lives. A new
    /// process's tenant is read by the tenant readers: the answer is then
    /// [`Asked::Reading`], and `waker` is woken when the read ends.
    /// `cache`: the calling thread's own memory of known processes.
    pub fn ask(self: &Arc<Self>, sock: BorrowedFd<'_>, cache: &mut ClientCache, waker: &Waker) -> Asked {
        cache.forget_exited(self.exited_count.load(std::sync::atomic::Ordering::Acquire));
        match self.begin(sock, Some(cache)) {
            Found::Now(who) => Asked::Now(Ok(self.client_of(who, Some(cache)))),
            Found::Cached(c) => Asked::Now(Ok(c)),
            Found::Reading(slot) => {
                let deadline = Instant::now() + self.timeout;
                match slot.poll(waker) {
                    Some(r) => Asked::Now(outcome(r).map(|w| self.client_of(w, Some(cache)))),
                    None => Asked::Reading(PendingClient { slot, deadline }),
                }
            }
        }
    }

    /// [`Self::ask`] for a connection taken from a listening socket found
    /// empty at `queued_after` (the connection was queued, so its `connect`
    /// made, after that): a process this thread has known as the
    /// connection's pid since before then is its opener, if that process
    /// still runs, and costs no pidfd.
    ///
    /// Why that holds: the kernel records the opener at `connect`. Suppose
    /// the opener were another process with the same pid. Two live
    /// processes never share a pid, so the opener must have exited, and its
    /// pid gone to the known process, before that process was created,
    /// which was before this thread first knew it, so before
    /// `queued_after`. But the connection was made after `queued_after`,
    /// while its opener ran. The known process runs now, so it ran at the
    /// `connect`: it is the opener. Without a `queued_after` (a connection
    /// taken over from another daemon), or where the pid is unknown or not
    /// visible here, the kernel's pidfd of the opener decides ([`Self::ask`]).
    pub fn ask_queued(
        self: &Arc<Self>,
        sock: BorrowedFd<'_>,
        cache: &mut ClientCache,
        waker: &Waker,
        queued_after: Option<Instant>,
    ) -> Asked {
        cache.forget_exited(self.exited_count.load(std::sync::atomic::Ordering::Acquire));
        // The cache's pids are those `/proc` shows; they are the connection's
        // (`SO_PEERCRED`, this process's namespace) only where `/proc` is this
        // process's own pid namespace. Elsewhere the kernel's pidfd decides.
        let own_pids = crate::pidfd::proc_is_own_pid_namespace();
        if let Some(after) = queued_after.filter(|_| self.policy.track && own_pids) {
            let pid = crate::identity::credentials(sock).and_then(|c| c.pid);
            if let Some(c) = pid.and_then(|p| cache.by_pid_since(p.get(), after)) {
                return Asked::Now(Ok(c));
            }
        }
        self.ask(sock, cache, waker)
    }

    /// A client whose tenant was being read: `Some` once the read ended
    /// (or, at `now`, the wait passed its deadline), else `None` with
    /// `waker` to be woken when it ends.
    pub fn pending(
        &self,
        p: &PendingClient,
        cache: &mut ClientCache,
        waker: &Waker,
        now: Instant,
    ) -> Option<Result<Client, IdentifyError>> {
        match p.slot.poll(waker) {
            Some(r) => Some(outcome(r).map(|w| self.client_of(w, Some(cache)))),
            None if now >= p.deadline => Some(Err(self.timed_out(&p.slot))),
            None => None,
        }
    }

    /// [`Self::ask`] for a task on the runtime: it waits, without holding a
    /// worker, at most [`IDENTIFY_TIMEOUT`].
    pub async fn who_async(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Client, IdentifyError> {
        let slot = match self.begin(sock, None) {
            Found::Now(who) => return Ok(self.client_of(who, None)),
            Found::Cached(c) => return Ok(c),
            Found::Reading(slot) => slot,
        };
        let read = std::future::poll_fn(|cx| match slot.poll(cx.waker()) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        });
        match tokio::time::timeout(self.timeout, read).await {
            Ok(r) => outcome(r).map(|w| self.client_of(w, None)),
            Err(_) => Err(self.timed_out(&slot)),
        }
    }

    /// [`Self::ask`], waiting on this thread for a tenant still to be read
    /// (at most [`IDENTIFY_TIMEOUT`]): for tools and tests, never for a
    /// thread that serves other clients.
    pub fn who(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Client, IdentifyError> {
        let who = self.find_blocking(sock)?;
        Ok(self.client_of(who, None))
    }

    /// The lease of the process that opened `sock` (`None`: not tracked,
    /// it cannot be told, or it has exited); its watch starts here if it is
    /// new. Waits like [`Self::who`].
    pub fn identify(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Option<Arc<Lease>>, IdentifyError> {
        Ok(match self.find_blocking(sock)? {
            Who::Lease(l) => Some(l),
            Who::Nobody | Who::OpenerExited => None,
        })
    }

    fn find_blocking(self: &Arc<Self>, sock: BorrowedFd<'_>) -> Result<Who, IdentifyError> {
        match self.begin(sock, None) {
            Found::Now(who) => Ok(who),
            Found::Cached(_) => unreachable!("no cache was given"),
            Found::Reading(slot) => match wait_blocking(&slot, Instant::now() + self.timeout) {
                Some(r) => outcome(r),
                None => Err(self.timed_out(&slot)),
            },
        }
    }

    /// A connection has waited its limit for the read behind `slot`, which
    /// has not ended: its request is refused (UNAVAILABLE, try again). The
    /// read is counted and logged once, and its thread stops counting as
    /// one of the readers, so that other processes' reads go on.
    fn timed_out(&self, slot: &ReadSlot) -> IdentifyError {
        if self.readers.ran_long(slot) {
            self.metrics.leases.tenant_reads_slow.inc();
            tracing::warn!(
                pid = slot.pid.map_or(0, NonZeroU32::get),
                "reading a new client's tenant has taken longer than a connection waits ({} s): its requests \
                 get UNAVAILABLE (try again) until the read ends, and another reader takes the reads waiting",
                self.timeout.as_secs_f32()
            );
        }
        IdentifyError::TimedOut
    }

    /// `who` as the client a request carries; remembered in `cache` when
    /// its process's pidfs inode names it.
    fn client_of(&self, who: Who, cache: Option<&mut ClientCache>) -> Client {
        match who {
            Who::Lease(lease) => {
                let inode = match lease.key {
                    ProcKey::Inode(i) => Some(i),
                    _ => None,
                };
                let c = Client::from(ClientInfo {
                    pid: lease.pid,
                    tenant: lease.tenant.clone(),
                    lease: self.policy.reclaim.then(|| lease.clone()),
                    process: Some(lease),
                    opener_exited: false,
                });
                if let (Some(cache), Some(inode)) = (cache, inode) {
                    cache.put(inode, &c);
                }
                c
            }
            Who::Nobody => Client::default(),
            Who::OpenerExited => Client::from(ClientInfo { opener_exited: true, ..ClientInfo::default() }),
        }
    }

    /// The lease of the process that opened `sock`, or the read under way
    /// that will tell it. A tenant to read is handed to the readers.
    fn begin(self: &Arc<Self>, sock: BorrowedFd<'_>, cache: Option<&mut ClientCache>) -> Found {
        if !self.policy.track {
            return Found::Now(Who::Nobody);
        }
        let (pidfd, key, pid) = match self.opener(sock, cache) {
            Opener::Cached(c) => return Found::Cached(c),
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
        // Its tenant: read once per process, by the readers.
        let slot = {
            let mut t = self.table.lock().expect("lease table lock");
            if let Some(slot) = t.reading.get(&key) {
                return Found::Reading(slot.clone()); // another connection of it started the read
            }
            let slot = Arc::new(ReadSlot { pid, ..ReadSlot::default() });
            t.reading.insert(key, slot.clone());
            slot
        };
        self.readers.submit(self, key, pidfd, pid, slot.clone());
        Found::Reading(slot)
    }

    /// Reads the tenant of the process behind `pidfd` and, unless it has
    /// exited meanwhile, records its lease (on a reader's thread).
    pub(super) fn read_tenant(
        self: &Arc<Self>,
        key: ProcKey,
        pidfd: crate::pidfd::Pidfd,
        pid: Option<NonZeroU32>,
    ) -> Read {
        match self.find_tenant(&pidfd, pid) {
            Ok(tenant) => Read::Lease(self.record(key, pidfd, pid, tenant)),
            Err(_) => Read::Exited,
        }
    }

    /// The read of `key` ended (or never started): its waiters hear of it.
    pub(super) fn read_done(&self, key: ProcKey, slot: &ReadSlot, read: Read) {
        self.table.lock().expect("lease table lock").reading.remove(&key);
        slot.finish(read);
    }
}
