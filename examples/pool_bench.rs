//! Pool setup time through [`CudaAllocator`], to hold against the bare driver
//! calls (the target: within 2×); `tests/gpu/pool_bench.py` makes the same
//! calls from Python.
//!
//! ```text
//! pool_bench [--gpu dddd:bb:dd.f] [--sizes 64M,1G,4G] [--iters 5] [--file]
//! ```
//! Prints one JSON line per size: setup and free times in milliseconds, each
//! iteration a fresh pool (allocate + export fd + reserve + map + access +
//! dma-buf), after one untimed warm-up pool that opens the device's context.
//! `cold_ms` is driver init + context + the first 64 MiB pool.

use std::time::Instant;

use tcpx_rxdm::gpu::CudaAllocator;
use tcpx_rxdm::gpu::{PoolAllocator, ShmemType};
use tcpx_rxdm::types::pci::PciAddr;

#[path = "shared/args.rs"]
mod args;
use args::{ms, parse_size};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut gpu, mut sizes, mut iters, mut shmem) =
        (None::<PciAddr>, vec![64 << 20, 1 << 30, 4 << 30], 5, ShmemType::Fd);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gpu" => gpu = Some(args.next().expect("--gpu value").parse().expect("PCI address")),
            "--sizes" => sizes = args.next().expect("--sizes value").split(',').map(parse_size).collect(),
            "--iters" => iters = args.next().expect("--iters value").parse().expect("number"),
            "--file" => shmem = ShmemType::File,
            other => panic!("unknown argument {other}"),
        }
    }

    let cold = Instant::now();
    let alloc = match CudaAllocator::new() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pool_bench: {e}");
            std::process::exit(1);
        }
    };
    let visible = alloc.visible_gpus().expect("visible_gpus").unwrap_or_default();
    let gpu = gpu.or_else(|| visible.first().copied()).expect("no CUDA GPU");
    let first = alloc.allocate(gpu, 64 << 20, shmem).expect("first pool");
    let cold_ms = ms(cold);
    eprintln!("pool_bench: {} ; visible {visible:?}", first.describe());
    drop(first);

    for size in sizes {
        let (mut setup, mut free) = (Vec::new(), Vec::new());
        for _ in 0..iters {
            let t = Instant::now();
            let pool = alloc.allocate(gpu, size, shmem).expect("allocate");
            setup.push(ms(t));
            assert!(
                pool.dmabuf_fd().is_some() || shmem == ShmemType::File,
                "no dma-buf: {}",
                pool.describe()
            );
            let t = Instant::now();
            drop(pool);
            free.push(ms(t));
        }
        let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(",");
        println!(
            "{{\"impl\":\"rust\",\"gpu\":\"{gpu}\",\"size\":{size},\"cold_ms\":{cold_ms:.3},\"setup_ms\":[{}],\"free_ms\":[{}]}}",
            fmt(&setup),
            fmt(&free)
        );
    }
}
