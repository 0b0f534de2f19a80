//! The MIG check: a GPU of the topology partitioned into MIG instances fails,
//! whatever the pool backend (GPUDirect-TCPX needs whole GPUs). Read from the
//! driver's procfs entries and, where libnvidia-ml loads, from NVML's MIG
//! mode; nothing is changed.

use super::{Ctx, Report, Status};
use crate::gpu::mig;
use crate::gpu::nvml::{MigModes, Nvml};
use crate::identity::tenant::GpuDevices;
use crate::types::pci::PciAddr;

pub(super) fn check_mig(r: &mut Report, ctx: &Ctx) {
    let s = "GPUs";
    // The sim preset placed on CUDA's GPUs checks those; otherwise the topology's.
    let pcis: Vec<PciAddr> = match (&ctx.placed_gpus, &ctx.topo) {
        (Some(placed), _) => placed.clone(),
        (None, Some(topo)) => topo.gpus().map(|(_, g)| g.pci).collect(),
        (None, None) => {
            r.add(s, "MIG", Status::Skip, "no topology, so no GPUs to check", None);
            return;
        }
    };
    let root = ctx.flags.procfs_root();
    let names: Vec<String> = pcis.iter().map(PciAddr::to_string).collect();
    let minors = GpuDevices::from_driver(&mig::driver_procfs(&root), &names, false).minors;
    let gpus: Vec<(PciAddr, u32)> = pcis.into_iter().zip(minors).collect();
    let nvml = Nvml::open();
    let c = mig::check(
        &mig::nvidia_proc_dir(&root),
        &gpus,
        nvml.as_ref().map(|n| n as &dyn MigModes).map_err(Clone::clone),
    );

    let mut read = Vec::new();
    if c.procfs_present {
        read.push(format!("procfs {}", c.procfs.display()));
    }
    match &c.nvml {
        Ok(what) => read.push(what.clone()),
        Err(_) if c.procfs_present => read.push("no NVML".into()),
        Err(_) => {}
    }
    let partitioned = c.partitioned();
    if !partitioned.is_empty() {
        let found: Vec<String> = partitioned.iter().map(|f| f.describe()).collect();
        r.add(
            s,
            "MIG",
            Status::Fail,
            format!("partitioned: {}", found.join("; ")),
            Some(mig::fix(&partitioned)),
        );
    } else if read.is_empty() {
        let why = c.nvml.as_ref().err().map(ToString::to_string).unwrap_or_default();
        r.add(
            s,
            "MIG",
            Status::Skip,
            format!("cannot tell: no NVIDIA driver entries under {}, and NVML: {why}", c.procfs.display()),
            None,
        );
    } else {
        r.add(
            s,
            "MIG",
            Status::Pass,
            format!("off: {} whole GPU{} (read {})", gpus.len(), super::plural(gpus.len()), read.join(", ")),
            None,
        );
    }
    for f in c.findings.iter().filter(|f| f.pending()) {
        r.add(
            s,
            "MIG pending",
            Status::Warn,
            f.describe(),
            Some(format!("{}, before the GPU is next reset", mig::fix(&[f]))),
        );
    }
    if !c.others.is_empty() {
        let others: Vec<String> =
            c.others.iter().map(|(m, gi)| format!("/dev/nvidia{m} ({})", gi.join(", "))).collect();
        r.add(
            s,
            "MIG elsewhere",
            Status::Warn,
            format!("GPUs outside the topology are partitioned: {}", others.join("; ")),
            None,
        );
    }
    for (gpu, e) in &c.nvml_errors {
        r.add(s, "MIG NVML", Status::Warn, format!("GPU {gpu}: NVML could not tell its MIG mode: {e}"), None);
    }
}
