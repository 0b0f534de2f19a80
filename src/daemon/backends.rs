//! Choosing the NIC, pool and binder backends from the flags (SPEC §3.1).

use std::sync::Arc;

use crate::config::flags::{BindBackendKind, Flags, GpuBackendKind, NicBackendKind};
use crate::config::presets::Source;
use crate::config::topology::Topology;
use crate::gpu::host::HostAllocator;
use crate::gpu::{NoBinder, PoolAllocator, QueueBinder};
use crate::nic::sim::SimNic;
use crate::nic::NicControl;

use super::DaemonError;

pub struct Backends {
    pub nic: Arc<dyn NicControl>,
    /// Set when the NIC backend is the simulator (test hooks, defaults).
    pub sim: Option<Arc<SimNic>>,
    pub alloc: Arc<dyn PoolAllocator>,
    pub binder: Arc<dyn QueueBinder>,
}

pub fn select(flags: &Flags, topo: &Topology, source: &Source) -> Result<Backends, DaemonError> {
    let use_sim = match flags.nic_backend {
        NicBackendKind::Sim => true,
        NicBackendKind::Auto => *source == Source::Preset("sim"),
        NicBackendKind::Ethtool => false,
    };
    let (nic, sim): (Arc<dyn NicControl>, Option<Arc<SimNic>>) = if use_sim {
        let ifnames: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        let sim = Arc::new(SimNic::new(&ifnames));
        for f in &flags.sim_fault {
            sim.inject(f.clone());
        }
        (sim.clone(), Some(sim))
    } else {
        return Err(DaemonError::Runtime("the ethtool NIC backend is not available in this build".into()));
    };
    if !flags.sim_fault.is_empty() && sim.is_none() {
        return Err(DaemonError::Config("--sim_fault needs --nic_backend=sim".into()));
    }
    let alloc: Arc<dyn PoolAllocator> = match flags.gpu_backend {
        GpuBackendKind::Host => Arc::new(HostAllocator),
        GpuBackendKind::Auto if sim.is_some() => Arc::new(HostAllocator),
        GpuBackendKind::Auto | GpuBackendKind::Cuda => {
            return Err(DaemonError::Runtime("the cuda pool backend is not available in this build".into()))
        }
    };
    let binder: Arc<dyn QueueBinder> = match flags.bind_backend {
        BindBackendKind::None => Arc::new(NoBinder),
        BindBackendKind::Auto if sim.is_some() => Arc::new(NoBinder),
        _ => {
            return Err(DaemonError::Runtime(
                "queue binding (tcpx/devmem) is not available in this build".into(),
            ))
        }
    };
    Ok(Backends { nic, sim, alloc, binder })
}
