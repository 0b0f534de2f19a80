//! What a NIC thread shows of its table: the gauges, and the `/debug/flows`
//! snapshot (the NIC's own table read beside the booked one).

use super::*;

impl NicThread {
    /// Sets the gauges from the table (one taken over from another daemon).
    pub(in crate::steering::apply) fn gauges_from_table(&self) {
        let rules = self.engine.rules();
        self.reset_gauges();
        self.series.installed.set(rules.len() as i64);
        self.series.pending.set(rules.pending_len() as i64);
        self.series.foreign.set(rules.foreign_slots().len() as i64);
        for (_, e) in rules.iter() {
            self.queue_add(e.queue, 1);
        }
    }

    pub(in crate::steering::apply) fn reset_gauges(&self) {
        self.series.installed.set(0);
        self.series.pending.set(0);
        self.series.foreign.set(0);
        for g in self.series.by_queue.values() {
            g.set(0);
        }
    }

    pub(super) fn queue_add(&self, q: u32, delta: i64) {
        match self.series.by_queue.get(&q) {
            Some(g) => g.add(delta),
            // A queue outside the topology's (not expected): its own series.
            None => {
                self.metrics.rules_by_queue.with_label_values(&[self.ifname(), &q.to_string()]).add(delta)
            }
        }
    }

    pub(super) fn snapshot(&self) -> NicFlows {
        let (nic_rules, nic_error) = match self.nic.list_rules(self.ifname()) {
            Ok(r) => (Some(r), None),
            Err(e) => {
                self.metrics.nic_op_failed(&e);
                (None, Some(e.to_string()))
            }
        };
        let rules = self.engine.booked().iter().map(|(f, e)| booked_rule(&self.gpu_names, f, e)).collect();
        NicFlows {
            ifname: self.ifname().to_string(),
            capacity: self.engine.rules().capacity(),
            rules,
            nic_rules,
            nic_error,
            foreign_slots: self.engine.rules().foreign_slots().iter().copied().collect(),
        }
    }
}
