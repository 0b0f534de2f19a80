//! Per-NIC rule threads: each NIC's rule operations run on that NIC's own
//! thread, in arrival order, so a slow driver call (an admin queue, rtnl_lock
//! contention) never holds a thread that serves connections: other NICs,
//! queries, pool fetches, HTTP probes and signals go on. Producers hand over
//! whole batches and the thread takes every queued request per wake-up, so
//! under load one hand-off serves many requests.
//!
//! Deletes the NIC refuses stay booked (bookkeeping always equals the NIC's
//! table) and the thread retries them with backoff until the NIC confirms.

use std::num::NonZeroU32;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::oneshot;

use crate::metrics::{Metrics, RuleOp};
use crate::nic::{FlowSpec, NicControl, NicError, NicRule};
use crate::rules::engine::{Installed, NicRuleEngine};
use crate::rules::table::{Owner, RuleEntry};
use crate::rules::RuleFailure;
use crate::types::pci::PciAddr;
use crate::types::status::StatusCode;

mod queue;
mod thread;

use super::rule_io::Handoff;
use queue::JobQueue;
use thread::{answer, booked_rule, NicThread};

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

/// Where a rule request's answer goes: the NIC thread writes it to the
/// client's socket itself (no wake-up of the connection's thread per request).
pub struct SocketReply {
    pub conn: Arc<Handoff>,
    pub op: RuleOp,
    pub started: Instant,
}

/// A unit of work for a NIC thread. Rule requests from clients are built
/// with [`Job::install_to`] and [`Job::uninstall_to`] and handed over in
/// batches with [`NicRuleThread::submit`].
pub enum Job {
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

impl Job {
    /// An install whose reply the NIC thread writes to the client.
    pub fn install_to(flow: FlowSpec, gpu: usize, hint: Option<u32>, who: Requester, to: SocketReply) -> Job {
        Job::InstallTo { flow, gpu, hint, who, to }
    }

    /// An uninstall whose reply the NIC thread writes to the client.
    pub fn uninstall_to(flow: FlowSpec, to: SocketReply) -> Job {
        Job::UninstallTo { flow, to }
    }

    /// Ends a job that will never run: a client still gets its reply; an
    /// in-process caller sees its answer channel close.
    fn abandon(self, metrics: Option<&Metrics>) {
        if let Job::InstallTo { to, .. } | Job::UninstallTo { to, .. } = self {
            answer(to, Err(unavailable("the daemon is shutting down")), metrics, Instant::now());
        }
    }
}

/// The booked rules of one NIC, copied on its thread (no NIC call, no formatting).
pub struct BookedCopy {
    pub capacity: u32,
    /// Sorted by slot.
    pub rules: Vec<(FlowSpec, RuleEntry)>,
    pub foreign_slots: Vec<u32>,
}

/// A handle to one NIC's rule thread. Dropping it ends the thread once the
/// jobs already queued are done.
pub struct NicRuleThread {
    pub ifname: String,
    jobs: Arc<JobQueue<Job>>,
    nic: Arc<dyn NicControl>,
    gpu_names: Arc<[String]>,
}

impl Drop for NicRuleThread {
    fn drop(&mut self) {
        self.jobs.close();
    }
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
        let thread = NicThread::new(
            NicRuleEngine::new(ifname, capacity, &queues),
            gpu_names.clone(),
            queues.concat(),
            nic.clone(),
            metrics,
            stopping,
        );
        thread.reset_gauges();
        let jobs = Arc::new(JobQueue::new());
        let queue = jobs.clone();
        std::thread::Builder::new().name(format!("nic-{ifname}")).spawn(move || thread.run(&queue))?;
        Ok(NicRuleThread { ifname: ifname.to_string(), jobs, nic, gpu_names })
    }

    /// Sends a job and waits for its answer without blocking the runtime.
    async fn ask<T>(&self, job: impl FnOnce(oneshot::Sender<T>) -> Job) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.jobs.push(job(tx)).ok()?;
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
        if self.jobs.push_all(batch).is_err() {
            for job in batch.drain(..) {
                job.abandon(None);
            }
        }
    }

    pub async fn uninstall(&self, flow: FlowSpec) -> Result<Option<RuleEntry>, RuleFailure> {
        self.ask(|reply| Job::Uninstall { flow, reply })
            .await
            .unwrap_or_else(|| Err(unavailable("the daemon is shutting down")))
    }

    /// Queues the removal of every rule of `lease` (its process exited).
    pub fn reclaim(&self, lease: NonZeroU32) {
        let _ = self.jobs.push(Job::Reclaim { lease, reply: None });
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
        let sent = self.jobs.push(Job::RemoveAll { give_up_at, reply }).is_ok();
        async move {
            match sent {
                true => rx.await.unwrap_or_default(),
                false => Vec::new(),
            }
        }
    }
}
