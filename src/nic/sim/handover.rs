//! The simulated NICs' state through a takeover: a real NIC keeps its
//! settings and rule table in the kernel when the daemon is replaced; the
//! simulated one lives in the daemon's memory, so it is handed on.

use foldhash::HashMap;

use super::{SimNic, SimRule, SimState};
use crate::nic::prime::handover::{data_split, flags, unflags};
use crate::wire::handover::{self as wire, Record};

impl SimNic {
    pub fn export(&self) -> Vec<wire::SimNic> {
        let mut out: Vec<_> = self
            .nics
            .iter()
            .map(|(name, st)| {
                let st = st.lock().expect("sim nic lock");
                let settings = wire::SimSettings {
                    index: st.index,
                    addresses: st.addresses.iter().map(|a| a.to_string()).collect(),
                    channels: st.channels,
                    capacity: st.capacity,
                    features: flags(&st.features),
                    priv_flags: flags(st.priv_flags.iter().map(|(k, v)| (k, v))),
                    data_split: wire::DataSplit::from(st.data_split).into(),
                    rx_ring: Some(st.rx_ring.into()),
                    rss: st.rss.clone(),
                    stats: st
                        .stats
                        .iter()
                        .map(|(k, v)| wire::Counter { name: k.clone(), value: *v })
                        .collect(),
                    rx_bytes: st.rx_bytes.clone(),
                };
                let mut rules = Vec::new();
                for (loc, r) in st.rules.iter().enumerate() {
                    let Some(r) = r else { continue };
                    let (loc, queue, flow) = (loc as u32, r.queue, r.flow);
                    Record {
                        flow,
                        loc,
                        queue,
                        gpu: 0,
                        owner_pid: 0,
                        lease: 0,
                        tenant: None,
                        pending_delete: false,
                        repaired: false,
                    }
                    .pack(&mut rules);
                }
                wire::SimNic { ifname: name.clone(), settings: Some(settings), rules: rules.into() }
            })
            .collect();
        out.sort_by(|a, b| a.ifname.cmp(&b.ifname));
        out
    }

    /// Replaces the named NICs' state; every NIC handed on must exist here.
    pub fn import(&self, state: &[wire::SimNic]) -> Result<(), String> {
        let mut staged = Vec::with_capacity(state.len());
        for n in state {
            let slot = self
                .nics
                .get(&n.ifname)
                .ok_or_else(|| format!("simulated NIC {} is not configured here", n.ifname))?;
            let bad = |e: String| format!("simulated NIC {}: {e}", n.ifname);
            let s = n.settings.clone().ok_or_else(|| bad("no settings".into()))?;
            let addresses = s
                .addresses
                .iter()
                .map(|a| a.parse().map_err(|_| bad(format!("\"{a}\" is no address"))))
                .collect::<Result<Vec<_>, _>>()?;
            let data_split = data_split(s.data_split).map_err(bad)?;
            let rx_ring = s.rx_ring.ok_or_else(|| bad("no RX ring".into()))?;
            let mut rules: Vec<Option<SimRule>> = Vec::new();
            let records =
                Record::unpack_all(&n.rules).map_err(|e| format!("simulated NIC {}: {e}", n.ifname))?;
            for r in records {
                let flow = r.flow;
                let loc = r.loc as usize;
                if r.loc >= s.capacity {
                    return Err(format!("simulated NIC {}: rule slot {loc} beyond the capacity", n.ifname));
                }
                if rules.len() <= loc {
                    rules.resize(loc + 1, None);
                }
                rules[loc] = Some(SimRule { queue: r.queue, flow });
            }
            let st = SimState {
                index: s.index,
                addresses,
                channels: s.channels,
                capacity: s.capacity,
                rules,
                features: unflags(s.features).into_iter().collect::<HashMap<_, _>>(),
                priv_flags: unflags(s.priv_flags),
                data_split,
                rx_ring: rx_ring.into(),
                rss: s.rss,
                stats: s.stats.into_iter().map(|c| (c.name, c.value)).collect(),
                rx_bytes: s.rx_bytes,
            };
            staged.push((slot, st));
        }
        for (slot, st) in staged {
            *slot.lock().expect("sim nic lock") = st;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::nic::sim::SimNic;
    use crate::nic::{FlowSpec, NicSetup, RuleControl, FEATURE_NTUPLE};

    #[test]
    fn a_second_sim_takes_on_the_first_ones_table_and_settings() {
        let a = SimNic::new(&["eth1", "eth2"]);
        a.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        a.set_rss_equal("eth1", 4).unwrap();
        let f = FlowSpec { src: "10.0.0.1:4000".parse().unwrap(), dst: "192.168.1.2:5000".parse().unwrap() };
        a.add_rule("eth1", &f, 3, 17).unwrap();
        let b = SimNic::new(&["eth1", "eth2"]);
        b.import(&a.export()).unwrap();
        assert_eq!(b.list_rules("eth1").unwrap(), a.list_rules("eth1").unwrap());
        assert_eq!(b.rss_table("eth1").unwrap(), a.rss_table("eth1").unwrap());
        assert!(b.feature("eth1", FEATURE_NTUPLE).unwrap());
        assert!(b.list_rules("eth2").unwrap().is_empty());
        let c = SimNic::new(&["eth9"]);
        assert!(c.import(&a.export()).unwrap_err().contains("eth1 is not configured here"));
    }
}
