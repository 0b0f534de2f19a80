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

use super::super::conn::Conn;
use super::super::PERMIT_POLL;
use super::{conn_flags, IoThread};
use crate::steering::Handoff;

impl IoThread {
    pub(super) fn accept(&mut self, li: usize) {
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

    pub(super) fn add(&mut self, fd: OwnedFd, li: usize, permit: Option<tokio::sync::OwnedSemaphorePermit>) {
        let (inbox, endpoint, now) = (self.inbox.clone(), self.listeners[li].endpoint, self.cx.now);
        let key = self
            .conns
            .insert(|key| Conn::new(Arc::new(Handoff::new(fd, inbox, key)), li, endpoint, now, permit));
        let c = self.conns.get_mut(key).expect("just inserted");
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
        if !self.watch(key, false) {
            return;
        }
        if self.cx.stopping {
            self.drive(key);
        }
    }

    /// Puts connection `key` in the epoll set (`out`: writability too);
    /// `false` when it could not be and the connection was closed.
    pub(super) fn watch(&mut self, key: u64, out: bool) -> bool {
        let Some(c) = self.conns.get_mut(key) else { return false };
        c.watching_out = out;
        if self.ep.add(c.shared.sock(), EpollEvent::new(conn_flags(out), key)).is_err() {
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
            let out = self.conns.get_mut(key).is_some_and(|c| c.watching_out);
            self.watch(key, out);
        }
        // The buffers are kept for the rounds to come.
        self.settling = std::mem::replace(&mut self.unwatched, keys);
        if self.settling.len() == 1 || self.cx.stopping {
            for key in std::mem::take(&mut self.settling) {
                let out = self.conns.get_mut(key).is_some_and(|c| c.watching_out);
                self.watch(key, out);
            }
        }
    }

    /// Stops accepting for at least `pause`.
    pub(super) fn pause(&mut self, pause: Duration) {
        if self.listening {
            for l in self.listeners.iter() {
                let _ = self.ep.delete(l.socket.as_fd());
            }
            self.listening = false;
        }
        self.resume_at = Some(self.cx.now + pause);
    }

    /// Serves the connections that waited for a permit, then accepts again
    /// if the budget has room.
    pub(super) fn resume(&mut self, now: Instant) {
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
}
