//! Per-NIC rule threads: each NIC's rule operations run on that NIC's own
//! thread, in arrival order, so a slow driver call (an admin queue, rtnl_lock
//! contention) never holds a thread that serves connections: other NICs,
//! queries, pool fetches, HTTP probes and signals go on. Producers hand over
//! whole batches and the thread takes every queued request per wake-up, so
//! under load one hand-off serves many requests.
//!
//! A hand-off costs a wake-up of the NIC thread (on a VM, an interrupt to an
//! idle CPU), and one more thread to be scheduled before the client's answer.
//! So a connection thread runs its requests itself ([`NicRuleThread::run_here`])
//! when the NIC has been quick: its last [`FAST_STREAK`] operations each
//! took under [`FAST_OP`], nothing is queued for it and nobody runs it now.
//! Only one thread runs a NIC's requests at a time, so a NIC that turns slow
//! in the middle of one delays only the requests of the thread that made it;
//! from three rule I/O threads on, one of them also stays out of such calls
//! at all times (see `steering::intake`).
//!
//! Deletes the NIC refuses stay booked (bookkeeping always equals the NIC's
//! table) and the thread retries them with backoff until the NIC confirms.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::oneshot;

use crate::metrics::Metrics;
use crate::nic::{FlowSpec, NicControl, NicError, NicRule};
use crate::rules::engine::{Installed, NicRuleEngine};
use crate::rules::table::{NicRules, RuleEntry};
use crate::rules::RuleFailure;
use crate::types::pci::PciAddr;
use crate::types::status::StatusCode;
use crate::wire::handover::RuleTable;

mod queue;
mod reply;
mod thread;
mod turns;

use super::{Job, Requester, Shared, SocketReply};
use queue::JobQueue;
use reply::{answer, booked_rule};
use thread::NicThread;

/// First wait before a refused delete is tried again; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// A rule operation slower than this makes the NIC's thread run its requests.
pub const FAST_OP: Duration = Duration::from_micros(100);
/// Quick operations in a row before requests may run outside the NIC's thread.
pub const FAST_STREAK: u32 = 32;

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
    /// Its tenant's workload id (tenant isolation on; see `identity::workload`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<u64>,
    /// The NIC refused to delete it; the daemon is retrying.
    pub pending_delete: bool,
    /// Its request named the flow with only the first 8 bytes of each IPv6
    /// address (the NCCL plugin's); the rule steers the connection's true ones.
    pub repaired: bool,
}

/// The booked rules of one NIC, copied on its thread (no NIC call, no formatting).
pub struct BookedCopy {
    pub capacity: u32,
    /// Sorted by slot.
    pub rules: Vec<(FlowSpec, RuleEntry)>,
    pub foreign_slots: Vec<u32>,
}

/// What a NIC's thread shares with the threads that may run a request inline.
struct NicCore {
    jobs: JobQueue<Job>,
    /// The rule engine and its bookkeeping: held by whoever runs rule operations.
    state: Mutex<NicThread>,
    /// Set by the operations themselves (see [`FAST_OP`]).
    fast: Arc<AtomicBool>,
}

/// A handle to one NIC's rule thread. Dropping it ends the thread once the
/// jobs already queued are done.
pub struct NicRuleThread {
    pub ifname: String,
    core: Arc<NicCore>,
    nic: Arc<dyn NicControl>,
    gpu_names: Arc<[String]>,
}

impl Drop for NicRuleThread {
    fn drop(&mut self) {
        self.core.jobs.close();
    }
}

/// Ends a job that will never run: a client still gets its reply; an
/// in-process caller sees its answer channel close.
fn abandon(job: Job, metrics: Option<&Metrics>) {
    if let Job::InstallTo { to, .. } | Job::UninstallTo { to, .. } = job {
        answer(to, Err(unavailable("the daemon is shutting down")), metrics, Instant::now());
    }
}

fn unavailable(msg: &str) -> RuleFailure {
    RuleFailure::new(StatusCode::Unavailable, msg)
}

impl NicRuleThread {
    /// Starts the rule thread of NIC `ifname`, over `adopted` (a table taken
    /// over from another daemon) or an empty table. Once `stopping` is set,
    /// requests not yet started are answered UNAVAILABLE.
    pub fn new(
        ifname: &str,
        capacity: u32,
        gpus: Vec<(PciAddr, Vec<u32>)>,
        nic: Arc<dyn NicControl>,
        shared: &Shared,
        adopted: Option<NicRules>,
    ) -> std::io::Result<NicRuleThread> {
        let metrics = shared.metrics.clone();
        let queues: Vec<Vec<u32>> = gpus.iter().map(|(_, q)| q.clone()).collect();
        metrics.rule_slots.with_label_values(&[ifname]).set(capacity as i64);
        let gpu_names: Arc<[String]> = gpus.iter().map(|(p, _)| p.to_string()).collect();
        let fast = Arc::new(AtomicBool::new(false));
        let engine = match adopted {
            Some(rules) => NicRuleEngine::with_rules(ifname, rules),
            None => NicRuleEngine::new(ifname, capacity, &queues),
        };
        let state = NicThread::new(
            engine,
            gpu_names.clone(),
            nic.clone(),
            metrics.clone(),
            shared.stopping.clone(),
            fast.clone(),
            shared.tenants.clone(),
        );
        state.gauges_from_table();
        let core = Arc::new(NicCore { jobs: JobQueue::new(), state: Mutex::new(state), fast });
        let shared = core.clone();
        std::thread::Builder::new()
            .name(format!("nic-{ifname}"))
            .spawn(move || thread::run(&shared.jobs, &shared.state, metrics))?;
        Ok(NicRuleThread { ifname: ifname.to_string(), core, nic, gpu_names })
    }

    /// Runs `batch` on the calling thread, now, if the NIC has been quick,
    /// nothing is queued for it and nobody runs it at the moment: `true`
    /// when it did (`batch` is then empty); otherwise `batch` is untouched,
    /// for [`Self::submit`].
    pub fn run_here(&self, batch: &mut Vec<Job>) -> bool {
        if !self.core.fast.load(Ordering::Relaxed) || !self.core.jobs.is_empty() {
            return false;
        }
        let Ok(mut st) = self.core.state.try_lock() else { return false };
        let had_retry = st.retry_pending();
        for job in batch.drain(..) {
            st.handle(job);
        }
        st.flush_counts();
        let new_retry = !had_retry && st.retry_pending();
        drop(st);
        if new_retry {
            // A refused delete: the thread must learn its retry deadline.
            let _ = self.core.jobs.push(Job::Wake);
        }
        true
    }

    /// Sends a job and waits for its answer without blocking the runtime.
    async fn ask<T>(&self, job: impl FnOnce(oneshot::Sender<T>) -> Job) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.core.jobs.push(job(tx)).ok()?;
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

    /// Hands over every job of `batch` at once (one wake-up of the thread at
    /// most), leaving `batch` empty with its capacity kept.
    pub fn submit(&self, batch: &mut Vec<Job>) {
        if self.core.jobs.push_all(batch).is_err() {
            for job in batch.drain(..) {
                abandon(job, None);
            }
        }
    }

    pub async fn uninstall(&self, flow: FlowSpec, who: Requester) -> Result<Option<RuleEntry>, RuleFailure> {
        self.ask(|reply| Job::Uninstall { flow, who, reply })
            .await
            .unwrap_or_else(|| Err(unavailable("the daemon is shutting down")))
    }

    /// Takeover: asks for the table as it stands once every job queued
    /// before is done (the answer comes on the receiver), with the hold that
    /// keeps the thread from running anything after (drop it to let the
    /// thread go on). `None` if the thread is gone.
    pub fn freeze(&self) -> Option<(oneshot::Receiver<RuleTable>, std::sync::mpsc::Sender<()>)> {
        let (tx, hold) = std::sync::mpsc::channel();
        let (reply, rx) = oneshot::channel();
        self.core.jobs.push(Job::Freeze { reply, hold }).ok()?;
        Some((rx, tx))
    }

    /// Queues the removal of every rule of `lease` (its process exited).
    pub fn reclaim(&self, lease: NonZeroU32) {
        let _ = self.core.jobs.push(Job::Reclaim { lease, reply: None });
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
        let sent = self.core.jobs.push(Job::RemoveAll { give_up_at, reply }).is_ok();
        async move {
            match sent {
                true => rx.await.unwrap_or_default(),
                false => Vec::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests;
