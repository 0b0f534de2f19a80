//! What startup changed, and undoing it: at shutdown, and as the rollback of
//! a startup that failed halfway. Every step is attempted even when an
//! earlier one failed; the failures are returned, typed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gpu::{Binding, RxPool};
use crate::host::tuning::HostTuning;
use crate::nic::prime::{PrimeError, PrimedNic};
use crate::nic::{NicControl, NicSetup};
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

    /// Removes rules, unbinds, frees pools, restores NICs (all at once, as
    /// startup primes them), undoes host tuning, removes the socket files.
    /// Idempotent.
    pub async fn teardown(&mut self) -> Vec<TeardownError> {
        let mut errors = Vec::new();
        if let Some(state) = self.state.take() {
            state.shared.stopping.store(true, Ordering::Release);
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
        errors.extend(
            restore_all(self.nic.as_ref(), &mut self.primed).into_iter().map(TeardownError::RestoreNic),
        );
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

/// Restores every primed NIC, each on its own thread as startup primed them,
/// so that stopping takes as long as the slowest NIC rather than the sum of
/// all. Each NIC's own steps still run in reverse order; the errors come
/// back in the order of `primed`.
pub(super) fn restore_all<N: NicSetup + Sync + ?Sized>(nic: &N, primed: &mut [PrimedNic]) -> Vec<PrimeError> {
    let t = Instant::now();
    let per_nic: Vec<Vec<PrimeError>> = std::thread::scope(|s| {
        let handles: Vec<_> = primed
            .iter_mut()
            .map(|p| {
                s.spawn(move || {
                    let errs = p.restore(nic);
                    if errs.is_empty() {
                        tracing::info!(ifname = %p.ifname, elapsed_ms = ms(t), "NIC restored");
                    }
                    errs
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("restore thread")).collect()
    });
    per_nic.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::nic::prime::prime;
    use crate::nic::sim::{held_marker, SimNic, Stall};
    use crate::nic::NicOp;

    #[test]
    fn nics_are_restored_at_the_same_time() {
        let names = ["eth1", "eth2", "eth3", "eth4"];
        let sim = SimNic::new(&names);
        let mut primed: Vec<_> = names.iter().map(|n| prime(&sim, n, 4).unwrap()).collect();
        // Each NIC's RSS write is held until its file exists: all four held at
        // once can only be restores running side by side.
        let tmp = tempfile::tempdir().unwrap();
        let go: Vec<_> = names.iter().map(|n| tmp.path().join(format!("{n}-go"))).collect();
        for (n, file) in names.iter().zip(&go) {
            sim.stall(Some(n), NicOp::SetRss, Stall::Until(file.clone()));
        }
        std::thread::scope(|s| {
            let restoring = s.spawn(|| restore_all(&sim, &mut primed));
            let deadline = Instant::now() + Duration::from_secs(60); // bounds a hang only
            let all_held = || go.iter().all(|f| held_marker(f).exists());
            while !all_held() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let held: Vec<_> = names.iter().zip(&go).filter(|(_, f)| held_marker(f).exists()).collect();
            for f in &go {
                std::fs::write(f, b"").unwrap();
            }
            let errors = restoring.join().unwrap();
            assert_eq!(held.len(), names.len(), "restores held at once: {held:?}; one ran after another");
            assert!(errors.is_empty(), "{errors:?}");
        });
        // And restored exactly: every NIC back as it was before priming.
        for n in names {
            assert!(!sim.feature(n, crate::nic::FEATURE_NTUPLE).unwrap(), "{n}: ntuple not restored");
        }
    }
}
