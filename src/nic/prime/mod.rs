//! Priming and restoring a NIC, generic over [`NicControl`]; the steps after
//! priming need only [`NicSetup`]. Every change is recorded with the value it
//! replaced; restore undoes them in reverse, so the NIC ends exactly as it was
//! read, and a failed start rolls back what it had applied.

use super::header_split::{HeaderSplit, FALLBACK_RING_LARGE, FALLBACK_RING_SMALL};
use super::{
    DataSplit, NicControl, NicError, NicSetup, FEATURE_NTUPLE, PRIV_HEADER_SPLIT, PRIV_MAX_RX_BUFFER,
    PRIV_STRICT_HEADER_SPLIT,
};

/// One applied change and the value it replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Undo {
    Feature(String, bool),
    PrivFlag(String, bool),
    DataSplit(bool),
    Rss(Vec<u32>),
    RxRing(u32),
}

/// A failed prime/restore step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ifname}: {step}: {source}")]
pub struct PrimeError {
    pub ifname: String,
    pub step: &'static str,
    #[source]
    pub source: NicError,
}

/// A NIC the daemon has changed, with what it needs to put it back.
#[derive(Debug)]
pub struct PrimedNic {
    pub ifname: String,
    pub header_split: HeaderSplit,
    pub channels: u32,
    pub rule_capacity: u32,
    undo: Vec<Undo>,
}

impl PrimedNic {
    fn run(
        &mut self,
        nic: &(impl NicSetup + ?Sized),
        step: &'static str,
        change: Change,
    ) -> Result<(), PrimeError> {
        let ifname = self.ifname.clone();
        let err = |source| PrimeError { ifname: ifname.clone(), step, source };
        match change {
            Change::Feature(name, on) => {
                let before = nic.feature(&ifname, name).map_err(err)?;
                nic.set_feature(&ifname, name, on).map_err(err)?;
                self.undo.push(Undo::Feature(name.to_string(), before));
            }
            Change::PrivFlag(name, on) => {
                let flags = nic.priv_flags(&ifname).map_err(err)?;
                let Some(&(_, before)) = flags.iter().find(|(n, _)| n == name) else {
                    return Ok(()); // driver lacks this flag: nothing to do
                };
                if before != on {
                    nic.set_priv_flag(&ifname, name, on).map_err(err)?;
                    self.undo.push(Undo::PrivFlag(name.to_string(), before));
                }
            }
            Change::DataSplit(on) => {
                let before = nic.tcp_data_split(&ifname).map_err(err)?;
                let before_on = before == DataSplit::Enabled;
                if before == DataSplit::Unknown || before_on != on {
                    nic.set_tcp_data_split(&ifname, on).map_err(err)?;
                    self.undo.push(Undo::DataSplit(before_on));
                }
            }
            Change::RxRing(size) => {
                let before = nic.rx_ring(&ifname).map_err(err)?.current;
                nic.set_rx_ring(&ifname, size).map_err(err)?;
                // Only the size read first is worth restoring.
                if !self.undo.iter().any(|u| matches!(u, Undo::RxRing(_))) {
                    self.undo.push(Undo::RxRing(before));
                }
            }
            Change::RssEqual(n) => {
                let before = nic.rss_table(&ifname).map_err(err)?;
                nic.set_rss_equal(&ifname, n).map_err(err)?;
                self.undo.push(Undo::Rss(before));
            }
        }
        Ok(())
    }

    /// Turns header split on (strict where the driver has it), after pools are bound.
    pub fn enable_header_split(&mut self, nic: &(impl NicSetup + ?Sized)) -> Result<(), PrimeError> {
        match self.header_split {
            HeaderSplit::PrivFlags { .. } => self
                .run(nic, "enable header split", Change::PrivFlag(PRIV_HEADER_SPLIT, true))
                .and_then(|_| {
                    self.run(
                        nic,
                        "enable strict header split",
                        Change::PrivFlag(PRIV_STRICT_HEADER_SPLIT, true),
                    )
                }),
            HeaderSplit::DataSplit { .. } => self.run(nic, "enable tcp-data-split", Change::DataSplit(true)),
            HeaderSplit::RingSizeFallback { .. } => self
                .run(nic, "shrink rx ring (fallback)", Change::RxRing(FALLBACK_RING_SMALL))
                .and_then(|_| self.run(nic, "grow rx ring (fallback)", Change::RxRing(FALLBACK_RING_LARGE))),
            HeaderSplit::Unsupported => Ok(()),
        }
    }

    /// Undoes every change in reverse order, attempting all of them; idempotent.
    pub fn restore(&mut self, nic: &(impl NicSetup + ?Sized)) -> Vec<PrimeError> {
        let mut errors = Vec::new();
        while let Some(u) = self.undo.pop() {
            let ifname = self.ifname.as_str();
            let (step, r) = match &u {
                Undo::Feature(name, on) => ("restore feature", nic.set_feature(ifname, name, *on)),
                Undo::PrivFlag(name, on) => ("restore private flag", nic.set_priv_flag(ifname, name, *on)),
                Undo::DataSplit(on) => ("restore tcp-data-split", nic.set_tcp_data_split(ifname, *on)),
                Undo::Rss(table) => ("restore RSS table", nic.set_rss_table(ifname, table)),
                Undo::RxRing(size) => ("restore rx ring size", nic.set_rx_ring(ifname, *size)),
            };
            if let Err(source) = r {
                errors.push(PrimeError { ifname: ifname.to_string(), step, source });
            }
        }
        errors
    }
}

enum Change {
    Feature(&'static str, bool),
    PrivFlag(&'static str, bool),
    DataSplit(bool),
    RssEqual(u32),
    RxRing(u32),
}

/// Primes `ifname`: flush stale rules (ntuple off → on), header split off,
/// max RX buffer on, ntuple on, RSS over the first `rss_set_size` queues.
/// On failure every step already applied is undone before the error returns.
pub fn prime(nic: &dyn NicControl, ifname: &str, rss_set_size: u32) -> Result<PrimedNic, PrimeError> {
    let err = |step, source| PrimeError { ifname: ifname.to_string(), step, source };
    let channels = nic.channels(ifname).map_err(|e| err("read channels", e))?;
    let rule_capacity = nic.rule_capacity(ifname).map_err(|e| err("read rule capacity", e))?;
    let header_split = HeaderSplit::probe(nic, ifname).map_err(|e| err("probe driver family", e))?;
    let mut primed =
        PrimedNic { ifname: ifname.to_string(), header_split, channels, rule_capacity, undo: Vec::new() };
    let result = (|| {
        let ntuple_on = nic.feature(ifname, FEATURE_NTUPLE).map_err(|e| err("read ntuple", e))?;
        if ntuple_on {
            primed.run(nic, "flush stale rules (ntuple off)", Change::Feature(FEATURE_NTUPLE, false))?;
        }
        match primed.header_split {
            HeaderSplit::PrivFlags { .. } => {
                primed.run(
                    nic,
                    "disable strict header split",
                    Change::PrivFlag(PRIV_STRICT_HEADER_SPLIT, false),
                )?;
                primed.run(nic, "disable header split", Change::PrivFlag(PRIV_HEADER_SPLIT, false))?;
                primed.run(nic, "enable max rx buffer size", Change::PrivFlag(PRIV_MAX_RX_BUFFER, true))?;
            }
            HeaderSplit::DataSplit { .. } => {
                primed.run(nic, "disable tcp-data-split", Change::DataSplit(false))?
            }
            HeaderSplit::RingSizeFallback { .. } | HeaderSplit::Unsupported => {}
        }
        primed.run(nic, "enable ntuple", Change::Feature(FEATURE_NTUPLE, true))?;
        primed.run(nic, "set RSS equal", Change::RssEqual(rss_set_size))
    })();
    match result {
        Ok(()) => Ok(primed),
        Err(e) => {
            for re in primed.restore(nic) {
                tracing::error!(error = %re, "rollback after failed prime");
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    use super::*;
    use crate::nic::sim::SimNic;
    use crate::nic::{FlowSpec, NicOp, RuleControl};

    fn state(nic: &SimNic) -> (bool, Vec<(String, bool)>, DataSplit, Vec<u32>) {
        (
            nic.feature("eth1", FEATURE_NTUPLE).unwrap(),
            nic.priv_flags("eth1").unwrap(),
            nic.tcp_data_split("eth1").unwrap(),
            nic.rss_table("eth1").unwrap(),
        )
    }

    #[test]
    fn prime_then_restore_returns_the_exact_state() {
        let nic = SimNic::new(&["eth1"]);
        // A stale rule from a previous run, and ntuple left on.
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        let f = FlowSpec { src: "10.0.0.2:1".parse().unwrap(), dst: "192.168.1.2:2".parse().unwrap() };
        nic.add_rule("eth1", &f, 9, 7).unwrap();
        nic.set_priv_flag("eth1", PRIV_MAX_RX_BUFFER, true).unwrap();
        let before = state(&nic);
        let mut p = prime(&nic, "eth1", 8).unwrap();
        assert_eq!(p.header_split.name(), "priv_flags");
        assert!(nic.list_rules("eth1").unwrap().is_empty(), "stale rules flushed");
        assert!(nic.feature("eth1", FEATURE_NTUPLE).unwrap());
        assert!(nic.rss_table("eth1").unwrap().iter().all(|&q| q < 8));
        p.enable_header_split(&nic).unwrap();
        assert!(nic.priv_flags("eth1").unwrap().iter().all(|(_, on)| *on));
        assert!(p.restore(&nic).is_empty());
        assert_eq!(state(&nic), before);
        assert!(p.restore(&nic).is_empty(), "restore is idempotent");
    }

    #[test]
    fn every_driver_family_primes_enables_and_restores() {
        use crate::nic::sim::SimDriver;
        for (driver, family) in [
            (SimDriver::GvePrivFlags, "priv_flags"),
            (SimDriver::UpstreamRings, "tcp_data_split"),
            (SimDriver::RingSizeOnly, "ring_size_fallback"),
        ] {
            let nic = SimNic::new(&["eth1"]);
            nic.model_driver("eth1", driver);
            let before = (state(&nic), nic.rx_ring("eth1").unwrap());
            let mut p = prime(&nic, "eth1", 8).unwrap();
            assert_eq!(p.header_split.name(), family);
            p.enable_header_split(&nic).unwrap();
            match family {
                "tcp_data_split" => assert_eq!(nic.tcp_data_split("eth1").unwrap(), DataSplit::Enabled),
                "ring_size_fallback" => {
                    assert_eq!(nic.rx_ring("eth1").unwrap().current, FALLBACK_RING_LARGE);
                    assert_eq!(nic.calls(NicOp::SetRing), 2, "shrink then grow");
                }
                _ => assert!(nic.priv_flags("eth1").unwrap().iter().all(|(_, on)| *on)),
            }
            assert!(p.restore(&nic).is_empty());
            assert_eq!((state(&nic), nic.rx_ring("eth1").unwrap()), before, "{driver:?}");
        }
    }

    #[test]
    fn failed_prime_rolls_back_and_names_the_step() {
        let nic = SimNic::new(&["eth1"]);
        let before = state(&nic);
        nic.fail_nth(NicOp::SetRss, 1, Errno::EOPNOTSUPP);
        let e = prime(&nic, "eth1", 8).unwrap_err();
        assert_eq!(e.step, "set RSS equal");
        let text = e.to_string();
        assert!(text.contains("eth1") && text.contains("set_rss"), "{text}");
        assert_eq!(state(&nic), before);
    }

    #[test]
    fn restore_attempts_every_step_even_after_a_failure() {
        let nic = SimNic::new(&["eth1"]);
        let mut p = prime(&nic, "eth1", 4).unwrap();
        nic.fail_nth(NicOp::SetRss, 1, Errno::EIO);
        let errs = p.restore(&nic);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].step, "restore RSS table");
        assert!(!nic.feature("eth1", FEATURE_NTUPLE).unwrap(), "later steps still ran");
        assert_eq!(p.undo.len(), 0);
    }
}

pub(crate) mod handover;
