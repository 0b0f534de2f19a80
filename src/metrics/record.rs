//! Recording: rule requests, failures and the ring of recent errors.

use std::time::SystemTime;

use prometheus::local::{LocalHistogram, LocalIntCounter};

use super::{Metrics, RecentError, RuleOp, RECENT_ERRORS};
use crate::nic::NicError;
use crate::types::status::{StatusCode, ALL_CODES};

/// The rule-request series of one thread, added to the shared ones by
/// [`RuleLocal::flush`]: a thread that answers many requests per wake-up
/// (a NIC's rule thread) touches the counters every thread shares once per
/// batch, not once per request (on a machine with many cores, a counter
/// written by all of them is a cache line they pass around).
pub struct RuleLocal {
    requests: [[LocalIntCounter; ALL_CODES.len()]; 2],
    latency: [LocalHistogram; 2],
    pending: bool,
}

impl RuleLocal {
    /// Counts one rule request and its latency, here.
    pub fn done(&mut self, op: RuleOp, code: StatusCode, seconds: f64) {
        self.requests[op as usize][code_index(code)].inc();
        self.latency[op as usize].observe(seconds);
        self.pending = true;
    }

    /// Adds what was counted here to the shared series.
    pub fn flush(&mut self) {
        if !std::mem::take(&mut self.pending) {
            return;
        }
        for c in self.requests.iter().flatten() {
            c.flush();
        }
        for h in &self.latency {
            h.flush();
        }
    }
}

fn code_index(code: StatusCode) -> usize {
    ALL_CODES.iter().position(|c| *c == code).expect("every code is listed")
}

impl Metrics {
    /// Counts one rule request and its latency.
    pub fn rule_done(&self, op: RuleOp, code: StatusCode, seconds: f64) {
        self.rule_series.requests[op as usize][code_index(code)].inc();
        self.rule_series.latency[op as usize].observe(seconds);
    }

    /// Rule-request series for one thread ([`RuleLocal`]).
    pub fn rule_local(&self) -> RuleLocal {
        RuleLocal {
            requests: self.rule_series.requests.each_ref().map(|codes| codes.each_ref().map(|c| c.local())),
            latency: self.rule_series.latency.each_ref().map(|h| h.local()),
            pending: false,
        }
    }

    /// Counts a failed NIC operation and remembers it for `status`.
    pub fn nic_op_failed(&self, e: &NicError) {
        let errno = format!("{:?}", e.errno);
        self.nic_op_failures.with_label_values(&[e.ifname.as_str(), e.op.name(), &errno]).inc();
        self.remember("nic_op", &e.ifname, e.to_string());
    }

    /// Counts a failed restore step (`nic` = `"host"` for host tuning) and remembers it.
    pub fn restore_failed(&self, nic: &str, message: &str) {
        self.restore_failures.with_label_values(&[nic]).inc();
        self.remember("restore", nic, message.to_string());
    }

    /// Sets the info series of one NIC (a previous one for the NIC is replaced).
    pub fn set_nic_info(&self, nic: &str, header_split: &str, binder: &str) {
        let _ = self.nic_info.remove_label_values(&[nic, header_split, binder]);
        self.nic_info.with_label_values(&[nic, header_split, binder]).set(1);
    }

    /// Time since these metrics were created (the daemon's start).
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Adds a line to the ring of recent errors (the oldest falls out).
    pub fn remember(&self, kind: &str, nic: &str, message: String) {
        let time =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let mut ring = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == RECENT_ERRORS {
            ring.pop_front();
        }
        ring.push_back(RecentError { time, kind: kind.to_string(), nic: nic.to_string(), message });
    }

    /// The remembered errors, oldest first.
    pub fn recent_errors(&self) -> Vec<RecentError> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// `nic`'s received bytes summed by queue role (`gpu`, `rss`), as last
    /// read from the NIC.
    pub fn rx_bytes_by_role(&self, nic: &str) -> std::collections::BTreeMap<String, u64> {
        use prometheus::core::Collector;
        let mut out = std::collections::BTreeMap::new();
        for family in self.queue_rx_bytes.collect() {
            for m in family.get_metric() {
                let label = |name: &str| m.get_label().iter().find(|l| l.name() == name).map(|l| l.value());
                if label("nic") == Some(nic) {
                    let role = label("role").unwrap_or("?").to_string();
                    *out.entry(role).or_default() += m.get_counter().get_value() as u64;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_bytes_sum_by_role_per_nic() {
        let m = Metrics::new();
        m.queue_rx_bytes.with_label_values(&["eth1", "0", "rss"]).inc_by(5);
        m.queue_rx_bytes.with_label_values(&["eth1", "1", "rss"]).inc_by(6);
        m.queue_rx_bytes.with_label_values(&["eth1", "8", "gpu"]).inc_by(7);
        m.queue_rx_bytes.with_label_values(&["eth2", "8", "gpu"]).inc_by(100);
        let by = m.rx_bytes_by_role("eth1");
        assert_eq!(by.get("rss"), Some(&11));
        assert_eq!(by.get("gpu"), Some(&7));
        assert!(m.rx_bytes_by_role("eth9").is_empty());
    }
    use crate::nic::NicOp;
    use nix::errno::Errno;

    #[test]
    fn failures_count_by_errno_and_the_ring_keeps_the_last_ones() {
        let m = Metrics::new();
        for i in 0..(RECENT_ERRORS + 5) {
            m.nic_op_failed(
                &NicError::new("eth3", NicOp::AddRule, Errno::ENOSPC).with_detail(format!("#{i}")),
            );
        }
        m.restore_failed("eth3", "restore RSS table: EIO");
        let text = m.render();
        let want = format!(
            r#"tcpx_rxdm_nic_op_failures_total{{errno="ENOSPC",nic="eth3",op="add_rule"}} {}"#,
            RECENT_ERRORS + 5
        );
        assert!(text.contains(&want), "{text}");
        assert!(text.contains(r#"tcpx_rxdm_restore_failures_total{nic="eth3"} 1"#));
        let ring = m.recent_errors();
        assert_eq!(ring.len(), RECENT_ERRORS);
        assert_eq!(ring.last().unwrap().kind, "restore");
        assert!(ring[0].message.contains("#6"), "oldest kept is the 7th: {}", ring[0].message);
    }
}
