//! The connection budget: `--max_connections` split so that idle clients of
//! one kind cannot starve the others, and the idle limit of short-lived
//! connections.
//!
//! - A quarter of the connections (rounded down) is kept for the registry and
//!   pool endpoints. The NCCL plugin holds its registry connection for the
//!   whole job, silently, and needs the pool endpoints once per GPU; neither
//!   must wait behind rule or queue connections. They use the shared part too
//!   once their own share is taken.
//! - Rule and queue connections (`rx_rule_manager`, `rx_rule_uninstall`,
//!   `queue_ids_by_gpu`) that have sent no complete request for
//!   `--client_idle_timeout` seconds are closed. With nothing pending the
//!   close is silent (no request, so no reply is owed); with part of a frame
//!   pending the client gets `INVALID_ARGUMENT` naming the bytes received,
//!   then the close, as for any malformed input. Registry and pool
//!   connections are not timed out once they asked for something (the
//!   plugin holds its registration for the whole job, silently); one that
//!   asked for nothing within the same limit is closed all the same, so
//!   that silent connections cannot hold the budget.
//! - Where tenants are read, each workload holds at most three quarters of
//!   what each kind may use (registry and pool: all of it; rule and queue:
//!   the shared part), so that one workload holding connections open, busy
//!   or silent, leaves room for the others; the next is refused, saying why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Endpoint;
use crate::types::status::StatusCode;
use crate::wire::frame;
use crate::wire::proto::UnixSocketProto;

/// Share of `--max_connections` kept for registry and pool endpoints: 1/RESERVE_DIVISOR.
pub const RESERVE_DIVISOR: usize = 4;

pub struct ConnBudget {
    shared: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
    total: usize,
    /// Most connections open at once since [`ConnBudget::take_peak`].
    peak: AtomicUsize,
    idle_timeout: Option<Duration>,
    /// Connections each workload holds now, and how many it may: rule and
    /// queue connections (`[0]`), registry and pool connections (`[1]`).
    workloads: [Arc<WorkloadCounts>; 2],
}

/// Counts kept in this many maps (by workload id), so that threads
/// accepting connections of different workloads seldom wait on each other.
const WORKLOAD_SHARDS: usize = 16;

/// Each workload's connections of one kind: at most `most`, so that the
/// rest of what that kind may use is always there for other workloads.
#[derive(Debug)]
struct WorkloadCounts {
    held: [Mutex<HashMap<u64, usize>>; WORKLOAD_SHARDS],
    most: usize,
    long_lived: bool,
}

impl WorkloadCounts {
    fn new(most: usize, long_lived: bool) -> Arc<Self> {
        Arc::new(WorkloadCounts { held: Default::default(), most: most.max(1), long_lived })
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        // Cgroup ids are inode numbers: their low bits spread well enough.
        self.held[(key % WORKLOAD_SHARDS as u64) as usize].lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The key that connections whose client could not be identified (its
/// process exited before it was read, or the read failed) are charged to,
/// all together, so that they cannot dodge the shares. No workload id is 0
/// (a cgroup's inode never is; a path's number has bit 63 set).
pub const NOBODY_WORKLOAD: u64 = 0;

/// A connection refused because its workload holds its most of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverShare {
    pub most: usize,
    long_lived: bool,
}

impl OverShare {
    /// The refusal's text, naming the workload (`None`: the clients that
    /// could not be identified, together).
    pub fn message(&self, workload: Option<&str>) -> String {
        let (kind, part) = if self.long_lived {
            ("registry and pool", "three quarters of --max_connections")
        } else {
            ("rule and queue", "three quarters of the part of --max_connections that they may use")
        };
        let n = self.most;
        match workload {
            Some(w) => format!(
                "workload {w} holds {n} {kind} connections to the daemon, the most one workload may ({part}; \
                 the rest is kept for other workloads); close connections it no longer uses"
            ),
            None => format!(
                "clients the daemon could not identify (their process exited or could not be read) hold {n} \
                 {kind} connections to the daemon, the most they may together ({part}; the rest is kept for \
                 identified workloads); connect from a live process that keeps the connection"
            ),
        }
    }
}

/// One connection charged to its workload; given back when dropped.
#[derive(Debug)]
pub struct WorkloadShare {
    counts: Arc<WorkloadCounts>,
    key: u64,
}

impl Drop for WorkloadShare {
    fn drop(&mut self) {
        let mut held = self.counts.shard(self.key);
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// Whether connections to `endpoint` may use the reserved share (and are
/// never timed out).
pub fn long_lived(endpoint: Endpoint) -> bool {
    !matches!(endpoint, Endpoint::RuleManager | Endpoint::RuleUninstall | Endpoint::QueueIdsByGpu)
}

impl ConnBudget {
    /// `max` connections in all; `idle_timeout` `None` never closes idle ones.
    pub fn new(max: usize, idle_timeout: Option<Duration>) -> Self {
        let reserved = max / RESERVE_DIVISOR;
        ConnBudget {
            shared: Arc::new(Semaphore::new(max - reserved)),
            reserved: Arc::new(Semaphore::new(reserved)),
            total: max,
            peak: AtomicUsize::new(0),
            idle_timeout,
            workloads: [
                WorkloadCounts::new((max - reserved) - (max - reserved) / RESERVE_DIVISOR, false),
                WorkloadCounts::new(max - max / RESERVE_DIVISOR, true),
            ],
        }
    }

    /// Charges one connection to `endpoint` to workload `key` (its id);
    /// `Err` when the workload holds its most of that kind already. A
    /// quarter of what each kind may use is never one workload's: however
    /// many connections one opens and holds (silent registrations
    /// included), every other workload finds room.
    pub fn charge_workload(&self, key: u64, endpoint: Endpoint) -> Result<WorkloadShare, OverShare> {
        let counts = &self.workloads[usize::from(long_lived(endpoint))];
        let mut held = counts.shard(key);
        let n = held.entry(key).or_insert(0);
        if *n >= counts.most {
            return Err(OverShare { most: counts.most, long_lived: counts.long_lived });
        }
        *n += 1;
        drop(held);
        Ok(WorkloadShare { counts: counts.clone(), key })
    }

    /// A permit for one connection to `endpoint`, waiting until one is free.
    pub async fn acquire(&self, endpoint: Endpoint) -> OwnedSemaphorePermit {
        let p = self.acquire_inner(endpoint).await;
        self.peak.fetch_max(self.open(), Ordering::Relaxed);
        p
    }

    /// A permit for one connection to `endpoint` if one is free now.
    pub fn try_acquire(&self, endpoint: Endpoint) -> Option<OwnedSemaphorePermit> {
        let p = if long_lived(endpoint) {
            self.reserved.clone().try_acquire_owned().or_else(|_| self.shared.clone().try_acquire_owned())
        } else {
            self.shared.clone().try_acquire_owned()
        };
        let p = p.ok()?;
        self.peak.fetch_max(self.open(), Ordering::Relaxed);
        Some(p)
    }

    /// Up to `n` permits at once for connections to `endpoint`, for a
    /// thread that hands them out to its connections itself (so that a
    /// connection costs no operation on the shared count): `n` if as many
    /// are free, else one; `None` when none is.
    pub fn try_acquire_up_to(&self, endpoint: Endpoint, n: usize) -> Option<OwnedSemaphorePermit> {
        let part = || if long_lived(endpoint) { &self.reserved } else { &self.shared };
        let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        let p = part().clone().try_acquire_many_owned(n).ok().or_else(|| self.try_acquire(endpoint))?;
        self.peak.fetch_max(self.open(), Ordering::Relaxed);
        Some(p)
    }

    /// Whether [`Self::try_acquire`] would find a permit for `endpoint` now.
    pub fn has_room(&self, endpoint: Endpoint) -> bool {
        self.shared.available_permits() > 0 || (long_lived(endpoint) && self.reserved.available_permits() > 0)
    }

    async fn acquire_inner(&self, endpoint: Endpoint) -> OwnedSemaphorePermit {
        if !long_lived(endpoint) {
            return self.shared.clone().acquire_owned().await.expect("never closed");
        }
        if let Ok(p) = self.reserved.clone().try_acquire_owned() {
            return p;
        }
        tokio::select! {
            biased;
            p = self.reserved.clone().acquire_owned() => p.expect("never closed"),
            p = self.shared.clone().acquire_owned() => p.expect("never closed"),
        }
    }

    /// The most connections open at once since the last call; starts over from now.
    pub fn take_peak(&self) -> usize {
        self.peak.swap(self.open(), Ordering::Relaxed).max(self.open())
    }

    /// How long a connection to `endpoint` may go without a complete request.
    pub fn idle_limit(&self, endpoint: Endpoint) -> Option<Duration> {
        if long_lived(endpoint) {
            None
        } else {
            self.idle_timeout
        }
    }

    /// How long a connection to any endpoint may wait before its first
    /// request: a connection that never asks for anything holds a share of
    /// the budget for nothing.
    pub fn first_request_limit(&self) -> Option<Duration> {
        self.idle_timeout
    }

    /// Connections being served now.
    pub fn open(&self) -> usize {
        self.total - self.shared.available_permits() - self.reserved.available_permits()
    }

    /// Free permits (shared, reserved); for tests and `/debug`.
    pub fn available(&self) -> (usize, usize) {
        (self.shared.available_permits(), self.reserved.available_permits())
    }
}

/// Resolves when a connection idle since `since` has used up `limit`; never without a limit.
pub async fn idle_expired(limit: Option<Duration>, since: tokio::time::Instant) {
    match limit {
        Some(d) => tokio::time::sleep_until(since + d).await,
        None => std::future::pending().await,
    }
}

/// The reply to a connection whose frame stayed incomplete past the idle limit.
pub fn incomplete_reply(pending: &[u8], limit: Duration) -> UnixSocketProto {
    let announced = frame::body_len(pending).map(|n| n + frame::HEADER_LEN);
    let want = announced.map(|n| format!(" of {n}")).unwrap_or_default();
    frame::error(
        StatusCode::InvalidArgument,
        format!(
            "incomplete request: {}{want} bytes received, nothing more for {} s; closing",
            pending.len(),
            limit.as_secs()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::pci::PciAddr;

    #[test]
    fn a_workload_holds_at_most_three_quarters_of_each_kind() {
        let b = ConnBudget::new(8, None);
        let pool = Endpoint::Registry;
        let shares: Vec<_> = (0..6).map(|_| b.charge_workload(7, pool).expect("within its share")).collect();
        let over = b.charge_workload(7, pool).unwrap_err();
        assert_eq!(over.most, 6, "the last quarter of the 8 is not one workload's");
        assert!(over.message(Some("pod x")).contains("workload pod x holds 6 registry and pool connections"));
        let other = b.charge_workload(8, pool).expect("another workload finds room");
        // Rule connections may use 6 of the 8; one workload 5 of those.
        let rules: Vec<_> =
            (0..5).map(|_| b.charge_workload(7, Endpoint::RuleManager).expect("its own kind")).collect();
        let over = b.charge_workload(7, Endpoint::QueueIdsByGpu).unwrap_err();
        assert_eq!(over.most, 5);
        let text = over.message(Some("job 3"));
        assert!(text.contains("5 rule and queue connections"), "{text}");
        assert!(over.message(None).contains("could not identify"));
        drop(shares);
        assert!(b.charge_workload(7, pool).is_ok(), "given back when the connections close");
        drop((other, rules));
        assert!(b.charge_workload(7, Endpoint::RuleUninstall).is_ok());
    }

    #[tokio::test]
    async fn rule_connections_cannot_take_the_reserved_share() {
        let b = ConnBudget::new(8, None);
        assert_eq!(b.available(), (6, 2));
        let mut held = Vec::new();
        for _ in 0..6 {
            held.push(b.acquire(Endpoint::RuleManager).await);
        }
        // The shared part is gone: a seventh rule connection waits...
        let wait = tokio::time::timeout(Duration::from_millis(50), b.acquire(Endpoint::QueueIdsByGpu)).await;
        assert!(wait.is_err());
        // ...while registry and pool connections still get in.
        let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
        held.push(b.acquire(Endpoint::Registry).await);
        held.push(b.acquire(Endpoint::GpuFd(gpu)).await);
        assert_eq!(b.available(), (0, 0));
        // Long-lived ones fall back to the shared part when theirs is taken.
        drop(held.remove(0));
        let p = tokio::time::timeout(Duration::from_millis(50), b.acquire(Endpoint::GpuMetadata(gpu))).await;
        assert!(p.is_ok());
    }

    #[test]
    fn try_acquire_keeps_the_same_shares() {
        let b = ConnBudget::new(8, None);
        let rules: Vec<_> =
            (0..6).map(|_| b.try_acquire(Endpoint::RuleManager).expect("shared part")).collect();
        assert!(!b.has_room(Endpoint::RuleUninstall));
        assert!(b.try_acquire(Endpoint::RuleUninstall).is_none(), "rule connections stay out of the reserve");
        assert!(b.has_room(Endpoint::Registry));
        let reg = b.try_acquire(Endpoint::Registry).expect("reserved part");
        assert_eq!((b.open(), b.take_peak()), (7, 7));
        drop(rules);
        drop(reg);
        assert!(b.has_room(Endpoint::RuleManager));
        assert_eq!(b.open(), 0);
    }

    #[test]
    fn permits_come_in_a_batch_while_the_budget_has_them_then_one_by_one() {
        let b = ConnBudget::new(8, None);
        let batch = b.try_acquire_up_to(Endpoint::RuleManager, 4).expect("room for 4");
        assert_eq!((batch.num_permits(), b.open()), (4, 4));
        let one = b.try_acquire_up_to(Endpoint::RuleManager, 4).expect("two left: one of them");
        assert_eq!((one.num_permits(), b.open()), (1, 5));
        let _last = b.try_acquire_up_to(Endpoint::RuleManager, 4).expect("the last shared one");
        assert!(b.try_acquire_up_to(Endpoint::RuleManager, 4).is_none(), "the reserve is not for rules");
        drop(batch);
        assert_eq!(b.open(), 2);
    }

    #[test]
    fn small_budgets_and_limits() {
        assert_eq!(ConnBudget::new(2, None).available(), (2, 0));
        assert_eq!(ConnBudget::new(4096, None).available(), (3072, 1024));
        let b = ConnBudget::new(8, Some(Duration::from_secs(60)));
        assert_eq!(b.idle_limit(Endpoint::RuleUninstall), Some(Duration::from_secs(60)));
        assert_eq!(b.idle_limit(Endpoint::Registry), None);
        assert_eq!(b.idle_limit(Endpoint::GpuIpcHandle), None);
    }

    #[test]
    fn incomplete_reply_names_the_bytes() {
        let r = incomplete_reply(&[0, 10, 1, 2, 3], Duration::from_secs(60));
        let text = r.status.unwrap().message;
        assert_eq!(text, "incomplete request: 5 of 12 bytes received, nothing more for 60 s; closing");
        let r = incomplete_reply(&[0], Duration::from_secs(60));
        assert!(r.status.unwrap().message.starts_with("incomplete request: 1 bytes"));
    }
}
