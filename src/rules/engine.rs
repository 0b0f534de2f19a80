//! Applies rule bookkeeping to one NIC through [`NicControl`]: the NIC is
//! changed first where it can fail, and the bookkeeping rolls back if it does.

use std::num::NonZeroU32;

use nix::errno::Errno;

use super::table::{NicRules, Owner, Reserve, RuleEntry};
use super::{code_for_errno, RuleFailure};
#[cfg(test)]
use crate::nic::NicRule;
use crate::nic::{FlowSpec, NicControl, NicError};
use crate::types::status::StatusCode;

/// The result of an install that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    New(RuleEntry),
    Existing(RuleEntry),
}

/// What a batch of deletes did: rules gone from the NIC, and rules the NIC
/// refused to delete (kept booked, retried later).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removal {
    pub removed: Vec<RuleEntry>,
    pub failed: Vec<NicError>,
}

/// One NIC's rules and the name the NIC backend knows it by.
#[derive(Debug)]
pub struct NicRuleEngine {
    pub ifname: String,
    rules: NicRules,
}

fn nic_failure(e: &NicError) -> RuleFailure {
    RuleFailure { nic: Some(e.clone()), ..RuleFailure::new(code_for_errno(e.errno), e.to_string()) }
}

/// Errnos with which drivers refuse an insert into an occupied slot
/// (gve reports its device's ALREADY_EXISTS as EINVAL).
fn may_be_occupied(errno: Errno) -> bool {
    matches!(errno, Errno::EEXIST | Errno::EBUSY | Errno::EINVAL)
}

impl NicRuleEngine {
    pub fn new(ifname: &str, capacity: u32, gpu_queues: &[Vec<u32>]) -> Self {
        NicRuleEngine { ifname: ifname.to_string(), rules: NicRules::new(capacity, gpu_queues) }
    }

    /// An engine over a table taken over from another daemon.
    pub fn with_rules(ifname: &str, rules: NicRules) -> Self {
        NicRuleEngine { ifname: ifname.to_string(), rules }
    }

    pub fn rules(&self) -> &NicRules {
        &self.rules
    }

    /// Installs `flow`. A slot found holding a rule the daemon did not put
    /// there is marked foreign and the next free slot is tried.
    pub fn install(
        &mut self,
        nic: &dyn NicControl,
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        owner: Owner,
    ) -> Result<Installed, RuleFailure> {
        loop {
            match self.rules.reserve(flow, gpu, hint, owner) {
                Reserve::Existing(e) => {
                    // Installed again before a retried delete got through:
                    // the client wants it, so it stays.
                    if e.pending_delete {
                        self.rules.set_pending(&flow, false);
                    }
                    self.rules.set_owner(&flow, owner);
                    return Ok(Installed::Existing(*self.rules.get(&flow).expect("booked")));
                }
                Reserve::Exhausted => {
                    return Err(RuleFailure::new(
                        StatusCode::ResourceExhausted,
                        format!("all {} rule slots of {} are in use", self.rules.capacity(), self.ifname),
                    ))
                }
                Reserve::New(e) => match nic.add_rule(&self.ifname, &flow, e.queue, e.loc) {
                    Ok(()) => return Ok(Installed::New(e)),
                    Err(err)
                        if may_be_occupied(err.errno) && nic.slot_in_use(&self.ifname, e.loc) == Ok(true) =>
                    {
                        self.rules.mark_foreign(&flow);
                        tracing::warn!(
                            ifname = %self.ifname,
                            loc = e.loc,
                            error = %err,
                            "slot holds a rule this daemon did not install; it stays out of use"
                        );
                    }
                    Err(err) => {
                        self.rules.release(&flow);
                        return Err(nic_failure(&err));
                    }
                },
            }
        }
    }

    /// Deletes one booked rule from the NIC. On success (or "no such rule")
    /// it is forgotten; otherwise it stays booked and is marked for a retry.
    fn delete(&mut self, nic: &dyn NicControl, flow: &FlowSpec, e: RuleEntry) -> Result<(), NicError> {
        match nic.del_rule(&self.ifname, e.loc) {
            Ok(()) => {}
            Err(err) if err.errno == Errno::ENOENT => {
                tracing::warn!(ifname = %self.ifname, loc = e.loc, "rule was already gone from the NIC")
            }
            Err(err) => {
                self.rules.set_pending(flow, true);
                return Err(err);
            }
        }
        self.rules.release(flow);
        Ok(())
    }

    /// Removes `flow`; an unknown flow is not an error. If the NIC refuses
    /// (other than "no such rule"), the rule stays booked, the client gets the
    /// error, and the daemon retries the delete itself ([`Self::retry_pending`]).
    pub fn uninstall(
        &mut self,
        nic: &dyn NicControl,
        flow: &FlowSpec,
    ) -> Result<Option<RuleEntry>, RuleFailure> {
        let Some(e) = self.rules.get(flow).copied() else {
            return Ok(None);
        };
        self.delete(nic, flow, e).map_err(|err| nic_failure(&err))?;
        Ok(Some(e))
    }

    fn delete_all(&mut self, nic: &dyn NicControl, flows: Vec<FlowSpec>) -> Removal {
        let mut out = Removal::default();
        for flow in flows {
            let Some(e) = self.rules.get(&flow).copied() else { continue };
            match self.delete(nic, &flow, e) {
                Ok(()) => out.removed.push(e),
                Err(err) => out.failed.push(err),
            }
        }
        out
    }

    /// Removes every rule installed under `lease` (its process exited).
    pub fn reclaim(&mut self, nic: &dyn NicControl, lease: NonZeroU32) -> Removal {
        let flows = self.rules.owned_by(lease);
        self.delete_all(nic, flows)
    }

    /// Tries again every delete the NIC refused before.
    pub fn retry_pending(&mut self, nic: &dyn NicControl) -> Removal {
        let flows: Vec<FlowSpec> = self.rules.pending().collect();
        self.delete_all(nic, flows)
    }

    /// Removes every rule (shutdown). Rules the NIC refuses stay booked and
    /// pending; the failures are returned.
    pub fn remove_all(&mut self, nic: &dyn NicControl) -> Vec<NicError> {
        let flows: Vec<FlowSpec> = self.rules.iter().map(|(f, _)| f).collect();
        self.delete_all(nic, flows).failed
    }

    /// Our rules as the NIC would report them, sorted by slot.
    pub fn booked(&self) -> Vec<(FlowSpec, RuleEntry)> {
        let mut v: Vec<_> = self.rules.iter().map(|(f, e)| (f, *e)).collect();
        v.sort_by_key(|(_, e)| e.loc);
        v
    }

    /// Whether the NIC's own table matches our bookkeeping (foreign slots aside).
    #[cfg(test)]
    pub fn matches_nic(&self, nic_rules: &[NicRule]) -> bool {
        let mut want: Vec<NicRule> = self
            .booked()
            .into_iter()
            .map(|(f, e)| NicRule { loc: e.loc, queue: e.queue, src: f.src, dst: f.dst })
            .collect();
        let foreign = self.rules.foreign_slots();
        let mut have: Vec<NicRule> =
            nic_rules.iter().filter(|r| !foreign.contains(&r.loc)).copied().collect();
        want.sort_by_key(|r| r.loc);
        have.sort_by_key(|r| r.loc);
        want == have
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::sim::SimNic;
    use crate::nic::{NicOp, NicSetup, RuleControl, FEATURE_NTUPLE};
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
            (Errno::EINVAL, StatusCode::InvalidArgument),
            (Errno::ENOSPC, StatusCode::ResourceExhausted),
            (Errno::EBUSY, StatusCode::Unavailable),
            (Errno::EAGAIN, StatusCode::Unavailable),
            (Errno::EIO, StatusCode::Internal),
        ] {
            nic.fail_nth(NicOp::AddRule, 1, errno);
            let e = eng.install(&nic, flow(1), 0, None, Owner::default()).unwrap_err();
            assert_eq!(e.code, code, "{errno}");
            assert!(eng.rules().is_empty());
            eng.rules().check_consistency().unwrap();
        }
        // The slot that failed is handed out again.
        assert!(
            matches!(eng.install(&nic, flow(1), 0, None, Owner::default()), Ok(Installed::New(e)) if e.loc == 0)
        );
        assert!(eng.matches_nic(&nic.list_rules("eth1").unwrap()));
    }

    #[test]
    fn failed_delete_keeps_the_rule_for_a_retry() {
        let (nic, mut eng) = setup(16);
        eng.install(&nic, flow(1), 1, Some(13), Owner::default()).unwrap();
        nic.fail_nth(NicOp::DelRule, 1, Errno::EBUSY);
        assert_eq!(eng.uninstall(&nic, &flow(1)).unwrap_err().code, StatusCode::Unavailable);
        assert_eq!(eng.rules().len(), 1);
        assert_eq!(eng.uninstall(&nic, &flow(1)).unwrap().unwrap().queue, 13);
        assert_eq!(eng.uninstall(&nic, &flow(1)), Ok(None));
        assert!(nic.list_rules("eth1").unwrap().is_empty());
    }

    fn owner(lease: u32) -> Owner {
        Owner {
            pid: NonZeroU32::new(1000 + lease),
            lease: NonZeroU32::new(lease),
            tenant: None,
            repaired: false,
        }
    }

    #[test]
    fn foreign_slot_is_skipped_not_fatal() {
        let (nic, mut eng) = setup(16);
        let stranger = FlowSpec { src: "10.9.9.9:1".parse().unwrap(), dst: "192.168.1.2:1".parse().unwrap() };
        nic.add_foreign_rule("eth1", 0, stranger, 3);
        nic.add_foreign_rule("eth1", 1, stranger, 3);
        let Ok(Installed::New(e)) = eng.install(&nic, flow(1), 0, None, Owner::default()) else { panic!() };
        assert_eq!(e.loc, 2);
        assert_eq!(eng.rules().foreign_slots().iter().copied().collect::<Vec<_>>(), vec![0, 1]);
        let Ok(Installed::New(e)) = eng.install(&nic, flow(2), 0, None, Owner::default()) else { panic!() };
        assert_eq!(e.loc, 3, "known foreign slots are not tried again");
        assert!(eng.matches_nic(&nic.list_rules("eth1").unwrap()));
        eng.rules().check_consistency().unwrap();
        // A plain refusal on a free slot is still an error, not a foreign slot.
        nic.fail_nth(NicOp::AddRule, 1, Errno::EBUSY);
        assert_eq!(
            eng.install(&nic, flow(3), 0, None, Owner::default()).unwrap_err().code,
            StatusCode::Unavailable
        );
        assert_eq!(eng.rules().foreign_slots().len(), 2);
        eng.rules().check_consistency().unwrap();
    }

    #[test]
    fn reclaim_removes_only_the_leases_rules_and_retries_refusals() {
        let (nic, mut eng) = setup(16);
        for i in 0..6 {
            eng.install(&nic, flow(i), 0, None, owner(1 + u32::from(i % 2))).unwrap();
        }
        nic.fail_nth(NicOp::DelRule, 2, Errno::EIO);
        let r = eng.reclaim(&nic, NonZeroU32::new(1).unwrap());
        assert_eq!((r.removed.len(), r.failed.len()), (2, 1));
        assert_eq!(r.failed[0].errno, Errno::EIO);
        // The refused one stays booked and on the NIC: bookkeeping equals the NIC table.
        assert_eq!(eng.rules().len(), 4);
        assert_eq!(eng.rules().pending_len(), 1);
        assert!(eng.matches_nic(&nic.list_rules("eth1").unwrap()));
        eng.rules().check_consistency().unwrap();
        let r = eng.retry_pending(&nic);
        assert_eq!((r.removed.len(), r.failed.len()), (1, 0));
        assert_eq!(eng.rules().len(), 3);
        assert!(eng.rules().iter().all(|(_, e)| e.owner == owner(2)));
        assert!(eng.matches_nic(&nic.list_rules("eth1").unwrap()));
    }

    #[test]
    fn reinstall_cancels_a_pending_delete() {
        let (nic, mut eng) = setup(16);
        eng.install(&nic, flow(1), 0, None, owner(1)).unwrap();
        nic.fail_nth(NicOp::DelRule, 1, Errno::EAGAIN);
        assert!(eng.uninstall(&nic, &flow(1)).is_err());
        assert_eq!(eng.rules().pending_len(), 1);
        assert!(
            matches!(eng.install(&nic, flow(1), 0, None, owner(2)), Ok(Installed::Existing(e)) if e.owner == owner(2) && !e.pending_delete)
        );
        assert_eq!(eng.rules().pending_len(), 0);
        assert!(eng.retry_pending(&nic).removed.is_empty());
        assert_eq!(nic.list_rules("eth1").unwrap().len(), 1);
    }

    #[test]
    fn remove_all_keeps_what_the_nic_refused() {
        let (nic, mut eng) = setup(16);
        for i in 0..4 {
            eng.install(&nic, flow(i), 0, None, Owner::default()).unwrap();
        }
        nic.fail_nth(NicOp::DelRule, 3, Errno::EBUSY);
        assert_eq!(eng.remove_all(&nic).len(), 1);
        assert_eq!(eng.rules().len(), 1);
        assert!(eng.matches_nic(&nic.list_rules("eth1").unwrap()));
        assert!(eng.remove_all(&nic).is_empty());
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
                        match eng.install(&nic, flow(f), gpu, hint, Owner::default()) {
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
                                    prop_assert_eq!(e.code, StatusCode::Unavailable);
                                } else {
                                    prop_assert_eq!(e.code, StatusCode::ResourceExhausted);
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
