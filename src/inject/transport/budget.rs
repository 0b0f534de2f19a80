//! The bytes of request bodies and replies that `inject serve` holds at
//! once, as semaphore permits (one per byte), in two pools. Each request's
//! first [`Budget::share`] bytes come from room kept for every connection,
//! so a typical review (tens of KiB) never waits for another client's;
//! bytes past the share come from a common pool as they arrive.
//!
//! A body still arriving holds its room at its client's pace. When a
//! request needs room and the common pool is full, the body that has been
//! arriving longest, if for [`GIVE_BACK_AFTER`] or more, is told to give
//! its room back (its request is refused): a body from the API server
//! arrives in milliseconds, so room held longer is held by a client that
//! sends slowly or not at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A body that has been arriving this long gives its room to a request
/// that needs it.
pub const GIVE_BACK_AFTER: Duration = Duration::from_millis(250);

/// No room came by the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom;

/// Bytes held at once by request bodies and replies (see the module's notes).
#[derive(Clone)]
pub struct Budget {
    own: Arc<Semaphore>,
    common: Arc<Semaphore>,
    share: usize,
    readers: Arc<Mutex<Readers>>,
}

/// Bodies being read that may be told to give their room back.
#[derive(Default)]
struct Readers {
    next: u64,
    map: HashMap<u64, Reader>,
}

struct Reader {
    since: Instant,
    /// Bytes of the common pool it holds.
    common: usize,
    /// Waiting for room itself: the server's turn, not its client's.
    waiting: bool,
    told: bool,
    give_back: Arc<Notify>,
}

/// What one request holds of the [`Budget`].
pub struct Holding {
    own: OwnedSemaphorePermit,
    common: OwnedSemaphorePermit,
}

impl Holding {
    pub fn bytes(&self) -> usize {
        self.own.num_permits() + self.common.num_permits()
    }
}

/// A body being read, known to its [`Budget`] until dropped.
pub struct BodyRoom {
    budget: Budget,
    id: u64,
    give_back: Arc<Notify>,
}

impl BodyRoom {
    /// Ready once the body was told to give its room to another request.
    pub async fn told_to_give_back(&self) {
        self.give_back.notified().await
    }
}

impl Drop for BodyRoom {
    fn drop(&mut self) {
        self.budget.readers().map.remove(&self.id);
    }
}

impl Budget {
    /// `share` bytes for each of `holders` requests at once, and `common`
    /// bytes for what is past the shares.
    pub fn new(share: usize, holders: usize, common: usize) -> Budget {
        Budget {
            own: Arc::new(Semaphore::new(share.saturating_mul(holders))),
            common: Arc::new(Semaphore::new(common)),
            share,
            readers: Arc::default(),
        }
    }

    fn readers(&self) -> MutexGuard<'_, Readers> {
        // Each statement leaves the map consistent: a panic elsewhere
        // leaves nothing half done.
        self.readers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes each request holds before it draws on the common pool.
    pub fn share(&self) -> usize {
        self.share
    }

    /// Bytes of the common pool free now.
    pub fn common_free(&self) -> usize {
        self.common.available_permits()
    }

    /// A holding of nothing, to grow.
    pub fn none(&self) -> Holding {
        let zero =
            |s: &Arc<Semaphore>| s.clone().try_acquire_many_owned(0).expect("zero permits are always there");
        Holding { own: zero(&self.own), common: zero(&self.common) }
    }

    /// A body starting to arrive now.
    pub fn body(&self) -> BodyRoom {
        let give_back = Arc::new(Notify::new());
        let mut r = self.readers();
        let id = r.next;
        r.next += 1;
        let reader = Reader {
            since: Instant::now(),
            common: 0,
            waiting: false,
            told: false,
            give_back: give_back.clone(),
        };
        r.map.insert(id, reader);
        drop(r);
        BodyRoom { budget: self.clone(), id, give_back }
    }

    /// The permits `held` lacks of `total`: (from the shares, from the common pool).
    fn lacks(&self, held: &Holding, total: usize) -> (usize, usize) {
        let own = total.min(self.share).saturating_sub(held.own.num_permits());
        let common = total.saturating_sub(held.own.num_permits() + own + held.common.num_permits());
        (own, common)
    }

    /// Grows `held` to `total` bytes if the room is there now.
    fn try_grow_to(&self, held: &mut Holding, total: usize) -> bool {
        let (own, common) = self.lacks(held, total);
        let take = |s: &Arc<Semaphore>, n: usize| match u32::try_from(n) {
            Ok(0) => Some(None),
            Ok(n) => s.clone().try_acquire_many_owned(n).ok().map(Some),
            Err(_) => None,
        };
        let Some(own) = take(&self.own, own) else { return false };
        let Some(common) = take(&self.common, common) else { return false };
        for (into, more) in [(&mut held.own, own), (&mut held.common, common)] {
            if let Some(more) = more {
                into.merge(more);
            }
        }
        true
    }

    /// Tells the bodies arriving longest (past [`GIVE_BACK_AFTER`]) to give
    /// their room back, until `need` bytes of the common pool would be free
    /// (counting what they hold and what is free now).
    fn reclaim(&self, need: usize, me: Option<u64>) {
        let mut free = self.common_free();
        let now = Instant::now();
        let mut r = self.readers();
        let mut slow: Vec<(&u64, &mut Reader)> = r
            .map
            .iter_mut()
            .filter(|(id, x)| {
                Some(**id) != me && !x.waiting && !x.told && x.common > 0 && now - x.since >= GIVE_BACK_AFTER
            })
            .collect();
        slow.sort_by_key(|(_, x)| x.since);
        for (_, x) in slow {
            if free >= need {
                break;
            }
            x.told = true;
            x.give_back.notify_one();
            free += x.common;
        }
    }

    /// Grows `held` to `total` bytes, waiting for room until `deadline` at
    /// most; `waiting` is called once, before it waits, if it must. `body`
    /// is the body the room is for, if it is one: its own room is not
    /// reclaimed for it, and it is not told to give room back while it
    /// waits. While it waits, the bodies arriving slowest are told to give
    /// theirs back, again every [`GIVE_BACK_AFTER`].
    pub async fn grow_to(
        &self,
        held: &mut Holding,
        total: usize,
        deadline: Instant,
        body: Option<&BodyRoom>,
        waiting: impl FnOnce(),
    ) -> Result<(), NoRoom> {
        if self.try_grow_to(held, total) {
            self.note(body, held);
            return Ok(());
        }
        waiting();
        let me = body.map(|b| b.id);
        self.mark_waiting(me, true);
        let (own, common) = self.lacks(held, total);
        let mut got = Ok(());
        for (pool, n, into) in [(&self.own, own, &mut held.own), (&self.common, common, &mut held.common)] {
            match self.acquire(pool, n, deadline, me).await {
                Ok(Some(more)) => into.merge(more),
                Ok(None) => {}
                Err(NoRoom) => {
                    got = Err(NoRoom);
                    break;
                }
            }
        }
        self.mark_waiting(me, false);
        self.note(body, held);
        got
    }

    /// `n` permits of `pool` by `deadline`, reclaiming room for them.
    async fn acquire(
        &self,
        pool: &Arc<Semaphore>,
        n: usize,
        deadline: Instant,
        me: Option<u64>,
    ) -> Result<Option<OwnedSemaphorePermit>, NoRoom> {
        let want = u32::try_from(n).map_err(|_| NoRoom)?;
        if want == 0 {
            return Ok(None);
        }
        let acquire = pool.clone().acquire_many_owned(want);
        tokio::pin!(acquire);
        loop {
            if Arc::ptr_eq(pool, &self.common) {
                self.reclaim(n, me);
            }
            let next = deadline.min(Instant::now() + GIVE_BACK_AFTER);
            tokio::select! {
                got = &mut acquire => return got.map(Some).map_err(|_| NoRoom),
                () = tokio::time::sleep_until(next) => if next >= deadline {
                    return Err(NoRoom);
                },
            }
        }
    }

    fn mark_waiting(&self, me: Option<u64>, waiting: bool) {
        if let Some(id) = me {
            if let Some(x) = self.readers().map.get_mut(&id) {
                x.waiting = waiting;
            }
        }
    }

    /// Records what `body` holds of the common pool.
    fn note(&self, body: Option<&BodyRoom>, held: &Holding) {
        if let Some(b) = body {
            if let Some(x) = self.readers().map.get_mut(&b.id) {
                x.common = held.common.num_permits();
            }
        }
    }

    /// Keeps `total` bytes of `held`, gives the rest back (the common
    /// pool's first).
    pub fn shrink_to(held: &mut Holding, total: usize) {
        let keep_common = total.saturating_sub(held.own.num_permits());
        if held.common.num_permits() > keep_common {
            drop(held.common.split(held.common.num_permits() - keep_common));
        }
        if held.own.num_permits() > total {
            drop(held.own.split(held.own.num_permits() - total));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn room_goes_to_the_shares_first_and_a_slow_body_gives_its_common_room_back() {
        let budget = Budget::new(100, 3, 1000);
        let far = Instant::now() + Duration::from_secs(60);
        // A slow body holds its share and the whole common pool.
        let slow = budget.body();
        let mut slow_held = budget.none();
        budget.grow_to(&mut slow_held, 1100, far, Some(&slow), || panic!("room was there")).await.unwrap();
        assert_eq!((slow_held.bytes(), budget.common_free()), (1100, 0));
        // Within a share: no wait, whatever the common pool holds.
        let mut small = budget.none();
        budget.grow_to(&mut small, 100, far, None, || panic!("a share waited")).await.unwrap();
        // Past it, before the slow body had its time: the wait ends at the deadline.
        let mut big = budget.none();
        let fast = budget.body();
        let mut waited = false;
        let soon = Instant::now() + Duration::from_millis(100);
        let r = budget.grow_to(&mut big, 600, soon, Some(&fast), || waited = true).await;
        assert_eq!(r, Err(NoRoom));
        assert!(waited);
        // Once it had: it is told to give its room back, and the room comes.
        tokio::time::sleep(GIVE_BACK_AFTER).await;
        {
            let grow = budget.grow_to(&mut big, 600, far, Some(&fast), || {});
            tokio::pin!(grow);
            tokio::select! {
                _ = &mut grow => panic!("room before the slow body gave it back"),
                () = slow.told_to_give_back() => {}
            }
            drop((slow_held, slow));
            grow.await.unwrap();
        }
        drop(fast);
        assert_eq!((big.bytes(), budget.common_free()), (600, 500));
        // Giving back: the common pool's first.
        Budget::shrink_to(&mut big, 50);
        assert_eq!((big.bytes(), budget.common_free()), (50, 1000));
    }
}
