use std::collections::BTreeSet;

use super::*;
use crate::gpu::{allocate_all, BindFailure};

fn pci(s: &str) -> PciAddr {
    s.parse().unwrap()
}

#[test]
fn allocate_bind_and_drop_are_logged_in_order() {
    let rec = GpuRecorder::new();
    let (alloc, binder) = (rec.allocator(), rec.binder());
    let gpu = pci("0000:04:00.0");
    let pool = alloc.allocate(gpu, 10_000, ShmemType::Fd).unwrap();
    assert_eq!(pool.size(), 12_288, "a real memfd pool underneath");
    assert!(pool.share_fd().is_some());
    let binding = binder.bind(pool.as_ref(), gpu, "eth1", None, &[8, 9]).unwrap();
    assert!(binding.describe().contains("eth1"), "{}", binding.describe());
    drop(binding);
    drop(pool);
    assert_eq!(
        rec.calls(),
        [
            GpuCall::Allocate { gpu, size: 10_000, shmem: ShmemType::Fd },
            GpuCall::Bind { gpu, ifname: "eth1".into(), queues: vec![8, 9] },
            GpuCall::Unbind { gpu, ifname: "eth1".into() },
            GpuCall::Free { gpu },
        ]
    );
}

#[test]
fn injected_failures_are_returned_typed_and_not_applied() {
    let rec = GpuRecorder::new();
    let (alloc, binder) = (rec.allocator(), rec.binder());
    let (a, b) = (pci("0000:04:00.0"), pci("0000:05:00.0"));
    let pool = alloc.allocate(a, 4096, ShmemType::Fd).unwrap();
    rec.fail_when(move |c| matches!(c, GpuCall::Allocate { gpu, .. } if *gpu == b));
    rec.fail_when(|c| matches!(c, GpuCall::Bind { ifname, .. } if ifname == "eth2"));

    let want = GpuCall::Allocate { gpu: b, size: 4096, shmem: ShmemType::Fd };
    match alloc.allocate(b, 4096, ShmemType::Fd) {
        Err(GpuError::Injected(InjectedFailure { call })) => assert_eq!(call, want),
        other => panic!("expected an injected failure, got {other:?}"),
    }
    let err = binder.bind(pool.as_ref(), a, "eth2", None, &[8]).unwrap_err();
    assert_eq!((err.gpu, err.ifname.as_str(), err.queues.as_slice()), (a, "eth2", &[8][..]));
    let bind = GpuCall::Bind { gpu: a, ifname: "eth2".into(), queues: vec![8] };
    assert!(matches!(&err.cause, BindFailure::Injected(f) if f.call == bind), "{err}");
    // Calls the matchers do not accept go through.
    drop(binder.bind(pool.as_ref(), a, "eth1", None, &[8]).unwrap());
    drop(pool);
    // Failed calls are logged; nothing they would have created is freed or unbound.
    assert_eq!(
        rec.calls(),
        [
            GpuCall::Allocate { gpu: a, size: 4096, shmem: ShmemType::Fd },
            want,
            bind,
            GpuCall::Bind { gpu: a, ifname: "eth1".into(), queues: vec![8] },
            GpuCall::Unbind { gpu: a, ifname: "eth1".into() },
            GpuCall::Free { gpu: a },
        ]
    );
}

#[test]
fn the_sink_sees_every_call_in_log_order() {
    let merged = Arc::new(Mutex::new(Vec::new()));
    let m = Arc::clone(&merged);
    let rec = GpuRecorder::new().with_sink(move |c| m.lock().unwrap().push(format!("gpu {c:?}")));
    let gpu = pci("0000:04:00.0");
    merged.lock().unwrap().push("nic prime".to_string());
    let pool = rec.allocator().allocate(gpu, 1, ShmemType::Fd).unwrap();
    merged.lock().unwrap().push("nic restore".to_string());
    drop(pool);
    let merged = merged.lock().unwrap().clone();
    assert_eq!(merged.len(), 4, "{merged:?}");
    assert_eq!(merged[0], "nic prime");
    assert!(merged[1].starts_with("gpu Allocate"), "{merged:?}");
    assert_eq!(merged[2], "nic restore");
    assert!(merged[3].starts_with("gpu Free"), "{merged:?}");
    assert_eq!(rec.calls().len(), 2);
}

#[test]
fn file_pools_are_refused_like_the_host_backend_and_parallel_order_is_free() {
    let rec = GpuRecorder::new();
    let alloc = rec.allocator();
    assert!(alloc.supports(ShmemType::Fd) && !alloc.supports(ShmemType::File));
    let gpu = pci("0000:04:00.0");
    assert!(matches!(alloc.allocate(gpu, 1, ShmemType::File), Err(GpuError::Unsupported { .. })));
    assert_eq!(rec.calls(), [GpuCall::Allocate { gpu, size: 1, shmem: ShmemType::File }]);

    // allocate_all runs one thread per GPU: compare the Allocate calls as a set.
    let rec = GpuRecorder::new();
    let gpus: Vec<PciAddr> =
        (1..=4u8).map(|b| PciAddr { domain: 0, bus: b, device: 0, function: 0 }).collect();
    let requests: Vec<(PciAddr, u64)> = gpus.iter().map(|&g| (g, 4096)).collect();
    let pools = allocate_all(&rec.allocator(), &requests, ShmemType::Fd);
    assert!(pools.iter().all(Result::is_ok));
    let allocated: BTreeSet<PciAddr> = rec
        .calls()
        .iter()
        .map(|c| match c {
            GpuCall::Allocate { gpu, .. } => *gpu,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(allocated, gpus.iter().copied().collect());
    assert_eq!(rec.calls().len(), gpus.len());
}
