//! The metric series of one NIC thread, and its gauges kept equal to its
//! rule table.

use std::collections::HashMap;

use prometheus::{Histogram, IntGauge};

use super::NicThread;
use crate::metrics::Metrics;

/// The metric series one NIC thread updates per request, resolved once
/// (a label lookup hashes and locks).
pub(super) struct Series {
    pub(super) add_latency: Histogram,
    pub(super) del_latency: Histogram,
    pub(super) installed: IntGauge,
    pub(super) pending: IntGauge,
    pub(super) foreign: IntGauge,
    by_queue: HashMap<u32, IntGauge>,
}

impl Series {
    pub(super) fn new(metrics: &Metrics, ifname: &str, queues: &[u32]) -> Self {
        Series {
            add_latency: metrics.nic_op_latency.with_label_values(&["add_rule"]),
            del_latency: metrics.nic_op_latency.with_label_values(&["del_rule"]),
            installed: metrics.rules_installed.with_label_values(&[ifname]),
            pending: metrics.rule_deletes_pending.with_label_values(&[ifname]),
            foreign: metrics.foreign_slots.with_label_values(&[ifname]),
            by_queue: queues
                .iter()
                .map(|q| (*q, metrics.rules_by_queue.with_label_values(&[ifname, &q.to_string()])))
                .collect(),
        }
    }
}

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

    pub(super) fn reset_gauges(&self) {
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
}
