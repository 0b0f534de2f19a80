//! The tenant readers: a few threads of the tracker's own that read new
//! client processes' tenants (cgroup, open files, network namespace), one
//! read per process. Nobody waits on them: a connection whose tenant is
//! being read is parked by whoever serves it, and woken when the read ends.
//!
//! Reads wait in a queue that takes turns between workloads (see
//! `identity::workload`: told from the new process's cgroup path, read when
//! it is queued; where its pid is not visible, the cgroup the kernel gives
//! for its pidfd; one lane for all where it gives none), each workload with
//! a bounded share of it and at most [`READING_PER_WORKLOAD`] of its reads
//! running at once, however many cgroups it has: a workload starting many
//! processes at once waits for its own reads, not others', and one whose
//! reads hang (files on a mount that does not answer) holds up only its
//! own. A read is bounded too (the open files it looks at, see
//! `identity::held`), waits on no file system the client controls, and
//! readers run at a lower priority than the threads that serve requests, so
//! that on a busy machine the rule path goes first.
//!
//! Should a read still run long (held up in the kernel by something not
//! foreseen), it is given up on: once a connection has waited its limit for
//! it ([`ReadSlot::slow`]), its thread stops counting as one of the
//! [`READERS`], and another may start for the reads waiting, up to
//! [`SLOW_READERS_MOST`] such threads. The read itself is not interrupted
//! (nothing can interrupt a thread in the kernel); when it ends, its thread
//! counts again, or ends if there are more than enough.

use std::num::NonZeroU32;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};

use super::identify::{Read, ReadSlot};
use super::{ClientTracker, ProcKey};
use crate::identity::{tenant, workload};
use crate::pidfd::Pidfd;
use crate::types::fair::FairQueue;

/// Reader threads, at most (started as reads come), not counting those
/// whose read ran long.
pub(super) const READERS: usize = 8;
/// Threads whose read ran long, at most, beyond the [`READERS`].
pub(super) const SLOW_READERS_MOST: usize = 24;
/// Reads of one workload running at once, at most.
pub(super) const READING_PER_WORKLOAD: usize = 2;
/// Reads waiting per workload, at most; past that a new process of that
/// workload is not identified this time (its request: UNAVAILABLE, try again).
pub(super) const WAITING_PER_WORKLOAD: usize = 32;
/// Reads waiting in all, at most.
pub(super) const WAITING_MOST: usize = 1024;

/// A process whose tenant is to be read.
struct Job {
    tracker: Weak<ClientTracker>,
    key: ProcKey,
    pidfd: Pidfd,
    pid: Option<NonZeroU32>,
    slot: Arc<ReadSlot>,
}

#[derive(Default)]
struct State {
    jobs: FairQueue<u64, Job>,
    /// Reads running now, per lane (workload).
    reading: foldhash::HashMap<u64, usize>,
    /// The reads running now.
    running: Vec<Arc<ReadSlot>>,
    threads: usize,
    idle: usize,
    closed: bool,
}

impl State {
    /// The threads that count as readers: all but those whose read ran long.
    fn counted(&self) -> usize {
        self.threads - self.running.iter().filter(|r| r.slow.load(Ordering::Acquire)).count()
    }

    /// Whether another reader thread is to start: none idles, fewer than
    /// [`READERS`] count, and the threads whose read ran long leave room.
    fn may_start(&self) -> bool {
        self.idle == 0 && self.counted() < READERS && self.threads < READERS + SLOW_READERS_MOST
    }

    /// The next read whose workload has room to run one more.
    fn next(&mut self) -> Option<(u64, Job)> {
        let reading = &self.reading;
        let (lane, job) =
            self.jobs.pop_where(|lane| reading.get(lane).copied().unwrap_or(0) < READING_PER_WORKLOAD)?;
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
    /// its workload already has [`WAITING_PER_WORKLOAD`] reads waiting, or
    /// all of them [`WAITING_MOST`].
    pub(super) fn submit(
        &self,
        tracker: &Arc<ClientTracker>,
        key: ProcKey,
        pidfd: Pidfd,
        pid: Option<NonZeroU32>,
        slot: Arc<ReadSlot>,
    ) {
        let (lane, workload) = lane_of(&pidfd, pid, tracker.tenants.workloads);
        let job = Job { tracker: Arc::downgrade(tracker), key, pidfd, pid, slot };
        let mut st = self.shared.lock();
        let refused = match st.closed || st.jobs.len() >= WAITING_MOST {
            true => Some(job),
            false => st.jobs.push_within(lane, job, WAITING_PER_WORKLOAD).err(),
        };
        if let Some(job) = refused {
            drop(st);
            tracker.metrics.leases.tenant_reads_refused.inc();
            tracing::warn!(
                pid = pid.map_or(0, NonZeroU32::get),
                %workload,
                "cannot read a new client's tenant now: too many of its workload's new processes wait to be \
                 read, or every reader is busy; its request gets UNAVAILABLE (try again)"
            );
            tracker.read_done(job.key, &job.slot, Read::Failed);
            return;
        }
        tracker.metrics.leases.tenant_reads_waiting.set(st.jobs.len() as i64);
        self.start_if_needed(&mut st);
        drop(st);
        self.shared.wake.notify_one();
    }

    /// A connection has waited its limit for the read behind `slot`, which
    /// has not ended: its thread stops counting as a reader (another may
    /// start for the reads waiting). `true` the first time for that read.
    pub(super) fn ran_long(&self, slot: &ReadSlot) -> bool {
        let first = !slot.slow.swap(true, Ordering::AcqRel);
        let mut st = self.shared.lock();
        if !st.jobs.is_empty() {
            self.start_if_needed(&mut st);
        }
        first
    }

    /// Starts a reader thread where [`State::may_start`] says so.
    fn start_if_needed(&self, st: &mut State) {
        if !st.may_start() {
            return;
        }
        st.threads += 1;
        let (shared, n) = (self.shared.clone(), st.threads);
        let spawned =
            std::thread::Builder::new().name(format!("tenant-read-{n}")).spawn(move || run(&shared));
        if spawned.is_err() {
            st.threads -= 1;
            tracing::warn!("cannot start a tenant reader thread; reads wait for the ones running");
        }
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

/// The lane of a new process's read, and how a log names it: its workload,
/// told from its cgroup path (one read of `/proc/<pid>/cgroup`, a file the
/// kernel writes: nothing a tenant's mounts can hold up), as a number with
/// bit 63 set; where its pid is not visible, the cgroup its pidfd names
/// (its workload, see `identity::workload`); where the kernel cannot say
/// (before Linux 6.13), the one lane of every such process.
fn lane_of(pidfd: &Pidfd, pid: Option<NonZeroU32>, rule: workload::Rule) -> (u64, String) {
    use std::os::fd::AsFd;
    let dir = pid.and_then(|p| tenant::proc_dir(pidfd, p.get()).ok());
    match dir.and_then(|d| tenant::cgroup_path(d.as_fd())) {
        Some(path) => {
            let part = workload::part(&path, rule).0;
            (workload::path_id(part), part.to_string())
        }
        None => {
            let id = pidfd.cgroup_id().unwrap_or(0);
            (id, format!("cgroup id {id}"))
        }
    }
}

/// A reader thread: takes the next read (turns between workloads) until the
/// tracker ends.
fn run(shared: &Shared) {
    crate::identity::lower_priority("tenant reader");
    loop {
        let (lane, job) = {
            let mut st = shared.lock();
            loop {
                if st.closed {
                    return;
                }
                if let Some((lane, job)) = st.next() {
                    st.running.push(job.slot.clone());
                    break (lane, job);
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
        let mut st = shared.lock();
        st.read_ended(lane);
        st.running.retain(|r| !Arc::ptr_eq(r, &job.slot));
        // Threads started while this one's read ran long: more than enough now.
        let surplus = st.counted() > READERS;
        if surplus {
            st.threads -= 1;
        }
        drop(st);
        // A read of that workload may run now.
        shared.wake.notify_one();
        if surplus {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    #[ignore = "needs root: cgroups"]
    fn reads_take_turns_by_workload_not_by_cgroup() {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let top = workload::cgroup2_mount(&mounts)
            .expect("cgroup2")
            .join(format!("tcpx-unit-{}", std::process::id()));
        // Two cgroups of one service, and another service.
        let dirs =
            ["svc.service/a", "svc.service/b", "other.service"].map(|d| top.join("system.slice").join(d));
        let lanes: Vec<u64> = dirs
            .iter()
            .map(|d| {
                std::fs::create_dir_all(d).unwrap();
                let mut kid = Command::new("sh")
                    .args(["-c", r#"echo $$ > "$1/cgroup.procs" && exec sleep 30"#, "sh"])
                    .arg(d)
                    .spawn()
                    .unwrap();
                let leaf = d.file_name().unwrap().to_string_lossy().into_owned();
                let moved = || std::fs::read_to_string(format!("/proc/{}/cgroup", kid.id())).unwrap();
                while !moved().trim_end().ends_with(&format!("/{leaf}")) {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                let pidfd = Pidfd::open(kid.id()).unwrap();
                let lane = lane_of(&pidfd, NonZeroU32::new(kid.id()), workload::Rule::Layouts).0;
                kid.kill().unwrap();
                kid.wait().unwrap();
                lane
            })
            .collect();
        for d in
            dirs.iter().chain([&dirs[0].parent().unwrap().to_path_buf(), &top.join("system.slice"), &top])
        {
            std::fs::remove_dir(d).unwrap();
        }
        assert_eq!(lanes[0], lanes[1], "one service's cgroups: one lane");
        assert_ne!(lanes[0], lanes[2], "another service: a lane of its own");
    }
}
