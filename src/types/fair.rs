//! A queue that takes turns between keys (tenants, processes): each key
//! has a lane of its own, and the lanes with items are served in rounds,
//! so a key with many items waiting does not push back the items of a key
//! with few. A lane that was empty goes to the front of the next round:
//! a key that asks now and then is served before one that always has
//! work queued (a sparse flow first, as fair queueing in network
//! schedulers does).
//!
//! Plain data: pushing and taking cost a hash lookup and a deque operation.

use std::collections::VecDeque;
use std::hash::Hash;

use foldhash::HashMap;

/// Items of type `V`, in one lane per key `K`, served round-robin.
pub struct FairQueue<K, V> {
    /// Each key with items: its lane's slot.
    index: HashMap<K, usize>,
    /// Lanes by slot; a free slot has no key and no items.
    lanes: Vec<Lane<K, V>>,
    free: Vec<usize>,
    /// Slots of the lanes with items, in the order they get their turns.
    ring: VecDeque<usize>,
    len: usize,
}

struct Lane<K, V> {
    key: Option<K>,
    items: VecDeque<V>,
}

impl<K, V> Default for FairQueue<K, V> {
    fn default() -> Self {
        FairQueue {
            index: HashMap::default(),
            lanes: Vec::new(),
            free: Vec::new(),
            ring: VecDeque::new(),
            len: 0,
        }
    }
}

impl<K: Hash + Eq + Copy, V> FairQueue<K, V> {
    /// Items queued, over all keys.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keys with items queued now.
    pub fn keys(&self) -> usize {
        self.ring.len()
    }

    /// Items queued for `key`.
    pub fn len_of(&self, key: &K) -> usize {
        self.index.get(key).map_or(0, |&s| self.lanes[s].items.len())
    }

    /// Queues `item` at the back of `key`'s lane. A key that had nothing
    /// queued gets its turn before the keys that had.
    pub fn push(&mut self, key: K, item: V) {
        let slot = match self.index.get(&key) {
            Some(&s) => s,
            None => {
                let s = match self.free.pop() {
                    Some(s) => s,
                    None => {
                        self.lanes.push(Lane { key: None, items: VecDeque::new() });
                        self.lanes.len() - 1
                    }
                };
                self.lanes[s].key = Some(key);
                self.index.insert(key, s);
                self.ring.push_front(s);
                s
            }
        };
        self.lanes[slot].items.push_back(item);
        self.len += 1;
    }

    /// [`Self::push`], unless `key` already has `most` items queued: then
    /// the item comes back.
    pub fn push_within(&mut self, key: K, item: V, most: usize) -> Result<(), V> {
        if self.len_of(&key) >= most {
            return Err(item);
        }
        self.push(key, item);
        Ok(())
    }

    /// One item, from the lane whose turn it is; that lane's next turn
    /// comes after every other lane's.
    pub fn pop(&mut self) -> Option<(K, V)> {
        let slot = self.ring.pop_front()?;
        let item = self.lanes[slot].items.pop_front().expect("a lane in the ring has items");
        let key = self.lanes[slot].key.expect("a lane in the ring has a key");
        self.len -= 1;
        self.requeue(slot);
        Some((key, item))
    }

    /// [`Self::pop`], skipping the lanes whose key `may` refuses (they keep
    /// their place in the turns).
    pub fn pop_where(&mut self, may: impl Fn(&K) -> bool) -> Option<(K, V)> {
        let at = self.ring.iter().position(|&s| self.lanes[s].key.as_ref().is_some_and(&may))?;
        let slot = self.ring.remove(at).expect("found");
        let item = self.lanes[slot].items.pop_front().expect("a lane in the ring has items");
        let key = self.lanes[slot].key.expect("a lane in the ring has a key");
        self.len -= 1;
        self.requeue(slot);
        Some((key, item))
    }

    /// One round: every lane with items gives up to `quantum` of them, in
    /// turn order, into `out`. A lone lane gives up to `alone` (there is
    /// nobody to take turns with now, but a key that comes next waits for
    /// the round to end: `alone` bounds that wait).
    pub fn round(&mut self, quantum: usize, alone: usize, out: &mut Vec<V>) {
        let lanes = self.ring.len();
        let quantum = if lanes == 1 { alone.max(quantum).max(1) } else { quantum.max(1) };
        for _ in 0..lanes {
            let slot = self.ring.pop_front().expect("counted");
            let items = &mut self.lanes[slot].items;
            let n = items.len().min(quantum);
            out.extend(items.drain(..n));
            self.len -= n;
            self.requeue(slot);
        }
    }

    /// Puts a lane that just had its turn back at the end of the ring, or
    /// frees it if it is empty.
    fn requeue(&mut self, slot: usize) {
        let lane = &mut self.lanes[slot];
        if !lane.items.is_empty() {
            self.ring.push_back(slot);
            return;
        }
        if let Some(key) = lane.key.take() {
            self.index.remove(&key);
        }
        // Keep small buffers for reuse; give big ones back.
        if lane.items.capacity() > 64 {
            lane.items = VecDeque::new();
        }
        self.free.push(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(q: &mut FairQueue<char, u32>, quantum: usize) -> Vec<u32> {
        let mut out = Vec::new();
        q.round(quantum, usize::MAX, &mut out);
        out
    }

    #[test]
    fn a_key_with_many_items_does_not_push_back_one_with_few() {
        let mut q = FairQueue::default();
        for i in 0..512 {
            q.push('h', i);
        }
        q.push('v', 1000);
        // The victim's one item comes within the first round, after at most a quantum of the flood's.
        let first = round(&mut q, 4);
        let at = first.iter().position(|&i| i == 1000).expect("served in the first round");
        assert!(at <= 4, "{first:?}");
        assert_eq!(first.len(), 5);
        assert_eq!(q.len(), 508);
        // Asking again, it is served in the next round, ahead of the flood.
        q.push('v', 1001);
        assert_eq!(round(&mut q, 4)[0], 1001, "a lane that was empty goes first");
    }

    #[test]
    fn pop_takes_turns_and_keeps_each_lane_in_order() {
        let mut q = FairQueue::default();
        for i in 0..3 {
            q.push('a', i);
        }
        q.push('b', 10);
        q.push('c', 20);
        q.push('c', 21);
        let got: Vec<(char, u32)> = std::iter::from_fn(|| q.pop()).collect();
        // Newest lane first, then turns.
        assert_eq!(got, [('c', 20), ('b', 10), ('a', 0), ('c', 21), ('a', 1), ('a', 2)]);
        assert!(q.is_empty() && q.keys() == 0);
    }

    #[test]
    fn a_lone_lane_gives_everything_in_one_round() {
        let mut q = FairQueue::default();
        for i in 0..100 {
            q.push('a', i);
        }
        assert_eq!(round(&mut q, 4), (0..100).collect::<Vec<_>>());
        assert!(q.is_empty());
        assert_eq!(round(&mut q, 4), Vec::<u32>::new());
    }

    #[test]
    fn a_lone_lane_gives_at_most_its_share_when_alone_and_a_newcomer_goes_next() {
        let mut q = FairQueue::default();
        for i in 0..100 {
            q.push('a', i);
        }
        let mut out = Vec::new();
        q.round(4, 32, &mut out);
        assert_eq!(out, (0..32).collect::<Vec<_>>(), "a lone lane: 32, not all 100");
        q.push('b', 1000);
        out.clear();
        q.round(4, 32, &mut out);
        assert_eq!(out, [1000, 32, 33, 34, 35], "the newcomer first, then a's turn of 4");
        assert_eq!(q.len(), 100 - 36);
    }

    #[test]
    fn every_lane_with_items_gets_a_turn_per_round() {
        let mut q = FairQueue::default();
        for (k, n) in [('a', 10u32), ('b', 3), ('c', 1)] {
            for i in 0..n {
                q.push(k, i + 100 * (k as u32 - 'a' as u32));
            }
        }
        assert_eq!(q.keys(), 3);
        let r1 = round(&mut q, 2);
        assert_eq!(r1, [200, 100, 101, 0, 1]);
        let r2 = round(&mut q, 2);
        assert_eq!(r2, [102, 2, 3]);
        assert_eq!(q.keys(), 1);
        assert_eq!(round(&mut q, 2), [4, 5, 6, 7, 8, 9], "alone again: all of it");
    }

    #[test]
    fn pop_where_skips_refused_keys_without_losing_their_turn() {
        let mut q = FairQueue::default();
        q.push('a', 1);
        q.push('a', 2);
        q.push('b', 3);
        q.push('c', 4);
        // Ring: c, b, a. `c` may not go now: `b` does.
        assert_eq!(q.pop_where(|k| *k != 'c'), Some(('b', 3)));
        assert_eq!(q.pop_where(|k| *k == 'z'), None);
        assert_eq!(q.len(), 3);
        // `c` kept its place at the front.
        assert_eq!(q.pop(), Some(('c', 4)));
        assert_eq!(q.pop(), Some(('a', 1)));
    }

    #[test]
    fn a_bound_per_key_refuses_only_that_key() {
        let mut q = FairQueue::default();
        for i in 0..3 {
            assert!(q.push_within('a', i, 3).is_ok());
        }
        assert_eq!(q.push_within('a', 9, 3), Err(9));
        assert!(q.push_within('b', 1, 3).is_ok());
        assert_eq!((q.len_of(&'a'), q.len_of(&'b'), q.len()), (3, 1, 4));
        // Freed lanes are reused, and a reused lane starts empty.
        while q.pop().is_some() {}
        q.push('z', 5);
        assert_eq!(q.pop(), Some(('z', 5)));
        assert_eq!(q.lanes.len(), 2);
    }
}
