//! The serving daemon's pause during a takeover, as a value. While it lives
//! the gate is paused and the NIC threads are frozen. However the session
//! ends without handing over (a failure, an abort, a panic unwinding it),
//! dropping it first makes sure the new daemon can serve nothing, then
//! thaws the NIC threads and opens the gate. Only [`Paused::declare`] (the
//! new daemon answered `serving`) ends it the other way.

use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use crate::endpoint::pause::Gate;
use crate::handover::Process;

/// How long a SIGKILLed successor is given to be gone (it runs nothing
/// more either way).
const KILL_WAIT: Duration = Duration::from_secs(2);

pub(in crate::daemon) struct Paused {
    gate: Arc<Gate>,
    /// Each frozen NIC thread's hold: dropped, it thaws.
    holds: Vec<Sender<()>>,
    /// The new daemon, once it holds a copy of everything.
    successor: Option<(Process, u32)>,
    declared: bool,
}

impl Paused {
    /// Pauses every serving path.
    pub(super) fn start(gate: Arc<Gate>) -> Paused {
        gate.pause();
        Paused { gate, holds: Vec::new(), successor: None, declared: false }
    }

    pub(super) fn gate(&self) -> &Gate {
        &self.gate
    }

    /// A NIC thread frozen until this ends.
    pub(super) fn hold(&mut self, hold: Sender<()>) {
        self.holds.push(hold);
    }

    /// From now on `process` (pid `pid` here) holds a copy of the state: it
    /// must be gone before this daemon serves again.
    pub(super) fn handing_to(&mut self, process: Process, pid: u32) {
        self.successor = Some((process, pid));
    }

    /// Whether the new daemon, once it held a copy, has exited.
    pub(super) fn successor_exited(&self) -> bool {
        self.successor.as_ref().is_some_and(|(p, _)| p.exited())
    }

    /// Makes sure the new daemon can serve nothing: still running after
    /// `grace`, it is killed. Blocks (up to `grace` and a moment).
    pub(super) fn fence(&mut self, grace: Duration) {
        let Some((p, pid)) = self.successor.take() else { return };
        if p.wait_exit(grace) {
            return;
        }
        if p.kill(KILL_WAIT) {
            tracing::warn!(pid, "stopped the new daemon (SIGKILL) so that it cannot serve beside this one");
        } else {
            tracing::error!(
                pid,
                "could not stop the new daemon; if it serves, stop it (kill -KILL {pid}), this daemon serves on"
            );
        }
    }

    /// The new daemon serves: the gate is committed and the NIC threads stay
    /// frozen until this process exits.
    pub(super) fn declare(mut self) {
        self.gate.commit();
        std::mem::forget(std::mem::take(&mut self.holds));
        self.successor = None;
        self.declared = true;
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if self.declared {
            return;
        }
        self.fence(Duration::ZERO);
        self.holds.clear();
        self.gate.resume();
    }
}
