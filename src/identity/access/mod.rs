//! Deciding what a client may do (`--tenant_isolation`): use a GPU, steer
//! a flow, remove a rule, hold one more rule. Each check gives the same
//! answer in `audit` and `enforce`; only `enforce` refuses. Every refusal,
//! real or audited, is counted (`tcpx_rxdm_requests_refused_total`) and
//! logged, at most one line per reason a second.
//!
//! No lock shared between tenants is held across a kernel call: a flow
//! lookup takes a `sock_diag` socket of the client process's own (kept with
//! its network namespace, closed when its lease ends), and the quota's lock
//! only guards a counter.

use std::collections::HashMap;
use std::fmt::Display;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::flows::{self, Found};
use super::tenant::{FilesRead, GpuDevices, NetNs, Tenant};
use super::workload::{self, Workload};
use super::Client;
use crate::config::flags::TenantIsolation;
use crate::metrics::Metrics;
use crate::types::flow::FlowSpec;
use crate::types::status::StatusCode;
use prometheus::IntCounter;

/// Why a request is (or would be) refused; the metric's `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A GPU whose device node the client does not hold open.
    Gpu,
    /// A flow whose TCP socket is not the client's tenant's.
    Flow,
    /// A rule another tenant (workload) installed.
    Owner,
    /// Over `--max_rules_per_tenant` (per workload).
    Quota,
    /// A client whose tenant cannot be told.
    Unidentified,
}

impl Refusal {
    pub const ALL: [Refusal; 5] =
        [Refusal::Gpu, Refusal::Flow, Refusal::Owner, Refusal::Quota, Refusal::Unidentified];

    pub fn name(self) -> &'static str {
        match self {
            Refusal::Gpu => "gpu",
            Refusal::Flow => "flow",
            Refusal::Owner => "owner",
            Refusal::Quota => "quota",
            Refusal::Unidentified => "unidentified",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The endpoints whose requests are checked (the metric's `endpoint` label).
pub const CHECKED_ENDPOINTS: [&str; 5] =
    ["rule_manager", "rule_uninstall", "gpu_fd", "gpu_metadata", "gpu_ipc_handle"];

/// The refusal of a client whose connection was opened by a process that
/// has exited since.
const OPENER_EXITED: &str = "cannot tell this client's tenant: the process that opened this connection has \
exited (a connection passed to another process is not that process's); requests must come from a live \
process, on a connection it opened itself";

/// The hint an unidentified client's refusal carries.
const UNIDENTIFIED: &str =
    "cannot tell this client's tenant: its process is not visible to the daemon and the \
kernel gave no pidfd information (Linux 6.13+); run the daemon in the workload's process namespace \
(hostPID: true for the node-wide DaemonSet, shareProcessNamespace: true for a sidecar)";

/// A refusal in `enforce` mode: what to answer the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub reason: Refusal,
    pub message: String,
}

impl Denied {
    /// The reply's status: RESOURCE_EXHAUSTED over the quota, else PERMISSION_DENIED.
    pub fn code(&self) -> StatusCode {
        match self.reason {
            Refusal::Quota => StatusCode::ResourceExhausted,
            _ => StatusCode::PermissionDenied,
        }
    }
}

/// A rule request's flow after [`TenantPolicy::examine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Examined {
    /// The flow to steer: as sent, or repaired.
    pub flow: FlowSpec,
    /// The flow as the request named it: what a refusal may name (the
    /// repaired one may be another tenant's connection).
    pub sent: FlowSpec,
    /// The request named it with garbled IPv6 addresses; `flow` is the
    /// connection's true 4-tuple.
    pub repaired: bool,
    /// What the lookup found (the repaired connection as `Exact`); `None`:
    /// not looked up.
    pub found: Option<Result<Found, String>>,
}

impl Examined {
    /// The connections a garbled request fits, when it fits several, each
    /// with the cgroup id of its creator.
    pub fn ambiguous(&self) -> Option<&[(FlowSpec, u64)]> {
        match &self.found {
            Some(Ok(Found::Ambiguous(all))) => Some(all),
            _ => None,
        }
    }
}

/// The isolation policy and its state: the mode, the devices, the quota.
pub struct TenantPolicy {
    pub mode: TenantIsolation,
    pub max_rules: u32,
    pub devices: GpuDevices,
    /// Where cgroup v2 is mounted (for the `/proc/<pid>/cgroup` fallback,
    /// and to find a workload's cgroup folder).
    pub cgroup2: Option<PathBuf>,
    /// How a client's workload is told from its cgroup path.
    pub workloads: workload::Rule,
    metrics: Option<Arc<Metrics>>,
    /// The refusal counters of this mode, per checked endpoint and reason,
    /// resolved once (no label hashing per refusal).
    refused: Vec<(&'static str, [IntCounter; 5])>,
    /// Rules held per workload (its id, as rules record it).
    held: Mutex<HashMap<u64, u32>>,
    /// Workloads seen, by id: how to name them.
    names: Mutex<HashMap<u64, String>>,
    /// Audit mode's IPv4 flow checks, run off the request's path
    /// ([`Self::defer_flow_checks`]).
    later: OnceLock<Arc<later::AuditQueue>>,
    /// Per reason: when a line was last logged (ms since `epoch`), and how many were not.
    last_log: [AtomicU64; 5],
    unlogged: [AtomicU64; 5],
    epoch: Instant,
}

impl std::fmt::Debug for TenantPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantPolicy").field("mode", &self.mode).field("max_rules", &self.max_rules).finish()
    }
}

impl TenantPolicy {
    pub fn new(
        mode: TenantIsolation,
        max_rules: u32,
        devices: GpuDevices,
        cgroup2: Option<PathBuf>,
        metrics: Option<Arc<Metrics>>,
    ) -> TenantPolicy {
        let mut refused = Vec::new();
        if let (Some(m), false) = (&metrics, mode == TenantIsolation::Off) {
            for e in CHECKED_ENDPOINTS {
                let series =
                    Refusal::ALL.map(|r| m.requests_refused.with_label_values(&[e, r.name(), mode.name()]));
                refused.push((e, series));
            }
        }
        TenantPolicy {
            later: OnceLock::new(),
            refused,
            mode,
            max_rules,
            devices,
            cgroup2,
            workloads: workload::Rule::default(),
            metrics,
            held: Mutex::default(),
            names: Mutex::default(),
            last_log: Default::default(),
            unlogged: Default::default(),
            epoch: Instant::now(),
        }
    }

    /// The policy with workloads told by `rule` (`--workload_cgroup_depth`).
    pub fn with_workloads(mut self, rule: workload::Rule) -> TenantPolicy {
        self.workloads = rule;
        self
    }

    /// The workload of a process in cgroup `cgroup_id`, at `path` where
    /// known (a takeover's tenants, told as this daemon tells them).
    pub fn workload_of(&self, cgroup_id: u64, path: Option<&str>) -> Workload {
        workload::resolve(cgroup_id, path, self.workloads, self.cgroup2.as_deref())
    }

    /// No checks at all.
    pub fn off() -> TenantPolicy {
        TenantPolicy::new(TenantIsolation::Off, 0, GpuDevices::default(), None, None)
    }

    /// Whether clients are checked (audit or enforce).
    pub fn checks(&self) -> bool {
        self.mode != TenantIsolation::Off
    }

    /// Remembers how to name `t`'s workload (for `status` and refusals).
    pub fn saw(&self, t: &Tenant) {
        self.names.lock().expect("tenant names lock").entry(t.workload.id).or_insert_with(|| t.name());
    }

    /// The name of workload `id`, if it was seen.
    pub fn name_of(&self, id: u64) -> Option<String> {
        self.names.lock().expect("tenant names lock").get(&id).cloned()
    }

    /// Records a refusal: counted and logged in audit and enforce; in
    /// enforce, the answer to send.
    pub fn refuse(
        &self,
        endpoint: &str,
        reason: Refusal,
        who: &Client,
        message: impl FnOnce() -> String,
    ) -> Result<(), Denied> {
        self.refuse_detailed(endpoint, reason, who, message, String::new)
    }

    /// [`Self::refuse`], with `detail` for the log only: what the client is
    /// not told because it is another tenant's (a rule's owner, the
    /// connection a flow was repaired to).
    pub fn refuse_detailed(
        &self,
        endpoint: &str,
        reason: Refusal,
        who: &Client,
        message: impl FnOnce() -> String,
        detail: impl FnOnce() -> String,
    ) -> Result<(), Denied> {
        if !self.checks() {
            return Ok(());
        }
        if let Some(c) = self.refused.iter().find(|(e, _)| *e == endpoint) {
            c.1[reason.index()].inc();
        } else if let Some(m) = &self.metrics {
            m.requests_refused.with_label_values(&[endpoint, reason.name(), self.mode.name()]).inc();
        }
        let enforce = self.mode == TenantIsolation::Enforce;
        let now = self.epoch.elapsed().as_millis() as u64;
        let i = reason.index();
        let last = self.last_log[i].load(Ordering::Relaxed);
        let log = (last == 0 || now >= last + 1000)
            && self.last_log[i]
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        if !log {
            self.unlogged[i].fetch_add(1, Ordering::Relaxed);
            // The message is built only when it is logged or sent.
            return match enforce {
                true => Err(Denied { reason, message: message() }),
                false => Ok(()),
            };
        }
        let unlogged = self.unlogged[i].swap(0, Ordering::Relaxed);
        let text = message();
        let logged = match detail() {
            d if d.is_empty() => text.clone(),
            d => format!("{text}; not told to the client: {d}"),
        };
        // The client's own workload and cgroup, never another's.
        let (workload, cgroup) = match &who.tenant {
            Some(t) => (t.name(), t.cgroup.clone().unwrap_or_else(|| format!("cgroup id {}", t.cgroup_id))),
            None => ("unknown".to_string(), "unknown".to_string()),
        };
        let pid = who.pid.map_or_else(|| "unknown".to_string(), |p| p.to_string());
        if enforce {
            tracing::warn!(endpoint, reason = reason.name(), %pid, %workload, %cgroup, unlogged, "refused: {logged}");
            return Err(Denied { reason, message: text });
        }
        tracing::warn!(
            endpoint, reason = reason.name(), %pid, %workload, %cgroup, unlogged,
            "would refuse (tenant_isolation=audit): {logged}"
        );
        Ok(())
    }

    /// The client's tenant, or the unidentified refusal.
    fn tenant<'a>(&self, endpoint: &str, who: &'a Client) -> Result<Option<&'a Tenant>, Denied> {
        let hint = if who.opener_exited { OPENER_EXITED } else { UNIDENTIFIED };
        match &who.tenant {
            Some(t) => Ok(Some(t)),
            None => self.refuse(endpoint, Refusal::Unidentified, who, || hint.into()).map(|_| None),
        }
    }

    /// May `who` use the GPU at topology place `gpu` (called `name`)?
    pub fn check_gpu(
        &self,
        endpoint: &str,
        who: &Client,
        gpu: usize,
        name: &dyn Display,
    ) -> Result<(), Denied> {
        if !self.checks() {
            return Ok(());
        }
        let Some(t) = self.tenant(endpoint, who)? else { return Ok(()) };
        if t.holds_gpu(gpu) {
            return Ok(());
        }
        let minor = self.devices.minors.get(gpu).copied().unwrap_or(gpu as u32);
        self.refuse(endpoint, Refusal::Gpu, who, || match t.files {
            FilesRead::None(why) => format!(
                "GPU {name} is not this client's (workload {}): the daemon cannot tell whether its process \
                 holds /dev/nvidia{minor} open for reading and writing, as a process that initialised CUDA does \
                 for each GPU it may use: its open files were not read: {why}",
                t.name()
            ),
            files => format!(
                "GPU {name} is not this client's (workload {}): its process does not hold /dev/nvidia{minor} \
                 open for reading and writing, as a process that initialised CUDA does for each GPU it may use{}",
                t.name(),
                files_read(files)
            ),
        })
    }

    /// Looks the flow of a rule request up in the client's network
    /// namespace where that matters: for an install's tenant check (audit,
    /// enforce), and for an IPv6 flow in every mode, to repair it when the
    /// request carries only the first half of each address (the NCCL
    /// plugin's, see `identity::flows`). The rest is not looked up at all.
    /// `check`: the flow is to be checked now (an install whose check is
    /// not deferred).
    pub fn examine(&self, who: &Client, flow: FlowSpec, check: bool) -> Examined {
        let exact = check && self.checks() && who.tenant.is_some();
        if !exact && !flows::repairable(&flow) {
            return Examined { flow, sent: flow, repaired: false, found: None };
        }
        let found = self.netns_of(who).and_then(|ns| flows::locate(ns, &flow, exact, who.cgroup_id()));
        Self::examined(flow, found)
    }

    /// The network namespace to look `who`'s flows up in: its own. With
    /// isolation off (a daemon in the workload's Pod or job), a client whose
    /// namespace cannot be had is looked for in the daemon's own, which a
    /// Pod's containers share.
    pub fn netns_of<'a>(&self, who: &'a Client) -> Result<&'a NetNs, String> {
        match (who.netns(), self.checks()) {
            (Some(ns), _) => Ok(ns),
            (None, false) => own_netns().ok_or_else(|| "no network namespace could be opened".to_string()),
            (None, true) => Err("its network namespace could not be opened".to_string()),
        }
    }

    /// A rule request's flow as sent and what looking it up `found`: a
    /// repaired flow becomes the connection it fits.
    pub fn examined(flow: FlowSpec, found: Result<Found, String>) -> Examined {
        match found {
            Ok(Found::Repaired { flow: true_flow, cgroup }) => Examined {
                flow: true_flow,
                sent: flow,
                repaired: true,
                found: Some(Ok(Found::Exact { cgroup })),
            },
            found => Examined { flow, sent: flow, repaired: false, found: Some(found) },
        }
    }

    /// May `who` steer the flow `e` names (after any repair)? Only if that
    /// TCP connection exists in the client's network namespace and belongs
    /// to the client's cgroup. A refusal names the flow as the client sent
    /// it, never the connection it was repaired to (which is not its own).
    pub fn check_flow(&self, endpoint: &str, who: &Client, e: &Examined) -> Result<(), Denied> {
        if !self.checks() {
            return Ok(());
        }
        let Some(t) = self.tenant(endpoint, who)? else { return Ok(()) };
        let why = match &e.found {
            Some(Ok(Found::Exact { cgroup })) if *cgroup == t.cgroup_id => return Ok(()),
            Some(Ok(Found::Exact { .. })) if e.repaired => {
                "the one connection it fits is another tenant's (not made in this client's cgroup)"
                    .to_string()
            }
            Some(Ok(Found::Exact { .. })) => {
                "the connection belongs to another tenant (it was not made in this client's cgroup)"
                    .to_string()
            }
            Some(Ok(Found::Missing)) => {
                "no such TCP connection in the client's network namespace".to_string()
            }
            Some(Ok(Found::Ambiguous(_))) => "several connections fit it".to_string(),
            Some(Ok(Found::Repaired { .. })) | None => "it was not looked up".to_string(),
            Some(Err(e)) => e.clone(),
        };
        let (flow, repaired) = (e.sent, e.repaired.then_some(e.flow));
        let message = || {
            format!("flow {} -> {} is not this client's: {why} (workload {})", flow.src, flow.dst, t.name())
        };
        let detail = || repaired.map(|f| format!("it fits {} -> {}", f.src, f.dst)).unwrap_or_default();
        self.refuse_detailed(endpoint, Refusal::Flow, who, message, detail)
    }
}

/// What a GPU refusal adds when the client's open files were not all read.
fn files_read(files: FilesRead) -> String {
    let last = super::held::SCAN_LIMIT - 1;
    match files {
        FilesRead::All => String::new(),
        FilesRead::UpToLimit => format!(
            " among its descriptors 0 to {last}; it held more when it was first seen, and the daemon reads no \
             further (CUDA opens its device nodes at cuInit: initialise CUDA before opening many files)"
        ),
        FilesRead::Unknown | FilesRead::None(_) => {
            format!(" among its descriptors 0 to {last} (the daemon reads no further)")
        }
    }
}

/// The daemon's own network namespace (its main thread's), opened once.
fn own_netns() -> Option<&'static NetNs> {
    static OWN: OnceLock<Option<NetNs>> = OnceLock::new();
    OWN.get_or_init(|| {
        let fd: std::os::fd::OwnedFd = std::fs::File::open("/proc/self/ns/net").ok()?.into();
        let inode = nix::sys::stat::fstat(std::os::fd::AsFd::as_fd(&fd)).ok()?.st_ino;
        Some(NetNs::new(inode, fd))
    })
    .as_ref()
}

mod rules;

mod later;
pub use later::LATER_QUEUE;

#[cfg(test)]
mod tests;
