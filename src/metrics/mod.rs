//! Prometheus metrics (SPEC §8) and the HTTP endpoints that expose them.

pub mod http;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::wire::frame::{Code, ALL_CODES};

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
    pub leases: LeaseMetrics,
    pub foreign_slots: IntGaugeVec,
    pub rule_deletes_pending: IntGaugeVec,
    pub rule_delete_retries: IntCounterVec,
    pub lease_rules_reclaimed: IntCounter,
    rule_series: RuleSeries,
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
            "tcpx_rule_requests_total",
            "Flow-steering requests by operation and result code.",
            &["op", "code"],
        );
        let rule_latency = hist(
            "tcpx_rule_latency_seconds",
            "Rule request latency, request received to reply queued.",
            &["op"],
        );
        let m = Metrics {
            nic_op_latency: hist("tcpx_nic_op_latency_seconds", "Latency of NIC rule operations.", &["op"]),
            rules_installed: gauge("tcpx_rules_installed", "Steering rules installed per NIC.", &["nic"]),
            rules_by_queue: gauge("tcpx_rules_by_queue", "Steering rules per NIC queue.", &["nic", "queue"]),
            rule_slots: gauge("tcpx_rule_slots", "Rule slots per NIC.", &["nic"]),
            pool_bytes: gauge("tcpx_pool_bytes", "Receive pool size per GPU.", &["gpu"]),
            pool_requests: counter(
                "tcpx_pool_requests_total",
                "Pool fd/metadata/handle requests by kind and result code.",
                &["kind", "code"],
            ),
            registered_apps: reg(
                &r,
                IntGauge::new("tcpx_registered_applications", "Registered client applications.")
                    .expect("valid metric"),
            ),
            connections: gauge(
                "tcpx_connections",
                "Open client connections per endpoint kind.",
                &["endpoint"],
            ),
            connections_total: counter(
                "tcpx_connections_total",
                "Accepted client connections per endpoint kind.",
                &["endpoint"],
            ),
            link_events: counter("tcpx_link_events_total", "Link events on managed NICs.", &["nic", "kind"]),
            ready: reg(
                &r,
                IntGauge::new("tcpx_ready", "1 once startup finished, 0 when shutting down.")
                    .expect("valid metric"),
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
        let build = gauge("tcpx_build_info", "Build information.", &["version"]);
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            m.registry.register(Box::new(pc)).expect("process collector registers once");
        }
        m
    }

    /// Counts one rule request and its latency.
    pub fn rule_done(&self, op: RuleOp, code: Code, seconds: f64) {
        let i = ALL_CODES.iter().position(|c| *c == code).expect("every code is listed");
        self.rule_series.requests[op as usize][i].inc();
        self.rule_series.latency[op as usize].observe(seconds);
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
