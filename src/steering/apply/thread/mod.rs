//! The loop of one NIC's rule thread: it owns that NIC's rule engine, runs
//! each queued job in arrival order, retries refused deletes with backoff,
//! and writes each rule request's reply to the client's socket itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::identity::TenantPolicy;
use crate::metrics::{Metrics, RuleLocal, RuleOp};
use crate::nic::{FlowSpec, NicControl, NicError};
use crate::rules::engine::{Installed, NicRuleEngine, Removal};
use crate::rules::table::RuleEntry;
use crate::rules::RuleFailure;
use crate::steering::request::{ENDPOINT_INSTALL, ENDPOINT_UNINSTALL};

use super::queue::{JobQueue, Taken};
use super::reply::answer_only;
use super::turns::{take_turns, NIC_TURN};
use super::*;
use crate::types::fair::FairQueue;
use crate::types::status::StatusCode;

mod series;
use series::Series;
mod garbled;
mod views;

/// The state owned by one NIC's thread.
pub(super) struct NicThread {
    engine: NicRuleEngine,
    gpu_names: Arc<[String]>,
    nic: Arc<dyn NicControl>,
    metrics: Arc<Metrics>,
    series: Series,
    stopping: Arc<AtomicBool>,
    retry_wait: Duration,
    /// When the next retry of refused deletes is due (none pending: `None`).
    retry_at: Option<Instant>,
    /// Whether requests may run outside this thread (see [`FAST_OP`]).
    fast: Arc<AtomicBool>,
    /// Quick operations in a row.
    fast_streak: u32,
    /// Tenant isolation: whose rule a client may remove, and the quota.
    tenants: Arc<TenantPolicy>,
    /// The rule-request series, counted here and added to the shared ones per batch.
    local: RuleLocal,
}

/// Answers whatever is left in the queue when the thread ends, even by a
/// panic, so that no client waits forever for a reply.
struct AbandonOnExit<'a>(&'a JobQueue<Job>, Arc<Metrics>);

impl Drop for AbandonOnExit<'_> {
    fn drop(&mut self) {
        for job in self.0.close_and_drain() {
            abandon(job, Some(&self.1));
        }
    }
}

/// The NIC thread: takes every queued job per wake-up and runs them holding the NIC's state; wakes
/// by itself when a retry of refused deletes is due. (A panic in a rule operation poisons the lock;
/// the engine keeps its bookkeeping consistent step by step, so the thread goes on.)
pub(super) fn run(jobs: &JobQueue<Job>, state: &Mutex<NicThread>, metrics: Arc<Metrics>) {
    let _abandon = AbandonOnExit(jobs, metrics);
    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
    let mut batch = Vec::new();
    let mut lanes = FairQueue::default();
    loop {
        let deadline = lock().retry_at;
        match jobs.take(&mut batch, deadline) {
            Taken::Jobs => {
                // Tenants taking turns: a few, then a look at the queue again.
                let mut rest = match take_turns(&mut batch, &mut lanes) && batch.len() > NIC_TURN {
                    true => batch.split_off(NIC_TURN),
                    false => Vec::new(),
                };
                let mut st = lock();
                for job in batch.drain(..) {
                    st.handle(job);
                }
                st.flush_counts();
                st.retry_if_due();
                drop(st);
                jobs.put_back(&mut rest);
            }
            Taken::Timeout => lock().retry_if_due(),
            Taken::Closed => return,
        }
    }
}

impl NicThread {
    pub(super) fn new(
        engine: NicRuleEngine,
        gpu_names: Arc<[String]>,
        nic: Arc<dyn NicControl>,
        metrics: Arc<Metrics>,
        stopping: Arc<AtomicBool>,
        fast: Arc<AtomicBool>,
        tenants: Arc<TenantPolicy>,
    ) -> Self {
        let queues: Vec<u32> =
            (0..gpu_names.len()).flat_map(|g| engine.rules().gpu(g).queues().to_vec()).collect();
        let series = Series::new(&metrics, &engine.ifname, &queues);
        NicThread {
            local: metrics.rule_local(),
            engine,
            gpu_names,
            nic,
            metrics,
            series,
            stopping,
            retry_wait: RETRY_FIRST,
            retry_at: None,
            fast,
            fast_streak: 0,
            tenants,
        }
    }

    /// Counts an answered rule request (see [`Self::flush_counts`]).
    fn count(&mut self, done: Option<(RuleOp, StatusCode, f64)>) {
        if let Some((op, code, secs)) = done {
            self.local.done(op, code, secs);
        }
    }

    /// Adds the requests counted since the last call to the shared series:
    /// once per batch.
    pub(super) fn flush_counts(&mut self) {
        self.local.flush();
    }

    pub(super) fn retry_pending(&self) -> bool {
        self.retry_at.is_some()
    }

    fn retry_if_due(&mut self) {
        if self.retry_at.is_some_and(|at| Instant::now() >= at) {
            self.retry();
        }
    }

    /// Notes how long a rule operation took (see [`FAST_OP`]).
    fn timed(&mut self, took: Duration) {
        if took > FAST_OP {
            self.fast_streak = 0;
            self.fast.store(false, Ordering::Relaxed);
        } else if self.fast_streak < FAST_STREAK {
            self.fast_streak += 1;
            if self.fast_streak == FAST_STREAK {
                self.fast.store(true, Ordering::Relaxed);
            }
        }
    }

    fn ifname(&self) -> &str {
        &self.engine.ifname
    }

    pub(super) fn handle(&mut self, job: Job) {
        let stopping = self.stopping.load(Ordering::Acquire);
        match job {
            Job::InstallTo { to, .. } | Job::UninstallTo { to, .. } if stopping => {
                let done = answer_only(to, Err(unavailable("the daemon is shutting down")), Instant::now());
                self.count(Some(done));
            }
            Job::InstallTo { flow, gpu, hint, who, to } => {
                let mut done = None;
                if who.gone() {
                    let r = Err(unavailable("the requesting process has exited"));
                    done = Some(answer_only(to, r, Instant::now()));
                } else {
                    let _ = self.install(flow, gpu, hint, &who, |r, now| {
                        done = Some(answer_only(to, r.clone().map(drop), now))
                    });
                }
                self.count(done);
            }
            Job::UninstallTo { flow, who, to } => {
                let mut done = None;
                let _ = self
                    .uninstall(flow, &who, |r, now| done = Some(answer_only(to, r.clone().map(drop), now)));
                self.count(done);
            }
            Job::Install { reply, .. } if stopping => {
                let _ = reply.send(Err(unavailable("the daemon is shutting down")));
            }
            Job::Uninstall { reply, .. } if stopping => {
                let _ = reply.send(Err(unavailable("the daemon is shutting down")));
            }
            Job::Install { flow, gpu, hint, who, reply } => {
                if who.gone() {
                    let _ = reply.send(Err(unavailable("the requesting process has exited")));
                    return;
                }
                let _ = reply.send(self.install(flow, gpu, hint, &who, |_, _| {}));
            }
            Job::Uninstall { flow, who, reply } => {
                let _ = reply.send(self.uninstall(flow, &who, |_, _| {}));
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
            Job::Freeze { reply, hold } => {
                let _ = (reply.send(self.engine.rules().to_wire(self.ifname())), hold.recv());
            }
            Job::Wake => {}
        }
    }

    /// Installs `flow`; `reply` is called with the result as soon as it is
    /// known (and the time it was), before the metrics are updated, so a
    /// waiting client gets its answer first.
    fn install(
        &mut self,
        flow: FlowSpec,
        gpu: usize,
        hint: Option<u32>,
        who: &Requester,
        reply: impl FnOnce(&Result<Installed, RuleFailure>, Instant),
    ) -> Result<Installed, RuleFailure> {
        let owner = who.owner;
        // The quota's place is taken first, given back if the rule is not a new
        // one of this tenant's (looked up only when a quota is counted).
        let counted = self.tenants.counts_rules();
        let before = if counted { self.engine.rules().get(&flow).map(|e| e.owner.tenant) } else { None };
        if counted && before != Some(owner.tenant) {
            if let Err(d) = self.tenants.take_rule(ENDPOINT_INSTALL, &who.client, owner.tenant) {
                let r = Err(RuleFailure::new(d.code(), d.message));
                reply(&r, Instant::now());
                return r;
            }
        }
        let foreign_before = self.engine.rules().foreign_slots().len();
        let t = Instant::now();
        let r = self.engine.install(self.nic.as_ref(), flow, gpu, hint, owner);
        match (&r, before) {
            _ if !counted => {}
            // Not booked: the place taken above stays unused.
            (Err(_), b) if b != Some(owner.tenant) => self.tenants.give_rule(owner.tenant),
            // Booked before for another tenant: it is this one's now.
            (Ok(Installed::Existing(_)), Some(b)) if b != owner.tenant => self.tenants.give_rule(b),
            _ => {}
        }
        // One clock read ends both the NIC latency and the request's latency.
        let done = Instant::now();
        reply(&r, done);
        self.timed(done - t);
        if let Ok(Installed::New(e)) = &r {
            self.series.add_latency.observe((done - t).as_secs_f64());
            self.series.installed.inc();
            self.queue_add(e.queue, 1);
        }
        if let Err(RuleFailure { nic: Some(e), .. }) = &r {
            self.metrics.nic_op_failed(e);
        }
        let foreign = self.engine.rules().foreign_slots().len();
        if foreign != foreign_before {
            self.series.foreign.set(foreign as i64);
        }
        r
    }

    /// Uninstalls `flow`; `reply` as for [`Self::install`].
    fn uninstall(
        &mut self,
        flow: FlowSpec,
        who: &Requester,
        reply: impl FnOnce(&Result<Option<RuleEntry>, RuleFailure>, Instant),
    ) -> Result<Option<RuleEntry>, RuleFailure> {
        let (flow, repaired) = match self.garbled_rule(&flow, who) {
            Ok(found) => found,
            Err(f) => {
                let r = Err(f);
                reply(&r, Instant::now());
                return r;
            }
        };
        let owner =
            self.tenants.checks().then(|| self.engine.rules().get(&flow).map(|e| e.owner.tenant)).flatten();
        if let Some(owner) = owner {
            let shown = format_args!("{} -> {}", flow.src, flow.dst);
            if let Err(d) = self.tenants.check_owner(ENDPOINT_UNINSTALL, &who.client, owner, &shown, repaired)
            {
                let r = Err(RuleFailure::new(d.code(), d.message));
                reply(&r, Instant::now());
                return r;
            }
        }
        let t = Instant::now();
        let r = self.engine.uninstall(self.nic.as_ref(), &flow);
        // One clock read ends both the NIC latency and the request's latency.
        let done = Instant::now();
        reply(&r, done);
        self.timed(done - t);
        match &r {
            Ok(Some(e)) => {
                self.series.del_latency.observe((done - t).as_secs_f64());
                self.removed(e);
                if repaired {
                    self.metrics.ipv6_flows_repaired.with_label_values(&["uninstall"]).inc();
                }
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
        self.tenants.give_rule(e.owner.tenant);
        self.series.installed.dec();
        self.queue_add(e.queue, -1);
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
        self.series.pending.set(self.engine.rules().pending_len() as i64);
    }

    fn schedule_retry(&mut self) {
        if self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + self.retry_wait);
        }
        self.series.pending.set(self.engine.rules().pending_len() as i64);
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
        self.series.pending.set(self.engine.rules().pending_len() as i64);
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
        self.series.installed.set(pending);
        self.series.pending.set(pending);
        failed
    }
}
