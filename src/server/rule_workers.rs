//! Per-NIC rule engines: requests for one NIC apply in arrival order, NICs
//! work in parallel, and nothing polls.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::Mutex;

use crate::config::pci::PciAddr;
use crate::metrics::Metrics;
use crate::nic::{FlowSpec, NicControl, NicError, NicRule};
use crate::rules::engine::{Installed, NicRuleEngine};
use crate::rules::table::RuleEntry;
use crate::rules::RuleFailure;

/// `/debug/flows` view of one NIC.
#[derive(Debug, Clone, Serialize)]
pub struct NicFlows {
    pub ifname: String,
    pub capacity: u32,
    pub rules: Vec<BookedRule>,
    pub nic_rules: Option<Vec<NicRule>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BookedRule {
    pub loc: u32,
    pub queue: u32,
    pub gpu: String,
    pub flow_type: &'static str,
    pub src: String,
    pub dst: String,
    pub pid: Option<u32>,
}

/// One NIC's rule engine behind a FIFO lock: requests for the NIC apply in
/// arrival order (tokio's mutex queues waiters fairly), different NICs in
/// parallel. The NIC call runs inside the critical section on the calling
/// runtime worker: one ioctl of a few microseconds, cheaper than handing the
/// request to another thread and waking the caller back (two context switches).
pub struct RuleWorker {
    pub ifname: String,
    engine: Mutex<NicRuleEngine>,
    gpu_names: Vec<String>,
    queues: Vec<u32>,
    nic: Arc<dyn NicControl>,
    metrics: Arc<Metrics>,
}

impl RuleWorker {
    pub fn new(
        ifname: &str,
        capacity: u32,
        gpus: Vec<(PciAddr, Vec<u32>)>,
        nic: Arc<dyn NicControl>,
        metrics: Arc<Metrics>,
    ) -> RuleWorker {
        let queues: Vec<Vec<u32>> = gpus.iter().map(|(_, q)| q.clone()).collect();
        metrics.rule_slots.with_label_values(&[ifname]).set(capacity as i64);
        let w = RuleWorker {
            ifname: ifname.to_string(),
            engine: Mutex::new(NicRuleEngine::new(ifname, capacity, &queues)),
            gpu_names: gpus.iter().map(|(p, _)| p.to_string()).collect(),
            queues: queues.concat(),
            nic,
            metrics,
        };
        w.reset_gauges();
        w
    }

    fn reset_gauges(&self) {
        self.metrics.rules_installed.with_label_values(&[&self.ifname]).set(0);
        for q in &self.queues {
            self.queue_gauge(*q).set(0);
        }
    }

    fn queue_gauge(&self, q: u32) -> prometheus::IntGauge {
        self.metrics.rules_by_queue.with_label_values(&[self.ifname.as_str(), &q.to_string()])
    }

    pub async fn install(
        &self,
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        pid: Option<u32>,
    ) -> Result<Installed, RuleFailure> {
        let mut engine = self.engine.lock().await;
        let t = Instant::now();
        let r = engine.install(self.nic.as_ref(), flow, gpu, hint, pid);
        drop(engine);
        if let Ok(Installed::New(e)) = &r {
            self.metrics.nic_op_latency.with_label_values(&["add_rule"]).observe(t.elapsed().as_secs_f64());
            self.metrics.rules_installed.with_label_values(&[&self.ifname]).inc();
            self.queue_gauge(e.queue).inc();
        }
        r
    }

    pub async fn uninstall(&self, flow: FlowSpec) -> Result<Option<RuleEntry>, RuleFailure> {
        let mut engine = self.engine.lock().await;
        let t = Instant::now();
        let r = engine.uninstall(self.nic.as_ref(), &flow);
        drop(engine);
        if let Ok(Some(e)) = &r {
            self.metrics.nic_op_latency.with_label_values(&["del_rule"]).observe(t.elapsed().as_secs_f64());
            self.metrics.rules_installed.with_label_values(&[&self.ifname]).dec();
            self.queue_gauge(e.queue).dec();
        }
        r
    }

    pub async fn snapshot(&self) -> Option<NicFlows> {
        let engine = self.engine.lock().await;
        let (nic_rules, nic_error) = match self.nic.list_rules(&engine.ifname) {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let rules = engine
            .booked()
            .into_iter()
            .map(|(f, e)| BookedRule {
                loc: e.loc,
                queue: e.queue,
                gpu: self.gpu_names[e.gpu].clone(),
                flow_type: if f.is_v6() { "tcp6" } else { "tcp4" },
                src: fmt_addr(f.src),
                dst: fmt_addr(f.dst),
                pid: e.pid,
            })
            .collect();
        Some(NicFlows {
            ifname: engine.ifname.clone(),
            capacity: engine.rules().capacity(),
            rules,
            nic_rules,
            nic_error,
        })
    }

    /// The booked rules, sorted by slot, and the slot capacity. The engine
    /// lock is held only to copy the table (no NIC call, no formatting), so
    /// `/debug/flows` never stalls installs for longer than that copy.
    pub async fn booked_copy(&self) -> (u32, Vec<(FlowSpec, RuleEntry)>) {
        let engine = self.engine.lock().await;
        let t = Instant::now();
        let capacity = engine.rules().capacity();
        let mut rules = Vec::with_capacity(engine.rules().len());
        rules.extend(engine.rules().iter().map(|(f, e)| (f, *e)));
        drop(engine);
        let held_us = t.elapsed().as_micros() as u64;
        tracing::debug!(nic = %self.ifname, rules = rules.len(), held_us, "rule table copied");
        rules.sort_unstable_by_key(|(_, e)| e.loc);
        (capacity, rules)
    }

    /// The NIC's own rule table, read without the engine lock (installs go on
    /// meanwhile, so it may differ from `booked_copy` by the rules in flight).
    pub fn nic_rules(&self) -> Result<Vec<NicRule>, NicError> {
        self.nic.list_rules(&self.ifname)
    }

    /// The `/debug/flows` form of one booked rule.
    pub fn booked_rule(&self, flow: &FlowSpec, e: &RuleEntry) -> BookedRule {
        BookedRule {
            loc: e.loc,
            queue: e.queue,
            gpu: self.gpu_names[e.gpu].clone(),
            flow_type: if flow.is_v6() { "tcp6" } else { "tcp4" },
            src: fmt_addr(flow.src),
            dst: fmt_addr(flow.dst),
            pid: e.pid,
        }
    }

    /// Removes every rule (idempotent).
    pub async fn remove_all(&self) -> Vec<NicError> {
        let errors = self.engine.lock().await.remove_all(self.nic.as_ref());
        self.reset_gauges();
        errors
    }
}

/// `10.0.0.1:5000` / `[fd00::2]:41000` — SocketAddr's own Display form.
fn fmt_addr(a: SocketAddr) -> String {
    a.to_string()
}
