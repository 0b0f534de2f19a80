//! Device check of [`PoolAllocator::adopt`] on the CUDA backend, in one
//! process (`tests/gpu/takeover.sh` runs it on a GPU machine):
//!
//! ```text
//! pool_adopt [--gpu dddd:bb:dd.f] [--sizes 64M,1G,4G] [--iters 3]
//! ```
//! Per size and iteration: allocate a pool, write a pattern through a client
//! import of its shareable fd, adopt a [`HandedPool`] made of dups of its
//! fds, drop the original, and read the pattern back through a fresh import
//! of the adopted pool's fd. Checks that the adopted pool keeps the very
//! files it was handed (same inodes), that dropping a second adoption of it
//! leaves its memory alone, and that a legacy IPC pool and mismatched sizes
//! are refused. Prints `PASS`/`FAIL name: detail` lines and one JSON line per
//! size (allocate and adopt times in ms); exits 1 on any failure.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Instant;

use cudarc::driver::sys;
use tcpx_rxdm::gpu::{CudaAllocator, GpuError, HandedPool, PoolAllocator, RxPool, ShmemType};
use tcpx_rxdm::types::pci::PciAddr;

/// Bytes written and read back at each end of a pool.
const WINDOW: usize = 8 << 20;

fn ck(res: sys::CUresult, call: &str) {
    assert_eq!(res, sys::CUresult::CUDA_SUCCESS, "{call} failed");
}

/// A client's mapping of a pool: its shareable fd imported and mapped
/// read-write, as `rxdm_gpu.py` does in another process; freed on drop.
struct ClientMap {
    handle: sys::CUmemGenericAllocationHandle,
    va: sys::CUdeviceptr,
    size: usize,
}

impl ClientMap {
    fn import(fd: BorrowedFd<'_>, size: usize, alignment: usize, ordinal: i32) -> ClientMap {
        let mut handle = 0;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: valid out-pointer; the fd's number stands in the pointer's place.
        ck(
            unsafe {
                sys::cuMemImportFromShareableHandle(&mut handle, fd.as_raw_fd() as usize as *mut _, kind)
            },
            "cuMemImportFromShareableHandle",
        );
        let mut va = 0;
        // SAFETY: valid out-pointer; no fixed address requested.
        ck(unsafe { sys::cuMemAddressReserve(&mut va, size, alignment, 0, 0) }, "cuMemAddressReserve");
        // SAFETY: maps the imported allocation into the range just reserved.
        ck(unsafe { sys::cuMemMap(va, size, 0, handle, 0) }, "cuMemMap");
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one descriptor, count 1.
        ck(unsafe { sys::cuMemSetAccess(va, size, &access, 1) }, "cuMemSetAccess");
        ClientMap { handle, va, size }
    }

    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.size);
        // SAFETY: the destination lies inside the mapped range; `data` is readable.
        ck(
            unsafe { sys::cuMemcpyHtoD_v2(self.va + offset as u64, data.as_ptr().cast(), data.len()) },
            "cuMemcpyHtoD",
        );
        // From pageable memory the copy returns once staged, before the DMA
        // lands: wait for it, or unmapping next could fault the context.
        // SAFETY: no arguments; the context is current.
        ck(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize");
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.size);
        let mut out = vec![0u8; len];
        // SAFETY: the source lies inside the mapped range; `out` holds `len` bytes.
        ck(
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.va + offset as u64, len) },
            "cuMemcpyDtoH",
        );
        out
    }
}

impl Drop for ClientMap {
    fn drop(&mut self) {
        // SAFETY: undoes exactly what `import` did, in reverse order.
        unsafe {
            ck(sys::cuMemUnmap(self.va, self.size), "cuMemUnmap");
            ck(sys::cuMemAddressFree(self.va, self.size), "cuMemAddressFree");
            ck(sys::cuMemRelease(self.handle), "cuMemRelease");
        }
    }
}

/// A deterministic pattern per seed (xorshift), so a stale or zeroed pool
/// cannot pass.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

fn inode(fd: BorrowedFd<'_>) -> (u64, u64) {
    let st = nix::sys::stat::fstat(fd).expect("fstat");
    (st.st_dev, st.st_ino)
}

/// Whether two fds of this process are one open file (`kcmp`, `KCMP_FILE`):
/// the driver's shareable fds all show one inode, so only this tells them apart.
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> Result<bool, std::io::Error> {
    const KCMP_FILE: libc::c_long = 0;
    let pid = libc::c_long::from(std::process::id() as i32);
    // SAFETY: kcmp only compares the two descriptors' kernel objects.
    let res = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a.as_raw_fd(), b.as_raw_fd()) };
    if res < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(res == 0)
}

/// A [`HandedPool`] of dups of `pool`'s fds, as a daemon hands it over.
fn hand(gpu: PciAddr, pool: &dyn RxPool) -> HandedPool {
    let dup = |fd: Option<BorrowedFd<'_>>| fd.map(|f| f.try_clone_to_owned().expect("dup"));
    HandedPool {
        gpu,
        size: pool.size(),
        alignment: pool.alignment(),
        share_fd: dup(pool.share_fd()),
        dmabuf_fd: dup(pool.dmabuf_fd()),
    }
}

struct Checks {
    failed: usize,
}

impl Checks {
    fn check(&mut self, ok: bool, name: &str, detail: impl std::fmt::Display) {
        println!("{} {name}: {detail}", if ok { "PASS" } else { "FAIL" });
        self.failed += usize::from(!ok);
    }
}

#[path = "shared/args.rs"]
mod args;
use args::{ms, parse_size};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut gpu, mut sizes, mut iters) = (None::<PciAddr>, vec![64 << 20, 1 << 30, 4 << 30], 3);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gpu" => gpu = Some(args.next().expect("--gpu value").parse().expect("PCI address")),
            "--sizes" => sizes = args.next().expect("--sizes value").split(',').map(parse_size).collect(),
            "--iters" => iters = args.next().expect("--iters value").parse().expect("number"),
            other => panic!("unknown argument {other}"),
        }
    }
    // Driver calls that fail while a pool is freed are logged, not returned.
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let alloc = CudaAllocator::new().unwrap_or_else(|e| panic!("pool_adopt: {e}"));
    let visible = alloc.visible_gpus().expect("visible_gpus").unwrap_or_default();
    let gpu = gpu.or_else(|| visible.first().copied()).expect("no CUDA GPU");

    // The client side's own context on this thread (the primary one, as the
    // allocator's), for the imports below.
    let bus = std::ffi::CString::new(gpu.to_string()).unwrap();
    let (mut ordinal, mut ctx) = (0, std::ptr::null_mut());
    let mut name = [0 as std::ffi::c_char; 96];
    // SAFETY: valid out-pointers and a NUL-terminated bus id; the driver writes
    // at most `name.len()` bytes, NUL included.
    unsafe {
        ck(sys::cuDeviceGetByPCIBusId(&mut ordinal, bus.as_ptr()), "cuDeviceGetByPCIBusId");
        ck(sys::cuDevicePrimaryCtxRetain(&mut ctx, ordinal), "cuDevicePrimaryCtxRetain");
        ck(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        ck(sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, ordinal), "cuDeviceGetName");
    }
    // SAFETY: the driver wrote a NUL-terminated string into `name`.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    println!("== {gpu} ({name}), CUDA driver {}", alloc.driver_version().expect("driver version"));

    let mut c = Checks { failed: 0 };
    for &size in &sizes {
        let (mut alloc_ms, mut adopt_ms) = (Vec::new(), Vec::new());
        for iter in 0..iters {
            let seed = size ^ (iter as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let t = Instant::now();
            let orig = alloc.allocate(gpu, size, ShmemType::Fd).expect("allocate");
            alloc_ms.push(ms(t));
            let (bytes, align) = (orig.size() as usize, orig.alignment() as usize);
            let window = WINDOW.min(bytes / 2);
            let (head, tail) = (pattern(window, seed), pattern(window, !seed));
            {
                let client = ClientMap::import(orig.share_fd().unwrap(), bytes, align, ordinal);
                client.write(0, &head);
                client.write(bytes - window, &tail);
            } // the client's import is released: only the pool and its fds hold the memory
            let share_fd = orig.share_fd().unwrap().try_clone_to_owned().expect("dup");
            let dmabuf_ino = orig.dmabuf_fd().map(inode);
            c.check(dmabuf_ino.is_some(), "dmabuf-exported", orig.describe());

            let t = Instant::now();
            let adopted = match alloc.adopt(hand(gpu, orig.as_ref())) {
                Ok(p) => p,
                Err(e) => panic!("adopting a {size}-byte pool: {e}"),
            };
            adopt_ms.push(ms(t));
            drop(orig);

            let same_share = same_file(adopted.share_fd().unwrap(), share_fd.as_fd());
            let same_files = matches!(same_share, Ok(true))
                && adopted.dmabuf_fd().map(inode) == dmabuf_ino
                && adopted.size() as usize == bytes
                && adopted.alignment() as usize == align;
            c.check(
                same_files,
                "adopt-keeps-files",
                format!(
                    "size {bytes}: same shareable fd file: {same_share:?}, dma-buf inode {dmabuf_ino:?}: {}",
                    adopted.describe()
                ),
            );
            let reader = ClientMap::import(adopted.share_fd().unwrap(), bytes, align, ordinal);
            let intact = reader.read(0, window) == head && reader.read(bytes - window, window) == tail;
            drop(reader);
            c.check(
                intact,
                "adopt-same-memory",
                format!("size {bytes}: the pattern written before the takeover reads back after the original was dropped"),
            );

            // A second adoption of the adopted pool, dropped: releases only its own.
            let second = alloc.adopt(hand(gpu, adopted.as_ref())).expect("second adoption");
            drop(second);
            let reader = ClientMap::import(adopted.share_fd().unwrap(), bytes, align, ordinal);
            let still = reader.read(0, window) == head && reader.read(bytes - window, window) == tail;
            drop(reader);
            let dmabuf_open = adopted.dmabuf_fd().map(inode) == dmabuf_ino;
            c.check(
                still && dmabuf_open,
                "adopt-drop-own-only",
                format!("size {bytes}: after dropping a second adoption the memory and dma-buf are intact"),
            );
        }
        println!(
            "{{\"gpu\":\"{gpu}\",\"name\":\"{name}\",\"size\":{size},\"allocate_ms\":{alloc_ms:.3?},\"adopt_ms\":{adopt_ms:.3?}}}"
        );
    }

    // Refusals, each with the reason the operator will read.
    let pool = alloc.allocate(gpu, 64 << 20, ShmemType::Fd).expect("allocate");
    let gran = pool.alignment();
    let other = alloc.allocate(gpu, 64 << 20, ShmemType::Fd).expect("allocate");
    let apart = same_file(pool.share_fd().unwrap(), other.share_fd().unwrap());
    c.check(
        matches!(apart, Ok(false)),
        "kcmp-tells-pools-apart",
        format!("two pools' shareable fds: same file {apart:?}"),
    );
    drop(other);
    let err = |h: HandedPool| alloc.adopt(h).err().map(|e| e.to_string()).unwrap_or_default();
    let odd = err(HandedPool { size: pool.size() + gran, ..hand(gpu, pool.as_ref()) });
    c.check(odd.contains("the handed dma-buf has"), "adopt-refuses-wrong-size", &odd);
    let rough = err(HandedPool { size: pool.size() - 4096, ..hand(gpu, pool.as_ref()) });
    c.check(
        rough.contains("not a multiple of the driver's allocation granularity"),
        "adopt-refuses-ungranular",
        &rough,
    );
    let bare = alloc.adopt(HandedPool { dmabuf_fd: None, ..hand(gpu, pool.as_ref()) });
    let ok = bare.as_ref().is_ok_and(|p| p.dmabuf_fd().is_none() && p.describe().contains("no dma-buf"));
    c.check(ok, "adopt-without-dmabuf", bare.map(|p| p.describe()).unwrap_or_else(|e| e.to_string()));
    let ipc = alloc.allocate(gpu, 64 << 20, ShmemType::File).expect("ipc pool");
    let refused = alloc.adopt(hand(gpu, ipc.as_ref()));
    let ok =
        matches!(&refused, Err(GpuError::CannotAdopt { why, .. }) if why.contains("--gpu_shmem_type file"));
    c.check(ok, "adopt-refuses-ipc", refused.err().map(|e| e.to_string()).unwrap_or_default());

    println!("== pool_adopt: {} failed", c.failed);
    std::process::exit(i32::from(c.failed > 0));
}
