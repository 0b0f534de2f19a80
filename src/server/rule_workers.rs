//! One worker thread per NIC owns that NIC's rule bookkeeping and makes its
//! NIC calls: requests for one NIC apply in arrival order, NICs work in
//! parallel, and nothing polls (each worker blocks on its channel).

use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::oneshot;

use crate::config::pci::PciAddr;
use crate::metrics::Metrics;
use crate::nic::{FlowSpec, NicControl, NicError, NicRule};
use crate::rules::engine::{Installed, NicRuleEngine};
use crate::rules::table::RuleEntry;
use crate::rules::RuleFailure;
use crate::wire::frame::Code;

enum Command {
    Install {
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        pid: Option<u32>,
        reply: oneshot::Sender<Result<Installed, RuleFailure>>,
    },
    Uninstall {
        flow: FlowSpec,
        reply: oneshot::Sender<Result<Option<RuleEntry>, RuleFailure>>,
    },
    Snapshot {
        reply: oneshot::Sender<NicFlows>,
    },
    RemoveAll {
        reply: oneshot::Sender<Vec<NicError>>,
    },
}

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

/// Handle to one NIC's worker.
pub struct RuleWorker {
    pub ifname: String,
    tx: std_mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

fn gone() -> RuleFailure {
    RuleFailure::new(Code::Unavailable, "daemon is shutting down")
}

impl RuleWorker {
    pub fn spawn(
        ifname: &str,
        capacity: u32,
        gpus: Vec<(PciAddr, Vec<u32>)>,
        nic: Arc<dyn NicControl>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<RuleWorker> {
        let (tx, rx) = std_mpsc::channel();
        let queues: Vec<Vec<u32>> = gpus.iter().map(|(_, q)| q.clone()).collect();
        let mut engine = NicRuleEngine::new(ifname, capacity, &queues);
        let gpu_names: Vec<String> = gpus.iter().map(|(p, _)| p.to_string()).collect();
        metrics.rule_slots.with_label_values(&[ifname]).set(capacity as i64);
        let name = ifname.to_string();
        let thread = std::thread::Builder::new().name(format!("rules-{ifname}")).spawn(move || {
            let installed = metrics.rules_installed.with_label_values(&[&name]);
            installed.set(0);
            let queue_gauge =
                |q: u32| metrics.rules_by_queue.with_label_values(&[name.as_str(), &q.to_string()]);
            for (_, qs) in &gpus {
                for &q in qs {
                    queue_gauge(q).set(0);
                }
            }
            while let Ok(cmd) = rx.recv() {
                match cmd {
                    Command::Install { flow, gpu, hint, pid, reply } => {
                        let t = Instant::now();
                        let r = engine.install(nic.as_ref(), flow, gpu, hint, pid);
                        if let Ok(Installed::New(e)) = &r {
                            metrics
                                .nic_op_latency
                                .with_label_values(&["add_rule"])
                                .observe(t.elapsed().as_secs_f64());
                            installed.inc();
                            queue_gauge(e.queue).inc();
                        }
                        let _ = reply.send(r);
                    }
                    Command::Uninstall { flow, reply } => {
                        let t = Instant::now();
                        let r = engine.uninstall(nic.as_ref(), &flow);
                        if let Ok(Some(e)) = &r {
                            metrics
                                .nic_op_latency
                                .with_label_values(&["del_rule"])
                                .observe(t.elapsed().as_secs_f64());
                            installed.dec();
                            queue_gauge(e.queue).dec();
                        }
                        let _ = reply.send(r);
                    }
                    Command::Snapshot { reply } => {
                        let (nic_rules, nic_error) = match nic.list_rules(&engine.ifname) {
                            Ok(r) => (Some(r), None),
                            Err(e) => (None, Some(e.to_string())),
                        };
                        let rules = engine
                            .booked()
                            .into_iter()
                            .map(|(f, e)| BookedRule {
                                loc: e.loc,
                                queue: e.queue,
                                gpu: gpu_names[e.gpu].clone(),
                                flow_type: if f.is_v6() { "tcp6" } else { "tcp4" },
                                src: fmt_addr(f.src),
                                dst: fmt_addr(f.dst),
                                pid: e.pid,
                            })
                            .collect();
                        let _ = reply.send(NicFlows {
                            ifname: engine.ifname.clone(),
                            capacity: engine.rules().capacity(),
                            rules,
                            nic_rules,
                            nic_error,
                        });
                    }
                    Command::RemoveAll { reply } => {
                        let errors = engine.remove_all(nic.as_ref());
                        installed.set(0);
                        for (_, qs) in &gpus {
                            for &q in qs {
                                queue_gauge(q).set(0);
                            }
                        }
                        let _ = reply.send(errors);
                    }
                }
            }
        })?;
        Ok(RuleWorker { ifname: ifname.to_string(), tx, thread: Some(thread) })
    }

    pub async fn install(
        &self,
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        pid: Option<u32>,
    ) -> Result<Installed, RuleFailure> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Install { flow, gpu, hint, pid, reply }).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    pub async fn uninstall(&self, flow: FlowSpec) -> Result<Option<RuleEntry>, RuleFailure> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Uninstall { flow, reply }).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    pub async fn snapshot(&self) -> Option<NicFlows> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Snapshot { reply }).ok()?;
        rx.await.ok()
    }

    /// Removes every rule; the worker keeps running (idempotent).
    pub async fn remove_all(&self) -> Vec<NicError> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::RemoveAll { reply }).is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }
}

impl Drop for RuleWorker {
    fn drop(&mut self) {
        // Closing the channel ends the worker loop.
        let (tx, _) = std_mpsc::channel();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `10.0.0.1:5000` / `[fd00::2]:41000` — SocketAddr's own Display form.
fn fmt_addr(a: SocketAddr) -> String {
    a.to_string()
}
