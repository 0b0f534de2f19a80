//! Taking connections in: accepting under the connection budget (pausing
//! while it is used up or accepting fails), asking who each client is, and
//! serving on once a permit frees.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::EpollEvent;
use nix::sys::socket::{accept4, SockFlag};

use std::collections::VecDeque;

use super::super::conn::Conn;
use super::super::{Listener, PERMIT_POLL};
use super::{conn_flags, IoThread};
use crate::endpoint::accept_backoff::AcceptBackoff;
use crate::steering::Handoff;

/// What an I/O thread keeps to take connections in.
pub(super) struct Accepting {
    pub(super) listeners: Arc<[Listener]>,
    /// The listeners are in the epoll set.
    pub(super) listening: bool,
    /// Paused (budget used up, or accept failing): when to look again.
    pub(super) resume_at: Option<Instant>,
    /// Accepted before the budget turned out to be used up: served first once a permit frees.
    pub(super) waiting: VecDeque<(OwnedFd, usize)>,
    pub(super) backoff: AcceptBackoff,
    /// Connections accepted in this batch of events and in the one before:
    /// under load (both) a listener event is drained until `EAGAIN`;
    /// otherwise one accept is enough (the listener is level-triggered, so
    /// epoll reports it again if more wait), which saves a call per client.
    pub(super) accepted_now: bool,
    pub(super) accepted_before: bool,
    /// Its share of the connection budget.
    pub(super) permits: Permits,
    /// Per listener: when this thread last found it empty (an accept said
    /// `EAGAIN`; the batch's time, which is no later).
    pub(super) drained_at: Vec<Option<Instant>>,
}

impl Accepting {
    pub(super) fn new(listeners: &Arc<[Listener]>) -> Self {
        Accepting {
            listeners: listeners.clone(),
            listening: false,
            resume_at: None,
            waiting: VecDeque::new(),
            backoff: AcceptBackoff::new("rule"),
            accepted_now: false,
            accepted_before: false,
            permits: Permits::default(),
            drained_at: vec![None; listeners.len()],
        }
    }
}

impl IoThread {
    pub(super) fn accept(&mut self, li: usize) {
        let endpoint = self.accepting.listeners[li].endpoint;
        loop {
            if !self.cx.stopping
                && !self.accepting.permits.has_spare()
                && !self.cx.state.shared.conn_limit.has_room(endpoint)
            {
                // At the limit: new clients wait in the kernel's backlog.
                self.pause(PERMIT_POLL);
                return;
            }
            let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
            match accept4(self.accepting.listeners[li].socket.as_raw_fd(), flags) {
                Ok(raw) => {
                    // SAFETY: accept4 just returned this descriptor; nothing else owns it.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    self.accepting.backoff.succeeded();
                    if self.cx.stopping {
                        self.add(fd, li, false, None);
                        continue;
                    }
                    match self.accepting.permits.take(&self.cx.state.shared.conn_limit, endpoint) {
                        true => {
                            // Queued after the last time this listener was seen empty.
                            self.add(fd, li, true, self.accepting.drained_at[li]);
                            let under_load = self.accepting.accepted_before;
                            self.accepting.accepted_now = true;
                            if !under_load {
                                return;
                            }
                        }
                        false => {
                            // Another thread took the last permit meanwhile.
                            self.accepting.waiting.push_back((fd, li));
                            self.pause(PERMIT_POLL);
                            return;
                        }
                    }
                }
                Err(Errno::EAGAIN) => {
                    // Empty now (at the latest): what is accepted later was queued later.
                    self.accepting.drained_at[li] = Some(self.cx.now);
                    return;
                }
                Err(Errno::EINTR | Errno::ECONNABORTED) => {}
                Err(e) => {
                    // EMFILE and friends: pause (growing, one log line per few
                    // seconds); clients wait in the backlog meanwhile.
                    let pause = self.accepting.backoff.failed(&io::Error::from(e));
                    self.pause(pause);
                    return;
                }
            }
        }
    }

    /// Takes in an accepted connection; `queued_after`: when its listener was
    /// last seen empty before it was accepted, if known.
    pub(super) fn add(&mut self, fd: OwnedFd, li: usize, counted: bool, queued_after: Option<Instant>) {
        let (inbox, endpoint, now) = (self.inbox.clone(), self.accepting.listeners[li].endpoint, self.cx.now);
        let key = self
            .conns
            .insert(|key| Conn::new(Arc::new(Handoff::new(fd, inbox, key)), li, endpoint, now, counted));
        let c = self.conns.get_mut(key).expect("just inserted");
        c.queued_after = queued_after;
        if self.cx.stopping {
            c.begin_stop();
        } else {
            c.ask_who(&mut self.cx);
        }
        // A client sends its request right after connecting: it is usually
        // there already, and is read in this round rather than the next.
        let first = !self.cx.stopping && c.fresh();
        self.series[li].opened += 1;
        self.series[li].accepted += 1;
        if first {
            // Watched only if it is still open at the end of the round
            // (see `Conn::finish_unwatched`).
            self.unwatched.push(key);
            self.ready(key);
            return;
        }
        if !self.watch(key) {
            return;
        }
        if self.cx.stopping {
            self.drive(key);
        }
    }

    /// Puts connection `key` in the epoll set (writability too where it
    /// waits to write); `false` when it could not be and the connection was
    /// closed.
    pub(super) fn watch(&mut self, key: u64) -> bool {
        let Some(c) = self.conns.get_mut(key) else { return false };
        if self.ep.add(c.shared.sock(), EpollEvent::new(conn_flags(c.watching_out), key)).is_err() {
            // Cannot watch it (out of kernel memory): close it at once rather
            // than leave a client that nobody serves.
            self.close(key);
            return false;
        }
        c.in_set = true;
        true
    }

    /// The end of a round: the connections taken in during the round
    /// before are looked at (`Conn::finish_unwatched`): those whose client
    /// has had its answer and closed are closed, the others enter the epoll
    /// set. This round's wait a round in turn, which gives their clients
    /// the time to read the reply and close. A round that took in one
    /// connection only is no load: it enters the set at once (a look would
    /// find its client still reading). Called after the round's requests
    /// ran, before the thread waits for events again (which does not block
    /// while some wait: see `timeout`).
    pub(super) fn watch_new(&mut self) {
        let mut keys = std::mem::take(&mut self.settling);
        for key in keys.drain(..) {
            let Some(c) = self.conns.get_mut(key) else { continue };
            if c.finish_unwatched(&mut self.cx) {
                self.close(key);
                continue;
            }
            self.watch(key);
        }
        // The buffers are kept for the rounds to come.
        self.settling = std::mem::replace(&mut self.unwatched, keys);
        if self.settling.len() == 1 || self.cx.stopping {
            while let Some(key) = self.settling.pop() {
                self.watch(key);
            }
        }
    }

    /// Stops accepting for at least `pause`.
    pub(super) fn pause(&mut self, pause: Duration) {
        if self.accepting.listening {
            for l in self.accepting.listeners.iter() {
                let _ = self.ep.delete(l.socket.as_fd());
            }
            self.accepting.listening = false;
        }
        self.accepting.resume_at = Some(self.cx.now + pause);
    }

    /// Serves the connections that waited for a permit, then accepts again
    /// if the budget has room.
    pub(super) fn resume(&mut self, now: Instant) {
        while let Some((_, li)) = self.accepting.waiting.front() {
            let endpoint = self.accepting.listeners[*li].endpoint;
            if !self.accepting.permits.take(&self.cx.state.shared.conn_limit, endpoint) {
                break;
            }
            let (fd, li) = self.accepting.waiting.pop_front().expect("front exists");
            // When it was queued is not kept: its client is asked of the kernel.
            self.add(fd, li, true, None);
        }
        let room = self.accepting.permits.has_spare()
            || self.accepting.listeners.iter().any(|l| self.cx.state.shared.conn_limit.has_room(l.endpoint));
        if !self.accepting.waiting.is_empty() || !room {
            self.accepting.resume_at = Some(now + PERMIT_POLL);
            return;
        }
        if let Err(e) = self.listen() {
            tracing::warn!(error = %e, "rule I/O thread: cannot watch the listeners again; retrying");
            for l in self.accepting.listeners.iter() {
                let _ = self.ep.delete(l.socket.as_fd());
            }
            self.accepting.listening = false;
            self.accepting.resume_at = Some(now + PERMIT_POLL);
        }
    }
}

/// Permits a thread takes from the shared part of the connection budget at
/// once, and how many unused ones it keeps at most (twice this).
const PERMIT_BATCH: usize = 16;

/// The connection-budget permits one I/O thread holds: those its
/// connections use and a few spare. A connection takes one from here and
/// gives it back on close, with no operation on the count all threads share
/// (on 16 cores that count's lock and cache line cost about 2 % of the rule
/// rate); the thread goes to the shared count once per [`PERMIT_BATCH`]
/// connections, and gives back what it does not use when it goes idle. The
/// budget is still never exceeded: spare permits count as taken.
#[derive(Default)]
pub(in crate::steering::intake) struct Permits {
    held: Option<tokio::sync::OwnedSemaphorePermit>,
    spare: usize,
}

impl Permits {
    /// A permit for a new connection to `endpoint`; `false` when the budget has none.
    pub(in crate::steering::intake) fn take(
        &mut self,
        budget: &crate::endpoint::budget::ConnBudget,
        endpoint: crate::endpoint::Endpoint,
    ) -> bool {
        if self.spare == 0 {
            let Some(more) = budget.try_acquire_up_to(endpoint, PERMIT_BATCH) else { return false };
            self.spare = more.num_permits();
            match &mut self.held {
                Some(h) => h.merge(more),
                None => self.held = Some(more),
            }
        }
        self.spare -= 1;
        true
    }

    /// Whether a permit is at hand without asking the budget.
    pub(in crate::steering::intake) fn has_spare(&self) -> bool {
        self.spare > 0
    }

    /// A connection that held a permit closed.
    pub(in crate::steering::intake) fn give_back(&mut self) {
        self.spare += 1;
        if self.spare > 2 * PERMIT_BATCH {
            self.release(PERMIT_BATCH);
        }
    }

    /// Gives every spare permit back to the budget (the thread goes idle).
    pub(in crate::steering::intake) fn release_spare(&mut self) {
        self.release(self.spare);
    }

    fn release(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if let Some(h) = &mut self.held {
            // Split off and dropped: back to the budget.
            drop(h.split(n));
            self.spare -= n;
            if h.num_permits() == 0 {
                self.held = None;
            }
        }
    }

    /// Permits held: in use and spare.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.num_permits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::budget::ConnBudget;
    use crate::endpoint::Endpoint;

    #[test]
    fn a_thread_takes_permits_in_batches_and_gives_back_what_it_does_not_use() {
        let budget = ConnBudget::new(100, None);
        let mut p = Permits::default();
        assert!(p.take(&budget, Endpoint::RuleManager));
        assert_eq!((p.held(), budget.open()), (PERMIT_BATCH, PERMIT_BATCH), "one batch, counted as taken");
        for _ in 1..PERMIT_BATCH {
            assert!(p.take(&budget, Endpoint::RuleManager));
        }
        assert_eq!(budget.open(), PERMIT_BATCH, "the batch served its connections without the shared count");
        assert!(p.take(&budget, Endpoint::RuleManager));
        assert_eq!(budget.open(), 2 * PERMIT_BATCH);
        for _ in 0..=PERMIT_BATCH {
            p.give_back();
        }
        assert_eq!(budget.open(), 2 * PERMIT_BATCH, "spares are kept up to twice a batch");
        p.release_spare();
        assert_eq!((p.held(), budget.open()), (0, 0), "idle: everything back");
    }

    #[test]
    fn the_budget_is_never_exceeded_and_its_last_permits_come_one_by_one() {
        // 8 in all: 6 shared (rule connections), 2 kept for the registry and pools.
        let budget = ConnBudget::new(8, None);
        let (mut a, mut b) = (Permits::default(), Permits::default());
        let taken = (0..10).filter(|_| a.take(&budget, Endpoint::RuleManager)).count();
        assert_eq!(taken, 6);
        assert!(!b.take(&budget, Endpoint::RuleManager), "another thread finds none");
        a.give_back();
        a.release_spare();
        assert!(b.take(&budget, Endpoint::RuleManager), "given back, taken by the other");
        assert_eq!(budget.open(), 6);
    }
}
