//! `/debug/config`: what the daemon runs with, as JSON, fixed at startup.

use super::teardown::Node;
use super::{Backends, Config};

pub(super) fn config_json(config: &Config, b: &Backends, node: &Node) -> String {
    let (flags, topo) = (&config.flags, &config.topology);
    let nics: Vec<_> = node
        .primed
        .iter()
        .map(|p| {
            serde_json::json!({
                "ifname": p.ifname,
                "header_split": p.header_split,
                "channels": p.channels,
                "rule_capacity": p.rule_capacity,
                "rule_slots": topo.max_rx_rules.min(p.rule_capacity),
            })
        })
        .collect();
    let pools: Vec<_> = node
        .pools
        .iter()
        .map(|(g, p)| {
            serde_json::json!({ "gpu": g.to_string(), "size": p.size(), "alignment": p.alignment(), "pool": p.describe() })
        })
        .collect();
    let bindings: Vec<_> = node
        .bindings
        .iter()
        .map(|b| serde_json::json!({ "binding": b.describe(), "dmabuf_id": b.dmabuf_id() }))
        .collect();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "source": config.source.describe(),
        "uds_path": flags.uds_path.display().to_string(),
        "backends": { "nic": b.nic.backend(), "gpu": b.alloc.backend(), "bind": b.binder.backend() },
        "topology": topo,
        "nics": nics,
        "pools": pools,
        "bindings": bindings,
        "monitor_shutdown": flags.monitor_shutdown,
        "max_connections": flags.max_connections,
        "rule_io_threads": crate::steering::intake::io_threads(flags.rule_io_threads),
    })
    .to_string()
}
