//! MIG-partitioned GPUs against a fabricated procfs (the driver's
//! `capabilities/gpu<minor>/mig/gi<N>` entries): `doctor` fails naming the
//! GPU, in text and JSON; the daemon with the CUDA backend refuses to start
//! (exit 2) before it loads CUDA or touches a NIC; whole GPUs pass both.

mod common;

use std::path::Path;

use common::run_bin;
use common::sysfs::a3_highgpu_8g;
use tcpx_rxdm::config::flags::Flags;
use tcpx_rxdm::config::presets;
use tcpx_rxdm::gpu::nvml::{MigMode, MigModes, NvmlError};
use tcpx_rxdm::types::pci::PciAddr;

/// A procfs with the NVIDIA driver's folder: `instances` GPU instances on
/// each listed minor, and `information` files naming each GPU's minor.
fn fake_procfs(instances: &[(u32, &[&str])], minors: &[(&str, u32)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let nvidia = root.path().join("driver/nvidia");
    for (minor, gis) in instances {
        let mig = nvidia.join(format!("capabilities/gpu{minor}/mig"));
        std::fs::create_dir_all(&mig).unwrap();
        for gi in *gis {
            std::fs::create_dir_all(mig.join(gi).join("ci0")).unwrap();
            std::fs::write(mig.join(gi).join("access"), "DeviceFileMinor: 66\nDeviceFileMode: 292\n")
                .unwrap();
        }
    }
    for (pci, minor) in minors {
        let dir = nvidia.join("gpus").join(pci);
        std::fs::create_dir_all(&dir).unwrap();
        let info =
            format!("Model: \t\t NVIDIA H100 80GB HBM3\nDevice Minor: \t {minor}\nBus Location: \t {pci}\n");
        std::fs::write(dir.join("information"), info).unwrap();
    }
    root
}

fn arg(name: &str, p: &Path) -> String {
    format!("--{name}={}", p.display())
}

/// The doctor check named `name` of section GPUs, from `--json`.
fn json_check(out: &str, name: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["section"] == "GPUs" && c["name"] == name)
        .unwrap_or_else(|| panic!("no GPUs/{name} check: {out}"))
        .clone()
}

#[test]
fn doctor_fails_on_two_gpu_instances_on_gpu_0_naming_it() {
    let proc_ = fake_procfs(&[(0, &["gi1", "gi2"])], &[]);
    let uds = tempfile::tempdir().unwrap();
    let args =
        ["doctor", "--gpu_nic_preset=sim", &arg("procfs_root", proc_.path()), &arg("uds_path", uds.path())];
    let (code, out, err) = run_bin(&args);
    assert_eq!(code, 1, "{out}\n{err}");
    let line = out.lines().find(|l| l.trim_start().starts_with("✗ MIG:")).unwrap_or_else(|| panic!("{out}"));
    // The topology's first GPU is /dev/nvidia0 (the driver lists no other minor for it).
    assert!(
        line.contains("GPU 0000:04:00.0 (/dev/nvidia0)") && line.contains("2 GPU instances (gi1, gi2)"),
        "{line}"
    );
    assert!(out.contains("nvidia-smi -i 0000:04:00.0 -mig 0"), "the fix names the GPU:\n{out}");
    assert!(out.contains("NOT ready: 1 problem"), "{out}");

    let (code, out, _) = run_bin(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 1);
    let c = json_check(&out, "MIG");
    assert_eq!(c["status"], "fail");
    assert!(c["found"].as_str().unwrap().contains("0000:04:00.0"), "{c}");
    assert!(c["fix"].as_str().unwrap().contains("whole GPUs"), "{c}");
}

#[test]
fn doctor_names_the_gpu_the_driver_gives_that_minor() {
    // a3-highgpu-8g's GPUs, the driver numbering them in reverse: minor 0 is
    // the last GPU of the topology.
    let sys = a3_highgpu_8g();
    let gpus = ["0000:04:00.0", "0000:05:00.0", "0000:0a:00.0", "0000:0b:00.0"];
    let gpus = [&gpus[..], &["0000:84:00.0", "0000:85:00.0", "0000:8a:00.0", "0000:8b:00.0"]].concat();
    let minors: Vec<(&str, u32)> = gpus.iter().enumerate().map(|(i, p)| (*p, 7 - i as u32)).collect();
    let proc_ = fake_procfs(&[(0, &["gi3", "gi11"]), (9, &["gi1"])], &minors);
    let uds = tempfile::tempdir().unwrap();
    let (code, out, err) = run_bin(&[
        "doctor",
        "--gpu_nic_preset=a3vm",
        "--nic_backend=sim",
        "--gpu_backend=host",
        &arg("sysfs_root", sys.root()),
        &arg("procfs_root", proc_.path()),
        &arg("uds_path", uds.path()),
    ]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("✗ MIG: partitioned: GPU 0000:8b:00.0 (/dev/nvidia0): 2 GPU instances (gi3, gi11)"),
        "{out}"
    );
    // A partitioned GPU the topology does not use is only a warning.
    assert!(
        out.contains("! MIG elsewhere: GPUs outside the topology are partitioned: /dev/nvidia9 (gi1)"),
        "{out}"
    );
}

#[test]
fn doctor_passes_whole_gpus() {
    let proc_ = fake_procfs(&[(0, &[]), (1, &[])], &[("0000:04:00.0", 0), ("0000:05:00.0", 1)]);
    let uds = tempfile::tempdir().unwrap();
    let (code, out, err) = run_bin(&[
        "doctor",
        "--gpu_nic_preset=sim",
        "--json",
        &arg("procfs_root", proc_.path()),
        &arg("uds_path", uds.path()),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let c = json_check(&out, "MIG");
    assert_eq!(c["status"], "pass", "{c}");
    let found = c["found"].as_str().unwrap();
    assert!(found.starts_with("off: 8 whole GPUs (read procfs "), "{found}");
}

/// The daemon on a fabricated a3-highgpu-8g whose NICs exist (in sysfs) and
/// whose GPU 0000:0a:00.0 has MIG instances.
#[test]
fn the_daemon_refuses_a_partitioned_gpu_before_cuda_and_the_nics() {
    let sys = a3_highgpu_8g();
    let proc_ = fake_procfs(&[(2, &["gi1", "gi2"])], &[("0000:0a:00.0", 2)]);
    let uds = tempfile::tempdir().unwrap();
    let (code, _, err) = run_bin(&[
        "--gpu_nic_preset=a3vm",
        "--gpu_backend=cuda",
        &arg("sysfs_root", sys.root()),
        &arg("procfs_root", proc_.path()),
        &arg("uds_path", uds.path()),
        "--metrics_address=",
    ]);
    // Exit 2, naming the GPU and MIG. Not "libcuda not found" (CUDA is not
    // loaded first) and not "priming NIC eth1" (no NIC was touched: eth1 is
    // only in the fake sysfs).
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("GPU 0000:0a:00.0 (/dev/nvidia2): 2 GPU instances (gi1, gi2)"), "{err}");
    assert!(err.contains("partitioned into MIG instances"), "{err}");
    assert!(!err.contains("libcuda") && !err.contains("priming"), "{err}");
    // Nothing was created in the socket folder: it was never locked.
    assert_eq!(std::fs::read_dir(uds.path()).unwrap().count(), 0);

    // Whole GPUs get past the check (to CUDA, which this machine may lack).
    let whole = fake_procfs(&[(2, &[])], &[("0000:0a:00.0", 2)]);
    let (code, _, err) = run_bin(&[
        "--gpu_nic_preset=a3vm",
        "--gpu_backend=cuda",
        &arg("sysfs_root", sys.root()),
        &arg("procfs_root", whole.path()),
        &arg("uds_path", uds.path()),
        "--metrics_address=",
    ]);
    assert!(!err.contains("partitioned into MIG"), "{err}");
    assert!(err.contains("no GPU is partitioned (MIG) gpus=8"), "{err}");
    if !tcpx_rxdm::gpu::CudaAllocator::driver_present() {
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("libcuda.so not found"), "{err}");
    }
}

/// NVML as a fake: MIG on for one GPU, no instance made yet.
struct MigOn(PciAddr);

impl MigModes for MigOn {
    fn mig_mode(&self, gpu: PciAddr) -> Result<Option<MigMode>, NvmlError> {
        Ok(Some(MigMode { current: gpu == self.0, pending: gpu == self.0 }))
    }
    fn describe(&self) -> String {
        "fake NVML".into()
    }
}

#[test]
fn the_daemons_decision_also_takes_nvmls_word() {
    let sys = a3_highgpu_8g();
    let proc_ = fake_procfs(&[], &[]);
    let flags = Flags::parse_args([
        "tcpx-rxdm".to_string(),
        "--gpu_nic_preset=a3vm".into(),
        arg("sysfs_root", sys.root()),
    ])
    .unwrap();
    let (topo, _) = presets::resolve_topology(&flags).unwrap();
    let nvml = MigOn("0000:85:00.0".parse().unwrap());
    let e = tcpx_rxdm::daemon::mig_check(proc_.path(), &topo, Ok(&nvml)).refusal().expect("refused");
    assert!(e.to_string().contains("GPU 0000:85:00.0 (/dev/nvidia5): NVML: MIG mode on"), "{e}");
    // Without NVML and without instances: nothing to refuse.
    let none =
        tcpx_rxdm::daemon::mig_check(proc_.path(), &topo, Err(NvmlError::MissingSymbol("nvmlInit_v2")))
            .refusal();
    assert!(none.is_none());
}
