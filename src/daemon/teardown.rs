//! What startup changed, and undoing it: at shutdown, and as the rollback of
//! a startup that failed halfway. Every step is attempted even when an
//! earlier one failed; the failures are returned, typed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gpu::{Binding, RxPool};
use crate::host::tuning::HostTuning;
use crate::nic::prime::PrimedNic;
use crate::nic::NicControl;
use crate::server::socket_dir::SocketDir;
use crate::server::ServerState;
use crate::types::pci::PciAddr;

use super::{ms, TeardownError};

/// How long shutdown keeps retrying rule deletes the NIC refuses.
const RULE_REMOVAL_GIVE_UP: Duration = Duration::from_secs(5);

/// What startup has changed so far, so that failure and shutdown undo the same things.
pub(super) struct Node {
    pub nic: Arc<dyn NicControl>,
    pub primed: Vec<PrimedNic>,
    pub bindings: Vec<Box<dyn Binding>>,
    pub pools: Vec<(PciAddr, Arc<dyn RxPool>)>,
    pub state: Option<Arc<ServerState>>,
    pub dir: SocketDir,
    /// Host tuning applied at startup (backends that allow it only).
    pub tuning: Option<HostTuning>,
}

impl Node {
    pub fn new(nic: Arc<dyn NicControl>, dir: SocketDir) -> Self {
        Node {
            nic,
            primed: Vec::new(),
            bindings: Vec::new(),
            pools: Vec::new(),
            state: None,
            dir,
            tuning: None,
        }
    }

    /// Removes rules, unbinds, frees pools, restores NICs (in reverse order
    /// of priming), undoes host tuning, removes the socket files. Idempotent.
    pub async fn teardown(&mut self) -> Vec<TeardownError> {
        let mut errors = Vec::new();
        if let Some(state) = self.state.take() {
            state.stopping.store(true, Ordering::Release);
            // Every NIC at once: each retries refused deletes on its own thread.
            let give_up_at = Instant::now() + RULE_REMOVAL_GIVE_UP;
            let t = Instant::now();
            let started: Vec<_> = state.rules.nics.iter().map(|w| w.remove_all(give_up_at)).collect();
            for (w, removal) in state.rules.nics.iter().zip(started) {
                let errs = removal.await;
                tracing::info!(ifname = %w.ifname, elapsed_ms = ms(t), refused = errs.len(), "rules removed");
                errors.extend(errs.into_iter().map(TeardownError::RemoveRule));
            }
        }
        // Bindings before pools: a binding refers to its pool's memory.
        self.bindings.clear();
        self.pools.clear();
        for p in self.primed.iter_mut().rev() {
            let errs = p.restore(self.nic.as_ref());
            if errs.is_empty() {
                tracing::info!(ifname = %p.ifname, "NIC restored");
            }
            errors.extend(errs.into_iter().map(TeardownError::RestoreNic));
        }
        self.primed.clear();
        if let Some(mut tuning) = self.tuning.take() {
            match tuning.restore() {
                Ok(()) => tracing::info!("host tuning undone"),
                Err(errs) => errors.extend(errs.into_iter().map(TeardownError::HostTuning)),
            }
        }
        self.dir.cleanup();
        errors
    }
}
