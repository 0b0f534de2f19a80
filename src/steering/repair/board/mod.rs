//! What waits to be repaired, and in which order: pure bookkeeping, no I/O.
//!
//! - **A queue per tenant**, served round-robin: a tenant with a thousand
//!   installs waiting gets one turn, like a tenant with one. Each queue holds
//!   at most `backlog` installs (those waiting for a dump included); past
//!   that, [`Board::push`] refuses.
//! - **A dump per namespace at a time**: an install that exact lookups did
//!   not settle is parked on its namespace ([`Board::park`]). Once no install
//!   of the namespace is still to be looked up and nothing has joined for
//!   [`GATHER`] (or [`GATHER_MAX`] after the first joined, whatever comes),
//!   one dump serves every install parked there ([`Next::Dump`]); those that
//!   come meanwhile wait for the next.
//! - **A flood costs its sender**: a tenant whose installs a dump found
//!   nothing for (a flood of flows that fit no connection) waits before its
//!   next dump, 1 ms, then twice as long after each such dump, up to
//!   [`BACKOFF_MAX`]; a dump or lookup that finds one of its connections ends
//!   the wait. Its own installs wait; other tenants' go on.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// How long a namespace's parked installs wait for others to join before
/// their dump: NCCL opens its connections in bursts.
pub const GATHER: Duration = Duration::from_millis(1);
/// The longest parked installs wait for others of their namespace to be
/// looked up before their dump.
pub const GATHER_MAX: Duration = Duration::from_millis(10);
/// The longest a tenant whose dumps find nothing waits before its next.
pub const BACKOFF_MAX: Duration = Duration::from_millis(256);
/// Tenants remembered while idle (their back-off), at most.
const IDLE_KEPT: usize = 4096;

/// Whose queue an install joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// Its tenant's workload (its id), with tenant isolation on.
    Tenant(u64),
    /// Its client process (lease number): isolation off, or the tenant unknown.
    Process(NonZeroU32),
    /// A client the daemon cannot tell.
    Nobody,
}

struct Queue<T> {
    /// Not looked up yet, each with its namespace.
    fresh: VecDeque<(u64, T)>,
    /// Of its installs, those parked on a namespace.
    parked: usize,
    /// Dumps in a row that found nothing for it.
    futile: u32,
    /// No dump for it before then.
    not_before: Option<Instant>,
}

impl<T> Queue<T> {
    fn new() -> Self {
        Queue { fresh: VecDeque::new(), parked: 0, futile: 0, not_before: None }
    }

    fn ready(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| t <= now)
    }
}

struct Space<T> {
    parked: Vec<(Key, T)>,
    dumping: bool,
    /// When the first install joined since the last dump, and the last one.
    first: Instant,
    joined: Instant,
}

/// What a worker does next.
pub enum Next<T> {
    /// Exact lookups of one install, of namespace `.1`: then
    /// [`Board::park`] or [`Board::looked`].
    Look(Key, u64, T),
    /// One dump of namespace `.0` for the installs `.1`.
    Dump(u64, Vec<(Key, T)>),
    /// Nothing now; something may be due at this time.
    Wait(Option<Instant>),
}

/// The installs waiting, by tenant and by namespace.
pub struct Board<T> {
    queues: HashMap<Key, Queue<T>>,
    /// Tenants with installs not looked up yet, in turn order.
    ring: VecDeque<Key>,
    spaces: HashMap<u64, Space<T>>,
    /// Per namespace, its installs queued or being looked up.
    looking: HashMap<u64, usize>,
    backlog: usize,
    waiting: usize,
}

impl<T> Board<T> {
    pub fn new(backlog: usize) -> Self {
        Board {
            queues: HashMap::new(),
            ring: VecDeque::new(),
            spaces: HashMap::new(),
            looking: HashMap::new(),
            backlog,
            waiting: 0,
        }
    }

    /// Installs waiting now (not looked up yet, or parked).
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Queues `item` of namespace `space` for tenant `key`; gives it back
    /// when the tenant has `backlog` installs waiting already.
    pub fn push(&mut self, key: Key, space: u64, item: T) -> Result<(), T> {
        let q = self.queues.entry(key).or_insert_with(Queue::new);
        if q.fresh.len() + q.parked >= self.backlog {
            return Err(item);
        }
        if q.fresh.is_empty() {
            self.ring.push_back(key);
        }
        q.fresh.push_back((space, item));
        *self.looking.entry(space).or_default() += 1;
        self.waiting += 1;
        Ok(())
    }

    /// An install of `key`'s exact lookups did not settle: it waits for a
    /// dump of namespace `space`.
    pub fn park(&mut self, key: Key, space: u64, item: T, now: Instant) {
        self.looked(space);
        self.queues.entry(key).or_insert_with(Queue::new).parked += 1;
        let new = || Space { parked: Vec::new(), dumping: false, first: now, joined: now };
        let s = self.spaces.entry(space).or_insert_with(new);
        if s.parked.is_empty() {
            s.first = now;
        }
        s.parked.push((key, item));
        s.joined = now;
        self.waiting += 1;
    }

    /// The lookup of an install of namespace `space` is over (settled, or parked).
    pub fn looked(&mut self, space: u64) {
        if let Some(n) = self.looking.get_mut(&space) {
            *n -= 1;
            if *n == 0 {
                self.looking.remove(&space);
            }
        }
    }

    /// An install of `key` found its connection: whatever it waited for ends.
    pub fn found(&mut self, key: Key) {
        if let Some(q) = self.queues.get_mut(&key) {
            q.futile = 0;
            q.not_before = None;
        }
    }

    /// The next thing to do at `now`.
    pub fn next(&mut self, now: Instant) -> Next<T> {
        while let Some(key) = self.ring.pop_front() {
            let Some(q) = self.queues.get_mut(&key) else { continue };
            let Some((space, item)) = q.fresh.pop_front() else { continue };
            if !q.fresh.is_empty() {
                self.ring.push_back(key);
            }
            self.waiting -= 1;
            return Next::Look(key, space, item);
        }
        let mut due: Option<Instant> = None;
        let mut soonest = |t: Instant| due = Some(due.map_or(t, |d| d.min(t)));
        for (&id, s) in &mut self.spaces {
            if s.dumping || s.parked.is_empty() {
                continue;
            }
            // Gathered: none of its installs left to look up, and none
            // joined for a while; or waited long enough, whatever comes.
            let at = match self.looking.contains_key(&id) {
                false => (s.joined + GATHER).min(s.first + GATHER_MAX),
                true => s.first + GATHER_MAX,
            };
            if now < at {
                soonest(at);
                continue;
            }
            let queues = &self.queues;
            let ready = |k: &Key| queues.get(k).is_none_or(|q| q.ready(now));
            let (take, keep): (Vec<_>, Vec<_>) = s.parked.drain(..).partition(|(k, _)| ready(k));
            for (k, _) in &keep {
                if let Some(t) = queues.get(k).and_then(|q| q.not_before) {
                    soonest(t);
                }
            }
            s.parked = keep;
            if take.is_empty() {
                continue;
            }
            s.dumping = true;
            self.waiting -= take.len();
            return Next::Dump(id, take);
        }
        Next::Wait(due)
    }

    /// The dump of `space` is done; `found[i]`: whether it settled anything
    /// for the `i`th install it served (of tenant `keys[i]`).
    pub fn dumped(&mut self, space: u64, served: &[(Key, bool)], now: Instant) {
        let mut productive: HashMap<Key, bool> = HashMap::new();
        for &(k, found) in served {
            *productive.entry(k).or_default() |= found;
            if let Some(q) = self.queues.get_mut(&k) {
                q.parked = q.parked.saturating_sub(1);
            }
        }
        for (k, found) in productive {
            let Some(q) = self.queues.get_mut(&k) else { continue };
            match found {
                true => (q.futile, q.not_before) = (0, None),
                false => {
                    q.futile = q.futile.saturating_add(1);
                    let wait = Duration::from_millis(1 << (q.futile - 1).min(8)).min(BACKOFF_MAX);
                    q.not_before = Some(now + wait);
                }
            }
        }
        if let Some(s) = self.spaces.get_mut(&space) {
            s.dumping = false;
            if s.parked.is_empty() {
                self.spaces.remove(&space);
            }
        }
        self.forget_idle(now);
    }

    /// Drops the queues of tenants with nothing waiting and no wait to
    /// remember (all idle ones, when too many are kept).
    fn forget_idle(&mut self, now: Instant) {
        let many = self.queues.len() > IDLE_KEPT;
        self.queues.retain(|_, q| !q.fresh.is_empty() || q.parked > 0 || (!many && !q.ready(now)));
    }
}

#[cfg(test)]
mod tests;
