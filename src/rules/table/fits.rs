//! The rules a garbled IPv6 flow may stand for (see `identity::flows`): an
//! index of the booked rules by their two ports, so that an uninstall named
//! with half its address bytes finds the rule it means in the daemon's own
//! table, without asking the kernel about connections.
//!
//! Only rules such a request can mean are indexed: IPv6 flows, and IPv4
//! flows installed from a repaired request (an IPv4 connection on a
//! dual-stack socket, which the plugin names v4-mapped). An IPv4 install
//! costs nothing here.

use foldhash::{HashMap as FastMap, HashMapExt};

use super::{FlowKey, NicRules, Owner, RuleEntry};
use crate::types::flow::{fits_garbled, FlowSpec};

/// Booked flows by (local port, remote port).
#[derive(Debug, Clone, Default)]
pub(super) struct PortIndex {
    by_ports: FastMap<(u16, u16), Vec<FlowKey>>,
}

/// Whether a garbled request may mean the rule for `key`, installed by `owner`.
fn indexed(key: &FlowKey, owner: &Owner) -> bool {
    matches!(key, FlowKey::V6 { .. }) || owner.repaired
}

fn ports(key: &FlowKey) -> (u16, u16) {
    match *key {
        FlowKey::V4 { sport, dport, .. } | FlowKey::V6 { sport, dport, .. } => (dport, sport),
    }
}

impl PortIndex {
    pub(super) fn new() -> PortIndex {
        PortIndex { by_ports: FastMap::new() }
    }

    pub(super) fn add(&mut self, key: FlowKey, owner: &Owner) {
        if indexed(&key, owner) {
            self.by_ports.entry(ports(&key)).or_default().push(key);
        }
    }

    pub(super) fn remove(&mut self, key: &FlowKey) {
        let p = ports(key);
        if let Some(keys) = self.by_ports.get_mut(&p) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_ports.remove(&p);
            }
        }
    }

    /// Flows indexed, for the consistency check.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_ports.values().map(Vec::len).sum()
    }
}

impl NicRules {
    /// The booked rules that garbled flow `garbled` may stand for (its two
    /// ports, and its addresses' first 8 bytes) and that `mine` accepts
    /// (the caller's own): O(rules with those ports).
    pub fn fitting(&self, garbled: &FlowSpec, mine: impl Fn(&Owner) -> bool) -> Vec<(FlowSpec, RuleEntry)> {
        let Some(keys) = self.ports.by_ports.get(&(garbled.dst.port(), garbled.src.port())) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|k| Some((k.spec(), *self.flows.get(k)?)))
            .filter(|(f, e)| fits_garbled(garbled, f) && mine(&e.owner))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(tenant: u64, repaired: bool) -> Owner {
        Owner { pid: None, lease: None, tenant: Some(tenant), repaired }
    }

    fn flow(src: &str, dst: &str) -> FlowSpec {
        FlowSpec { src: src.parse().unwrap(), dst: dst.parse().unwrap() }
    }

    #[test]
    fn a_garbled_flow_finds_the_callers_rules_of_its_ports_and_prefixes() {
        let mut t = NicRules::new(16, &[vec![8, 9]]);
        let a = flow("[fd00:2::7]:40001", "[fd00:1::1]:5000");
        let b = flow("[fd00:2::8]:40001", "[fd00:1::2]:5000");
        let other_port = flow("[fd00:2::7]:40002", "[fd00:1::1]:5000");
        let other_prefix = flow("[fd00:3::7]:40001", "[fd00:1::1]:5000");
        let v4 = flow("10.0.0.2:40001", "10.0.0.1:5000");
        let v4_repaired = flow("10.0.0.3:40001", "10.0.0.1:5000");
        for (f, o) in [
            (a, owner(1, true)),
            (b, owner(2, true)),
            (other_port, owner(1, true)),
            (other_prefix, owner(1, true)),
            (v4, owner(1, false)),
            (v4_repaired, owner(1, true)),
        ] {
            assert!(matches!(t.reserve(f, 0, None, o), super::super::Reserve::New(_)));
        }
        assert_eq!(t.ports.len(), 5, "the plain IPv4 rule is not indexed");
        let sent = flow("[fd00:2::dead:1]:40001", "[fd00:1::beef:2]:5000");
        let mine = |t: &NicRules, tenant| -> Vec<FlowSpec> {
            t.fitting(&sent, |o| o.tenant == Some(tenant)).into_iter().map(|(f, _)| f).collect()
        };
        assert_eq!(mine(&t, 1), [a]);
        assert_eq!(mine(&t, 2), [b]);
        assert_eq!(t.fitting(&sent, |_| true).len(), 2);
        // Dual stack: the plugin names a v4-mapped connection with prefix 0::/64.
        let sent4 = flow("[::1:2:3:4]:40001", "[::5:6:7:8]:5000");
        assert_eq!(
            t.fitting(&sent4, |_| true).into_iter().map(|(f, _)| f).collect::<Vec<_>>(),
            [v4_repaired]
        );
        // Gone from the index with the rule; a foreign slot takes it out too.
        t.release(&a);
        assert_eq!(mine(&t, 1), Vec::<FlowSpec>::new());
        t.mark_foreign(&b);
        assert!(t.fitting(&sent, |_| true).is_empty());
        t.check_consistency().unwrap();
    }
}
