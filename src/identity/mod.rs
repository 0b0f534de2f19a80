//! Client identity: who is at the other end of a connection.
//!
//! Every endpoint that needs to know its client asks here and nowhere else:
//! the rule path (to record who owns a rule and to tie the rule to the
//! client's lease) and the pool and registry endpoints (to watch the client
//! process). This module owns:
//! - the kernel calls that name a peer process: `SO_PEERCRED`,
//!   `SO_PEERPIDFD`, `pidfd_open`, the pidfs inode that tells two pidfds of
//!   one process apart, and whether a pidfd's process still holds its pid
//!   ([`peer`](self) functions, private). Who a client is gets decided once
//!   per connection from these, never from a pid number alone;
//! - the [`leases`]: one watched pidfd per client process, and what happens
//!   when that process exits;
//! - what a client is *to the daemon* ([`Client`]), including its [`tenant`]:
//!   its cgroup and the [`workload`] it belongs to (what its budgets count
//!   by), the GPUs whose device nodes it holds open, and its network
//!   namespace;
//! - the [`access`] checks that keep tenants apart (`--tenant_isolation`):
//!   which GPU and which flow a client may use, whose rule it may remove, how
//!   many rules it may hold;
//! - the [`flows`] lookup behind the flow check, which also repairs the IPv6
//!   flows the NCCL plugin names with half their address bytes: by exact
//!   lookups of the addresses each namespace is known to use
//!   (`flows_space`), else from a dump, narrowed to the sockets the client
//!   holds where several fit (`flows_held`).
//!
//! It may use `metrics` and the layers below; it knows nothing of the
//! endpoints, the rule path or the daemon.

pub mod access;
pub mod flows;
mod flows_held;
mod flows_space;
mod held;
pub mod leases;
pub mod operator;
pub mod tenant;
pub mod workload;

use std::num::NonZeroU32;
use std::ops::Deref;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use nix::sys::socket::{getsockopt, sockopt};

pub use crate::pidfd::probe_peer_pidfd;
pub use access::{Denied, Examined, Refusal, TenantPolicy};
pub use leases::{
    Asked, ClientCache, ClientCount, ClientTracker, IdentifyError, Lease, LeasePolicy, PendingClient,
};
pub use tenant::Tenant;

/// Who a connection's client is, as far as the daemon can tell: a shared
/// [`ClientInfo`] (nobody by default). A request carries it from thread to
/// thread, so cloning it touches one reference count, not one per part.
#[derive(Debug, Clone, Default)]
pub struct Client(Option<Arc<ClientInfo>>);

/// Nobody: what [`Client::default`] reads as.
static NOBODY: ClientInfo =
    ClientInfo { pid: None, lease: None, tenant: None, process: None, opener_exited: false };

impl Deref for Client {
    type Target = ClientInfo;

    fn deref(&self) -> &ClientInfo {
        self.0.as_deref().unwrap_or(&NOBODY)
    }
}

impl From<ClientInfo> for Client {
    fn from(info: ClientInfo) -> Client {
        Client(Some(Arc::new(info)))
    }
}

/// What the daemon knows of a connection's client.
#[derive(Debug, Default)]
pub struct ClientInfo {
    /// The process's pid in the daemon's pid namespace; `None` when that
    /// process lives in a namespace the daemon cannot see, or clients are not
    /// tracked.
    pub pid: Option<NonZeroU32>,
    /// Its lease, when its rules are to go away with it (`--leases`).
    pub lease: Option<Arc<Lease>>,
    /// Its tenant, when tenant isolation is on and the tenant could be told.
    pub tenant: Option<Arc<Tenant>>,
    /// Its process's watch, whenever client processes are tracked (with or
    /// without `--leases`): where its network namespace is found.
    pub process: Option<Arc<Lease>>,
    /// The process that opened the connection had exited when the daemon
    /// asked (it may have passed the connection on): the client is nobody,
    /// whoever sends on the connection now.
    pub opener_exited: bool,
}

impl ClientInfo {
    /// Its process's cgroup id, which a socket's creator is compared with
    /// (flows stay each cgroup's own).
    pub fn cgroup_id(&self) -> Option<u64> {
        self.tenant.as_ref().map(|t| t.cgroup_id)
    }

    /// Its workload's id: what rules record as their tenant, and what every
    /// budget, turn and queue is counted by.
    pub fn workload_id(&self) -> Option<u64> {
        self.tenant.as_ref().map(|t| t.workload.id)
    }

    /// Its network namespace, where the daemon can open it: the one its
    /// tenant was read with, else its process's (opened on first use).
    pub fn netns(&self) -> Option<&tenant::NetNs> {
        match &self.tenant {
            Some(t) => t.net.as_ref(),
            None => self.process.as_ref()?.netns(),
        }
    }
}

/// What the kernel recorded of a Unix socket's peer when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// `None` where the peer's pid is not visible from the daemon's pid
    /// namespace (the kernel reports 0 then).
    pub pid: Option<NonZeroU32>,
    pub uid: u32,
}

/// The nice value of identity's background threads (the tenant readers,
/// audit's flow checks): below the threads that serve requests.
const BACKGROUND_NICE: libc::c_int = 10;

/// Lowers the calling thread's scheduling priority ([`BACKGROUND_NICE`]):
/// on a busy machine the threads that serve requests run first. Needs no
/// privilege. `what`: the thread, for the log.
pub(crate) fn lower_priority(what: &str) {
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority takes plain integers; for PRIO_PROCESS with a
    // thread id, Linux changes that one thread.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE) };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the {what}'s priority");
    }
}

/// `SO_PEERCRED` of `sock`; `None` if the kernel will not say (not a Unix socket).
pub fn credentials(sock: BorrowedFd<'_>) -> Option<Credentials> {
    let c = getsockopt(&sock, sockopt::PeerCredentials).ok()?;
    Some(Credentials { pid: u32::try_from(c.pid()).ok().and_then(NonZeroU32::new), uid: c.uid() })
}
