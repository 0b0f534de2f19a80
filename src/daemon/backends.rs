//! Choosing the NIC, pool and binder backends from the flags, and how to
//! tune the host for them.

use std::path::Path;
use std::sync::Arc;

use crate::config::flags::{Flags, GpuBackendKind, NicBackendKind};
use crate::config::presets::Source;
use crate::config::views::SysfsViews;
use crate::gpu::mig;
use crate::gpu::nvml::{MigModes, Nvml, NvmlError};
use crate::gpu::{
    select_binder, spread_gpus, CudaAllocator, HostAllocator, PoolAllocator, QueueBinder, ShmemType,
};
use crate::host::tuning::TuningPlan;
use crate::identity::tenant::GpuDevices;
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
    /// The simulated NICs, where `nic` is them: their state (which real
    /// NICs keep in the kernel) goes with a takeover.
    pub sim: Option<Arc<SimNic>>,
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
        GpuBackendKind::Cuda => Arc::new(cuda_allocator(topo, use_sim, "cuda", &flags.procfs_root())?),
        GpuBackendKind::Auto => Arc::new(cuda_allocator(topo, false, "auto", &flags.procfs_root())?),
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
    let mut sim_nics = None;
    let nic: Arc<dyn NicControl> = if use_sim {
        let ifnames: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        let sim = SimNic::new(&ifnames);
        for f in &flags.sim_fault {
            sim.inject(f.clone());
        }
        for d in &flags.sim_delay {
            sim.stall(d.ifname.as_deref(), d.op, d.stall());
        }
        let sim = Arc::new(sim);
        sim_nics = Some(sim.clone());
        sim
    } else {
        let real = EthtoolNic::open().map_err(DaemonError::EthtoolBackend)?;
        let ifnames: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        crate::nic::veth_standin::real_or_standin(real, &ifnames)
    };
    let binder: Arc<dyn QueueBinder> = Arc::from(select_binder(flags.bind_backend, use_sim));
    Ok(Backends { nic, sim: sim_nics, alloc, binder })
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

/// With real NICs (`--nic_backend=ethtool`, or `auto` on a topology other
/// than the sim preset's), the NICs of the topology that are not (yet)
/// present, every one named. Present means in the daemon's own network
/// namespace, or listed by a fabricated `--sysfs_root` (`config::views`).
pub fn missing_nic(flags: &Flags, topo: &Topology, source: &Source) -> Option<FlagError> {
    if uses_sim(flags.nic_backend, source) {
        return None;
    }
    let views = SysfsViews::new(flags);
    let ifnames: Vec<String> =
        topo.nics.iter().filter(|n| !views.has_nic(&n.ifname)).map(|n| n.ifname.clone()).collect();
    if ifnames.is_empty() {
        return None;
    }
    let backend = if flags.nic_backend == NicBackendKind::Ethtool { "ethtool" } else { "auto" };
    let class_net = views.fabricated().then(|| views.root().join("class/net"));
    // Listed by the host's sysfs but not here: the daemon runs in another namespace than its NICs.
    let elsewhere = match views.separate() && !views.fabricated() {
        true => ifnames.iter().filter(|i| views.root_lists(i)).cloned().collect(),
        false => Vec::new(),
    };
    let elsewhere = (!elsewhere.is_empty()).then(|| (elsewhere, views.root().join("class/net")));
    Some(FlagError::NicNotFound { backend, ifnames, class_net, elsewhere })
}

/// Native tuning for the daemon's network namespace: the host's (or not
/// known), or a Pod's, where only that namespace's knobs are the daemon's
/// (`TuningPlan::Pod`).
pub(super) fn native_tuning(config: &Config) -> TuningPlan {
    let flags = &config.flags;
    let views = SysfsViews::new(flags);
    let nics: Vec<&str> = config.topology.nics.iter().map(|n| n.ifname.as_str()).collect();
    let netns = views.netns(&nics);
    match netns.is_other() {
        true => {
            tracing::info!(why = %netns.why, "a network namespace other than the host's: its own knobs are tuned, host-wide ones are the node's")
        }
        false => tracing::debug!(why = %netns.why, "tuning as in the host's network namespace"),
    }
    let (procfs_root, sysfs_root) = (flags.procfs_root(), flags.sysfs_root());
    match netns.is_other() {
        true => TuningPlan::Pod {
            // Given: by flag, or the host's mounted apart (/hostprocsysfs, /hostsysfs).
            host_procfs: flags.procfs_root.is_some() || procfs_root != Path::new("/proc"),
            host_sysfs: flags.sysfs_root.is_some() || views.separate(),
            procfs_root,
            sysfs_root,
        },
        false => TuningPlan::Native { procfs_root, sysfs_root },
    }
}

/// The CUDA backend, checked against the topology: every GPU must be visible
/// to CUDA, or (`place_on_sim`) the visible GPUs replace the topology's.
fn cuda_allocator(
    topo: &mut Topology,
    place_on_sim: bool,
    flag: &'static str,
    procfs_root: &Path,
) -> Result<CudaAllocator, DaemonError> {
    let cuda = |source| DaemonError::Cuda { flag, source };
    // The topology's GPUs are known before CUDA loads; placed sim GPUs only after.
    if !place_on_sim {
        refuse_mig(procfs_root, topo)?;
    }
    let alloc = CudaAllocator::new().map_err(cuda)?;
    tracing::info!(library = %alloc.driver(), "CUDA driver loaded");
    let visible = alloc.visible_gpus().map_err(cuda)?.unwrap_or_default();
    if place_on_sim {
        *topo = spread_gpus(topo, &visible).map_err(DaemonError::PlaceGpus)?;
        topo.validate().map_err(DaemonError::PlacedTopology)?;
        refuse_mig(procfs_root, topo)?;
        tracing::info!(gpus = %crate::types::list(&visible), "sim topology uses the CUDA-visible GPUs");
        return Ok(alloc);
    }
    let missing: Vec<PciAddr> = topo.gpus().map(|(_, g)| g.pci).filter(|g| !visible.contains(g)).collect();
    if !missing.is_empty() {
        return Err(DaemonError::GpusNotVisible { flag, missing, visible });
    }
    Ok(alloc)
}

/// Refuses GPUs of the topology that are partitioned into MIG instances
/// (procfs under `procfs_root`, and NVML where libnvidia-ml loads): the CUDA
/// backend needs whole GPUs. Runs before CUDA loads and before any NIC is
/// touched.
fn refuse_mig(procfs_root: &Path, topo: &Topology) -> Result<(), DaemonError> {
    let t = std::time::Instant::now();
    let nvml = Nvml::open()
        .inspect_err(|e| tracing::debug!(error = %e, "NVML unavailable; MIG judged from procfs alone"));
    let found = mig_check(procfs_root, topo, nvml.as_ref().map(|n| n as &dyn MigModes).map_err(Clone::clone));
    drop(nvml);
    for (gpu, e) in &found.nvml_errors {
        tracing::warn!(gpu = %gpu, error = %e, "NVML could not tell this GPU's MIG mode; procfs alone judges it");
    }
    if let Some(e) = found.refusal() {
        return Err(DaemonError::Mig(e));
    }
    tracing::info!(
        gpus = found.findings.len(),
        procfs = %found.procfs.display(),
        nvml = found.nvml.as_deref().unwrap_or("not loaded"),
        elapsed_ms = super::ms(t),
        "no GPU is partitioned (MIG)"
    );
    Ok(())
}

/// The MIG state of the GPUs of `topo`, per the driver's procfs under
/// `procfs_root` and `nvml`; its [`refusal`](mig::MigCheck::refusal) is the
/// CUDA backend's.
pub fn mig_check(
    procfs_root: &Path,
    topo: &Topology,
    nvml: Result<&dyn MigModes, NvmlError>,
) -> mig::MigCheck {
    let pcis: Vec<String> = topo.gpus().map(|(_, g)| g.pci.to_string()).collect();
    let minors = GpuDevices::from_driver(&mig::driver_procfs(procfs_root), &pcis, false).minors;
    let gpus: Vec<(PciAddr, u32)> = topo.gpus().map(|(_, g)| g.pci).zip(minors).collect();
    mig::check(&mig::nvidia_proc_dir(procfs_root), &gpus, nvml)
}
