//! Per-NIC rule threads: each NIC's rule operations run on that NIC's own
//! thread, in arrival order, so a slow driver call (an admin queue, rtnl_lock
//! contention) never holds an async runtime worker: other NICs, queries, pool
//! fetches, HTTP probes and signals go on. The thread takes every queued
//! request per wake-up, so under load one hand-off serves many requests.
//!
//! Deletes the NIC refuses stay booked (bookkeeping always equals the NIC's
//! table) and the thread retries them with backoff until the NIC confirms.

use std::num::NonZeroU32;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
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

mod thread;

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
