//! `--gpu_backend=cuda` on a host without the NVIDIA driver: exit 1 with a
//! message naming CUDA/libcuda, never a panic.

mod common;

use std::process::Command;

use common::BIN;
use tcpx_rxdm::gpu::CudaAllocator;

#[test]
fn cuda_backend_without_libcuda_exits_1_naming_cuda() {
    if CudaAllocator::driver_present() {
        eprintln!("skipping: this host has libcuda (the device check covers it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["--gpu_nic_preset", "sim", "--gpu_backend=cuda", "--metrics_address="])
        .arg(format!("--uds_path={}", dir.path().display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("--gpu_backend=cuda") && stderr.contains("libcuda.so"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Nothing was left behind: no socket files.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| n.to_string_lossy().starts_with('.')), "left behind: {left:?}");
}
