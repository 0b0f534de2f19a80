//! The connections of one I/O thread, by epoll key. A key carries the slot
//! and the slot's generation, so that a late event or inbox hint for a closed
//! connection never reaches the connection that reused its slot.

/// Keys below this are the thread's own (inbox, listeners).
pub(super) const FIRST_KEY: u64 = 16;

pub(super) struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { slots: Vec::new(), free: Vec::new(), len: 0 }
    }
}

fn split(key: u64) -> Option<(usize, u32)> {
    let slot = (key & u32::MAX as u64).checked_sub(FIRST_KEY)?;
    Some((slot as usize, (key >> 32) as u32))
}

impl<T> Slab<T> {
    /// Stores the value `make` builds from its key; returns the key.
    pub(super) fn insert(&mut self, make: impl FnOnce(u64) -> T) -> u64 {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push((0, None));
                u32::try_from(self.slots.len() - 1).expect("fewer than 4 billion connections")
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.0 = entry.0.wrapping_add(1);
        let key = ((entry.0 as u64) << 32) | (slot as u64 + FIRST_KEY);
        entry.1 = Some(make(key));
        self.len += 1;
        key
    }

    pub(super) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        let (slot, generation) = split(key)?;
        match self.slots.get_mut(slot) {
            Some((g, Some(v))) if *g == generation => Some(v),
            _ => None,
        }
    }

    pub(super) fn remove(&mut self, key: u64) -> Option<T> {
        let (slot, generation) = split(key)?;
        match self.slots.get_mut(slot) {
            Some((g, v @ Some(_))) if *g == generation => {
                self.free.push(slot as u32);
                self.len -= 1;
                v.take()
            }
            _ => None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The values in use now.
    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|(_, v)| v.as_ref())
    }

    /// The keys in use now.
    pub(super) fn keys(&self) -> Vec<u64> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, (_, v))| v.is_some())
            .map(|(i, (g, _))| ((*g as u64) << 32) | (i as u64 + FIRST_KEY))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_slot_does_not_answer_to_the_old_key() {
        let mut s = Slab::default();
        let a = s.insert(|k| k);
        assert!(a >= FIRST_KEY);
        assert_eq!(s.get_mut(a).copied(), Some(a), "the value sees its own key");
        assert_eq!(s.remove(a), Some(a));
        assert!(s.is_empty());
        let b = s.insert(|k| k);
        assert_ne!(a, b, "same slot, new generation");
        assert_eq!(a & u32::MAX as u64, b & u32::MAX as u64);
        assert_eq!(s.get_mut(a), None);
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get_mut(b).copied(), Some(b));
    }

    #[test]
    fn keys_lists_live_entries_only() {
        let mut s = Slab::default();
        let k: Vec<u64> = (0..4).map(|_| s.insert(|k| k)).collect();
        s.remove(k[1]);
        assert_eq!(s.keys(), [k[0], k[2], k[3]]);
        assert_eq!(s.get_mut(3), None, "the thread's own keys are never connections");
    }
}
