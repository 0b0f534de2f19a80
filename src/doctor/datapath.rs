//! The running daemon's view of its datapath: per NIC, whether traffic
//! reaches the GPU queues or lands on the host's (a steering miss). Asked
//! over the daemon's status socket; skipped when no daemon runs.

use serde_json::Value;

use super::report::{Report, Status};
use super::Ctx;

const SECTION: &str = "datapath (running daemon)";

/// What to check when a NIC misses its steering.
const MISS_FIX: &str = "check ntuple and header split on the NIC (`tcpx-rxdm doctor` above), that the \
     workload's NCCL_GPUDIRECTTCPX_SOCKET_IFNAME lists it (`tcpx-rxdm nccl-env --check`), and \
     docs/TROUBLESHOOTING.md";

pub(super) fn check_datapath(r: &mut Report, ctx: &Ctx) {
    let Some(pid) = &ctx.daemon else {
        let found = if ctx.daemon_unknown() {
            // The host section says why, and as whom to run to see it.
            "cannot tell whether a daemon serves --uds_path (see the host section's daemon line)"
        } else {
            "no daemon serves --uds_path"
        };
        r.add(SECTION, "daemon", Status::Skip, found, None);
        return;
    };
    match crate::server::status::ask(&ctx.flags.uds_path, "status") {
        Ok(v) => {
            for (name, status, found, fix) in nic_lines(&v) {
                r.add(SECTION, &name, status, found, fix);
            }
        }
        Err(e) => r.add(SECTION, "daemon", Status::Warn, format!("{pid} did not answer: {e}"), None),
    }
}

/// One line per NIC of a `status` reply.
fn nic_lines(v: &Value) -> Vec<(String, Status, String, Option<String>)> {
    let bytes = |n: &Value, role: &str| n["rx_bytes_by_role"][role].as_u64().unwrap_or(0);
    v["nics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let name = n["ifname"].as_str().unwrap_or("?").to_string();
            let counts = format!("{} B on GPU queues, {} B on host queues", bytes(n, "gpu"), bytes(n, "rss"));
            if n["steering_miss"].as_bool() == Some(true) {
                let found = format!(
                    "steering miss: {} rules installed, traffic on the host (RSS) queues, none on the GPU queues ({counts})",
                    n["rules"]
                );
                (name, Status::Fail, found, Some(MISS_FIX.to_string()))
            } else {
                (name, Status::Pass, format!("no steering miss ({counts})"), None)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nic_missing_its_steering_fails_and_the_others_pass() {
        let v = serde_json::json!({ "nics": [
            { "ifname": "eth1", "rules": 4, "steering_miss": false, "rx_bytes_by_role": { "gpu": 900, "rss": 10 } },
            { "ifname": "eth2", "rules": 4, "steering_miss": true, "rx_bytes_by_role": { "gpu": 0, "rss": 5000 } },
        ]});
        let lines = nic_lines(&v);
        assert_eq!(lines[0].1, Status::Pass);
        assert_eq!(lines[0].2, "no steering miss (900 B on GPU queues, 10 B on host queues)");
        assert_eq!(lines[1].0, "eth2");
        assert_eq!(lines[1].1, Status::Fail);
        assert!(lines[1].2.starts_with("steering miss: 4 rules installed"), "{}", lines[1].2);
        assert!(lines[1].3.as_deref().is_some_and(|f| f.contains("docs/TROUBLESHOOTING.md")));
    }
}
