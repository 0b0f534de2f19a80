//! The topology as the `GpuRxqConfigurationList` message carries it: defaults
//! for absent fields and PCI addresses normalised. Structure is checked by
//! [`Topology::validate`].

use crate::types::pci::{PciAddr, PciAddrError};
use crate::types::topology::{
    GpuSpec, NicSpec, Topology, TopologyError, DEFAULT_MAX_RX_RULES, DEFAULT_POOL_SIZE, DEFAULT_QUEUES,
};
use crate::wire::proto;

/// Builds a topology from the message, applying defaults for absent fields.
/// PCI addresses are normalised; structure is validated by [`Topology::validate`].
pub fn from_proto(msg: &proto::GpuRxqConfigurationList) -> Result<Topology, TopologyError> {
    let positive = |field: &'static str, v: Option<i32>, default: u32| match v {
        None => Ok(default),
        Some(x) if x > 0 => Ok(x as u32),
        Some(x) => Err(TopologyError::NotPositive { field, value: x as i64 }),
    };
    let mut nics = Vec::new();
    for (i, cfg) in msg.gpu_rxq_configs.iter().enumerate() {
        let ifname = cfg.ifname.clone().filter(|s| !s.is_empty()).ok_or(TopologyError::MissingIfname(i))?;
        let pci = match cfg.nic_pci_addr.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(s.parse().map_err(|e: PciAddrError| TopologyError::BadNicPci {
                nic: ifname.clone(),
                err: e.to_string(),
            })?),
        };
        let mut gpus = Vec::new();
        for g in &cfg.gpu_infos {
            let pci: PciAddr =
                g.gpu_pci_addr.as_deref().unwrap_or("").parse().map_err(|e: PciAddrError| {
                    TopologyError::BadGpuPci { nic: ifname.clone(), err: e.to_string() }
                })?;
            gpus.push(GpuSpec { pci, queues: g.queue_ids.clone() });
        }
        nics.push(NicSpec { ifname, pci, gpus });
    }
    let rx_pool_size = match msg.rx_pool_size {
        None | Some(0) => DEFAULT_POOL_SIZE,
        Some(x) => x,
    };
    Ok(Topology {
        nics,
        max_rx_rules: positive("max_rx_rules", msg.max_rx_rules, DEFAULT_MAX_RX_RULES)?,
        tcpd_queue_size: positive("tcpd_queue_size", msg.tcpd_queue_size, DEFAULT_QUEUES)?,
        rss_set_size: positive("rss_set_size", msg.rss_set_size, DEFAULT_QUEUES)?,
        rx_pool_size,
    })
}
