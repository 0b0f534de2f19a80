//! `deploy/monitoring/`: the Grafana dashboard and the Prometheus alert rules
//! load, and every metric they name exists in a freshly started daemon's
//! `/metrics` (with a sample, so that panels and alerts never show "no data").

use std::collections::{BTreeSet, HashMap};

mod common;
use common::Daemon;

const DASHBOARD: &str = include_str!("../deploy/monitoring/grafana-dashboard.json");
const ALERTS: &str = include_str!("../deploy/monitoring/prometheus-alerts.yaml");

/// Every `tcpx_rxdm_…` identifier in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("tcpx_rxdm_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every `expr` string anywhere in the dashboard JSON.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// `# TYPE` of each family, and the sample names that have at least one line.
fn exposition(body: &str) -> (HashMap<String, String>, BTreeSet<String>) {
    let mut types = HashMap::new();
    let mut samples = BTreeSet::new();
    for line in body.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut w = t.split_whitespace();
            types.insert(w.next().unwrap().to_string(), w.next().unwrap().to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            samples.insert(line.split(['{', ' ']).next().unwrap().to_string());
        }
    }
    (types, samples)
}

/// One alert rule of the YAML file, as lines.
struct Rule {
    name: String,
    body: String,
}

/// A minimal reading of a Prometheus rule file: `groups:`, then `- alert:`
/// entries, each with the keys Prometheus and Alertmanager need.
fn alert_rules(yaml: &str) -> Vec<Rule> {
    let content: Vec<&str> =
        yaml.lines().filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty()).collect();
    assert_eq!(content.first().copied(), Some("groups:"), "a rule file starts with groups:");
    assert!(content.iter().any(|l| l.trim_start().starts_with("- name: ")), "a named group");
    let mut rules: Vec<Rule> = Vec::new();
    for line in content {
        if let Some(name) = line.trim_start().strip_prefix("- alert: ") {
            rules.push(Rule { name: name.trim().to_string(), body: String::new() });
        } else if let Some(r) = rules.last_mut() {
            assert!(!line.contains('\t'), "YAML must not indent with tabs: {line:?}");
            r.body.push_str(line);
            r.body.push('\n');
        }
    }
    rules
}

#[test]
fn dashboard_and_alerts_name_only_metrics_the_daemon_exports() {
    let dash: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard is JSON");
    assert_eq!(dash["uid"], "tcpx-rxdm");
    let panels = dash["panels"].as_array().expect("panels");
    for p in panels {
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()), "{p}");
        assert!(p["targets"].as_array().is_some_and(|t| !t.is_empty()), "panel without queries: {p}");
    }
    let mut dash_exprs = Vec::new();
    exprs(&dash, &mut dash_exprs);
    let dash_names: BTreeSet<String> = dash_exprs.iter().flat_map(|e| metric_names(e)).collect();
    // What the dashboard must show.
    for want in [
        "tcpx_rxdm_rule_requests_total",
        "tcpx_rxdm_rule_latency_seconds_bucket",
        "tcpx_rxdm_rules_installed",
        "tcpx_rxdm_rule_slots",
        "tcpx_rxdm_registered_applications",
        "tcpx_rxdm_pool_size_bytes",
        "tcpx_rxdm_nic_op_failures_total",
        "tcpx_rxdm_queue_rx_bytes_total",
        "tcpx_rxdm_steering_miss",
    ] {
        assert!(dash_names.contains(want), "dashboard lacks {want}");
    }

    let rules = alert_rules(ALERTS);
    let names: BTreeSet<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), rules.len(), "alert names are unique");
    for r in &rules {
        for key in ["expr:", "labels:", "severity:", "annotations:", "summary:"] {
            assert!(r.body.contains(key), "alert {} lacks {key}", r.name);
        }
    }
    let alert_names: BTreeSet<String> = rules.iter().flat_map(|r| metric_names(&r.body)).collect();
    for want in [
        "tcpx_rxdm_ready",
        "tcpx_rxdm_rule_slots",
        "tcpx_rxdm_nic_op_failures_total",
        "tcpx_rxdm_steering_miss",
    ] {
        assert!(alert_names.contains(want), "no alert on {want}");
    }

    let d = Daemon::start(&[]);
    let (status, body) = d.http_get("/metrics");
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"tcpx_rxdm_nic_info{binder="none",header_split="priv_flags",nic="eth4"} 1"#),
        "{body}"
    );
    let (types, samples) = exposition(&body);
    for name in dash_names.iter().chain(&alert_names) {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s).filter(|base| types.get(*base).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "{name}: no family {family} in /metrics");
        let sample = match types.get(name).map(String::as_str) {
            // A histogram named by its family (in prose): its series are the _count etc.
            Some("histogram") => format!("{name}_count"),
            _ => name.clone(),
        };
        assert!(samples.contains(&sample), "{name}: no sample at startup in /metrics");
    }
}
