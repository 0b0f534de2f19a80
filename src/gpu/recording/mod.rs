//! A recording fake of the GPU layer, for lifecycle tests without GPUs or
//! NICs: [`RecordingAllocator`] allocates memfd pools as the `host` backend
//! does, [`RecordingBinder`] binds nothing, and both append every call, and
//! every drop of what they returned, to one ordered log.
//!
//! Order: [`allocate_all`](super::allocate_all) allocates GPUs on parallel
//! threads, so the order of `Allocate` calls among GPUs is not fixed; each
//! GPU's own calls, and everything done from one thread, are in order.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::host::HostAllocator;
use super::{BindError, Binding, GpuError, PoolAllocator, QueueBinder, RxPool, ShmemType};
use crate::types::pci::PciAddr;

/// One call into the GPU layer, as the recorder logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuCall {
    Allocate {
        gpu: PciAddr,
        size: u64,
        shmem: ShmemType,
    },
    /// The pool was dropped.
    Free {
        gpu: PciAddr,
    },
    Bind {
        gpu: PciAddr,
        ifname: String,
        queues: Vec<u32>,
    },
    /// The binding was dropped.
    Unbind {
        gpu: PciAddr,
        ifname: String,
    },
}

/// The failure [`GpuRecorder::fail_when`] injects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("injected failure of {call:?}")]
pub struct InjectedFailure {
    pub call: GpuCall,
}

type Matcher = Box<dyn Fn(&GpuCall) -> bool + Send + Sync>;
type Sink = Box<dyn Fn(&GpuCall) + Send + Sync>;

/// What the recorder, its allocator, binder, pools and bindings share.
#[derive(Default)]
struct Log {
    calls: Mutex<Vec<GpuCall>>,
    failures: Mutex<Vec<Matcher>>,
    sink: Mutex<Option<Sink>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked mid-call must not hide the log from the next assertion.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Log {
    /// Logs `call`, then fails it if a matcher asks to (only calls that can
    /// fail: `Allocate` and `Bind`).
    fn call(&self, call: GpuCall) -> Result<(), InjectedFailure> {
        let fail = lock(&self.failures).iter().any(|m| m(&call));
        self.record(call.clone());
        if fail {
            return Err(InjectedFailure { call });
        }
        Ok(())
    }

    fn record(&self, call: GpuCall) {
        let mut calls = lock(&self.calls);
        // Under the log's lock, so the sink sees the calls in the log's order.
        if let Some(sink) = lock(&self.sink).as_ref() {
            sink(&call);
        }
        calls.push(call);
    }
}

/// The shared, ordered log of GPU calls; cloning shares it.
#[derive(Clone, Default)]
pub struct GpuRecorder {
    log: Arc<Log>,
}

impl GpuRecorder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A `host`-like allocator that logs into this recorder.
    pub fn allocator(&self) -> RecordingAllocator {
        RecordingAllocator { log: Arc::clone(&self.log), inner: HostAllocator }
    }

    /// A binder that binds nothing and logs into this recorder.
    pub fn binder(&self) -> RecordingBinder {
        RecordingBinder { log: Arc::clone(&self.log) }
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<GpuCall> {
        lock(&self.log.calls).clone()
    }

    /// Later calls `matches` accepts fail (Allocate/Bind only) with a typed
    /// error ([`GpuError::Injected`], [`BindFailure::Injected`](super::BindFailure::Injected));
    /// such a call is recorded, not applied.
    pub fn fail_when(&self, matches: impl Fn(&GpuCall) -> bool + Send + Sync + 'static) {
        lock(&self.log.failures).push(Box::new(matches));
    }

    /// Also send each call to `sink` (so a test can merge NIC and GPU calls
    /// into one ordered log). The sink runs under the log's lock: it must not
    /// call back into the recorder.
    pub fn with_sink(self, sink: impl Fn(&GpuCall) + Send + Sync + 'static) -> Self {
        *lock(&self.log.sink) = Some(Box::new(sink));
        self
    }
}

impl std::fmt::Debug for GpuRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRecorder").field("calls", &*lock(&self.log.calls)).finish_non_exhaustive()
    }
}

/// Allocates memfd pools (as [`HostAllocator`]) and logs `Allocate` and,
/// when each pool is dropped, `Free`.
pub struct RecordingAllocator {
    log: Arc<Log>,
    inner: HostAllocator,
}

impl PoolAllocator for RecordingAllocator {
    fn backend(&self) -> &'static str {
        "recording"
    }

    fn supports(&self, shmem: ShmemType) -> bool {
        self.inner.supports(shmem)
    }

    fn allocate(&self, gpu: PciAddr, size: u64, shmem: ShmemType) -> Result<Box<dyn RxPool>, GpuError> {
        self.log.call(GpuCall::Allocate { gpu, size, shmem })?;
        let pool = self.inner.allocate(gpu, size, shmem)?;
        Ok(Box::new(RecordingPool { pool, gpu, log: Arc::clone(&self.log) }))
    }
}

/// A pool that logs `Free` when dropped.
#[derive(Debug)]
struct RecordingPool {
    pool: Box<dyn RxPool>,
    gpu: PciAddr,
    log: Arc<Log>,
}

impl Drop for RecordingPool {
    fn drop(&mut self) {
        self.log.record(GpuCall::Free { gpu: self.gpu });
    }
}

impl RxPool for RecordingPool {
    fn share_fd(&self) -> Option<BorrowedFd<'_>> {
        self.pool.share_fd()
    }
    fn size(&self) -> u64 {
        self.pool.size()
    }
    fn alignment(&self) -> u64 {
        self.pool.alignment()
    }
    fn dmabuf_fd(&self) -> Option<BorrowedFd<'_>> {
        self.pool.dmabuf_fd()
    }
    fn ipc_handle(&self) -> Option<[u8; 64]> {
        self.pool.ipc_handle()
    }
    fn describe(&self) -> String {
        format!("recorded {}", self.pool.describe())
    }
}

/// Binds nothing; logs `Bind` and, when the binding is dropped, `Unbind`.
pub struct RecordingBinder {
    log: Arc<Log>,
}

impl QueueBinder for RecordingBinder {
    fn backend(&self) -> &'static str {
        "recording"
    }

    fn bind(
        &self,
        _pool: &dyn RxPool,
        gpu: PciAddr,
        ifname: &str,
        _nic_pci: Option<PciAddr>,
        queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError> {
        let call = GpuCall::Bind { gpu, ifname: ifname.into(), queues: queues.to_vec() };
        self.log.call(call).map_err(|e| BindError::new(gpu, ifname, queues, e))?;
        let binding = RecordingBinding {
            gpu,
            ifname: ifname.into(),
            queues: queues.to_vec(),
            log: Arc::clone(&self.log),
        };
        Ok(Box::new(binding))
    }
}

/// A binding that logs `Unbind` when dropped.
struct RecordingBinding {
    gpu: PciAddr,
    ifname: String,
    queues: Vec<u32>,
    log: Arc<Log>,
}

impl std::fmt::Debug for RecordingBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Drop for RecordingBinding {
    fn drop(&mut self) {
        self.log.record(GpuCall::Unbind { gpu: self.gpu, ifname: std::mem::take(&mut self.ifname) });
    }
}

impl Binding for RecordingBinding {
    fn describe(&self) -> String {
        format!("recording: {} on {} queues {}", self.gpu, self.ifname, crate::types::list(&self.queues))
    }
}

// Without the calls: a pool or binding may be printed from inside a sink,
// which runs under the calls' lock.
impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Log")
    }
}

#[cfg(test)]
mod tests;
