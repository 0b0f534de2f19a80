//! A NIC's bookkeeping as a takeover hands it on: written out by the old
//! daemon's NIC thread, rebuilt by the new one exactly (slots, queue loads,
//! owners, refused deletes, foreign slots), without a call to the NIC.

use std::collections::BTreeSet;
use std::num::NonZeroU32;

use foldhash::{HashMap as FastMap, HashMapExt, HashSet as FastSet, HashSetExt};

use super::{FlowKey, NicRules, Owner, QueueLoads, RuleEntry, RuleSlots};
use crate::wire::handover::{Record, RuleTable, RECORD};

impl RuleSlots {
    /// The allocator of a table whose slots `used` are taken (each once).
    fn with_used(capacity: u32, used: &BTreeSet<u32>) -> RuleSlots {
        let next = used.last().map_or(0, |&l| l + 1);
        let freed = (0..next).filter(|s| !used.contains(s)).collect();
        RuleSlots { capacity, freed, next }
    }
}

impl NicRules {
    /// The table as the handover message carries it.
    pub fn to_wire(&self, ifname: &str) -> RuleTable {
        let mut rules = Vec::with_capacity(self.flows.len() * RECORD);
        for (k, e) in &self.flows {
            Record {
                flow: k.spec(),
                loc: e.loc,
                queue: e.queue,
                gpu: e.gpu as u32,
                owner_pid: e.owner.pid.map_or(0, NonZeroU32::get),
                lease: e.owner.lease.map_or(0, NonZeroU32::get),
                tenant: e.owner.tenant,
                pending_delete: e.pending_delete,
                repaired: e.owner.repaired,
            }
            .pack(&mut rules);
        }
        RuleTable {
            ifname: ifname.to_string(),
            capacity: self.slots.capacity(),
            rules: rules.into(),
            foreign: self.foreign.iter().copied().collect(),
        }
    }

    /// Records each rule's tenant as `now` maps it: the daemon that handed
    /// the table over may have told tenants otherwise (see
    /// `ClientTracker::handed_workloads`).
    pub fn retenant(&mut self, now: impl Fn(u64) -> u64) {
        for e in self.flows.values_mut() {
            e.owner.tenant = e.owner.tenant.map(&now);
        }
    }

    /// Rebuilds a table from the message, for a NIC whose GPUs have
    /// `gpu_queues`; an error names what does not fit (a slot used twice, a
    /// queue that is not the GPU's, a slot beyond the capacity).
    pub fn from_wire(t: &RuleTable, capacity: u32, gpu_queues: &[Vec<u32>]) -> Result<NicRules, String> {
        if t.capacity != capacity {
            return Err(format!("{}: {} rule slots then, {capacity} now", t.ifname, t.capacity));
        }
        let mut gpus: Vec<QueueLoads> = gpu_queues.iter().map(|q| QueueLoads::new(q)).collect();
        let records = Record::unpack_all(&t.rules).map_err(|e| format!("{}: {e}", t.ifname))?;
        let mut flows = FastMap::with_capacity(t.rules.len() / RECORD);
        let mut pending = FastSet::new();
        let mut ports = super::fits::PortIndex::new();
        let mut used: BTreeSet<u32> = t.foreign.iter().copied().collect();
        for r in records {
            let flow = r.flow;
            let gpu = r.gpu as usize;
            let loads = gpus.get_mut(gpu).ok_or_else(|| format!("{}: no GPU {gpu}", t.ifname))?;
            if !loads.queues().contains(&r.queue) {
                return Err(format!("{}: queue {} is not GPU {gpu}'s", t.ifname, r.queue));
            }
            if r.loc >= capacity || !used.insert(r.loc) {
                return Err(format!("{}: slot {} out of range or used twice", t.ifname, r.loc));
            }
            loads.add(r.queue, 1);
            let owner = Owner {
                pid: NonZeroU32::new(r.owner_pid),
                lease: NonZeroU32::new(r.lease),
                tenant: r.tenant,
                repaired: r.repaired,
            };
            let key = FlowKey::from(&flow);
            let entry =
                RuleEntry { loc: r.loc, queue: r.queue, gpu, owner, pending_delete: r.pending_delete };
            if flows.insert(key, entry).is_some() {
                return Err(format!("{}: flow {flow} twice", t.ifname));
            }
            ports.add(key, &owner);
            if r.pending_delete {
                pending.insert(key);
            }
        }
        if let Some(&f) = t.foreign.iter().find(|&&f| f >= capacity) {
            return Err(format!("{}: foreign slot {f} out of range", t.ifname));
        }
        Ok(NicRules {
            slots: RuleSlots::with_used(capacity, &used),
            gpus,
            flows,
            foreign: t.foreign.iter().copied().collect(),
            pending,
            ports,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::table::Reserve;
    use crate::types::flow::FlowSpec;

    fn flow(i: u32) -> FlowSpec {
        FlowSpec {
            src: format!("10.0.{}.{}:{}", i / 200, i % 200, 2000 + i).parse().unwrap(),
            dst: if i % 3 == 0 {
                "[fd00::2]:5000".parse().unwrap()
            } else {
                "192.168.1.2:5000".parse().unwrap()
            },
        }
    }

    #[test]
    fn a_table_rebuilt_from_the_message_is_the_same_table() {
        let queues = vec![vec![1, 2], vec![3, 4, 5]];
        let mut t = NicRules::new(64, &queues);
        for i in 0..40 {
            let owner = Owner {
                pid: NonZeroU32::new(100 + i),
                lease: NonZeroU32::new(i % 4),
                tenant: Some(7),
                repaired: i % 3 == 0,
            };
            assert!(matches!(t.reserve(flow(i), (i % 2) as usize, None, owner), Reserve::New(_)));
        }
        for i in (0..40).step_by(3) {
            t.release(&flow(i));
        }
        t.set_pending(&flow(1), true);
        t.mark_foreign(&flow(5));
        let wire = t.to_wire("eth1");
        let back = NicRules::from_wire(&wire, 64, &queues).unwrap();
        back.check_consistency().unwrap();
        assert_eq!(back.len(), t.len());
        for (f, e) in t.iter() {
            assert_eq!(back.get(&f), Some(e), "{f:?}");
        }
        assert_eq!(back.foreign_slots(), t.foreign_slots());
        assert_eq!(back.pending().collect::<Vec<_>>(), vec![flow(1)]);
        // The next slots handed out are the same ones.
        let (mut a, mut b) = (t.clone(), back.clone());
        for i in 100..110 {
            let (x, y) = (
                a.reserve(flow(i), 1, None, Owner::default()),
                b.reserve(flow(i), 1, None, Owner::default()),
            );
            assert_eq!(x, y);
        }
    }

    #[test]
    fn an_adopted_tables_tenants_are_rewritten_as_the_successor_tells_them() {
        let mut t = NicRules::new(8, &[vec![1]]);
        for (i, tenant) in [Some(7), Some(8), None].into_iter().enumerate() {
            let owner = Owner { tenant, ..Owner::default() };
            t.reserve(flow(i as u32 + 1), 0, None, owner);
        }
        t.retenant(|id| if id == 7 { 70 } else { id });
        let tenants: BTreeSet<Option<u64>> = t.iter().map(|(_, e)| e.owner.tenant).collect();
        assert_eq!(tenants, BTreeSet::from([Some(70), Some(8), None]));
    }

    #[test]
    fn a_table_that_does_not_fit_is_refused() {
        let queues = vec![vec![1, 2]];
        let mut t = NicRules::new(8, &queues);
        t.reserve(flow(1), 0, None, Owner::default());
        let wire = t.to_wire("eth1");
        assert!(NicRules::from_wire(&wire, 16, &queues).unwrap_err().contains("8 rule slots then, 16 now"));
        assert!(NicRules::from_wire(&wire, 8, &[vec![3]]).unwrap_err().contains("queue"));
        let mut twice = wire.clone();
        let mut other = Record::unpack_all(&wire.rules).unwrap().next().unwrap();
        other.flow = flow(2);
        let mut bytes = twice.rules.to_vec();
        other.pack(&mut bytes);
        twice.rules = bytes.into();
        assert!(NicRules::from_wire(&twice, 8, &queues).unwrap_err().contains("used twice"));
        let mut far = wire;
        far.foreign.push(9);
        assert!(NicRules::from_wire(&far, 8, &queues).unwrap_err().contains("foreign slot 9"));
    }
}
