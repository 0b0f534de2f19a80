//! One rule I/O thread: its epoll set, its connections, accepting under the
//! connection budget, and shutdown.
//!
//! Tenants take turns. Each batch of events only notes which connections
//! are ready, in a queue with a lane per tenant (per process where tenants
//! are not told apart); the thread then runs them in rounds, each lane
//! giving at most [`TURN`] connections per round while other lanes wait,
//! and looks for new events between rounds. A lane that was empty goes
//! first. So a tenant with hundreds of connections busy delays another
//! tenant's request by at most a turn of its own, not by all of them; with
//! one tenant busy, a round is at most [`ALONE_TURN`] connections, so a
//! request of another tenant arriving meanwhile is seen soon.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{shutdown, Shutdown};
use prometheus::{IntCounter, IntGauge};
use tokio::sync::mpsc;

use super::conn::{Conn, Next};
use super::slab::{self, Slab};
use super::{Cx, Listener, Shared, EVENTS, FIRST_LISTENER_KEY, INBOX_KEY, PERMIT_POLL, SCRATCH, SWEEP_EVERY};
use crate::endpoint::Endpoint;
use crate::steering::{Inbox, RulePath};
use crate::types::fair::FairQueue;

/// Connections of one tenant run per round while other tenants wait.
pub(super) const TURN: usize = 4;
/// Connections run per round while only one tenant has some ready: new
/// events are looked for between rounds, so another tenant's new request
/// waits for at most this many of them, not for a whole batch of events.
pub(super) const ALONE_TURN: usize = 32;

/// Jobs for one NIC a thread runs itself after a round, at most, where the
/// daemon has many cores ([`HANDOFF_CORES`]). More are a load: one wake-up
/// of the NIC's thread then serves them all, on a core of its own, while
/// this thread goes back to its clients. On 16 cores with 64 clients that
/// gave about 5 % more rules a second than running every round's jobs here;
/// a lone client's requests still never wait for a wake-up. On fewer cores
/// there is no core to spare for the NIC's thread: every round's jobs are
/// run here.
pub(super) const INLINE_MOST: usize = 2;
/// Cores from which a round's many jobs are handed to the NIC's thread.
pub(super) const HANDOFF_CORES: usize = 8;

/// [`INLINE_MOST`] on `cores` cores.
pub(super) fn inline_most(cores: usize) -> usize {
    if cores >= HANDOFF_CORES {
        INLINE_MOST
    } else {
        usize::MAX
    }
}

mod accept;
mod pause;

/// Per listener: the connection gauge and counter of its endpoint, and
/// what this thread changed since it last added that to them (once per
/// batch of events: a series every thread writes per connection is a cache
/// line they pass around).
struct Series {
    open: IntGauge,
    total: IntCounter,
    opened: i64,
    accepted: u64,
}

impl Series {
    fn flush(&mut self) {
        if self.opened != 0 {
            self.open.add(std::mem::take(&mut self.opened));
        }
        if self.accepted != 0 {
            self.total.inc_by(std::mem::take(&mut self.accepted));
        }
    }
}

pub(super) struct IoThread {
    pub(super) id: usize,
    ep: Epoll,
    series: Vec<Series>,
    /// Taking connections in: the listeners and the budget's share.
    accepting: accept::Accepting,
    pub(super) inbox: Arc<Inbox>,
    conns: Slab<Conn>,
    /// Connections to run, by turn key (see the module's notes).
    turns: FairQueue<u64, u64>,
    cx: Cx,
    shared: Arc<Shared>,
    next_sweep: Instant,
    /// Its connections are parked at the takeover's gate.
    parked: bool,
    /// Connections taken in during this round, and during the one before,
    /// not in the epoll set yet (see `watch_new`).
    unwatched: Vec<u64>,
    settling: Vec<u64>,
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
    pub(super) fn new(
        id: usize,
        listeners: &Arc<[Listener]>,
        state: &Arc<RulePath>,
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
                open: state.shared.metrics.connections.with_label_values(&[l.endpoint.kind()]),
                total: state.shared.metrics.connections_total.with_label_values(&[l.endpoint.kind()]),
                opened: 0,
                accepted: 0,
            })
            .collect();
        let now = Instant::now();
        let mut t = IoThread {
            id,
            ep,
            series,
            accepting: accept::Accepting::new(listeners),
            inbox,
            conns: Slab::default(),
            turns: FairQueue::default(),
            cx: Cx {
                state: state.clone(),
                runtime: runtime.clone(),
                pending: (0..state.nics.len()).map(|_| Vec::new()).collect(),
                stopping: false,
                paused: false,
                now,
                scratch: Box::new([0; SCRATCH]),
                clients: Default::default(),
                deadlines: Default::default(),
            },
            shared: shared.clone(),
            next_sweep: now,
            parked: false,
            unwatched: Vec::new(),
            settling: Vec::new(),
            _done: done,
        };
        if t.cx.state.shared.gate.closed() {
            // Started paused (a takeover not yet committed): the gate opens it.
            t.cx.paused = true;
        } else {
            t.listen()?;
        }
        Ok(t)
    }

    fn listen(&mut self) -> io::Result<()> {
        for (i, l) in self.accepting.listeners.iter().enumerate() {
            self.ep
                .add(l.socket.as_fd(), EpollEvent::new(listener_flags(), FIRST_LISTENER_KEY + i as u64))?;
        }
        self.accepting.listening = true;
        self.accepting.resume_at = None;
        Ok(())
    }

    pub(super) fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); EVENTS];
        let mut hints = Vec::new();
        let mut round = Vec::new();
        loop {
            // Connections still waiting for their turn or for a look (see
            // `watch_new`): only look for new events.
            let busy = !self.turns.is_empty() || !self.settling.is_empty();
            if !busy {
                // Possibly idle: what its connections do not use goes back to the budget.
                self.accepting.permits.release_spare();
            }
            let timeout = if busy { EpollTimeout::ZERO } else { self.timeout() };
            let n = match self.ep.wait(&mut events, timeout) {
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
                            self.ready(key);
                        }
                    }
                    // (An event from before a pause is dropped.)
                    key if key < slab::FIRST_KEY => {
                        if self.accepting.listening {
                            self.accept((key - FIRST_LISTENER_KEY) as usize)
                        }
                    }
                    key => {
                        if let Some(c) = self.conns.get_mut(key) {
                            c.on_event(ev.events());
                            self.ready(key);
                        }
                    }
                }
            }
            self.turns.round(TURN, ALONE_TURN, &mut round);
            for key in round.drain(..) {
                self.drive(key);
            }
            if !self.cx.stopping
                && (self.shared.requested.load(Ordering::Acquire)
                    || self.cx.state.shared.stopping.load(Ordering::Acquire))
            {
                self.begin_stop();
            }
            self.flush();
            self.watch_new();
            // A client that sent more before closing has had it read just now.
            self.flush();
            self.follow_gate();
            self.housekeeping();
            for s in &mut self.series {
                s.flush();
            }
            self.accepting.accepted_before = std::mem::take(&mut self.accepting.accepted_now);
            if self.cx.stopping && self.conns.is_empty() {
                return;
            }
        }
    }

    /// Runs the jobs collected in this round here, NIC by NIC, where they
    /// are few ([`inline_most`]), the NIC has been quick, nothing is queued
    /// for it and nobody runs it now; hands the others to their NIC threads
    /// (see the module's notes).
    fn flush(&mut self) {
        if self.cx.pending.iter().all(Vec::is_empty) {
            return;
        }
        let here = self.shared.enter_inline();
        for (nic, jobs) in self.cx.pending.iter_mut().enumerate() {
            let few = jobs.len() <= self.shared.inline_most;
            if jobs.is_empty() || (here && few && self.cx.state.nics[nic].run_here(jobs)) {
                continue;
            }
            self.cx.state.nics[nic].submit(jobs);
        }
        if here {
            self.shared.leave_inline();
        }
    }

    /// How long to wait for events; from the time taken after the last wait
    /// (a clock read per loop is enough: a deadline is at worst met late by
    /// the time one batch took).
    fn timeout(&self) -> EpollTimeout {
        let now = self.cx.now;
        let mut until: Option<Instant> = None;
        let mut sooner = |t: Instant| until = Some(until.map_or(t, |u| u.min(t)));
        if let Some(t) = self.accepting.resume_at {
            sooner(t);
        }
        if let Some(std::cmp::Reverse((t, _))) = self.cx.deadlines.peek() {
            sooner(*t);
        }
        if !self.conns.is_empty() && self.idle_limit().is_some() {
            sooner(self.next_sweep);
        }
        if self.cx.paused && !self.parked {
            // A pause waits for answers the NIC threads write themselves: look often.
            sooner(now + Duration::from_millis(1));
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
        self.cx.state.shared.conn_limit.idle_limit(Endpoint::RuleManager)
    }

    /// Queues a connection to run in its tenant's turn.
    fn ready(&mut self, key: u64) {
        if let Some(c) = self.conns.get_mut(key).filter(|c| !c.queued) {
            c.queued = true;
            self.turns.push(c.turn, key);
        }
    }

    fn drive(&mut self, key: u64) {
        let Some(c) = self.conns.get_mut(key) else { return };
        c.queued = false;
        match c.drive(&mut self.cx) {
            Next::Keep => {}
            Next::WantWrite => {
                if !c.watching_out {
                    c.watching_out = true;
                    if !c.in_set {
                        // Not watched yet: it enters the set with writability at the round's end.
                        return;
                    }
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
            self.series[c.listener].opened -= 1;
            if c.counted {
                self.accepting.permits.give_back();
            }
            // The socket closes with the last holder of the hand-off (a NIC
            // thread may still hold it for a moment); closing also takes it
            // out of the epoll set.
        }
    }

    fn housekeeping(&mut self) {
        let now = self.cx.now;
        // Requests whose client's tenant was not read in time are answered.
        while let Some(&std::cmp::Reverse((t, key))) = self.cx.deadlines.peek() {
            if t > now {
                break;
            }
            self.cx.deadlines.pop();
            self.ready(key);
        }
        if self.cx.paused {
            return;
        }
        if !self.cx.stopping && self.accepting.resume_at.is_some_and(|t| now >= t) {
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

    /// Shutdown: no new connection can queue, the backlog is taken in and
    /// answered, every connection answers what it has and closes.
    fn begin_stop(&mut self) {
        self.cx.stopping = true;
        if !self.shared.listeners_shut.swap(true, Ordering::AcqRel) {
            for l in self.accepting.listeners.iter() {
                // A shut listening socket refuses connect() (ECONNREFUSED, a clear
                // error for the client) but still hands out what is queued.
                let _ = shutdown(l.socket.as_raw_fd(), Shutdown::Both);
            }
        }
        for li in 0..self.accepting.listeners.len() {
            self.accept(li);
        }
        for l in self.accepting.listeners.iter() {
            let _ = self.ep.delete(l.socket.as_fd());
        }
        self.accepting.listening = false;
        self.accepting.resume_at = None;
        while let Some((fd, li)) = self.accepting.waiting.pop_front() {
            self.add(fd, li, false, None);
        }
        for key in self.conns.keys() {
            if let Some(c) = self.conns.get_mut(key) {
                c.begin_stop();
            }
            self.drive(key);
        }
    }
}
