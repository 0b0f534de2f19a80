//! An I/O thread through a takeover: on the pause it stops accepting and
//! reading, lets the requests it already read finish, and once every
//! connection sits between two requests parks them all at the gate; when
//! the pause ends it serves on. The successor starts with the parked
//! connections ([`IoThread::adopt`]).

use std::sync::Arc;

use super::{Conn, IoThread};
use crate::endpoint::pause::{GateState, Parked};
use crate::steering::Handoff;

impl IoThread {
    /// Follows the gate: pause, park, or serve on.
    pub(super) fn follow_gate(&mut self) {
        let gate = self.cx.state.shared.gate.clone();
        match (gate.state(), self.cx.paused) {
            (GateState::Open, false) => return,
            (GateState::Open, true) => {
                self.cx.paused = false;
                self.parked = false;
                if !self.cx.stopping {
                    self.resume(self.cx.now);
                }
                for key in self.conns.keys() {
                    if let Some(c) = self.conns.get_mut(key) {
                        c.unpause();
                    }
                    self.drive(key);
                }
                // What that read goes to the NIC threads now, not after the next event.
                self.flush();
                return;
            }
            (_, false) => {
                self.cx.paused = true;
                for l in self.accepting.listeners.iter() {
                    let _ = self.ep.delete(std::os::fd::AsFd::as_fd(&l.socket));
                }
                self.accepting.listening = false;
                self.accepting.resume_at = None;
            }
            (GateState::Committed, true) => {
                if self.parked && !(self.conns.is_empty() && self.accepting.waiting.is_empty()) {
                    // Handed over: the successor serves them; this process's copies
                    // close, so that a close by the successor reaches the client.
                    self.conns = Default::default();
                    self.accepting.waiting.clear();
                }
                return;
            }
            (_, true) => {}
        }
        if self.parked {
            return;
        }
        for key in self.conns.keys() {
            if let Some(c) = self.conns.get_mut(key) {
                c.settle_now();
            }
            self.drive(key);
        }
        self.flush();
        if !self.conns.values().all(Conn::parkable) {
            return;
        }
        let mut out = Vec::with_capacity(self.conns.len() + self.accepting.waiting.len());
        for c in self.conns.values() {
            match c.park() {
                Ok(p) => out.push(p),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot duplicate a rule connection for the takeover: it stays here")
                }
            }
        }
        for (fd, li) in &self.accepting.waiting {
            match fd.try_clone() {
                Ok(fd) => out.push(Parked {
                    fd,
                    endpoint: self.accepting.listeners[*li].endpoint,
                    registered: false,
                    input: Vec::new(),
                    peeked: 0,
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot duplicate a waiting rule connection for the takeover")
                }
            }
        }
        gate.park_thread(out);
        self.parked = true;
    }

    /// Takes on a connection parked by the daemon this one took over from.
    pub(in crate::steering::intake) fn adopt(&mut self, p: Parked) {
        let Some(li) = self.accepting.listeners.iter().position(|l| l.endpoint == p.endpoint) else {
            tracing::warn!(
                endpoint = p.endpoint.kind(),
                "a taken-over connection has no listener here; closed"
            );
            return;
        };
        let counted = self.accepting.permits.take(&self.cx.state.shared.conn_limit, p.endpoint);
        let (inbox, now) = (self.inbox.clone(), self.cx.now);
        let key = self.conns.insert(|key| {
            Conn::new(Arc::new(Handoff::new(p.fd, inbox, key)), li, p.endpoint, now, counted)
                .adopted(p.input, p.peeked)
        });
        self.series[li].opened += 1;
        if !self.watch(key) {
            return;
        }
        self.conns.get_mut(key).expect("just inserted").ask_who(&mut self.cx);
        self.drive(key);
    }
}
