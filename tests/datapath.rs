//! Datapath health on a running daemon (sim NICs): the per-queue counters and
//! the steering-miss gauge are on `/metrics` from startup, and `status` and
//! `doctor` report each NIC's state. (Misses themselves are driven through the
//! simulated NIC's counters in `daemon::datapath`'s tests, on a fake clock.)

mod common;

use common::{run_bin, Daemon};
use serde_json::json;
use tcpx_rxdm::server::status::status_text;

#[test]
fn metrics_status_and_doctor_show_the_datapath_from_startup() {
    let d = Daemon::start(&[]);
    let (code, body) = d.http_get("/metrics");
    assert_eq!(code, 200);
    for nic in ["eth1", "eth2", "eth3", "eth4"] {
        assert!(body.contains(&format!("tcpx_rxdm_steering_miss{{nic=\"{nic}\"}} 0")), "{body}");
        for (q, role) in [(0, "rss"), (7, "rss"), (8, "gpu"), (15, "gpu")] {
            let series =
                format!("tcpx_rxdm_queue_rx_bytes_total{{nic=\"{nic}\",queue=\"{q}\",role=\"{role}\"}} 0");
            assert!(body.contains(&series), "{series} missing");
        }
    }
    // Queue 8 (eth1's first GPU queue) is not an RSS queue.
    assert!(!body.contains(r#"queue="8",role="rss""#));

    let uds = d.uds_arg();
    let (code, out, err) = run_bin(&["status", "--json", &uds]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for n in v["nics"].as_array().unwrap() {
        assert_eq!(n["steering_miss"], false, "{n}");
        assert_eq!(n["rx_bytes_by_role"]["gpu"], 0, "{n}");
        assert_eq!(n["rx_bytes_by_role"]["rss"], 0, "{n}");
    }
    let (_, text, _) = run_bin(&["status", &uds]);
    assert!(text.contains("received: 0 B on GPU queues, 0 B on host (RSS) queues"), "{text}");

    let (_, out, err) = run_bin(&["doctor", "--json", "--gpu_nic_preset=sim", &uds]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let lines: Vec<&serde_json::Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["section"] == "datapath (running daemon)")
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for l in lines {
        assert_eq!(l["status"], "pass", "{l}");
        assert!(l["found"].as_str().unwrap().starts_with("no steering miss"), "{l}");
    }
}

#[test]
fn doctor_without_a_daemon_skips_the_datapath() {
    let dir = tempfile::tempdir().unwrap();
    let uds = format!("--uds_path={}", dir.path().display());
    let (_, out, _) = run_bin(&["doctor", "--json", "--gpu_nic_preset=sim", &uds]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let line =
        v["checks"].as_array().unwrap().iter().find(|c| c["section"] == "datapath (running daemon)").unwrap();
    assert_eq!(line["status"], "skip");
}

#[test]
fn status_text_shows_a_steering_miss_under_its_nic() {
    let nic = |name: &str, miss: bool| {
        json!({ "ifname": name, "rules": 3, "slots": 10, "slots_free": 7, "rules_by_queue": [],
                "steering_miss": miss, "rx_bytes_by_role": { "gpu": 2048, "rss": 0 } })
    };
    let v = json!({ "version": "x", "pid": 1, "ready": true, "uptime_seconds": 1.0,
                    "nics": [nic("eth1", false), nic("eth2", true)] });
    let text = status_text(&v);
    let eth2 = text.split("  eth2:").nth(1).unwrap();
    assert!(eth2.contains("    STEERING MISS: rules are installed"), "{text}");
    let eth1 = text.split("  eth1:").nth(1).unwrap().split("  eth2:").next().unwrap();
    assert!(eth1.contains("received: 2.0 KiB on GPU queues, 0 B on host (RSS) queues"), "{text}");
    assert!(!eth1.contains("STEERING MISS"), "{text}");
}
