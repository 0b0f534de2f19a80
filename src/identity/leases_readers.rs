//! The tenant readers: a few threads of the tracker's own that read new
//! client processes' tenants (cgroup, open files, network namespace), one
//! read per process. Nobody waits on them: a connection whose tenant is
//! being read is parked by whoever serves it, and woken when the read ends.
//!
//! Reads wait in a queue that takes turns between cgroups (the cgroup the
//! kernel gives for the new process's pidfd; one lane for all where it
//! gives none), each cgroup with a bounded share of it and at most
//! [`READING_PER_TENANT`] of its reads running at once: a tenant starting
//! many processes at once waits for its own reads, not other tenants', and
//! one whose reads hang (files on a mount that does not answer) holds up
//! only its own. A read is bounded too (the open files it looks at, see
//! `identity::held`), and readers run at a lower priority than the threads
//! that serve requests, so that on a busy machine the rule path goes first.

use std::num::NonZeroU32;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, Weak};

use super::identify::{Read, ReadSlot};
use super::{peer, ClientTracker, ProcKey};
use crate::types::fair::FairQueue;

/// Reader threads, at most (started as reads come).
pub(super) const READERS: usize = 8;
/// Reads of one cgroup running at once, at most.
pub(super) const READING_PER_TENANT: usize = 2;
/// Reads waiting per cgroup, at most; past that a new process of that
/// cgroup is not identified this time (its request: UNAVAILABLE, try again).
pub(super) const WAITING_PER_TENANT: usize = 32;
/// Reads waiting in all, at most.
pub(super) const WAITING_MOST: usize = 1024;
/// The readers' nice value: below the rule path's threads.
const READER_NICE: libc::c_int = 10;

/// A process whose tenant is to be read.
struct Job {
    tracker: Weak<ClientTracker>,
    key: ProcKey,
    pidfd: OwnedFd,
    pid: Option<NonZeroU32>,
    slot: Arc<ReadSlot>,
}

#[derive(Default)]
struct State {
    jobs: FairQueue<u64, Job>,
    /// Reads running now, per cgroup.
    reading: foldhash::HashMap<u64, usize>,
    threads: usize,
    idle: usize,
    closed: bool,
}

impl State {
    /// The next read whose cgroup has room to run one more.
    fn next(&mut self) -> Option<(u64, Job)> {
        let reading = &self.reading;
        let (lane, job) =
            self.jobs.pop_where(|lane| reading.get(lane).copied().unwrap_or(0) < READING_PER_TENANT)?;
        *self.reading.entry(lane).or_default() += 1;
        Some((lane, job))
    }

    fn read_ended(&mut self, lane: u64) {
        if let Some(n) = self.reading.get_mut(&lane) {
            *n -= 1;
            if *n == 0 {
                self.reading.remove(&lane);
            }
        }
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The readers of one tracker; they end when it does.
#[derive(Default)]
pub(super) struct Readers {
    shared: Arc<Shared>,
}

impl Readers {
    /// Queues the read of the process behind `pidfd` (`key`, `pid`), whose
    /// outcome goes to `slot`. Refused at once (the outcome: failed) when
    /// its cgroup already has [`WAITING_PER_TENANT`] reads waiting, or all
    /// of them [`WAITING_MOST`].
    pub(super) fn submit(
        &self,
        tracker: &Arc<ClientTracker>,
        key: ProcKey,
        pidfd: OwnedFd,
        pid: Option<NonZeroU32>,
        slot: Arc<ReadSlot>,
    ) {
        // Where the kernel cannot say (before Linux 6.13, a parent the daemon
        // cannot see), every such process shares one lane.
        let lane = peer::pidfd_cgroup_id(pidfd.as_fd()).unwrap_or(0);
        let job = Job { tracker: Arc::downgrade(tracker), key, pidfd, pid, slot };
        let mut st = self.shared.lock();
        let refused = match st.closed || st.jobs.len() >= WAITING_MOST {
            true => Some(job),
            false => st.jobs.push_within(lane, job, WAITING_PER_TENANT).err(),
        };
        if let Some(job) = refused {
            drop(st);
            tracker.metrics.leases.tenant_reads_refused.inc();
            tracing::warn!(
                pid = pid.map_or(0, NonZeroU32::get),
                cgroup_id = lane,
                "cannot read a new client's tenant now: too many of its cgroup's new processes wait to be \
                 read, or every reader is busy; its request gets UNAVAILABLE (try again)"
            );
            tracker.read_done(job.key, &job.slot, Read::Failed);
            return;
        }
        tracker.metrics.leases.tenant_reads_waiting.set(st.jobs.len() as i64);
        if st.idle == 0 && st.threads < READERS {
            st.threads += 1;
            let (shared, n) = (self.shared.clone(), st.threads);
            let spawned =
                std::thread::Builder::new().name(format!("tenant-read-{n}")).spawn(move || run(&shared));
            if spawned.is_err() {
                st.threads -= 1;
                tracing::warn!("cannot start a tenant reader thread; reads wait for the ones running");
            }
        }
        drop(st);
        self.shared.wake.notify_one();
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.closed = true;
        // Whoever waits for a read that will not run hears of it.
        while let Some((_, job)) = st.jobs.pop() {
            job.slot.finish(Read::Failed);
        }
        drop(st);
        self.shared.wake.notify_all();
    }
}

/// A reader thread: takes the next read (turns between cgroups) until the
/// tracker ends.
fn run(shared: &Shared) {
    lower_priority();
    loop {
        let (lane, job) = {
            let mut st = shared.lock();
            loop {
                if st.closed {
                    return;
                }
                if let Some(next) = st.next() {
                    break next;
                }
                st.idle += 1;
                st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                st.idle -= 1;
            }
        };
        match job.tracker.upgrade() {
            Some(tracker) => {
                tracker.metrics.leases.tenant_reads_waiting.set(shared.lock().jobs.len() as i64);
                hold_for_tests(&tracker);
                let read = tracker.read_tenant(job.key, job.pidfd, job.pid);
                tracker.read_done(job.key, &job.slot, read);
            }
            None => job.slot.finish(Read::Failed),
        }
        shared.lock().read_ended(lane);
        // A read of that cgroup may run now.
        shared.wake.notify_one();
    }
}

/// Lowers this thread's scheduling priority ([`READER_NICE`]): on a busy
/// machine the threads that serve requests run first. Needs no privilege.
fn lower_priority() {
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority takes plain integers; for PRIO_PROCESS with a
    // thread id, Linux changes that one thread.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, READER_NICE) };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the tenant reader's priority");
    }
}

/// Tests: holds a read. In unit tests, the tracker's `read_delay`; in debug
/// builds of the binary, while the file that `TCPX_RXDM_TEST_HOLD_TENANT_READS`
/// names exists, having created `<that file>.held` to say a read waits
/// (how `tests/identity_parked.rs` keeps a client's read pending while
/// other clients are served).
fn hold_for_tests(tracker: &ClientTracker) {
    #[cfg(test)]
    std::thread::sleep(tracker.read_delay);
    #[cfg(debug_assertions)]
    {
        static HOLD: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
        if let Some(path) = HOLD.get_or_init(|| std::env::var_os(HOLD_VAR).map(Into::into)) {
            if path.exists() {
                let mut held = path.clone().into_os_string();
                held.push(".held");
                let _ = std::fs::write(held, b"");
            }
            while path.exists() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
    let _ = tracker;
}

/// See [`hold_for_tests`]; read by debug builds only.
#[cfg(debug_assertions)]
const HOLD_VAR: &str = "TCPX_RXDM_TEST_HOLD_TENANT_READS";
