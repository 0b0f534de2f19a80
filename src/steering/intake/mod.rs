//! The rule endpoints (`rx_rule_manager`, `rx_rule_uninstall`) on threads of
//! their own, outside the async runtime.
//!
//! The NCCL plugin opens a connection per rule: accept, one frame in, a
//! 7-byte reply out, EOF, close. The cost of that is the kernel's per
//! connection work; on the runtime each connection added a task, a reactor
//! registration and cross-thread wake-ups, which on two cores cost a third of
//! the rule rate. Here each I/O thread has its own epoll set, all of them
//! watch the listening sockets with `EPOLLEXCLUSIVE` (a new connection wakes
//! one thread), and a connection stays on the thread that accepted it.
//!
//! A parsed request becomes a job for its NIC's rule thread. Jobs are
//! collected while the thread works through one batch of epoll events and
//! handed over per NIC at the end of it, so under load one wake-up of a NIC
//! thread serves many requests. The NIC thread writes the reply to the client
//! itself (see [`Handoff`](super::Handoff)).
//!
//! A thread runs the requests of its round itself, NIC by NIC, where they
//! are few, the NIC has been quick, nothing is queued for it and no other thread runs it
//! (see [`apply`](super::apply)): no hand-off, no wake-up of another thread,
//! one thread fewer to be scheduled on the request's way. From three
//! threads on, at most all but one do so at any moment: one always stays
//! free to accept and serve, so a NIC call that turns slow holds up only the
//! requests of the thread that made it (the NIC is then left to its own
//! thread). Two threads (a machine of two to five cores) may both: keeping
//! one of two out of NIC calls sent half of all requests through a NIC
//! thread's wake-up and cost about 5 % of the rule rate on two cores. A
//! NIC that turns slow still holds only the thread inside it (another
//! thread finds it taken and hands its requests to the NIC's thread); both
//! wait only if two NICs turn slow in the same moment, for that one call.
//!
//! Under load a connection need not enter the epoll set at all: its request
//! is read as soon as it is accepted, and a round later its client has
//! usually read the answer and closed, which one `poll` shows; only the
//! connections still open then are added (see `IoThread::watch_new`). On two
//! cores with 64 clients that spared two of every three connections the
//! add and the removal, about a tenth of the rule rate.
//!
//! The connection budget, the idle limit, the error replies and the shutdown
//! behaviour are the ones of every other endpoint.

mod conn;
mod io_thread;
mod slab;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::{Inbox, Job, RulePath};
use crate::endpoint::pause::Parked;
use crate::endpoint::Endpoint;
use crate::identity::ClientCache;
use io_thread::IoThread;

/// Epoll keys below [`slab::FIRST_KEY`]: the inbox, then the listeners.
const INBOX_KEY: u64 = 0;
const FIRST_LISTENER_KEY: u64 = 1;
/// While the connection budget is used up, how often to look for a free permit.
const PERMIT_POLL: Duration = Duration::from_millis(10);
/// How often idle connections are looked for (the idle limit is in seconds).
const SWEEP_EVERY: Duration = Duration::from_millis(200);
/// Epoll events taken per wait.
const EVENTS: usize = 256;
/// Read size per call: a rule request is under 200 bytes.
const SCRATCH: usize = 4096;

/// A listening socket and what it serves.
pub struct Listener {
    pub socket: UnixListener,
    pub endpoint: Endpoint,
}

/// What the connection state machines share on one thread.
pub(super) struct Cx {
    state: Arc<RulePath>,
    runtime: tokio::runtime::Handle,
    /// Jobs collected for each NIC during one batch of events.
    pending: Vec<Vec<Job>>,
    stopping: bool,
    /// Paused for a takeover (see `endpoint::pause`).
    paused: bool,
    /// Taken once per batch of events.
    now: Instant,
    scratch: Box<[u8; SCRATCH]>,
    /// The client processes this thread has seen (no lock shared with
    /// other threads for a known one).
    clients: ClientCache,
    /// When connections waiting for their client's tenant stop waiting.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
}

/// Starts `threads` I/O threads serving `listeners` until `shutdown`, and
/// the connections `adopted` from the daemon this one took over from. Each
/// thread holds a clone of `done` until its last connection is closed.
pub fn spawn(
    listeners: Vec<Listener>,
    threads: usize,
    state: Arc<RulePath>,
    mut shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
    adopted: Vec<Parked>,
) -> io::Result<()> {
    assert!(listeners.len() < (slab::FIRST_KEY - FIRST_LISTENER_KEY) as usize, "too many listeners");
    for l in &listeners {
        l.socket.set_nonblocking(true)?;
    }
    let listeners: Arc<[Listener]> = listeners.into();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let shared = Arc::new(Shared {
        threads: threads.max(1),
        inline_most: io_thread::inline_most(cores),
        ..Shared::default()
    });
    let runtime = tokio::runtime::Handle::current();
    let mut workers = (0..threads.max(1))
        .map(|i| IoThread::new(i, &listeners, &state, &shared, &runtime, done.clone()))
        .collect::<io::Result<Vec<_>>>()?;
    let n = workers.len();
    for (i, p) in adopted.into_iter().enumerate() {
        workers[i % n].adopt(p);
    }
    let inboxes: Vec<_> = workers.iter().map(|w| w.inbox.clone()).collect();
    {
        // A takeover's pause and its end wake every thread.
        let (mut gate, inboxes) = (state.shared.gate.subscribe(), inboxes.clone());
        tokio::spawn(async move {
            while gate.changed().await.is_ok() {
                for i in &inboxes {
                    i.poke();
                }
            }
        });
    }
    {
        let (shared, inboxes) = (shared.clone(), inboxes.clone());
        tokio::spawn(async move {
            crate::endpoint::stopped(&mut shutdown).await;
            shared.request_stop(&inboxes);
        });
    }
    for w in workers {
        state.shared.gate.add_io_thread();
        let name = format!("rule-io-{}", w.id);
        if let Err(e) = std::thread::Builder::new().name(name).spawn(move || w.run()) {
            shared.request_stop(&inboxes);
            return Err(e);
        }
    }
    Ok(())
}

/// What the threads of one [`spawn`] share: the stop request and the count
/// of threads inside a NIC call.
#[derive(Default)]
struct Shared {
    requested: AtomicBool,
    /// The listeners are shut (no new connection can queue): by the first thread that stops.
    listeners_shut: AtomicBool,
    /// Threads running a request themselves now, and how many threads there are.
    inline_now: AtomicUsize,
    threads: usize,
    /// Jobs for one NIC a thread runs itself after a round, at most.
    inline_most: usize,
}

impl Shared {
    /// How many threads may run a request themselves at once: all but one,
    /// or both of two (see the module's notes).
    fn inline_places(&self) -> usize {
        match self.threads {
            2 => 2,
            n => n.saturating_sub(1),
        }
    }

    /// A place among the threads that may run a request themselves.
    fn enter_inline(&self) -> bool {
        if self.inline_now.fetch_add(1, Ordering::AcqRel) < self.inline_places() {
            return true;
        }
        self.inline_now.fetch_sub(1, Ordering::AcqRel);
        false
    }

    fn leave_inline(&self) {
        self.inline_now.fetch_sub(1, Ordering::AcqRel);
    }

    /// Asks every thread to stop, waking each through its inbox.
    fn request_stop(&self, inboxes: &[Arc<Inbox>]) {
        self.requested.store(true, Ordering::Release);
        for i in inboxes {
            i.poke();
        }
    }
}

/// Rule I/O threads by default, at most, however many cores there are.
pub const MAX_IO_THREADS: usize = 32;

/// How many I/O threads serve the rule endpoints: `flag`
/// (`--rule_io_threads`) if not 0, else [`default_io_threads`] of the cores
/// the daemon may run on (the kernel's answer: its CPU affinity and cgroup
/// quota).
pub fn io_threads(flag: u32) -> usize {
    match flag {
        0 => default_io_threads(std::thread::available_parallelism().map_or(2, |n| n.get())),
        n => n as usize,
    }
}

/// Rule I/O threads for `cores`: one per two cores, at least two, at most
/// [`MAX_IO_THREADS`]. The NIC threads and the clients themselves want the
/// other half: on 16 cores, 8 threads served 64 clients about 10 % faster
/// than 16 (docs/PERFORMANCE.md).
pub fn default_io_threads(cores: usize) -> usize {
    (cores / 2).clamp(2, MAX_IO_THREADS)
}

/// The async runtime's workers: it serves the endpoints other than the
/// rule sockets (queue ids, registry, pools, HTTP), which see far less
/// traffic; one per core, at most four.
pub fn runtime_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_io_threads_are_half_the_cores_within_two_and_the_cap() {
        let by_cores: Vec<usize> = [1, 2, 3, 4, 16, 64, 65, 208].map(default_io_threads).to_vec();
        assert_eq!(by_cores, [2, 2, 2, 2, 8, 32, 32, MAX_IO_THREADS]);
        assert_eq!(io_threads(5), 5, "the flag wins");
    }

    #[test]
    fn many_jobs_go_to_the_nics_thread_only_where_there_are_cores_for_it() {
        assert_eq!(io_thread::inline_most(2), usize::MAX, "two cores: every round's jobs run here");
        assert_eq!(io_thread::inline_most(io_thread::HANDOFF_CORES - 1), usize::MAX);
        assert_eq!(io_thread::inline_most(io_thread::HANDOFF_CORES), io_thread::INLINE_MOST);
        assert_eq!(io_thread::inline_most(64), io_thread::INLINE_MOST);
    }

    #[test]
    fn from_three_threads_one_always_stays_out_of_nic_calls() {
        let three = Shared { threads: 3, ..Shared::default() };
        assert!(three.enter_inline() && three.enter_inline());
        assert!(!three.enter_inline(), "the third of three threads must stay free");
        three.leave_inline();
        assert!(three.enter_inline(), "free again once one left");
        let two = Shared { threads: 2, ..Shared::default() };
        assert!(two.enter_inline() && two.enter_inline(), "both of two may");
        assert!(!two.enter_inline());
        let four = Shared { threads: 4, ..Shared::default() };
        let entered = (0..4).filter(|_| four.enter_inline()).count();
        assert_eq!(entered, 3);
        assert_eq!(four.inline_now.load(Ordering::Relaxed), 3, "a refused entry leaves the count as it was");
        let one = Shared { threads: 1, ..Shared::default() };
        assert!(!one.enter_inline(), "a single thread never makes NIC calls itself");
    }
}
