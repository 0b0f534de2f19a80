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
//! itself (see [`Handoff`]).
//!
//! A thread that serves a single connection with a single request, the
//! unloaded case where nothing amortises a hand-off, runs it itself if the
//! NIC has been quick (see `rule_threads`). At most all threads but one do
//! so at any moment: one always stays free to accept and serve, so a NIC
//! call that turns slow holds up only the request that waits for it.
//!
//! The connection budget, the idle limit, the error replies and the shutdown
//! behaviour are the ones of every other endpoint.

mod conn;
mod handoff;
mod slab;

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{accept4, shutdown, Shutdown, SockFlag};
use prometheus::{IntCounter, IntGauge};
use tokio::sync::{mpsc, watch};

pub use handoff::{Handoff, Inbox};

use super::accept_backoff::AcceptBackoff;
use super::rule_threads::Job;
use super::{Endpoint, ServerState};
use conn::{Conn, Next};
use slab::Slab;

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
    state: Arc<ServerState>,
    runtime: tokio::runtime::Handle,
    /// Jobs collected for each NIC during one batch of events.
    pending: Vec<Vec<Job>>,
    stopping: bool,
    /// Taken once per batch of events.
    now: Instant,
    scratch: Box<[u8; SCRATCH]>,
}

/// Starts `threads` I/O threads serving `listeners` until `shutdown`. Each
/// thread holds a clone of `done` until its last connection is closed.
pub fn spawn(
    listeners: Vec<Listener>,
    threads: usize,
    state: Arc<ServerState>,
    mut shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) -> io::Result<()> {
    assert!(listeners.len() < (slab::FIRST_KEY - FIRST_LISTENER_KEY) as usize, "too many listeners");
    for l in &listeners {
        l.socket.set_nonblocking(true)?;
    }
    let listeners: Arc<[Listener]> = listeners.into();
    let shared = Arc::new(Shared { threads: threads.max(1), ..Shared::default() });
    let runtime = tokio::runtime::Handle::current();
    let workers = (0..threads.max(1))
        .map(|i| IoThread::new(i, &listeners, &state, &shared, &runtime, done.clone()))
        .collect::<io::Result<Vec<_>>>()?;
    let inboxes: Vec<_> = workers.iter().map(|w| w.inbox.clone()).collect();
    {
        let (shared, inboxes) = (shared.clone(), inboxes.clone());
        tokio::spawn(async move {
            super::stopped(&mut shutdown).await;
            shared.request_stop(&inboxes);
        });
    }
    for w in workers {
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
}

impl Shared {
    /// A place among the threads that may run a request themselves: all but one.
    fn enter_inline(&self) -> bool {
        if self.inline_now.fetch_add(1, Ordering::AcqRel) + 1 < self.threads {
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

/// Per listener: the connection gauge and counter of its endpoint.
struct Series {
    open: IntGauge,
    total: IntCounter,
}

struct IoThread {
    id: usize,
    ep: Epoll,
    listeners: Arc<[Listener]>,
    series: Vec<Series>,
    /// The listeners are in the epoll set.
    listening: bool,
    /// Paused (budget used up, or accept failing): when to look again.
    resume_at: Option<Instant>,
    /// Accepted before the budget turned out to be used up: served first once a permit frees.
    waiting: std::collections::VecDeque<(OwnedFd, usize)>,
    backoff: AcceptBackoff,
    inbox: Arc<Inbox>,
    conns: Slab<Conn>,
    cx: Cx,
    shared: Arc<Shared>,
    next_sweep: Instant,
    /// Connections accepted in this batch of events and in the one before:
    /// under load (both) a listener event is drained until `EAGAIN`;
    /// otherwise one accept is enough (the listener is level-triggered, so
    /// epoll reports it again if more wait), which saves a call per client.
    accepted_now: bool,
    accepted_before: bool,
    /// Dropped when the thread ends: shutdown waits for every clone.
    _done: mpsc::Sender<()>,
}

fn listener_flags() -> EpollFlags {
    EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE
}

fn conn_flags(out: bool) -> EpollFlags {
    let f = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
    if out {
        f | EpollFlags::EPOLLOUT
    } else {
        f
    }
}

impl IoThread {
    fn new(
        id: usize,
        listeners: &Arc<[Listener]>,
        state: &Arc<ServerState>,
        shared: &Arc<Shared>,
        runtime: &tokio::runtime::Handle,
        done: mpsc::Sender<()>,
    ) -> io::Result<Self> {
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let inbox = Arc::new(Inbox::new()?);
        ep.add(inbox.fd(), EpollEvent::new(EpollFlags::EPOLLIN, INBOX_KEY))?;
        let series = listeners
            .iter()
            .map(|l| Series {
                open: state.metrics.connections.with_label_values(&[l.endpoint.kind()]),
                total: state.metrics.connections_total.with_label_values(&[l.endpoint.kind()]),
            })
            .collect();
        let now = Instant::now();
        let mut t = IoThread {
            id,
            ep,
            listeners: listeners.clone(),
            series,
            listening: false,
            resume_at: None,
            waiting: Default::default(),
            backoff: AcceptBackoff::new("rule"),
            inbox,
            conns: Slab::default(),
            cx: Cx {
                state: state.clone(),
                runtime: runtime.clone(),
                pending: (0..state.rule_threads.len()).map(|_| Vec::new()).collect(),
                stopping: false,
                now,
                scratch: Box::new([0; SCRATCH]),
            },
            shared: shared.clone(),
            next_sweep: now,
            accepted_now: false,
            accepted_before: false,
            _done: done,
        };
        t.listen()?;
        Ok(t)
    }

    fn listen(&mut self) -> io::Result<()> {
        for (i, l) in self.listeners.iter().enumerate() {
            self.ep
                .add(l.socket.as_fd(), EpollEvent::new(listener_flags(), FIRST_LISTENER_KEY + i as u64))?;
        }
        self.listening = true;
        self.resume_at = None;
        Ok(())
    }

    fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); EVENTS];
        let mut hints = Vec::new();
        loop {
            let n = match self.ep.wait(&mut events, self.timeout()) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    tracing::error!(error = %e, "rule I/O thread: epoll_wait failed");
                    std::thread::sleep(PERMIT_POLL);
                    0
                }
            };
            self.cx.now = Instant::now();
            for ev in &events[..n] {
                match ev.data() {
                    INBOX_KEY => {
                        self.inbox.take(&mut hints);
                        for key in hints.drain(..) {
                            self.drive(key);
                        }
                    }
                    // (An event from before a pause is dropped.)
                    key if key < slab::FIRST_KEY => {
                        if self.listening {
                            self.accept((key - FIRST_LISTENER_KEY) as usize)
                        }
                    }
                    key => {
                        if let Some(c) = self.conns.get_mut(key) {
                            c.on_event(ev.events());
                            self.drive(key);
                        }
                    }
                }
            }
            if !self.cx.stopping
                && (self.shared.requested.load(Ordering::Acquire)
                    || self.cx.state.stopping.load(Ordering::Acquire))
            {
                self.begin_stop();
            }
            self.flush();
            self.housekeeping();
            self.accepted_before = std::mem::take(&mut self.accepted_now);
            if self.cx.stopping && self.conns.is_empty() {
                return;
            }
        }
    }

    /// Hands the jobs collected in this batch to their NIC threads, or runs
    /// a lone request here (see the module's notes).
    fn flush(&mut self) {
        if let Some(nic) = self.lone_job() {
            if self.shared.enter_inline() {
                let ran = self.cx.state.rule_threads[nic].run_here(&mut self.cx.pending[nic]);
                self.shared.leave_inline();
                if ran {
                    return;
                }
            }
        }
        for (nic, jobs) in self.cx.pending.iter_mut().enumerate() {
            if !jobs.is_empty() {
                self.cx.state.rule_threads[nic].submit(jobs);
            }
        }
    }

    /// How long to wait for events; from the time taken after the last wait
    /// (a clock read per loop is enough: a deadline is at worst met late by
    /// the time one batch took).
    /// The NIC of the only job collected, when this thread has no other
    /// connection: then running it here keeps nobody waiting.
    fn lone_job(&self) -> Option<usize> {
        if self.conns.len() != 1 || !self.waiting.is_empty() {
            return None;
        }
        let mut busy = self.cx.pending.iter().enumerate().filter(|(_, j)| !j.is_empty());
        match (busy.next(), busy.next()) {
            (Some((nic, jobs)), None) if jobs.len() == 1 => Some(nic),
            _ => None,
        }
    }

    fn timeout(&self) -> EpollTimeout {
        let now = self.cx.now;
        let mut until: Option<Instant> = None;
        let mut sooner = |t: Instant| until = Some(until.map_or(t, |u| u.min(t)));
        if let Some(t) = self.resume_at {
            sooner(t);
        }
        if !self.conns.is_empty() && self.idle_limit().is_some() {
            sooner(self.next_sweep);
        }
        if self.cx.stopping {
            // Answers in flight come through the inbox; this is only a safety net.
            sooner(now + Duration::from_millis(100));
        }
        match until {
            None => EpollTimeout::NONE,
            Some(t) => {
                // Rounded up, so that a wake-up never comes just before the deadline.
                let ms = t.saturating_duration_since(now).as_micros().div_ceil(1000).min(60_000);
                EpollTimeout::try_from(ms as i32).unwrap_or(EpollTimeout::ZERO)
            }
        }
    }

    fn idle_limit(&self) -> Option<Duration> {
        self.cx.state.conn_limit.idle_limit(Endpoint::RuleManager)
    }

    fn drive(&mut self, key: u64) {
        let Some(c) = self.conns.get_mut(key) else { return };
        match c.drive(&mut self.cx) {
            Next::Keep => {}
            Next::WantWrite => {
                if !c.watching_out {
                    c.watching_out = true;
                    let mut ev = EpollEvent::new(conn_flags(true), key);
                    if self.ep.modify(c.shared.sock(), &mut ev).is_err() {
                        self.close(key);
                    }
                }
            }
            Next::Close => self.close(key),
        }
    }

    fn close(&mut self, key: u64) {
        if let Some(c) = self.conns.remove(key) {
            self.series[c.listener].open.dec();
            // The socket closes with the last holder of the hand-off (a NIC
            // thread may still hold it for a moment); closing also takes it
            // out of the epoll set.
        }
    }

    fn accept(&mut self, li: usize) {
        let endpoint = self.listeners[li].endpoint;
        loop {
            if !self.cx.stopping && !self.cx.state.conn_limit.has_room(endpoint) {
                // At the limit: new clients wait in the kernel's backlog.
                self.pause(PERMIT_POLL);
                return;
            }
            let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
            match accept4(self.listeners[li].socket.as_raw_fd(), flags) {
                Ok(raw) => {
                    // SAFETY: accept4 just returned this descriptor; nothing else owns it.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    self.backoff.succeeded();
                    if self.cx.stopping {
                        self.add(fd, li, None);
                        continue;
                    }
                    match self.cx.state.conn_limit.try_acquire(endpoint) {
                        Some(p) => {
                            self.add(fd, li, Some(p));
                            let under_load = self.accepted_before;
                            self.accepted_now = true;
                            if !under_load {
                                return;
                            }
                        }
                        None => {
                            // Another thread took the last permit meanwhile.
                            self.waiting.push_back((fd, li));
                            self.pause(PERMIT_POLL);
                            return;
                        }
                    }
                }
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR | Errno::ECONNABORTED) => {}
                Err(e) => {
                    // EMFILE and friends: pause (growing, one log line per few
                    // seconds); clients wait in the backlog meanwhile.
                    let pause = self.backoff.failed(&io::Error::from(e));
                    self.pause(pause);
                    return;
                }
            }
        }
    }

    fn add(&mut self, fd: OwnedFd, li: usize, permit: Option<tokio::sync::OwnedSemaphorePermit>) {
        let (inbox, endpoint, now) = (self.inbox.clone(), self.listeners[li].endpoint, self.cx.now);
        let key = self
            .conns
            .insert(|key| Conn::new(Arc::new(Handoff::new(fd, inbox, key)), li, endpoint, now, permit));
        let c = self.conns.get_mut(key).expect("just inserted");
        if self.cx.stopping {
            c.begin_stop();
        }
        if self.ep.add(c.shared.sock(), EpollEvent::new(conn_flags(false), key)).is_err() {
            // Cannot watch it (out of kernel memory): close it at once rather
            // than leave a client that nobody serves.
            self.conns.remove(key);
            return;
        }
        self.series[li].open.inc();
        self.series[li].total.inc();
        if self.cx.stopping {
            self.drive(key);
        }
    }

    /// Stops accepting for at least `pause`.
    fn pause(&mut self, pause: Duration) {
        if self.listening {
            for l in self.listeners.iter() {
                let _ = self.ep.delete(l.socket.as_fd());
            }
            self.listening = false;
        }
        self.resume_at = Some(self.cx.now + pause);
    }

    fn housekeeping(&mut self) {
        let now = self.cx.now;
        if !self.cx.stopping && self.resume_at.is_some_and(|t| now >= t) {
            self.resume(now);
        }
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP_EVERY;
            if let Some(limit) = self.idle_limit() {
                for key in self.conns.keys() {
                    if let Some(c) = self.conns.get_mut(key).filter(|c| c.idle_for(limit, now)) {
                        c.expire(limit);
                        self.drive(key);
                    }
                }
            }
        }
    }

    /// Serves the connections that waited for a permit, then accepts again
    /// if the budget has room.
    fn resume(&mut self, now: Instant) {
        while let Some((_, li)) = self.waiting.front() {
            let endpoint = self.listeners[*li].endpoint;
            let Some(p) = self.cx.state.conn_limit.try_acquire(endpoint) else { break };
            let (fd, li) = self.waiting.pop_front().expect("front exists");
            self.add(fd, li, Some(p));
        }
        let room = self.listeners.iter().any(|l| self.cx.state.conn_limit.has_room(l.endpoint));
        if !self.waiting.is_empty() || !room {
            self.resume_at = Some(now + PERMIT_POLL);
            return;
        }
        if let Err(e) = self.listen() {
            tracing::warn!(error = %e, "rule I/O thread: cannot watch the listeners again; retrying");
            for l in self.listeners.iter() {
                let _ = self.ep.delete(l.socket.as_fd());
            }
            self.listening = false;
            self.resume_at = Some(now + PERMIT_POLL);
        }
    }

    /// Shutdown: no new connection can queue, the backlog is taken in and
    /// answered, every connection answers what it has and closes.
    fn begin_stop(&mut self) {
        self.cx.stopping = true;
        if !self.shared.listeners_shut.swap(true, Ordering::AcqRel) {
            for l in self.listeners.iter() {
                // A shut listening socket refuses connect() (ECONNREFUSED, a clear
                // error for the client) but still hands out what is queued.
                let _ = shutdown(l.socket.as_raw_fd(), Shutdown::Both);
            }
        }
        for li in 0..self.listeners.len() {
            self.accept(li);
        }
        for l in self.listeners.iter() {
            let _ = self.ep.delete(l.socket.as_fd());
        }
        self.listening = false;
        self.resume_at = None;
        while let Some((fd, li)) = self.waiting.pop_front() {
            self.add(fd, li, None);
        }
        for key in self.conns.keys() {
            if let Some(c) = self.conns.get_mut(key) {
                c.begin_stop();
            }
            self.drive(key);
        }
    }
}

/// How many I/O threads serve the rule endpoints, and how many workers the
/// async runtime has: one per core, at most four.
pub fn worker_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get().min(4)).unwrap_or(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_always_stays_out_of_nic_calls() {
        let two = Shared { threads: 2, ..Shared::default() };
        assert!(two.enter_inline());
        assert!(!two.enter_inline(), "the second of two threads must stay free");
        two.leave_inline();
        assert!(two.enter_inline(), "free again once the first left");
        let four = Shared { threads: 4, ..Shared::default() };
        let entered = (0..4).filter(|_| four.enter_inline()).count();
        assert_eq!(entered, 3);
        assert_eq!(four.inline_now.load(Ordering::Relaxed), 3, "a refused entry leaves the count as it was");
        let one = Shared { threads: 1, ..Shared::default() };
        assert!(!one.enter_inline(), "a single thread never makes NIC calls itself");
    }
}
