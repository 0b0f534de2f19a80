//! Identifying a connection's client process: the lease it already has, or
//! a new one whose tenant is read off the caller's thread, by the tenant
//! readers (`readers`), once per process. A caller that serves others
//! (a rule I/O thread, a runtime task) never waits for a read: it is told
//! the read is under way, and its `Waker` is woken when the read ends. A
//! process that exits before its tenant is read is nobody (see `opener`).

use std::num::NonZeroU32;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Poll, Wake, Waker};
use std::time::{Duration, Instant};

use foldhash::HashMap;

use super::opener::Opener;
use super::peer;
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

/// The clients one thread has seen, by their process's pidfs inode, so that
/// a known process's next connection costs no lock shared with other
/// threads. An entry counts while its process's lease is alive.
#[derive(Default)]
pub struct ClientCache {
    by_inode: HashMap<u64, Client>,
    /// The same clients by their pid as the daemon sees it, with when each
    /// was first known here (see [`ClientTracker::ask_queued`]).
    pub(super) by_pid: HashMap<u32, (Client, Instant)>,
}

/// Entries a [`ClientCache`] keeps, at most; past that it starts over.
const CACHE_MOST: usize = 4096;

impl ClientCache {
    /// The client of process `inode`, while its process lives.
    pub(super) fn get(&mut self, inode: u64) -> Option<Client> {
        let c = self.by_inode.get(&inode)?;
        if c.process.as_ref().is_some_and(|l| l.alive()) {
            return Some(c.clone());
        }
        self.by_inode.remove(&inode);
        None
    }

    fn put(&mut self, inode: u64, c: &Client) {
        if self.by_inode.len() >= CACHE_MOST || self.by_pid.len() >= CACHE_MOST {
            let alive = |c: &Client| c.process.as_ref().is_some_and(|l| l.alive());
            self.by_inode.retain(|_, c| alive(c));
            self.by_pid.retain(|_, (c, _)| alive(c));
            if self.by_inode.len() >= CACHE_MOST || self.by_pid.len() >= CACHE_MOST {
                self.by_inode.clear();
                self.by_pid.clear();
            }
        }
        self.by_inode.insert(inode, c.clone());
        if let Some(pid) = c.process.as_ref().and_then(|l| l.pid) {
            // Known from now on: the process has existed since before this instant.
            self.by_pid.insert(pid.get(), (c.clone(), Instant::now()));
        }
    }

    /// The client known here as pid `pid` since before `queued_after`, if
    /// its process has not exited (asked of the kernel now, not of the
    /// exit watcher, which may be a moment late).
    pub(super) fn by_pid_since(&mut self, pid: u32, queued_after: Instant) -> Option<Client> {
        let (c, seen) = self.by_pid.get(&pid)?;
        if *seen >= queued_after {
            return None;
        }
        let lease = c.process.as_ref()?;
        let running = lease.alive() && lease.pidfd.as_ref().is_some_and(|fd| !peer::exited(fd.as_fd()));
        if running {
            return Some(c.clone());
        }
        self.by_pid.remove(&pid);
        None
    }
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

/// Waits on this thread, at most until `deadline`, for the read behind `slot`.
fn wait_blocking(slot: &ReadSlot, deadline: Instant) -> Result<Who, IdentifyError> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    loop {
        if let Some(r) = slot.poll(&waker) {
            return outcome(r);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(IdentifyError::TimedOut);
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
        if let Some(after) = queued_after.filter(|_| self.policy.track) {
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
            None if now >= p.deadline => Some(Err(IdentifyError::TimedOut)),
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
            Err(_) => Err(IdentifyError::TimedOut),
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
            Found::Reading(slot) => wait_blocking(&slot, Instant::now() + self.timeout),
        }
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
            let slot = Arc::<ReadSlot>::default();
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
        pidfd: OwnedFd,
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
