//! Pure per-NIC bookkeeping: rule slots (lowest free first), per-queue loads
//! of each GPU, and the exact-flow index. No I/O.

use std::collections::BTreeSet;

use foldhash::{HashMap as FastMap, HashMapExt, HashSet as FastSet, HashSetExt};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;

use crate::types::flow::{as_v6, FlowSpec};

/// Exact-match flow key as stored: 38 bytes instead of two `SocketAddr`s (64),
/// which matters at 100 000 rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum FlowKey {
    V4 { src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16 },
    V6 { src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16 },
}

impl From<&FlowSpec> for FlowKey {
    fn from(f: &FlowSpec) -> Self {
        let (sport, dport) = (f.src.port(), f.dst.port());
        match (f.src.ip(), f.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => FlowKey::V4 { src: s.octets(), dst: d.octets(), sport, dport },
            (s, d) => FlowKey::V6 { src: as_v6(s).octets(), dst: as_v6(d).octets(), sport, dport },
        }
    }
}

impl FlowKey {
    fn spec(&self) -> FlowSpec {
        match *self {
            FlowKey::V4 { src, dst, sport, dport } => FlowSpec {
                src: SocketAddr::new(IpAddr::from(src), sport),
                dst: SocketAddr::new(IpAddr::from(dst), dport),
            },
            FlowKey::V6 { src, dst, sport, dport } => FlowSpec {
                src: SocketAddr::new(IpAddr::V6(Ipv6Addr::from(src)), sport),
                dst: SocketAddr::new(IpAddr::V6(Ipv6Addr::from(dst)), dport),
            },
        }
    }
}

/// Slot allocator handing out the lowest free slot in `0..capacity`.
#[derive(Debug, Clone)]
pub struct RuleSlots {
    capacity: u32,
    /// Slots below `next` that are free again.
    freed: BTreeSet<u32>,
    /// Every slot at or above `next` has never been used.
    next: u32,
}

impl RuleSlots {
    pub fn new(capacity: u32) -> Self {
        RuleSlots { capacity, freed: BTreeSet::new(), next: 0 }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    #[cfg(test)]
    pub fn used(&self) -> u32 {
        self.next - self.freed.len() as u32
    }

    pub fn allocate(&mut self) -> Option<u32> {
        if let Some(slot) = self.freed.pop_first() {
            return Some(slot);
        }
        (self.next < self.capacity).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    pub fn free(&mut self, slot: u32) {
        debug_assert!(slot < self.next && !self.freed.contains(&slot), "double free of slot {slot}");
        if slot + 1 == self.next {
            // Shrink the high-water mark so `freed` stays small under churn.
            self.next -= 1;
            while let Some(&last) = self.freed.last() {
                if last + 1 != self.next {
                    break;
                }
                self.freed.pop_last();
                self.next -= 1;
            }
        } else {
            self.freed.insert(slot);
        }
    }
}

/// One GPU's receive queues on this NIC and how many rules point at each.
#[derive(Debug, Clone)]
pub struct QueueLoads {
    queues: Vec<u32>,
    loads: Vec<u32>,
}

impl QueueLoads {
    pub fn new(queues: &[u32]) -> Self {
        QueueLoads { queues: queues.to_vec(), loads: vec![0; queues.len()] }
    }

    pub fn queues(&self) -> &[u32] {
        &self.queues
    }

    #[cfg(test)]
    pub fn load(&self, queue: u32) -> Option<u32> {
        self.queues.iter().position(|&q| q == queue).map(|i| self.loads[i])
    }

    /// `hint` if it is one of ours, else the least-loaded queue (lowest id on ties).
    pub fn pick(&self, hint: Option<u32>) -> u32 {
        if let Some(h) = hint.filter(|h| self.queues.contains(h)) {
            return h;
        }
        let (i, _) = self
            .loads
            .iter()
            .enumerate()
            .min_by_key(|&(i, &load)| (load, self.queues[i]))
            .expect("a GPU has at least one queue (validated)");
        self.queues[i]
    }

    fn add(&mut self, queue: u32, delta: i32) {
        let i = self.queues.iter().position(|&q| q == queue).expect("queue belongs to this GPU");
        self.loads[i] = self.loads[i].checked_add_signed(delta).expect("queue load never goes negative");
    }
}

/// The client process that installed a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Owner {
    /// Its pid as the daemon sees it (none when it lives in a pid namespace
    /// the daemon cannot see).
    pub pid: Option<NonZeroU32>,
    /// The lease that removes the rule when the process exits, if one is held.
    pub lease: Option<NonZeroU32>,
    /// Its tenant's workload id (tenant isolation on, tenant known): the
    /// quota counts the rule against that workload, and its processes may
    /// remove it.
    pub tenant: Option<u64>,
    /// Its request named the flow with garbled IPv6 addresses; the rule
    /// steers the connection's true ones (see `identity::flows`).
    pub repaired: bool,
}

/// A steered flow as we keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleEntry {
    pub loc: u32,
    pub queue: u32,
    /// Index of the GPU within this NIC.
    pub gpu: usize,
    pub owner: Owner,
    /// The NIC refused to delete it; the daemon retries until it confirms.
    pub pending_delete: bool,
}

/// Why a reservation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// Already steered: nothing to do.
    Existing(RuleEntry),
    /// New: slot and queue load taken; apply to the NIC, then keep or roll back.
    New(RuleEntry),
    /// No free slot.
    Exhausted,
}

#[derive(Debug, Clone)]
pub struct NicRules {
    slots: RuleSlots,
    gpus: Vec<QueueLoads>,
    flows: FastMap<FlowKey, RuleEntry>,
    /// Slots held by rules somebody else put on the NIC: never handed out.
    foreign: BTreeSet<u32>,
    /// Flows whose delete the NIC refused, to be retried.
    pending: FastSet<FlowKey>,
    /// The flows a garbled IPv6 request may stand for, by ports.
    ports: fits::PortIndex,
}

impl NicRules {
    pub fn new(capacity: u32, gpu_queues: &[Vec<u32>]) -> Self {
        NicRules {
            slots: RuleSlots::new(capacity),
            gpus: gpu_queues.iter().map(|q| QueueLoads::new(q)).collect(),
            flows: FastMap::new(),
            foreign: BTreeSet::new(),
            pending: FastSet::new(),
            ports: fits::PortIndex::new(),
        }
    }

    /// Slots found taken by rules the daemon did not install.
    pub fn foreign_slots(&self) -> &BTreeSet<u32> {
        &self.foreign
    }

    /// Flows waiting for the NIC to confirm their delete.
    pub fn pending(&self) -> impl Iterator<Item = FlowSpec> + '_ {
        self.pending.iter().map(FlowKey::spec)
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Marks (or unmarks) `flow` as waiting for a delete the NIC refused.
    pub fn set_pending(&mut self, flow: &FlowSpec, pending: bool) {
        let key = FlowKey::from(flow);
        let Some(e) = self.flows.get_mut(&key) else {
            return;
        };
        e.pending_delete = pending;
        if pending {
            self.pending.insert(key);
        } else {
            self.pending.remove(&key);
        }
    }

    /// Gives `flow` a new owner (an install of a flow that is already steered).
    pub fn set_owner(&mut self, flow: &FlowSpec, owner: Owner) {
        let key = FlowKey::from(flow);
        if let Some(e) = self.flows.get_mut(&key) {
            e.owner = owner;
            self.ports.remove(&key);
            self.ports.add(key, &owner);
        }
    }

    /// Flows installed under `lease`.
    pub fn owned_by(&self, lease: NonZeroU32) -> Vec<FlowSpec> {
        self.flows.iter().filter(|(_, e)| e.owner.lease == Some(lease)).map(|(k, _)| k.spec()).collect()
    }

    /// `flow`'s slot turned out to hold a rule the daemon did not install:
    /// forget the reservation but keep the slot out of use.
    pub fn mark_foreign(&mut self, flow: &FlowSpec) -> Option<u32> {
        let key = FlowKey::from(flow);
        let e = self.flows.remove(&key)?;
        self.pending.remove(&key);
        self.ports.remove(&key);
        self.gpus[e.gpu].add(e.queue, -1);
        self.foreign.insert(e.loc);
        Some(e.loc)
    }

    pub fn capacity(&self) -> u32 {
        self.slots.capacity()
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    pub fn gpu(&self, gpu: usize) -> &QueueLoads {
        &self.gpus[gpu]
    }

    pub fn get(&self, flow: &FlowSpec) -> Option<&RuleEntry> {
        self.flows.get(&FlowKey::from(flow))
    }

    pub fn iter(&self) -> impl Iterator<Item = (FlowSpec, &RuleEntry)> {
        self.flows.iter().map(|(k, e)| (k.spec(), e))
    }

    /// Reserves a slot and a queue for `flow` on GPU `gpu`.
    pub fn reserve(&mut self, flow: FlowSpec, gpu: usize, hint: Option<u32>, owner: Owner) -> Reserve {
        let key = FlowKey::from(&flow);
        if let Some(e) = self.flows.get(&key) {
            return Reserve::Existing(*e);
        }
        let Some(loc) = self.slots.allocate() else {
            return Reserve::Exhausted;
        };
        let queue = self.gpus[gpu].pick(hint);
        self.gpus[gpu].add(queue, 1);
        let entry = RuleEntry { loc, queue, gpu, owner, pending_delete: false };
        self.flows.insert(key, entry);
        self.ports.add(key, &owner);
        Reserve::New(entry)
    }

    /// Forgets `flow`, giving back its slot and queue load.
    pub fn release(&mut self, flow: &FlowSpec) -> Option<RuleEntry> {
        let key = FlowKey::from(flow);
        let e = self.flows.remove(&key)?;
        self.pending.remove(&key);
        self.ports.remove(&key);
        self.slots.free(e.loc);
        self.gpus[e.gpu].add(e.queue, -1);
        self.shrink_if_sparse();
        Some(e)
    }

    /// Gives the flow index's memory back once it is at most a quarter full
    /// (after a peak of rules went away), keeping room to double. Each shrink
    /// needs the table to fall by another 4x, so the rehash cost stays
    /// proportional to the removals.
    fn shrink_if_sparse(&mut self) {
        const MIN_CAPACITY: usize = 1024;
        let cap = self.flows.capacity();
        if cap > MIN_CAPACITY && self.flows.len() < cap / 4 {
            self.flows.shrink_to((self.flows.len() * 2).max(MIN_CAPACITY / 2));
            if cap > 64 * 1024 {
                crate::host::memory::note_large_free();
            }
        }
    }

    /// Heap slots of the flow index (for memory tests).
    #[cfg(test)]
    pub fn flow_capacity(&self) -> usize {
        self.flows.capacity()
    }

    /// Checks every invariant; used by tests.
    #[cfg(test)]
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut locs = BTreeSet::new();
        let mut loads: Vec<std::collections::HashMap<u32, u32>> = vec![Default::default(); self.gpus.len()];
        for (flow, e) in &self.flows {
            if !locs.insert(e.loc) {
                return Err(format!("slot {} used twice", e.loc));
            }
            if e.loc >= self.slots.capacity() {
                return Err(format!("slot {} beyond capacity", e.loc));
            }
            if !self.gpus[e.gpu].queues().contains(&e.queue) {
                return Err(format!("{flow:?} on foreign queue {}", e.queue));
            }
            if self.foreign.contains(&e.loc) {
                return Err(format!("slot {} is foreign and booked", e.loc));
            }
            if e.pending_delete != self.pending.contains(flow) {
                return Err(format!("{flow:?}: pending flag and pending set disagree"));
            }
            *loads[e.gpu].entry(e.queue).or_default() += 1;
            debug_assert_eq!(FlowKey::from(&flow.spec()), *flow);
        }
        if self.pending.iter().any(|k| !self.flows.contains_key(k)) {
            return Err("a pending delete is not booked".into());
        }
        let indexed = self.flows.iter().filter(|(k, e)| matches!(k, FlowKey::V6 { .. }) || e.owner.repaired);
        if indexed.count() != self.ports.len() {
            return Err("the port index and the booked flows disagree".into());
        }
        let held = self.flows.len() + self.foreign.len();
        if self.slots.used() as usize != held {
            return Err(format!("{} slots used for {} flows and foreign slots", self.slots.used(), held));
        }
        for (g, q) in self.gpus.iter().enumerate() {
            for &queue in q.queues() {
                let want = loads[g].get(&queue).copied().unwrap_or(0);
                if q.load(queue) != Some(want) {
                    return Err(format!("gpu {g} queue {queue}: load {:?}, {want} flows", q.load(queue)));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

mod handover;

mod fits;
