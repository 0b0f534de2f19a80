//! Prometheus metrics (the daemon's HTTP routes serve them at `/metrics`).
//!
//! Every family is named `tcpx_rxdm_…` with its unit in the name, and every
//! family has series from startup: zero-valued ones for the label values known
//! then (each NIC, GPU and queue once [`Metrics::init_topology`] ran, each rule op and result
//! code, each endpoint kind), so that alerts never see "no data". Failures are
//! also kept in a small ring of recent errors for `tcpx-rxdm status`.

mod families;
mod record;

pub use record::RuleLocal;

use std::collections::VecDeque;
use std::sync::Mutex;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use crate::types::status::ALL_CODES;

/// How many recent errors [`Metrics::recent_errors`] keeps.
pub const RECENT_ERRORS: usize = 20;

/// Errnos whose NIC operation failure series exist from startup (per NIC, for
/// `add_rule` and `del_rule`); others appear with their first failure.
pub const KNOWN_ERRNOS: [&str; 6] = ["EBUSY", "EAGAIN", "ENOSPC", "EINVAL", "EIO", "EOPNOTSUPP"];

/// Pool request kinds (`pool_requests_total{kind}`).
pub const POOL_KINDS: [&str; 3] = ["fd", "metadata", "ipc_handle"];

/// Endpoint kinds (`connections{endpoint}`), as `endpoint::Endpoint::kind` names them.
pub const ENDPOINT_KINDS: [&str; 8] = [
    "rule_manager",
    "rule_uninstall",
    "queue_ids",
    "registry",
    "gpu_fd",
    "gpu_metadata",
    "gpu_ipc_handle",
    "status",
];

/// Why the HTTP server let a connection go unserved (`http_turned_away_total{reason}`),
/// as `server::http::TurnedAway` names it.
pub const HTTP_TURNED_AWAY: [&str; 2] = ["evicted", "busy"];

/// Link event kinds (`link_events_total{kind}`).
pub const LINK_EVENT_KINDS: [&str; 3] = ["link_down", "removed", "reset"];

/// How the lookup of a garbled IPv6 install ended (`tcpx_rxdm_ipv6_repair_lookups_total`).
pub const REPAIR_OUTCOMES: [&str; 6] = ["exact", "dump", "missing", "ambiguous", "failed", "busy"];

/// One remembered failure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecentError {
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// `nic_op`, `restore`, or another short kind.
    pub kind: String,
    pub nic: String,
    pub message: String,
}

/// Rule operations, as metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleOp {
    Install = 0,
    Uninstall = 1,
}

impl RuleOp {
    pub fn name(self) -> &'static str {
        match self {
            RuleOp::Install => "install",
            RuleOp::Uninstall => "uninstall",
        }
    }
}

/// Rule-request series resolved once, so the request path does no label hashing.
struct RuleSeries {
    requests: [[IntCounter; ALL_CODES.len()]; 2],
    latency: [Histogram; 2],
}

/// Every metric the daemon exports, registered on one registry.
pub struct Metrics {
    registry: Registry,
    pub rule_requests: IntCounterVec,
    pub rule_latency: HistogramVec,
    pub nic_op_latency: HistogramVec,
    pub rules_installed: IntGaugeVec,
    pub rules_by_queue: IntGaugeVec,
    pub rule_slots: IntGaugeVec,
    pub pool_bytes: IntGaugeVec,
    pub pool_requests: IntCounterVec,
    /// Requests refused (or, in audit mode, that would be) by tenant isolation.
    pub requests_refused: IntCounterVec,
    /// Garbled IPv6 rule requests repaired to their connection, by `op`.
    pub ipv6_flows_repaired: IntCounterVec,
    /// Garbled IPv6 installs looked up, by `outcome` ([`REPAIR_OUTCOMES`]).
    pub ipv6_repair_lookups: IntCounterVec,
    /// Dumps of a namespace's connections made for them.
    pub ipv6_repair_dumps: IntCounter,
    /// Audit mode's flow checks left out: the audit thread's queue was full.
    pub audit_flow_checks_skipped: IntCounter,
    /// Connections refused because their workload held its most already.
    pub connections_over_share: IntCounter,
    /// Garbled IPv6 installs waiting to be looked up now.
    pub ipv6_repairs_waiting: IntGauge,
    pub registered_apps: IntGauge,
    pub connections: IntGaugeVec,
    pub connections_total: IntCounterVec,
    /// HTTP connections let go unserved, by `reason` ([`HTTP_TURNED_AWAY`]).
    pub http_turned_away: IntCounterVec,
    pub link_events: IntCounterVec,
    pub ready: IntGauge,
    /// NIC operations that failed, by NIC, operation and errno name.
    pub nic_op_failures: IntCounterVec,
    /// NIC or host-tuning restore steps that failed (`nic="host"` for tuning).
    pub restore_failures: IntCounterVec,
    pub leases: LeaseMetrics,
    /// Rules removed because the client process that installed them exited.
    pub lease_rules_reclaimed: IntCounter,
    /// Constant 1 per NIC, labelled with its header-split family and binder.
    pub nic_info: IntGaugeVec,
    pub foreign_slots: IntGaugeVec,
    pub rule_deletes_pending: IntGaugeVec,
    pub rule_delete_retries: IntCounterVec,
    /// Bytes each receive queue got, by NIC, queue and role (`gpu`: bound to
    /// a pool; `rss`: the host's queues), read from the NIC when scraped.
    pub queue_rx_bytes: IntCounterVec,
    /// 1 while a NIC's steering misses: rules installed, host queues busy,
    /// GPU queues silent.
    pub steering_miss: IntGaugeVec,
    rule_series: RuleSeries,
    recent: Mutex<VecDeque<RecentError>>,
    started: std::time::Instant,
}

/// Client processes and their leases.
pub struct LeaseMetrics {
    /// Client processes tracked now.
    pub clients: IntGauge,
    /// Connections whose process could not be identified (no lease).
    pub connections_without_lease: IntCounter,
    /// New processes' tenant reads waiting for a reader now.
    pub tenant_reads_waiting: IntGauge,
    /// New processes whose tenant read was refused (too many waiting).
    pub tenant_reads_refused: IntCounter,
    /// Tenant reads still running when a connection had waited its limit
    /// for them (each read counted once).
    pub tenant_reads_slow: IntCounter,
}
