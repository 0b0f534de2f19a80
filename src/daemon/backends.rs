//! Choosing the NIC, pool and binder backends from the flags.

use std::sync::Arc;

use crate::config::flags::{Flags, GpuBackendKind, NicBackendKind};
use crate::config::presets::Source;
use crate::gpu::{
    select_binder, spread_gpus, CudaAllocator, HostAllocator, PoolAllocator, QueueBinder, ShmemType,
};
use crate::nic::ethtool::EthtoolNic;
use crate::nic::sim::SimNic;
use crate::nic::NicControl;
use crate::types::pci::PciAddr;
use crate::types::topology::Topology;

use super::error::FlagError;
use super::{Config, DaemonError};

/// What the daemon programs and allocates through. `main` picks the real
/// ones ([`select`]); tests pass recording fakes.
pub struct Backends {
    pub nic: Arc<dyn NicControl>,
    pub alloc: Arc<dyn PoolAllocator>,
    pub binder: Arc<dyn QueueBinder>,
}

/// Picks the backends the flags ask for. With the simulated NIC and
/// `--gpu_backend cuda`, the topology's GPUs are replaced by the CUDA-visible
/// ones (hence `&mut`).
pub fn select(config: &mut Config) -> Result<Backends, DaemonError> {
    let Config { flags, topology: topo, source } = config;
    let source: &Source = source;
    // Real NICs must exist.
    let use_sim = uses_sim(flags.nic_backend, source);
    if let Some(e) = missing_nic(flags, topo, source) {
        return Err(e.into());
    }
    // Before the NIC backend: a sim topology may be re-placed onto real GPUs.
    let alloc: Arc<dyn PoolAllocator> = match flags.gpu_backend {
        GpuBackendKind::Host => Arc::new(HostAllocator),
        GpuBackendKind::Auto if use_sim => Arc::new(HostAllocator),
        GpuBackendKind::Cuda => Arc::new(cuda_allocator(topo, use_sim, "cuda")?),
        GpuBackendKind::Auto => Arc::new(cuda_allocator(topo, false, "auto")?),
    };
    if flags.gpu_shmem_type == ShmemType::File && !alloc.supports(ShmemType::File) {
        return Err(FlagError::ShmemFileNeedsCuda { backend: alloc.backend() }.into());
    }
    if (!flags.sim_fault.is_empty() || !flags.sim_delay.is_empty()) && !use_sim {
        return Err(FlagError::SimFlagsNeedSim.into());
    }
    if let Some(d) = flags
        .sim_delay
        .iter()
        .find(|d| d.ifname.as_ref().is_some_and(|i| !topo.nics.iter().any(|n| &n.ifname == i)))
    {
        return Err(FlagError::SimDelayUnknownNic(d.ifname.clone().unwrap_or_default()).into());
    }
    let nic: Arc<dyn NicControl> = if use_sim {
        let ifnames: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        let sim = SimNic::new(&ifnames);
        for f in &flags.sim_fault {
            sim.inject(f.clone());
        }
        for d in &flags.sim_delay {
            match &d.ifname {
                Some(ifname) => sim.delay_on(ifname, d.op, d.by),
                None => sim.delay(d.op, d.by),
            }
        }
        Arc::new(sim)
    } else {
        Arc::new(EthtoolNic::open().map_err(DaemonError::EthtoolBackend)?)
    };
    let binder: Arc<dyn QueueBinder> = Arc::from(select_binder(flags.bind_backend, use_sim));
    Ok(Backends { nic, alloc, binder })
}

/// `auto`: the sim preset means simulated NICs (its eth1..eth4 may exist on
/// the host and must not be touched); anything else means real NICs.
fn uses_sim(kind: NicBackendKind, source: &Source) -> bool {
    match kind {
        NicBackendKind::Sim => true,
        NicBackendKind::Auto => *source == Source::Preset("sim"),
        NicBackendKind::Ethtool => false,
    }
}

/// With `--nic_backend=auto` and real NICs, the first NIC of the topology
/// that is not (yet) under `<sysfs>/class/net`.
pub fn missing_nic(flags: &Flags, topo: &Topology, source: &Source) -> Option<FlagError> {
    if flags.nic_backend != NicBackendKind::Auto || uses_sim(flags.nic_backend, source) {
        return None;
    }
    let class_net = flags.sysfs_root().join("class/net");
    let n = topo.nics.iter().find(|n| !class_net.join(&n.ifname).exists())?;
    Some(FlagError::NicNotFound { ifname: n.ifname.clone(), class_net })
}

/// The CUDA backend, checked against the topology: every GPU must be visible
/// to CUDA, or (`place_on_sim`) the visible GPUs replace the topology's.
fn cuda_allocator(
    topo: &mut Topology,
    place_on_sim: bool,
    flag: &'static str,
) -> Result<CudaAllocator, DaemonError> {
    let cuda = |source| DaemonError::Cuda { flag, source };
    let alloc = CudaAllocator::new().map_err(cuda)?;
    let visible = alloc.visible_gpus().map_err(cuda)?.unwrap_or_default();
    if place_on_sim {
        *topo = spread_gpus(topo, &visible).map_err(DaemonError::PlaceGpus)?;
        topo.validate().map_err(DaemonError::PlacedTopology)?;
        tracing::info!(gpus = %crate::types::list(&visible), "sim topology uses the CUDA-visible GPUs");
        return Ok(alloc);
    }
    let missing: Vec<PciAddr> = topo.gpus().map(|(_, g)| g.pci).filter(|g| !visible.contains(g)).collect();
    if !missing.is_empty() {
        return Err(DaemonError::GpusNotVisible { flag, missing, visible });
    }
    Ok(alloc)
}
