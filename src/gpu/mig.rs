//! MIG (Multi-Instance GPU): whether a GPU is partitioned. GPUDirect-TCPX
//! needs whole GPUs: CUDA cannot allocate on a GPU in MIG mode (only on its
//! instances), and NCCL does not span instances. Two witnesses, both read-only:
//!
//! - procfs: the driver lists each GPU instance as
//!   `<procfs>/driver/nvidia/capabilities/gpu<minor>/mig/gi<N>`;
//! - NVML's MIG mode, where `libnvidia-ml` loads (it also sees MIG turned on
//!   before any instance was made).

use std::path::{Path, PathBuf};

use super::nvml::{MigMode, MigModes, NvmlError};
use crate::types::pci::PciAddr;

/// The procfs to read the NVIDIA driver's entries under, given
/// `--procfs_root`. A root that is a mount of the host's `/proc/sys` (the
/// daemon's `/hostprocsysfs`), or holds only its `net` (as the Kubernetes
/// manifests mount it), has no `driver/`: the driver's entries are the
/// same in every pid namespace, so the process's own `/proc` is read instead.
pub fn driver_procfs(procfs_root: &Path) -> PathBuf {
    let sysctls = ["kernel", "net"].iter().any(|d| procfs_root.join(d).is_dir());
    let sysctl_mount = sysctls && !procfs_root.join("sys").exists();
    if sysctl_mount && !procfs_root.join("driver/nvidia").exists() {
        return PathBuf::from("/proc");
    }
    procfs_root.to_path_buf()
}

/// The NVIDIA driver's procfs folder for `--procfs_root` (see [`driver_procfs`]).
pub fn nvidia_proc_dir(procfs_root: &Path) -> PathBuf {
    driver_procfs(procfs_root).join("driver/nvidia")
}

/// `gi1`, `gi2`, … under `<nvidia>/capabilities/gpu<minor>/mig`, in number order.
pub fn gpu_instances(nvidia_dir: &Path, minor: u32) -> Vec<String> {
    let dir = nvidia_dir.join(format!("capabilities/gpu{minor}/mig"));
    numbered(&dir, "gi").into_iter().map(|n| format!("gi{n}")).collect()
}

/// The numbers `N` of the entries `<prefix>N` of `dir`, sorted.
fn numbered(dir: &Path, prefix: &str) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix(prefix)?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// One GPU of the topology, as MIG goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub gpu: PciAddr,
    /// Its `/dev/nvidia<minor>`.
    pub minor: u32,
    /// GPU instances the driver lists in procfs.
    pub instances: Vec<String>,
    /// NVML's answer, where NVML knows the GPU.
    pub nvml: Option<MigMode>,
}

impl Finding {
    /// Partitioned now: instances exist, or NVML says MIG is on.
    pub fn partitioned(&self) -> bool {
        !self.instances.is_empty() || self.nvml.is_some_and(|m| m.current)
    }

    /// MIG is off now but turns on at the GPU's next reset.
    pub fn pending(&self) -> bool {
        !self.partitioned() && self.nvml.is_some_and(|m| m.pending)
    }

    /// `GPU 0000:04:00.0 (/dev/nvidia0): MIG on, 2 GPU instances (gi1, gi2)`.
    pub fn describe(&self) -> String {
        let mut why = Vec::new();
        if !self.instances.is_empty() {
            let n = self.instances.len();
            why.push(format!(
                "{n} GPU instance{} ({}) in procfs capabilities/gpu{}/mig",
                if n == 1 { "" } else { "s" },
                self.instances.join(", "),
                self.minor
            ));
        }
        match self.nvml {
            Some(MigMode { current: true, pending }) => why.push(format!(
                "NVML: MIG mode on{}",
                if pending { "" } else { " (off after the next GPU reset)" }
            )),
            Some(MigMode { current: false, pending: true }) => {
                why.push("NVML: MIG mode off, on after the next GPU reset".into())
            }
            _ => {}
        }
        format!("GPU {} (/dev/nvidia{}): {}", self.gpu, self.minor, why.join("; "))
    }
}

/// What was found for a set of GPUs.
#[derive(Debug)]
pub struct MigCheck {
    /// The driver's procfs folder read, and whether it exists.
    pub procfs: PathBuf,
    pub procfs_present: bool,
    /// One per GPU asked about, in order.
    pub findings: Vec<Finding>,
    /// What answered for NVML (its library), or why nothing did.
    pub nvml: Result<String, NvmlError>,
    /// NVML errors for single GPUs (the GPU is then judged by procfs alone).
    pub nvml_errors: Vec<(PciAddr, NvmlError)>,
    /// Minors with GPU instances that are not among the GPUs asked about.
    pub others: Vec<(u32, Vec<String>)>,
}

impl MigCheck {
    pub fn partitioned(&self) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.partitioned()).collect()
    }

    /// The daemon's refusal, if a GPU is partitioned.
    pub fn refusal(&self) -> Option<MigError> {
        let p: Vec<Finding> = self.partitioned().into_iter().cloned().collect();
        (!p.is_empty()).then_some(MigError::Partitioned(p))
    }
}

/// Checks `gpus` (PCI address and device minor each) against the driver's
/// procfs folder `nvidia_dir` and, where given, NVML (`nvml`: what
/// [`Nvml::open`](super::nvml::Nvml::open) returned).
pub fn check(nvidia_dir: &Path, gpus: &[(PciAddr, u32)], nvml: Result<&dyn MigModes, NvmlError>) -> MigCheck {
    let mut nvml_errors = Vec::new();
    let findings: Vec<Finding> = gpus
        .iter()
        .map(|&(gpu, minor)| {
            let mode = match &nvml {
                Ok(n) => n.mig_mode(gpu).unwrap_or_else(|e| {
                    nvml_errors.push((gpu, e));
                    None
                }),
                Err(_) => None,
            };
            Finding { gpu, minor, instances: gpu_instances(nvidia_dir, minor), nvml: mode }
        })
        .collect();
    let others = numbered(&nvidia_dir.join("capabilities"), "gpu")
        .into_iter()
        .filter(|m| !gpus.iter().any(|(_, minor)| minor == m))
        .map(|m| (m, gpu_instances(nvidia_dir, m)))
        .filter(|(_, gi)| !gi.is_empty())
        .collect();
    MigCheck {
        procfs: nvidia_dir.to_path_buf(),
        procfs_present: nvidia_dir.is_dir(),
        findings,
        nvml: nvml.map(|n| n.describe()),
        nvml_errors,
        others,
    }
}

/// What to do about partitioned (or pending) GPUs: the command names the
/// GPU when there is one.
pub fn fix(gpus: &[&Finding]) -> String {
    let id = match gpus {
        [one] => one.gpu.to_string(),
        _ => "<PCI address>".into(),
    };
    format!(
        "GPUDirect-TCPX needs whole GPUs: turn MIG off (`nvidia-smi -i {id} -mig 0` with no process \
         on the GPU, then reset the GPU; GPU Operator: label the node nvidia.com/mig.config=all-disabled), \
         or run on a node pool without GPU partitions (GKE: no gpu-partition-size)"
    )
}

/// Why the daemon will not use the GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    #[error(
        "{} partitioned into MIG instances: {}. {}",
        if .0.len() == 1 { "a GPU of the topology is" } else { "GPUs of the topology are" },
        .0.iter().map(Finding::describe).collect::<Vec<_>>().join("; "),
        fix(&.0.iter().collect::<Vec<_>>())
    )]
    Partitioned(Vec<Finding>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn pci(s: &str) -> PciAddr {
        s.parse().unwrap()
    }

    /// A fake NVML: modes by GPU, errors by GPU.
    struct FakeNvml(HashMap<PciAddr, Result<MigMode, NvmlError>>);

    impl MigModes for FakeNvml {
        fn mig_mode(&self, gpu: PciAddr) -> Result<Option<MigMode>, NvmlError> {
            self.0.get(&gpu).cloned().transpose()
        }
        fn describe(&self) -> String {
            "fake NVML".into()
        }
    }

    /// A driver folder with GPU instances `gis` on each `minor`.
    fn fake_proc(layout: &[(u32, &[&str])]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (minor, gis) in layout {
            let mig = root.path().join(format!("driver/nvidia/capabilities/gpu{minor}/mig"));
            std::fs::create_dir_all(&mig).unwrap();
            for gi in *gis {
                std::fs::create_dir_all(mig.join(gi).join("ci0")).unwrap();
                std::fs::write(mig.join(gi).join("access"), "DeviceFileMinor: 66\n").unwrap();
            }
        }
        root
    }

    const NO_NVML: fn() -> Result<&'static dyn MigModes, NvmlError> =
        || Err(NvmlError::MissingSymbol("nvmlInit_v2"));

    #[test]
    fn two_gpu_instances_on_gpu_0_are_found_and_refused() {
        let root = fake_proc(&[(0, &["gi2", "gi1"]), (1, &[])]);
        let dir = nvidia_proc_dir(root.path());
        let gpus = [(pci("0000:04:00.0"), 0), (pci("0000:05:00.0"), 1)];
        let c = check(&dir, &gpus, NO_NVML());
        assert!(c.procfs_present);
        assert_eq!(c.findings[0].instances, ["gi1", "gi2"]);
        assert!(c.findings[0].partitioned() && !c.findings[1].partitioned());
        let e = c.refusal().expect("refused").to_string();
        assert!(e.starts_with("a GPU of the topology is partitioned into MIG instances: GPU 0000:04:00.0 (/dev/nvidia0): 2 GPU instances (gi1, gi2) in procfs capabilities/gpu0/mig."), "{e}");
        assert!(e.contains("nvidia-smi -i 0000:04:00.0 -mig 0") && !e.contains("0000:05:00.0"), "{e}");
    }

    #[test]
    fn whole_gpus_pass_and_other_partitioned_gpus_are_listed_apart() {
        let root = fake_proc(&[(0, &[]), (3, &["gi7"])]);
        let c = check(&nvidia_proc_dir(root.path()), &[(pci("0000:04:00.0"), 0)], NO_NVML());
        assert!(c.refusal().is_none());
        assert_eq!(c.others, [(3, vec!["gi7".to_string()])]);
        // No driver folder at all: nothing found, and it says so.
        let empty = tempfile::tempdir().unwrap();
        let c = check(&nvidia_proc_dir(empty.path()), &[(pci("0000:04:00.0"), 0)], NO_NVML());
        assert!(!c.procfs_present && c.refusal().is_none());
    }

    #[test]
    fn nvml_sees_mig_on_before_any_instance_exists() {
        let root = fake_proc(&[]);
        let (a, b, c3) = (pci("0000:04:00.0"), pci("0000:05:00.0"), pci("0000:0a:00.0"));
        let nvml = FakeNvml(HashMap::from([
            (a, Ok(MigMode { current: true, pending: true })),
            (b, Ok(MigMode { current: false, pending: true })),
            (c3, Err(NvmlError::Call { call: "nvmlDeviceGetMigMode", code: 999, text: "x".into() })),
        ]));
        let c = check(&nvidia_proc_dir(root.path()), &[(a, 0), (b, 1), (c3, 2)], Ok(&nvml));
        assert_eq!(c.nvml.as_deref(), Ok("fake NVML"));
        assert!(c.findings[0].partitioned());
        assert!(c.findings[0].describe().ends_with("NVML: MIG mode on"), "{}", c.findings[0].describe());
        assert!(!c.findings[1].partitioned() && c.findings[1].pending());
        // An NVML error on one GPU leaves that GPU to procfs, and is kept.
        assert!(!c.findings[2].partitioned());
        assert_eq!(c.nvml_errors.len(), 1);
        let e = c.refusal().unwrap();
        assert!(matches!(&e, MigError::Partitioned(f) if f.len() == 1 && f[0].gpu == a), "{e}");
    }

    #[test]
    fn a_proc_sys_mount_reads_the_processes_own_driver_folder() {
        let sysctl = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(sysctl.path().join("kernel")).unwrap();
        std::fs::create_dir_all(sysctl.path().join("net")).unwrap();
        assert_eq!(nvidia_proc_dir(sysctl.path()), Path::new("/proc/driver/nvidia"));
        // Only the host's /proc/sys/net, as the Kubernetes manifests mount it.
        let net = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(net.path().join("net/ipv4")).unwrap();
        assert_eq!(nvidia_proc_dir(net.path()), Path::new("/proc/driver/nvidia"));
        let procfs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(procfs.path().join("sys/kernel")).unwrap();
        assert_eq!(nvidia_proc_dir(procfs.path()), procfs.path().join("driver/nvidia"));
    }
}
