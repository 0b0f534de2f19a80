//! The rule path: everything between a client's flow-steering request and
//! the NIC's rule table.
//!
//! - [`intake`]: the rule sockets (`rx_rule_manager`, `rx_rule_uninstall`),
//!   served by epoll threads of their own: accept, read, parse, answer what
//!   needs no NIC, and hand the rest over in batches.
//! - [`apply`]: one thread per NIC that applies installs and removals in
//!   arrival order, keeps the bookkeeping equal to the NIC's table, retries
//!   refused deletes and reclaims the rules of exited clients.
//! - [`request`]: what a rule request means: parse it, pick its NIC and GPU,
//!   and turn it into a [`Job`].
//! - [`repair`]: installs of IPv6 flows named with half their address bytes
//!   (the NCCL plugin's), looked up on a few worker threads of their own, a
//!   queue per tenant, before they become jobs.
//! - [`handoff`](Handoff): how the NIC thread writes a reply to the client's
//!   socket itself, waking the connection's thread only when it must.
//! - [`flows_stream`]: the booked rules, streamed as JSON (`/debug/flows`).
//!
//! The types the parts share live here: the [`Job`] a NIC thread runs, the
//! [`Requester`] it records as a rule's owner, the [`SocketReply`] that
//! carries the answer, and the [`RulePath`] they all serve from.
//!
//! It may use `endpoint` (socket names, the connection budget, accept
//! back-off), `identity` (who a client is), `rules`, `nic`, `metrics` and
//! the layers below. The async endpoints (`server`) and the daemon use it;
//! it knows neither.

pub mod apply;
pub mod flows_stream;
mod handoff;
pub mod intake;
pub mod repair;
pub mod request;

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use foldhash::HashMap;
use tokio::sync::oneshot;

use crate::endpoint::budget::ConnBudget;
use crate::endpoint::pause::Gate;
use crate::identity::{Client, ClientTracker, TenantPolicy};
use crate::metrics::{Metrics, RuleOp};
use crate::nic::{FlowSpec, NicError};
use crate::rules::engine::Installed;
use crate::rules::table::{Owner, RuleEntry};
use crate::rules::RuleFailure;
use crate::types::pci::PciAddr;
use crate::wire::handover::RuleTable;
use apply::{BookedCopy, NicFlows, NicRuleThread};
pub use handoff::{Handoff, Inbox};

/// Where a managed GPU sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSlot {
    /// Its NIC's index (into [`RulePath::nics`]).
    pub nic: usize,
    /// Its index among that NIC's GPUs.
    pub index: usize,
    /// Its place among all the daemon's GPUs, in topology order.
    pub ordinal: usize,
}

/// What the rule path serves from: one rule thread per NIC and the maps
/// that pick a request's NIC.
pub struct RulePath {
    /// One per NIC, in topology order.
    pub nics: Vec<NicRuleThread>,
    /// Each managed GPU and where it sits.
    gpus: HashMap<PciAddr, GpuSlot>,
    /// Local address → NIC index, for requests without a GPU.
    addresses: RwLock<HashMap<IpAddr, usize>>,
    /// What the rule path shares with every other endpoint.
    pub shared: Arc<Shared>,
    /// Where garbled IPv6 installs wait to be repaired.
    pub repairs: repair::Repairs,
}

/// What every endpoint, the rule path and its NIC threads share: one
/// value, held by each through an `Arc`.
pub struct Shared {
    pub metrics: Arc<Metrics>,
    /// `--max_connections`, with a share kept for registry and pool endpoints.
    pub conn_limit: Arc<ConnBudget>,
    /// Client processes and their leases.
    pub clients: Arc<ClientTracker>,
    /// Set when shutdown starts: the NIC threads answer requests not yet
    /// started with UNAVAILABLE.
    pub stopping: Arc<AtomicBool>,
    /// Tenant isolation: which GPU and which flow a client may use.
    pub tenants: Arc<TenantPolicy>,
    /// A takeover's pause: no accepting, connections parked between requests.
    pub gate: Arc<Gate>,
}

impl Shared {
    /// For unit tests: nothing tracked, no isolation, room for 64 connections.
    #[cfg(test)]
    pub fn for_tests() -> Shared {
        let metrics = Arc::new(Metrics::new());
        let tenants = Arc::new(TenantPolicy::off());
        let policy = crate::identity::LeasePolicy { track: false, reclaim: false };
        let (clients, _) = ClientTracker::new(policy, metrics.clone(), tenants.clone());
        Shared {
            metrics,
            conn_limit: Arc::new(ConnBudget::new(64, None)),
            clients,
            stopping: Arc::new(AtomicBool::new(false)),
            tenants,
            gate: Arc::new(Gate::default()),
        }
    }
}

impl RulePath {
    pub fn new(
        nics: Vec<NicRuleThread>,
        gpus: impl IntoIterator<Item = (PciAddr, GpuSlot)>,
        shared: Arc<Shared>,
    ) -> RulePath {
        RulePath {
            repairs: repair::Repairs::new(shared.metrics.clone()),
            nics,
            gpus: gpus.into_iter().collect(),
            addresses: Default::default(),
            shared,
        }
    }

    /// Where a managed GPU sits.
    pub fn gpu(&self, pci: &PciAddr) -> Option<GpuSlot> {
        self.gpus.get(pci).copied()
    }

    /// The managed GPU at `index` of NIC `nic`.
    pub fn gpu_at(&self, nic: usize, index: usize) -> Option<(PciAddr, GpuSlot)> {
        self.gpus.iter().find(|(_, s)| s.nic == nic && s.index == index).map(|(p, s)| (*p, *s))
    }

    pub fn nic_for_address(&self, ip: IpAddr) -> Option<usize> {
        self.addresses.read().expect("address map lock").get(&ip.to_canonical()).copied()
    }

    pub fn set_addresses(&self, map: impl IntoIterator<Item = (IpAddr, usize)>) {
        *self.addresses.write().expect("address map lock") = map.into_iter().collect();
    }
}

/// Who asks for an install: the rule's recorded owner and, with
/// `--leases`, the lease whose end removes the rule. The NIC thread refuses
/// installs for a process already known to be gone, so that no rule
/// outlives its reclaim. There is no default: each is the client of a
/// connection (`From<Client>`), or explicitly nobody
/// ([`Requester::unchecked`]).
#[derive(Debug, Clone)]
pub struct Requester {
    /// What a rule it installs records of it.
    pub owner: Owner,
    /// Who asks: its lease and its tenant, for the checks.
    pub client: Client,
    /// An uninstall of an IPv6 flow that may name only the first 8 bytes of
    /// each address (the NCCL plugin's): if no rule is booked for the flow as
    /// named, the NIC thread removes the one rule of this client's that fits it.
    pub garbled: bool,
}

impl From<Client> for Requester {
    fn from(c: Client) -> Requester {
        let owner = Owner {
            pid: c.pid,
            lease: c.lease.as_ref().map(|l| l.id()),
            tenant: c.workload_id(),
            repaired: false,
        };
        Requester { owner, client: c, garbled: false }
    }
}

/// The turn key of requests whose client is not known.
pub const NOBODY_TURN: u64 = u64::MAX;

impl Requester {
    /// What its requests take turns by, wherever they wait with others'
    /// (a rule I/O thread's ready connections, a NIC thread's batch): its
    /// workload, else its process (lease), else nobody's.
    pub fn turn(&self) -> u64 {
        turn_of(&self.client)
    }

    /// Whether its process is already known to be gone.
    pub fn gone(&self) -> bool {
        self.client.lease.as_ref().is_some_and(|l| !l.alive())
    }

    /// Nobody in particular: for an uninstall while tenant isolation is
    /// off, when the NIC thread checks no owner. With isolation on, a check
    /// finds no tenant in it and refuses it as unidentified.
    pub fn unchecked() -> Requester {
        Requester::from(Client::default())
    }
}

/// [`Requester::turn`] of a client.
pub fn turn_of(c: &Client) -> u64 {
    match (&c.tenant, &c.process) {
        (Some(t), _) => t.workload.id & !(1 << 63),
        (None, Some(l)) => (1 << 63) | u64::from(l.id().get()),
        (None, None) => NOBODY_TURN,
    }
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
        who: Requester,
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
        who: Requester,
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
    /// A takeover: writes the table out, then runs nothing more until
    /// `hold` ends (a message or its sender dropped: the takeover failed,
    /// serve on). Handed over, the process exits with the thread still held.
    Freeze {
        reply: oneshot::Sender<RuleTable>,
        hold: std::sync::mpsc::Receiver<()>,
    },
    /// Nothing: makes the thread look at its retry deadline again.
    Wake,
}

impl Job {
    /// An install whose reply the NIC thread writes to the client.
    pub fn install_to(flow: FlowSpec, gpu: usize, hint: Option<u32>, who: Requester, to: SocketReply) -> Job {
        Job::InstallTo { flow, gpu, hint, who, to }
    }

    /// An uninstall whose reply the NIC thread writes to the client.
    pub fn uninstall_to(flow: FlowSpec, who: Requester, to: SocketReply) -> Job {
        Job::UninstallTo { flow, who, to }
    }
}
