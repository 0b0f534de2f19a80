//! Applies rule bookkeeping to one NIC through [`NicControl`]: the NIC is
//! changed first where it can fail, and the bookkeeping rolls back if it does.

use nix::errno::Errno;

use super::table::{NicRules, Reserve, RuleEntry};
use super::{code_for_errno, RuleFailure};
use crate::nic::{FlowSpec, NicControl, NicError, NicRule};
use crate::wire::frame::Code;

/// The result of an install that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    New(RuleEntry),
    Existing(RuleEntry),
}

/// One NIC's rules and the name the NIC backend knows it by.
#[derive(Debug)]
pub struct NicRuleEngine {
    pub ifname: String,
    rules: NicRules,
}

fn nic_failure(e: &NicError) -> RuleFailure {
    RuleFailure::new(code_for_errno(e.errno), e.to_string())
}

impl NicRuleEngine {
    pub fn new(ifname: &str, capacity: u32, gpu_queues: &[Vec<u32>]) -> Self {
        NicRuleEngine { ifname: ifname.to_string(), rules: NicRules::new(capacity, gpu_queues) }
    }

    pub fn rules(&self) -> &NicRules {
        &self.rules
    }

    pub fn install(
        &mut self,
        nic: &dyn NicControl,
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        pid: Option<u32>,
    ) -> Result<Installed, RuleFailure> {
        match self.rules.reserve(flow, gpu, hint, pid) {
            Reserve::Existing(e) => Ok(Installed::Existing(e)),
            Reserve::Exhausted => Err(RuleFailure::new(
                Code::ResourceExhausted,
                format!("all {} rule slots of {} are in use", self.rules.capacity(), self.ifname),
            )),
            Reserve::New(e) => match nic.add_rule(&self.ifname, &flow, e.queue, e.loc) {
                Ok(()) => Ok(Installed::New(e)),
                Err(err) => {
                    self.rules.release(&flow);
                    Err(nic_failure(&err))
                }
            },
        }
    }

    /// Removes `flow`; an unknown flow is not an error. If the NIC refuses
    /// (other than "no such rule"), the rule stays booked so a retry can remove it.
    pub fn uninstall(
        &mut self,
        nic: &dyn NicControl,
        flow: &FlowSpec,
    ) -> Result<Option<RuleEntry>, RuleFailure> {
        let Some(e) = self.rules.get(flow).copied() else {
            return Ok(None);
        };
        match nic.del_rule(&self.ifname, e.loc) {
            Ok(()) => {}
            Err(err) if err.errno == Errno::ENOENT => {
                tracing::warn!(ifname = %self.ifname, loc = e.loc, "rule was already gone from the NIC")
            }
            Err(err) => return Err(nic_failure(&err)),
        }
        self.rules.release(flow);
        Ok(Some(e))
    }

    /// Removes every rule (shutdown). Returns the failures; bookkeeping is cleared regardless.
    pub fn remove_all(&mut self, nic: &dyn NicControl) -> Vec<NicError> {
        let flows: Vec<FlowSpec> = self.rules.iter().map(|(f, _)| f).collect();
        let mut errors = Vec::new();
        for flow in flows {
            let e = self.rules.release(&flow).expect("listed above");
            if let Err(err) = nic.del_rule(&self.ifname, e.loc) {
                if err.errno != Errno::ENOENT {
                    errors.push(err);
                }
            }
        }
        errors
    }

    /// Our rules as the NIC would report them, sorted by slot.
    pub fn booked(&self) -> Vec<(FlowSpec, RuleEntry)> {
        let mut v: Vec<_> = self.rules.iter().map(|(f, e)| (f, *e)).collect();
        v.sort_by_key(|(_, e)| e.loc);
        v
    }

    /// Whether the NIC's own table matches our bookkeeping.
    pub fn matches_nic(&self, nic_rules: &[NicRule]) -> bool {
        let mut want: Vec<NicRule> = self
            .booked()
            .into_iter()
            .map(|(f, e)| NicRule { loc: e.loc, queue: e.queue, src: f.src, dst: f.dst })
            .collect();
        let mut have = nic_rules.to_vec();
        want.sort_by_key(|r| r.loc);
        have.sort_by_key(|r| r.loc);
        want == have
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::sim::SimNic;
    use crate::nic::{NicOp, FEATURE_NTUPLE};
    use proptest::prelude::*;

    fn flow(i: u16) -> FlowSpec {
        if i % 3 == 0 {
            FlowSpec {
                src: format!("[fd00::2]:{i}").parse().unwrap(),
                dst: "[fd00::1]:5000".parse().unwrap(),
            }
        } else {
            FlowSpec {
                src: format!("10.1.0.2:{i}").parse().unwrap(),
                dst: "192.168.1.2:5000".parse().unwrap(),
            }
        }
    }

    fn setup(capacity: u32) -> (SimNic, NicRuleEngine) {
        let nic = SimNic::new(&["eth1"]);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        (nic, NicRuleEngine::new("eth1", capacity, &[vec![8, 9, 10, 11], vec![12, 13, 14, 15]]))
    }

    #[test]
    fn nic_failure_rolls_back_and_maps_errno() {
        let (nic, mut eng) = setup(16);
        for (errno, code) in [
            (Errno::EINVAL, Code::InvalidArgument),
            (Errno::ENOSPC, Code::ResourceExhausted),
            (Errno::EBUSY, Code::Unavailable),
            (Errno::EAGAIN, Code::Unavailable),
            (Errno::EIO, Code::Internal),
        ] {
            nic.fail_nth(NicOp::AddRule, 1, errno);
            let e = eng.install(&nic, flow(1), 0, None, None).unwrap_err();
            assert_eq!(e.code, code, "{errno}");
            assert!(eng.rules().is_empty());
            eng.rules().check_consistency().unwrap();
        }
        // The slot that failed is handed out again.
        assert!(matches!(eng.install(&nic, flow(1), 0, None, None), Ok(Installed::New(e)) if e.loc == 0));
        assert!(eng.matches_nic(&nic.list_rules("eth1").unwrap()));
    }

    #[test]
    fn failed_delete_keeps_the_rule_for_a_retry() {
        let (nic, mut eng) = setup(16);
        eng.install(&nic, flow(1), 1, Some(13), None).unwrap();
        nic.fail_nth(NicOp::DelRule, 1, Errno::EBUSY);
        assert_eq!(eng.uninstall(&nic, &flow(1)).unwrap_err().code, Code::Unavailable);
        assert_eq!(eng.rules().len(), 1);
        assert_eq!(eng.uninstall(&nic, &flow(1)).unwrap().unwrap().queue, 13);
        assert_eq!(eng.uninstall(&nic, &flow(1)), Ok(None));
        assert!(nic.list_rules("eth1").unwrap().is_empty());
    }

    #[derive(Debug, Clone)]
    enum Step {
        Install { flow: u16, gpu: usize, hint: Option<u32>, fail: bool },
        Uninstall { flow: u16, fail: bool },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u16..40, 0usize..2, proptest::option::of(6u32..17), proptest::bool::weighted(0.15))
                .prop_map(|(flow, gpu, hint, fail)| Step::Install { flow, gpu, hint, fail }),
            (0u16..40, proptest::bool::weighted(0.15))
                .prop_map(|(flow, fail)| Step::Uninstall { flow, fail }),
        ]
    }

    proptest! {
        #[test]
        fn random_sequences_keep_bookkeeping_and_nic_in_step(steps in proptest::collection::vec(step(), 1..120)) {
            let (nic, mut eng) = setup(24);
            for s in steps {
                match s {
                    Step::Install { flow: f, gpu, hint, fail } => {
                        if fail { nic.fail_nth(NicOp::AddRule, 1, Errno::EBUSY); }
                        let free_before = eng.rules().capacity() as usize - eng.rules().len();
                        let existed = eng.rules().get(&flow(f)).is_some();
                        match eng.install(&nic, flow(f), gpu, hint, None) {
                            Ok(Installed::New(e)) => {
                                prop_assert!(!existed);
                                // Lowest free slot: no lower slot is in use by nobody.
                                let used: std::collections::BTreeSet<u32> = eng.booked().iter().map(|(_, e)| e.loc).collect();
                                prop_assert!((0..e.loc).all(|l| used.contains(&l)));
                                let qs = eng.rules().gpu(gpu).queues().to_vec();
                                prop_assert!(qs.contains(&e.queue));
                                if let Some(h) = hint.filter(|h| qs.contains(h)) { prop_assert_eq!(e.queue, h); }
                            }
                            Ok(Installed::Existing(_)) => prop_assert!(existed),
                            Err(e) => {
                                if fail && !existed && free_before > 0 {
                                    prop_assert_eq!(e.code, Code::Unavailable);
                                } else {
                                    prop_assert_eq!(e.code, Code::ResourceExhausted);
                                    prop_assert_eq!(free_before, 0);
                                }
                            }
                        }
                        if fail { nic.clear_faults(); }
                    }
                    Step::Uninstall { flow: f, fail } => {
                        if fail { nic.fail_nth(NicOp::DelRule, 1, Errno::EAGAIN); }
                        let existed = eng.rules().get(&flow(f)).is_some();
                        let r = eng.uninstall(&nic, &flow(f));
                        prop_assert_eq!(eng.rules().get(&flow(f)).is_some(), existed && fail);
                        prop_assert_eq!(r.is_err(), existed && fail);
                        nic.clear_faults();
                    }
                }
                eng.rules().check_consistency().map_err(TestCaseError::fail)?;
                prop_assert!(eng.matches_nic(&nic.list_rules("eth1").unwrap()));
            }
            prop_assert!(eng.remove_all(&nic).is_empty());
            prop_assert!(nic.list_rules("eth1").unwrap().is_empty());
        }
    }
}
