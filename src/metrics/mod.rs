//! Prometheus metrics and the HTTP endpoints that expose them.
//!
//! Every family is named `tcpx_rxdm_…` with its unit in the name, and every
//! family has series from startup: zero-valued ones for the label values known
//! then (each NIC, GPU and queue once [`Metrics::init_topology`] ran, each rule op and result
//! code, each endpoint kind), so that alerts never see "no data". Failures are
//! also kept in a small ring of recent errors for `tcpx-rxdm status`.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::SystemTime;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::nic::NicError;
use crate::types::status::{StatusCode, ALL_CODES};

/// How many recent errors [`Metrics::recent_errors`] keeps.
pub const RECENT_ERRORS: usize = 20;

/// Errnos whose NIC operation failure series exist from startup (per NIC, for
/// `add_rule` and `del_rule`); others appear with their first failure.
pub const KNOWN_ERRNOS: [&str; 6] = ["EBUSY", "EAGAIN", "ENOSPC", "EINVAL", "EIO", "EOPNOTSUPP"];

/// Pool request kinds (`pool_requests_total{kind}`).
pub const POOL_KINDS: [&str; 3] = ["fd", "metadata", "ipc_handle"];

/// Endpoint kinds (`connections{endpoint}`), as `server::Endpoint::kind` names them.
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

/// Link event kinds (`link_events_total{kind}`).
pub const LINK_EVENT_KINDS: [&str; 3] = ["link_down", "removed", "reset"];

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
    pub registered_apps: IntGauge,
    pub connections: IntGaugeVec,
    pub connections_total: IntCounterVec,
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
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    r.register(Box::new(m.clone())).expect("metric names are unique");
    m
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let latency_buckets = vec![
            5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3, 0.25, 1.0,
        ];
        let counter = |name: &str, help: &str, labels: &[&str]| {
            reg(&r, IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            reg(&r, IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
        };
        let hist = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                HistogramVec::new(HistogramOpts::new(name, help).buckets(latency_buckets.clone()), labels)
                    .expect("valid metric"),
            )
        };
        let rule_requests = counter(
            "tcpx_rxdm_rule_requests_total",
            "Flow-steering requests by operation and result code.",
            &["op", "code"],
        );
        let rule_latency = hist(
            "tcpx_rxdm_rule_latency_seconds",
            "Rule request latency, request received to reply queued.",
            &["op"],
        );
        let m = Metrics {
            nic_op_latency: hist(
                "tcpx_rxdm_nic_op_latency_seconds",
                "Latency of NIC rule operations.",
                &["op"],
            ),
            rules_installed: gauge(
                "tcpx_rxdm_rules_installed",
                "Steering rules installed per NIC.",
                &["nic"],
            ),
            rules_by_queue: gauge(
                "tcpx_rxdm_rules_by_queue",
                "Steering rules per NIC queue.",
                &["nic", "queue"],
            ),
            rule_slots: gauge("tcpx_rxdm_rule_slots", "Rule slots per NIC.", &["nic"]),
            pool_bytes: gauge("tcpx_rxdm_pool_size_bytes", "Receive pool size per GPU, in bytes.", &["gpu"]),
            pool_requests: counter(
                "tcpx_rxdm_pool_requests_total",
                "Pool fd/metadata/handle requests by kind and result code.",
                &["kind", "code"],
            ),
            registered_apps: reg(
                &r,
                IntGauge::new("tcpx_rxdm_registered_applications", "Registered client applications.")
                    .expect("valid metric"),
            ),
            connections: gauge(
                "tcpx_rxdm_connections",
                "Open client connections per endpoint kind.",
                &["endpoint"],
            ),
            connections_total: counter(
                "tcpx_rxdm_connections_total",
                "Accepted client connections per endpoint kind.",
                &["endpoint"],
            ),
            link_events: counter(
                "tcpx_rxdm_link_events_total",
                "Link events on managed NICs.",
                &["nic", "kind"],
            ),
            ready: reg(
                &r,
                IntGauge::new("tcpx_rxdm_ready", "1 once startup finished, 0 when shutting down.")
                    .expect("valid metric"),
            ),
            nic_op_failures: counter(
                "tcpx_rxdm_nic_op_failures_total",
                "NIC operations that failed, by NIC, operation and errno.",
                &["nic", "op", "errno"],
            ),
            restore_failures: counter(
                "tcpx_rxdm_restore_failures_total",
                "Restore steps that failed at shutdown or rollback (nic=\"host\": host tuning).",
                &["nic"],
            ),
            leases: LeaseMetrics {
                clients: reg(
                    &r,
                    IntGauge::new("tcpx_rxdm_lease_clients", "Client processes tracked by a pidfd.")
                        .expect("valid metric"),
                ),
                connections_without_lease: reg(
                    &r,
                    IntCounter::new(
                        "tcpx_rxdm_connections_without_lease_total",
                        "Connections whose client process could not be identified, so nothing they install is removed when it exits.",
                    )
                    .expect("valid metric"),
                ),
            },
            foreign_slots: gauge(
                "tcpx_rxdm_foreign_rule_slots",
                "Rule slots found holding rules this daemon did not install (kept out of use).",
                &["nic"],
            ),
            rule_deletes_pending: gauge(
                "tcpx_rxdm_rule_deletes_pending",
                "Rules the NIC refused to delete, retried in the background.",
                &["nic"],
            ),
            rule_delete_retries: counter(
                "tcpx_rxdm_rule_delete_retries_total",
                "Background retries of refused rule deletes.",
                &["nic"],
            ),
            lease_rules_reclaimed: reg(
                &r,
                IntCounter::new(
                    "tcpx_rxdm_lease_rules_reclaimed_total",
                    "Rules removed because the client process that installed them exited.",
                )
                .expect("valid metric"),
            ),
            nic_info: gauge(
                "tcpx_rxdm_nic_info",
                "Constant 1 per managed NIC, labelled with its header-split family and queue binder.",
                &["nic", "header_split", "binder"],
            ),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_ERRORS)),
            started: std::time::Instant::now(),
            rule_series: RuleSeries {
                requests: [RuleOp::Install, RuleOp::Uninstall]
                    .map(|op| ALL_CODES.map(|c| rule_requests.with_label_values(&[op.name(), c.name()]))),
                latency: [RuleOp::Install, RuleOp::Uninstall]
                    .map(|op| rule_latency.with_label_values(&[op.name()])),
            },
            rule_requests,
            rule_latency,
            registry: r.clone(),
        };
        let build = gauge("tcpx_rxdm_build_info", "Build information.", &["version"]);
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        for op in [RuleOp::Install, RuleOp::Uninstall] {
            for code in ALL_CODES {
                m.rule_requests.with_label_values(&[op.name(), code.name()]);
            }
        }
        for op in ["add_rule", "del_rule"] {
            m.nic_op_latency.with_label_values(&[op]);
        }
        for kind in POOL_KINDS {
            for code in ALL_CODES {
                m.pool_requests.with_label_values(&[kind, code.name()]);
            }
        }
        for e in ENDPOINT_KINDS {
            m.connections.with_label_values(&[e]);
            m.connections_total.with_label_values(&[e]);
        }
        m.restore_failures.with_label_values(&["host"]);
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            m.registry.register(Box::new(pc)).expect("process collector registers once");
        }
        m
    }

    /// Counts one rule request and its latency.
    pub fn rule_done(&self, op: RuleOp, code: StatusCode, seconds: f64) {
        let i = ALL_CODES.iter().position(|c| *c == code).expect("every code is listed");
        self.rule_series.requests[op as usize][i].inc();
        self.rule_series.latency[op as usize].observe(seconds);
    }

    /// Creates the zero-valued series of every family labelled by NIC, GPU or
    /// queue, for the NICs, GPUs and queues of `topo`.
    pub fn init_topology(&self, topo: &crate::types::topology::Topology) {
        self.init_nics(topo.nics.iter().map(|n| n.ifname.as_str()));
        for (nic, gpu) in topo.gpus() {
            self.pool_bytes.with_label_values(&[&gpu.pci.to_string()]);
            for q in &gpu.queues {
                self.rules_by_queue.with_label_values(&[nic.ifname.as_str(), &q.to_string()]);
            }
        }
    }

    /// Creates the zero-valued per-NIC series of every family labelled by NIC.
    pub fn init_nics<'a>(&self, nics: impl IntoIterator<Item = &'a str>) {
        for nic in nics {
            self.rules_installed.with_label_values(&[nic]);
            self.rule_slots.with_label_values(&[nic]);
            self.restore_failures.with_label_values(&[nic]);
            self.foreign_slots.with_label_values(&[nic]);
            self.rule_deletes_pending.with_label_values(&[nic]);
            self.rule_delete_retries.with_label_values(&[nic]);
            for kind in LINK_EVENT_KINDS {
                self.link_events.with_label_values(&[nic, kind]);
            }
            for op in ["add_rule", "del_rule"] {
                for errno in KNOWN_ERRNOS {
                    self.nic_op_failures.with_label_values(&[nic, op, errno]);
                }
            }
        }
    }

    /// Counts a failed NIC operation and remembers it for `status`.
    pub fn nic_op_failed(&self, e: &NicError) {
        let errno = format!("{:?}", e.errno);
        self.nic_op_failures.with_label_values(&[e.ifname.as_str(), e.op.name(), &errno]).inc();
        self.remember("nic_op", &e.ifname, e.to_string());
    }

    /// Counts a failed restore step (`nic` = `"host"` for host tuning) and remembers it.
    pub fn restore_failed(&self, nic: &str, message: &str) {
        self.restore_failures.with_label_values(&[nic]).inc();
        self.remember("restore", nic, message.to_string());
    }

    /// Sets the info series of one NIC (a previous one for the NIC is replaced).
    pub fn set_nic_info(&self, nic: &str, header_split: &str, binder: &str) {
        let _ = self.nic_info.remove_label_values(&[nic, header_split, binder]);
        self.nic_info.with_label_values(&[nic, header_split, binder]).set(1);
    }

    /// Time since these metrics were created (the daemon's start).
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Adds a line to the ring of recent errors (the oldest falls out).
    pub fn remember(&self, kind: &str, nic: &str, message: String) {
        let time =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let mut ring = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == RECENT_ERRORS {
            ring.pop_front();
        }
        ring.push_back(RecentError { time, kind: kind.to_string(), nic: nic.to_string(), message });
    }

    /// The remembered errors, oldest first.
    pub fn recent_errors(&self) -> Vec<RecentError> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding cannot fail");
        String::from_utf8(buf).expect("text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::NicOp;
    use nix::errno::Errno;

    #[test]
    fn families_have_series_from_startup_and_carry_the_program_name() {
        let m = Metrics::new();
        let topo = crate::config::presets::topology_from_text(crate::config::presets::SIM, "sim").unwrap();
        m.init_topology(&topo);
        let text = m.render();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(name.starts_with("tcpx_rxdm_") || name.starts_with("process_"), "{line}");
        }
        for want in [
            r#"tcpx_rxdm_rule_requests_total{code="RESOURCE_EXHAUSTED",op="install"} 0"#,
            r#"tcpx_rxdm_nic_op_failures_total{errno="EBUSY",nic="eth2",op="add_rule"} 0"#,
            r#"tcpx_rxdm_restore_failures_total{nic="host"} 0"#,
            "tcpx_rxdm_lease_rules_reclaimed_total 0",
            r#"tcpx_rxdm_link_events_total{kind="reset",nic="eth1"} 0"#,
            r#"tcpx_rxdm_connections{endpoint="rule_manager"} 0"#,
            "tcpx_rxdm_lease_clients 0",
            "tcpx_rxdm_connections_without_lease_total 0",
            "tcpx_rxdm_ready 0",
            r#"tcpx_rxdm_pool_size_bytes{gpu="0000:8b:00.0"} 0"#,
            r#"tcpx_rxdm_rules_by_queue{nic="eth4",queue="15"} 0"#,
        ] {
            assert!(text.contains(want), "{want} missing");
        }
    }

    #[test]
    fn failures_count_by_errno_and_the_ring_keeps_the_last_ones() {
        let m = Metrics::new();
        for i in 0..(RECENT_ERRORS + 5) {
            m.nic_op_failed(
                &NicError::new("eth3", NicOp::AddRule, Errno::ENOSPC).with_detail(format!("#{i}")),
            );
        }
        m.restore_failed("eth3", "restore RSS table: EIO");
        let text = m.render();
        let want = format!(
            r#"tcpx_rxdm_nic_op_failures_total{{errno="ENOSPC",nic="eth3",op="add_rule"}} {}"#,
            RECENT_ERRORS + 5
        );
        assert!(text.contains(&want), "{text}");
        assert!(text.contains(r#"tcpx_rxdm_restore_failures_total{nic="eth3"} 1"#));
        let ring = m.recent_errors();
        assert_eq!(ring.len(), RECENT_ERRORS);
        assert_eq!(ring.last().unwrap().kind, "restore");
        assert!(ring[0].message.contains("#6"), "oldest kept is the 7th: {}", ring[0].message);
    }
}
