//! The steps of an adopted start that take, in place of a fresh start's
//! work, what the daemon taken over from handed on: its primed NICs (with
//! their undo logs and rule tables) and its pools.

use std::sync::Arc;

use crate::gpu::RxPool;
use crate::rules::table::NicRules;
use crate::types::pci::PciAddr;
use crate::types::topology::NicSpec;
use crate::wire::handover::RuleTable;

use super::super::takeover::{Handed, TakeoverError};
use super::super::teardown::Node;
use super::super::DaemonError;
use super::Startup;

impl Startup<'_> {
    /// Takes the primed NICs (their undo logs, and a simulated NIC's own
    /// state); returns each NIC's rule table rebuilt for this daemon, in
    /// topology order. The NICs handed over must be the ones this daemon
    /// manages.
    pub(super) fn adopt_nics(
        &self,
        node: &mut Node,
        handed: &mut Handed,
    ) -> Result<Vec<Option<NicRules>>, DaemonError> {
        let (topo, nic) = (&self.config.topology, &self.backends.nic);
        node.primed = std::mem::take(&mut handed.primed);
        let names: Vec<&str> = node.primed.iter().map(|p| p.ifname.as_str()).collect();
        let ours: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        if names != ours {
            let (handed, ours) = (crate::types::list(&names), crate::types::list(&ours));
            return Err(TakeoverError::OtherNics { handed, ours }.into());
        }
        // The simulated NICs' state and each NIC's rule table, all at once.
        let (sim, tables, primed) = (&handed.sim, &handed.tables, &node.primed);
        let (sim, rules) = std::thread::scope(|s| {
            let sim = s.spawn(|| match (&self.backends.sim, sim.as_slice()) {
                (Some(nics), _) => nics.import(sim),
                (None, []) => Ok(()),
                (None, _) => Err(format!("the {} NIC backend keeps no state of its own", nic.backend())),
            });
            let rules: Vec<_> = topo
                .nics
                .iter()
                .zip(primed)
                .map(|(n, p)| s.spawn(move || adopt_table(tables, n, topo.max_rx_rules.min(p.rule_capacity))))
                .collect();
            let rules: Vec<_> = rules.into_iter().map(|r| r.join().expect("table thread")).collect();
            (sim.join().expect("sim thread"), rules)
        });
        sim.map_err(TakeoverError::Adopt)?;
        Ok(rules.into_iter().map(|r| r.map(Some)).collect::<Result<_, _>>().map_err(TakeoverError::Adopt)?)
    }

    /// Takes the pools, one for each GPU this daemon serves.
    pub(super) fn adopt_pools(&self, node: &mut Node, handed: &mut Handed) -> Result<(), DaemonError> {
        let (topo, alloc) = (&self.config.topology, &self.backends.alloc);
        let pools = std::mem::take(&mut handed.pools);
        let gpus: Vec<PciAddr> = pools.iter().map(|p| p.gpu).collect();
        for (gpu, r) in gpus.into_iter().zip(crate::gpu::adopt_all(alloc.as_ref(), pools)) {
            let pool: Arc<dyn RxPool> = Arc::from(r.map_err(DaemonError::Allocate)?);
            self.metrics.pool_bytes.with_label_values(&[&gpu.to_string()]).set(pool.size() as i64);
            node.pools.push((gpu, pool));
        }
        let missing: Vec<_> =
            topo.gpus().filter(|(_, g)| !node.pools.iter().any(|(p, _)| *p == g.pci)).collect();
        if let Some((_, g)) = missing.first() {
            return Err(TakeoverError::NoPool(g.pci).into());
        }
        Ok(())
    }
}

/// NIC `n`'s rule table as handed over, rebuilt for `capacity` slots.
fn adopt_table(tables: &[RuleTable], n: &NicSpec, capacity: u32) -> Result<NicRules, String> {
    let table = tables
        .iter()
        .find(|t| t.ifname == n.ifname)
        .ok_or_else(|| format!("no rule table was handed over for {}", n.ifname))?;
    let queues: Vec<Vec<u32>> = n.gpus.iter().map(|g| g.queues.clone()).collect();
    NicRules::from_wire(table, capacity, &queues)
}
