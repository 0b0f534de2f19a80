//! What a NIC thread shows of its table: the `/debug/flows` snapshot (the
//! NIC's own table read beside the booked one); the gauges are `series`'.

use super::*;

impl NicThread {
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
