//! The registry: every family registered once, with its zero-valued series
//! from startup, and the text exposition.

use std::collections::VecDeque;
use std::sync::Mutex;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use super::{
    LeaseMetrics, Metrics, RuleOp, RuleSeries, ENDPOINT_KINDS, HTTP_TURNED_AWAY, KNOWN_ERRNOS,
    LINK_EVENT_KINDS, POOL_KINDS, RECENT_ERRORS,
};
use crate::types::status::ALL_CODES;

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
            requests_refused: counter(
                "tcpx_rxdm_requests_refused_total",
                "Requests refused by tenant isolation, by endpoint and reason; mode=\"audit\": served, but would have been refused.",
                &["endpoint", "reason", "mode"],
            ),
            ipv6_flows_repaired: counter(
                "tcpx_rxdm_ipv6_flows_repaired_total",
                "IPv6 rule requests named with only the first 8 bytes of each address (the NCCL plugin's) whose connection was found: the rule steers its true addresses; op install or uninstall.",
                &["op"],
            ),
            ipv6_repair_lookups: counter(
                "tcpx_rxdm_ipv6_repair_lookups_total",
                "IPv6 installs named with only the first 8 bytes of each address, looked up: outcome exact (found by exact lookups), dump (found in a dump), missing (fits no connection), ambiguous, failed (the lookup failed), busy (refused: too many of the client's waited).",
                &["outcome"],
            ),
            ipv6_repair_dumps: reg(
                &r,
                IntCounter::new(
                    "tcpx_rxdm_ipv6_repair_dumps_total",
                    "Dumps of a network namespace's connections for IPv6 installs that exact lookups did not settle; each serves every install of the namespace waiting then.",
                )
                .expect("valid metric"),
            ),
            audit_flow_checks_skipped: reg(
                &r,
                IntCounter::new(
                    "tcpx_rxdm_audit_flow_checks_skipped_total",
                    "IPv4 installs whose flow audit mode did not look up: 4096 checks already waited.",
                )
                .expect("valid metric"),
            ),
            connections_over_share: reg(
                &r,
                IntCounter::new(
                    "tcpx_rxdm_connections_over_share_total",
                    "Registry and pool connections refused because their workload held three quarters of --max_connections.",
                )
                .expect("valid metric"),
            ),
            ipv6_repairs_waiting: reg(
                &r,
                IntGauge::new(
                    "tcpx_rxdm_ipv6_repairs_waiting",
                    "IPv6 installs named with half their address bytes that wait to be looked up.",
                )
                .expect("valid metric"),
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
            http_turned_away: counter(
                "tcpx_rxdm_http_turned_away_total",
                "HTTP connections let go unserved: evicted (closed unanswered, no request head yet when a newer connection needed its place) or busy (told 503, every request slot taken).",
                &["reason"],
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
                tenant_reads_waiting: reg(
                    &r,
                    IntGauge::new(
                        "tcpx_rxdm_tenant_reads_waiting",
                        "New client processes whose tenant waits to be read.",
                    )
                    .expect("valid metric"),
                ),
                tenant_reads_refused: reg(
                    &r,
                    IntCounter::new(
                        "tcpx_rxdm_tenant_reads_refused_total",
                        "New client processes not identified because too many of their cgroup's waited to be read.",
                    )
                    .expect("valid metric"),
                ),
                tenant_reads_slow: reg(
                    &r,
                    IntCounter::new(
                        "tcpx_rxdm_tenant_reads_slow_total",
                        "Tenant reads still running when a connection had waited 2 s for them: its request got UNAVAILABLE, and the read's thread stopped counting as a reader.",
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
            queue_rx_bytes: counter(
                "tcpx_rxdm_queue_rx_bytes_total",
                "Bytes received per NIC receive queue; role gpu (bound to a pool) or rss (host queues).",
                &["nic", "queue", "role"],
            ),
            steering_miss: gauge(
                "tcpx_rxdm_steering_miss",
                "1 while rules are installed but traffic lands on the host (RSS) queues and none on GPU queues.",
                &["nic"],
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
        for op in [RuleOp::Install, RuleOp::Uninstall] {
            m.ipv6_flows_repaired.with_label_values(&[op.name()]);
        }
        for outcome in super::REPAIR_OUTCOMES {
            m.ipv6_repair_lookups.with_label_values(&[outcome]);
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
        for r in HTTP_TURNED_AWAY {
            m.http_turned_away.with_label_values(&[r]);
        }
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            m.registry.register(Box::new(pc)).expect("process collector registers once");
        }
        m
    }

    /// Creates the zero-valued series of every family labelled by NIC, GPU or
    /// queue, for the NICs, GPUs and queues of `topo`.
    pub fn init_topology(&self, topo: &crate::types::topology::Topology) {
        self.init_nics(topo.nics.iter().map(|n| n.ifname.as_str()));
        for (nic, gpu) in topo.gpus() {
            self.pool_bytes.with_label_values(&[&gpu.pci.to_string()]);
            for q in &gpu.queues {
                self.rules_by_queue.with_label_values(&[nic.ifname.as_str(), &q.to_string()]);
                self.queue_rx_bytes.with_label_values(&[nic.ifname.as_str(), &q.to_string(), "gpu"]);
            }
        }
        for nic in &topo.nics {
            for q in 0..topo.rss_set_size {
                self.queue_rx_bytes.with_label_values(&[nic.ifname.as_str(), &q.to_string(), "rss"]);
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
            self.steering_miss.with_label_values(&[nic]);
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
            r#"tcpx_rxdm_ipv6_flows_repaired_total{op="uninstall"} 0"#,
            r#"tcpx_rxdm_ipv6_repair_lookups_total{outcome="busy"} 0"#,
            "tcpx_rxdm_ipv6_repair_dumps_total 0",
            "tcpx_rxdm_audit_flow_checks_skipped_total 0",
            "tcpx_rxdm_connections_over_share_total 0",
            "tcpx_rxdm_ipv6_repairs_waiting 0",
            r#"tcpx_rxdm_link_events_total{kind="reset",nic="eth1"} 0"#,
            r#"tcpx_rxdm_connections{endpoint="rule_manager"} 0"#,
            r#"tcpx_rxdm_http_turned_away_total{reason="evicted"} 0"#,
            "tcpx_rxdm_lease_clients 0",
            "tcpx_rxdm_connections_without_lease_total 0",
            "tcpx_rxdm_tenant_reads_waiting 0",
            "tcpx_rxdm_tenant_reads_refused_total 0",
            "tcpx_rxdm_tenant_reads_slow_total 0",
            "tcpx_rxdm_ready 0",
            r#"tcpx_rxdm_pool_size_bytes{gpu="0000:8b:00.0"} 0"#,
            r#"tcpx_rxdm_rules_by_queue{nic="eth4",queue="15"} 0"#,
            r#"tcpx_rxdm_queue_rx_bytes_total{nic="eth1",queue="0",role="rss"} 0"#,
            r#"tcpx_rxdm_queue_rx_bytes_total{nic="eth4",queue="15",role="gpu"} 0"#,
            r#"tcpx_rxdm_steering_miss{nic="eth3"} 0"#,
        ] {
            assert!(text.contains(want), "{want} missing");
        }
    }
}
