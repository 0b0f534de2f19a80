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
    /// A takeover: what the daemon taken over from handed on, adopted by
    /// the startup steps in place of doing their work.
    pub adopting: Option<super::takeover::Handed>,
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
            adopting: None,
        }
    }

    /// Removes rules, unbinds, frees pools, restores NICs (all at once, as
    /// startup primes them), undoes host tuning, removes the socket files.
    /// Idempotent.
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
    use std::sync::Mutex;

    use super::*;
    use crate::nic::prime::prime;
    use crate::nic::sim::SimNic;
    use crate::nic::{DataSplit, NicOp, NicResult};

    /// The sim NIC, recording when each NIC's restore writes ran.
    struct Recorder<'a> {
        sim: &'a SimNic,
        windows: Mutex<Vec<(String, Instant, Instant)>>,
    }

    impl Recorder<'_> {
        fn write<T>(&self, ifname: &str, f: impl FnOnce() -> NicResult<T>) -> NicResult<T> {
            let start = Instant::now();
            let r = f();
            self.windows.lock().unwrap().push((ifname.to_string(), start, Instant::now()));
            r
        }
    }

    impl NicSetup for Recorder<'_> {
        fn rss_table(&self, ifname: &str) -> NicResult<Vec<u32>> {
            self.sim.rss_table(ifname)
        }
        fn set_rss_table(&self, ifname: &str, table: &[u32]) -> NicResult<()> {
            self.write(ifname, || self.sim.set_rss_table(ifname, table))
        }
        fn feature(&self, ifname: &str, name: &str) -> NicResult<bool> {
            self.sim.feature(ifname, name)
        }
        fn set_feature(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
            self.write(ifname, || self.sim.set_feature(ifname, name, on))
        }
        fn priv_flags(&self, ifname: &str) -> NicResult<Vec<(String, bool)>> {
            self.sim.priv_flags(ifname)
        }
        fn set_priv_flag(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
            self.write(ifname, || self.sim.set_priv_flag(ifname, name, on))
        }
        fn tcp_data_split(&self, ifname: &str) -> NicResult<DataSplit> {
            self.sim.tcp_data_split(ifname)
        }
        fn set_tcp_data_split(&self, ifname: &str, on: bool) -> NicResult<()> {
            self.write(ifname, || self.sim.set_tcp_data_split(ifname, on))
        }
    }

    #[test]
    fn nics_are_restored_at_the_same_time_so_stopping_takes_the_slowest_nics_time() {
        let names = ["eth1", "eth2", "eth3", "eth4"];
        let sim = SimNic::new(&names);
        let mut primed: Vec<_> = names.iter().map(|n| prime(&sim, n, 4).unwrap()).collect();
        // A slow RSS write on every NIC, slowest on eth4.
        let delays = [60, 80, 100, 200];
        for (n, ms) in names.iter().zip(delays) {
            sim.delay_on(n, NicOp::SetRss, Duration::from_millis(ms));
        }
        let rec = Recorder { sim: &sim, windows: Mutex::new(Vec::new()) };
        let t = Instant::now();
        let errors = restore_all(&rec, &mut primed);
        let took = t.elapsed();
        assert!(errors.is_empty(), "{errors:?}");
        let windows = rec.windows.into_inner().unwrap();
        // Each NIC's restore, from its first write to its last.
        let span = |n: &str| {
            let w: Vec<_> = windows.iter().filter(|w| w.0 == n).collect();
            assert!(!w.is_empty(), "{n} was not restored");
            (w.iter().map(|w| w.1).min().unwrap(), w.iter().map(|w| w.2).max().unwrap())
        };
        let spans: Vec<_> = names.iter().map(|n| span(n)).collect();
        // Every NIC's restore overlaps every other's: all ran at once.
        let latest_start = spans.iter().map(|s| s.0).max().unwrap();
        let earliest_end = spans.iter().map(|s| s.1).min().unwrap();
        assert!(latest_start < earliest_end, "restores did not overlap: {spans:?}");
        let sum: u64 = delays.iter().sum();
        println!(
            "restore of {} NICs with RSS writes of {delays:?} ms: {} ms (slowest NIC {} ms, one after another {sum} ms)",
            names.len(),
            took.as_millis(),
            delays.iter().max().unwrap()
        );
        assert!(took < Duration::from_millis(sum), "took {took:?}, as long as one NIC after another");
        // And restored exactly: every NIC back as it was before priming.
        for n in names {
            assert!(!sim.feature(n, crate::nic::FEATURE_NTUPLE).unwrap(), "{n}: ntuple not restored");
        }
    }
}
