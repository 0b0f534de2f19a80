//! Per-NIC rule threads: each NIC's rule operations run on that NIC's own
//! thread, in arrival order, so a slow driver call (an admin queue, rtnl_lock
//! contention) never holds an async runtime worker: other NICs, queries, pool
//! fetches, HTTP probes and signals go on. The thread takes every queued
//! request per wake-up, so under load one hand-off serves many requests.
//!
//! Deletes the NIC refuses stay booked (bookkeeping always equals the NIC's
//! table) and the thread retries them with backoff until the NIC confirms.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::oneshot;

use crate::metrics::{Metrics, RuleOp};
use crate::nic::{FlowSpec, NicControl, NicError, NicRule};
use crate::rules::engine::{Installed, NicRuleEngine, Removal};
use crate::rules::table::{Owner, RuleEntry};
use crate::rules::RuleFailure;
use crate::types::pci::PciAddr;
use crate::types::status::StatusCode;

/// First wait before a refused delete is tried again; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// `/debug/flows` view of one NIC.
#[derive(Debug, Clone, Serialize)]
pub struct NicFlows {
    pub ifname: String,
    pub capacity: u32,
    pub rules: Vec<BookedRule>,
    pub nic_rules: Option<Vec<NicRule>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic_error: Option<String>,
    /// Slots held by rules this daemon did not install.
    pub foreign_slots: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BookedRule {
    pub loc: u32,
    pub queue: u32,
    pub gpu: String,
    pub flow_type: &'static str,
    pub src: String,
    pub dst: String,
    /// The installing process's pid as the daemon sees it (null when that
    /// process lives in a pid namespace the daemon cannot see).
    pub pid: Option<u32>,
    /// Whether the rule goes away by itself when that process exits.
    pub lease: bool,
    /// The NIC refused to delete it; the daemon is retrying.
    pub pending_delete: bool,
}

/// A lease as the rule path sees it: the NIC thread refuses installs for a
/// process already known to be gone, so that no rule outlives its reclaim.
pub trait LeaseState: Send + Sync {
    fn id(&self) -> NonZeroU32;
    fn alive(&self) -> bool;
}

/// Who asks for an install.
#[derive(Clone, Default)]
pub struct Requester {
    pub owner: Owner,
    pub lease: Option<Arc<dyn LeaseState>>,
}

/// Where a rule request's answer goes when the NIC thread writes it to the
/// client's socket itself (no wake-up of the connection's task per request).
pub struct SocketReply {
    /// The client's socket (a duplicate: the connection may close meanwhile).
    pub sock: std::os::fd::OwnedFd,
    pub op: RuleOp,
    pub started: Instant,
    /// Bytes that could not be written at once (`None`: all were), for the
    /// connection's task to send before anything else.
    pub done: oneshot::Sender<Option<Vec<u8>>>,
}

enum Job {
    InstallTo {
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        who: Requester,
        to: SocketReply,
    },
    UninstallTo {
        flow: FlowSpec,
        to: SocketReply,
    },
    Install {
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        who: Requester,
        reply: oneshot::Sender<Result<Installed, RuleFailure>>,
    },
    Uninstall {
        flow: FlowSpec,
        reply: oneshot::Sender<Result<Option<RuleEntry>, RuleFailure>>,
    },
    Reclaim {
        lease: NonZeroU32,
        reply: Option<oneshot::Sender<usize>>,
    },
    Snapshot {
        reply: oneshot::Sender<NicFlows>,
    },
    Copy {
        reply: oneshot::Sender<BookedCopy>,
    },
    RemoveAll {
        give_up_at: Instant,
        reply: oneshot::Sender<Vec<NicError>>,
    },
}

/// The booked rules of one NIC, copied on its thread (no NIC call, no formatting).
pub struct BookedCopy {
    pub capacity: u32,
    /// Sorted by slot.
    pub rules: Vec<(FlowSpec, RuleEntry)>,
    pub foreign_slots: Vec<u32>,
}

/// A handle to one NIC's rule thread. Dropping the last handle
/// ends the thread once the jobs already queued are done.
pub struct NicRuleThread {
    pub ifname: String,
    jobs: mpsc::Sender<Job>,
    nic: Arc<dyn NicControl>,
    gpu_names: Arc<[String]>,
}

fn unavailable(msg: &str) -> RuleFailure {
    RuleFailure::new(StatusCode::Unavailable, msg)
}

impl NicRuleThread {
    /// Starts the rule thread of NIC `ifname`. Once `stopping` is set,
    /// requests not yet started are answered UNAVAILABLE.
    pub fn new(
        ifname: &str,
        capacity: u32,
        gpus: Vec<(PciAddr, Vec<u32>)>,
        nic: Arc<dyn NicControl>,
        metrics: Arc<Metrics>,
        stopping: Arc<AtomicBool>,
    ) -> std::io::Result<NicRuleThread> {
        let queues: Vec<Vec<u32>> = gpus.iter().map(|(_, q)| q.clone()).collect();
        metrics.rule_slots.with_label_values(&[ifname]).set(capacity as i64);
        let gpu_names: Arc<[String]> = gpus.iter().map(|(p, _)| p.to_string()).collect();
        let thread = NicThread {
            engine: NicRuleEngine::new(ifname, capacity, &queues),
            gpu_names: gpu_names.clone(),
            queues: queues.concat(),
            nic: nic.clone(),
            metrics,
            stopping,
            retry_wait: RETRY_FIRST,
            retry_at: None,
        };
        thread.reset_gauges();
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new().name(format!("nic-{ifname}")).spawn(move || thread.run(rx))?;
        Ok(NicRuleThread { ifname: ifname.to_string(), jobs: tx, nic, gpu_names })
    }

    /// Sends a job and waits for its answer without blocking the runtime.
    async fn ask<T>(&self, job: impl FnOnce(oneshot::Sender<T>) -> Job) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.jobs.send(job(tx)).ok()?;
        rx.await.ok()
    }

    pub async fn install(
        &self,
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        who: Requester,
    ) -> Result<Installed, RuleFailure> {
        self.ask(|reply| Job::Install { flow, gpu, hint, who, reply })
            .await
            .unwrap_or_else(|| Err(unavailable("the daemon is shutting down")))
    }

    /// Queues an install whose reply the NIC thread writes to the client itself.
    pub fn install_to(&self, flow: FlowSpec, gpu: usize, hint: Option<u32>, who: Requester, to: SocketReply) {
        if let Err(mpsc::SendError(Job::InstallTo { to, .. })) =
            self.jobs.send(Job::InstallTo { flow, gpu, hint, who, to })
        {
            answer(to, Err(unavailable("the daemon is shutting down")), None);
        }
    }

    /// Queues an uninstall whose reply the NIC thread writes to the client itself.
    pub fn uninstall_to(&self, flow: FlowSpec, to: SocketReply) {
        if let Err(mpsc::SendError(Job::UninstallTo { to, .. })) =
            self.jobs.send(Job::UninstallTo { flow, to })
        {
            answer(to, Err(unavailable("the daemon is shutting down")), None);
        }
    }

    pub async fn uninstall(&self, flow: FlowSpec) -> Result<Option<RuleEntry>, RuleFailure> {
        self.ask(|reply| Job::Uninstall { flow, reply })
            .await
            .unwrap_or_else(|| Err(unavailable("the daemon is shutting down")))
    }

    /// Queues the removal of every rule of `lease` (its process exited).
    pub fn reclaim(&self, lease: NonZeroU32) {
        let _ = self.jobs.send(Job::Reclaim { lease, reply: None });
    }

    /// Like [`Self::reclaim`], answering how many rules were removed.
    pub async fn reclaim_now(&self, lease: NonZeroU32) -> usize {
        self.ask(|reply| Job::Reclaim { lease, reply: Some(reply) }).await.unwrap_or(0)
    }

    pub async fn snapshot(&self) -> Option<NicFlows> {
        self.ask(|reply| Job::Snapshot { reply }).await
    }

    /// The booked rules, copied on the NIC's thread between two rule
    /// operations (a copy of plain values: about a millisecond at 100 000
    /// rules); sorting and formatting happen in the caller.
    pub async fn booked_copy(&self) -> BookedCopy {
        let mut copy = self.ask(|reply| Job::Copy { reply }).await.unwrap_or(BookedCopy {
            capacity: 0,
            rules: Vec::new(),
            foreign_slots: Vec::new(),
        });
        copy.rules.sort_unstable_by_key(|(_, e)| e.loc);
        copy
    }

    /// The NIC's own rule table, read on a blocking-pool thread: neither the
    /// runtime nor this NIC's rule operations wait for it (so it may differ
    /// from [`Self::booked_copy`] by the rules in flight).
    pub async fn nic_rules(&self) -> Result<Vec<NicRule>, NicError> {
        let (nic, ifname) = (self.nic.clone(), self.ifname.clone());
        match tokio::task::spawn_blocking(move || nic.list_rules(&ifname)).await {
            Ok(r) => r,
            Err(_) => {
                Err(NicError::new(&self.ifname, crate::nic::NicOp::ListRules, nix::errno::Errno::EINTR))
            }
        }
    }

    /// The `/debug/flows` form of one booked rule.
    pub fn booked_rule(&self, flow: &FlowSpec, e: &RuleEntry) -> BookedRule {
        booked_rule(&self.gpu_names, flow, e)
    }

    /// Starts removing every rule, retrying refused deletes with backoff until
    /// `give_up_at`; the answer is the deletes still refused then. Started at
    /// once, so that several NICs work in parallel.
    pub fn remove_all(&self, give_up_at: Instant) -> impl std::future::Future<Output = Vec<NicError>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.jobs.send(Job::RemoveAll { give_up_at, reply }).is_ok();
        async move {
            match sent {
                true => rx.await.unwrap_or_default(),
                false => Vec::new(),
            }
        }
    }
}

/// The state owned by one NIC's thread.
struct NicThread {
    engine: NicRuleEngine,
    gpu_names: Arc<[String]>,
    queues: Vec<u32>,
    nic: Arc<dyn NicControl>,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
    retry_wait: Duration,
    /// When the next retry of refused deletes is due (none pending: `None`).
    retry_at: Option<Instant>,
}

impl NicThread {
    fn run(mut self, jobs: mpsc::Receiver<Job>) {
        loop {
            let job = match self.retry_at {
                None => match jobs.recv() {
                    Ok(j) => Some(j),
                    Err(_) => return,
                },
                Some(at) => match jobs.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(j) => Some(j),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
            };
            if let Some(job) = job {
                self.handle(job);
                // Everything that queued up meanwhile, before sleeping again.
                while let Ok(job) = jobs.try_recv() {
                    self.handle(job);
                }
            }
            if self.retry_at.is_some_and(|at| Instant::now() >= at) {
                self.retry();
            }
        }
    }

    fn ifname(&self) -> &str {
        &self.engine.ifname
    }

    fn handle(&mut self, job: Job) {
        let stopping = self.stopping.load(Ordering::Acquire);
        match job {
            Job::InstallTo { to, .. } | Job::UninstallTo { to, .. } if stopping => {
                answer(to, Err(unavailable("the daemon is shutting down")), Some(&self.metrics));
            }
            Job::InstallTo { flow, gpu, hint, who, to } => {
                let r = if who.lease.as_ref().is_some_and(|l| !l.alive()) {
                    Err(unavailable("the requesting process has exited"))
                } else {
                    self.install(flow, gpu, hint, who.owner).map(drop)
                };
                answer(to, r, Some(&self.metrics));
            }
            Job::UninstallTo { flow, to } => {
                let r = self.uninstall(flow).map(drop);
                answer(to, r, Some(&self.metrics));
            }
            Job::Install { reply, .. } if stopping => {
                let _ = reply.send(Err(unavailable("the daemon is shutting down")));
            }
            Job::Uninstall { reply, .. } if stopping => {
                let _ = reply.send(Err(unavailable("the daemon is shutting down")));
            }
            Job::Install { flow, gpu, hint, who, reply } => {
                if who.lease.as_ref().is_some_and(|l| !l.alive()) {
                    let _ = reply.send(Err(unavailable("the requesting process has exited")));
                    return;
                }
                let _ = reply.send(self.install(flow, gpu, hint, who.owner));
            }
            Job::Uninstall { flow, reply } => {
                let _ = reply.send(self.uninstall(flow));
            }
            Job::Reclaim { lease, reply } => {
                let r = self.engine.reclaim(self.nic.as_ref(), lease);
                let n = r.removed.len();
                self.metrics.lease_rules_reclaimed.inc_by(n as u64);
                if n > 0 || !r.failed.is_empty() {
                    tracing::info!(ifname = %self.ifname(), lease, removed = n, refused = r.failed.len(), "rules of an exited client removed");
                }
                self.account(r);
                if let Some(reply) = reply {
                    let _ = reply.send(n);
                }
            }
            Job::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Job::Copy { reply } => {
                let t = Instant::now();
                let rules = self.engine.rules();
                let mut copy = Vec::with_capacity(rules.len());
                copy.extend(rules.iter().map(|(f, e)| (f, *e)));
                let foreign_slots = rules.foreign_slots().iter().copied().collect();
                tracing::debug!(ifname = %self.ifname(), rules = copy.len(), held_us = t.elapsed().as_micros() as u64, "rule table copied");
                let _ = reply.send(BookedCopy { capacity: rules.capacity(), rules: copy, foreign_slots });
            }
            Job::RemoveAll { give_up_at, reply } => {
                let _ = reply.send(self.remove_all(give_up_at));
            }
        }
    }

    fn install(
        &mut self,
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        owner: Owner,
    ) -> Result<Installed, RuleFailure> {
        let foreign_before = self.engine.rules().foreign_slots().len();
        let t = Instant::now();
        let r = self.engine.install(self.nic.as_ref(), flow, gpu, hint, owner);
        if let Ok(Installed::New(e)) = &r {
            self.metrics.nic_op_latency.with_label_values(&["add_rule"]).observe(t.elapsed().as_secs_f64());
            self.metrics.rules_installed.with_label_values(&[self.ifname()]).inc();
            self.queue_gauge(e.queue).inc();
        }
        if let Err(RuleFailure { nic: Some(e), .. }) = &r {
            self.metrics.nic_op_failed(e);
        }
        let foreign = self.engine.rules().foreign_slots().len();
        if foreign != foreign_before {
            self.metrics.foreign_slots.with_label_values(&[self.ifname()]).set(foreign as i64);
        }
        r
    }

    fn uninstall(&mut self, flow: FlowSpec) -> Result<Option<RuleEntry>, RuleFailure> {
        let t = Instant::now();
        let r = self.engine.uninstall(self.nic.as_ref(), &flow);
        match &r {
            Ok(Some(e)) => {
                self.metrics
                    .nic_op_latency
                    .with_label_values(&["del_rule"])
                    .observe(t.elapsed().as_secs_f64());
                self.removed(e);
            }
            Ok(None) => {}
            Err(f) => {
                if let Some(e) = &f.nic {
                    self.metrics.nic_op_failed(e);
                }
                self.schedule_retry()
            }
        }
        r
    }

    fn removed(&self, e: &RuleEntry) {
        self.metrics.rules_installed.with_label_values(&[self.ifname()]).dec();
        self.queue_gauge(e.queue).dec();
    }

    /// Updates gauges after a batch of deletes and schedules a retry for refusals.
    fn account(&mut self, r: Removal) {
        for e in &r.removed {
            self.removed(e);
        }
        for err in &r.failed {
            self.metrics.nic_op_failed(err);
            tracing::warn!(ifname = %self.ifname(), error = %err, "NIC refused a rule delete; retrying");
        }
        if !r.failed.is_empty() {
            self.schedule_retry();
        }
        self.metrics
            .rule_deletes_pending
            .with_label_values(&[self.ifname()])
            .set(self.engine.rules().pending_len() as i64);
    }

    fn schedule_retry(&mut self) {
        if self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + self.retry_wait);
        }
        self.metrics
            .rule_deletes_pending
            .with_label_values(&[self.ifname()])
            .set(self.engine.rules().pending_len() as i64);
    }

    fn retry(&mut self) {
        self.retry_at = None;
        let r = self.engine.retry_pending(self.nic.as_ref());
        self.metrics.rule_delete_retries.with_label_values(&[self.ifname()]).inc();
        let refused = !r.failed.is_empty();
        for err in &r.failed {
            self.metrics.nic_op_failed(err);
        }
        for e in &r.removed {
            self.removed(e);
        }
        if refused {
            self.retry_wait = (self.retry_wait * 2).min(RETRY_MAX);
            self.retry_at = Some(Instant::now() + self.retry_wait);
        } else {
            self.retry_wait = RETRY_FIRST;
            if !r.removed.is_empty() {
                tracing::info!(ifname = %self.ifname(), removed = r.removed.len(), "refused rule deletes went through on retry");
            }
        }
        self.metrics
            .rule_deletes_pending
            .with_label_values(&[self.ifname()])
            .set(self.engine.rules().pending_len() as i64);
    }

    fn remove_all(&mut self, give_up_at: Instant) -> Vec<NicError> {
        let mut failed = self.engine.remove_all(self.nic.as_ref());
        let mut wait = RETRY_FIRST;
        while !failed.is_empty() && Instant::now() + wait <= give_up_at {
            std::thread::sleep(wait);
            wait = (wait * 2).min(RETRY_MAX);
            failed = self.engine.retry_pending(self.nic.as_ref()).failed;
        }
        for err in &failed {
            self.metrics.nic_op_failed(err);
        }
        self.retry_at = None;
        self.reset_gauges();
        let pending = self.engine.rules().len() as i64;
        self.metrics.rules_installed.with_label_values(&[self.ifname()]).set(pending);
        self.metrics.rule_deletes_pending.with_label_values(&[self.ifname()]).set(pending);
        failed
    }

    fn reset_gauges(&self) {
        let ifname = self.ifname();
        self.metrics.rules_installed.with_label_values(&[ifname]).set(0);
        self.metrics.rule_deletes_pending.with_label_values(&[ifname]).set(0);
        self.metrics.foreign_slots.with_label_values(&[ifname]).set(0);
        for q in &self.queues {
            self.queue_gauge(*q).set(0);
        }
    }

    fn queue_gauge(&self, q: u32) -> prometheus::IntGauge {
        self.metrics.rules_by_queue.with_label_values(&[self.ifname(), &q.to_string()])
    }

    fn snapshot(&self) -> NicFlows {
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

/// Writes a rule request's reply to the client's socket and counts it.
fn answer(to: SocketReply, r: Result<(), RuleFailure>, metrics: Option<&Metrics>) {
    use crate::wire::frame;
    let (code, msg) = match r {
        Ok(()) => (StatusCode::Ok, frame::ok()),
        Err(f) => {
            tracing::debug!(op = to.op.name(), code = f.code.name(), error = %f.message, "rule request failed");
            (f.code, frame::error(f.code, f.message))
        }
    };
    let bytes = frame::encode(&msg).unwrap_or_else(|e| {
        frame::encode(&frame::error(StatusCode::Internal, format!("reply not sent: {e}")))
            .expect("a short reply fits")
    });
    if let Some(m) = metrics {
        m.rule_done(to.op, code, to.started.elapsed().as_secs_f64());
    }
    // The socket is non-blocking: what does not fit now goes back to the
    // connection's task; a client that left makes this fail harmlessly.
    let flags = nix::sys::socket::MsgFlags::MSG_NOSIGNAL | nix::sys::socket::MsgFlags::MSG_DONTWAIT;
    let rest = match nix::sys::socket::send(std::os::fd::AsRawFd::as_raw_fd(&to.sock), &bytes, flags) {
        Ok(n) if n == bytes.len() => None,
        Ok(n) => Some(bytes[n..].to_vec()),
        Err(_) => Some(bytes),
    };
    let _ = to.done.send(rest);
}

fn booked_rule(gpu_names: &[String], f: &FlowSpec, e: &RuleEntry) -> BookedRule {
    BookedRule {
        loc: e.loc,
        queue: e.queue,
        gpu: gpu_names[e.gpu].clone(),
        flow_type: if f.is_v6() { "tcp6" } else { "tcp4" },
        src: fmt_addr(f.src),
        dst: fmt_addr(f.dst),
        pid: e.owner.pid.map(NonZeroU32::get),
        lease: e.owner.lease.is_some(),
        pending_delete: e.pending_delete,
    }
}

/// `10.0.0.1:5000` / `[fd00::2]:41000` — SocketAddr's own Display form.
fn fmt_addr(a: SocketAddr) -> String {
    a.to_string()
}
