//! The places of connections that hold no request slot: those still waiting
//! for their request head, and those being given a short answer that needs
//! no slot (a probe, 405, 431, 503). There are at most `cap`; a connection
//! accepted when all are taken evicts the oldest holder, which is closed
//! without a reply. An idle connection therefore costs its place only until
//! newer ones arrive, and a probe, which sends its head as soon as it has
//! connected, is never the oldest for long.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The places, oldest first (ids grow with each accepted connection).
pub(super) struct Waiting {
    cap: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    next: u64,
    /// Dropping a holder's sender tells it that it was evicted.
    holders: BTreeMap<u64, oneshot::Sender<()>>,
}

impl Waiting {
    pub(super) fn new(cap: usize) -> Arc<Waiting> {
        Arc::new(Waiting { cap: cap.max(1), inner: Mutex::new(Inner { next: 0, holders: BTreeMap::new() }) })
    }

    /// A place for a connection just accepted, and whether an older one was
    /// evicted to make room.
    pub(super) fn enter(self: &Arc<Self>) -> (Place, bool) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.lock().expect("waiting lock");
        let evicted = inner.holders.len() >= self.cap && inner.holders.pop_first().is_some();
        let id = inner.next;
        inner.next += 1;
        inner.holders.insert(id, tx);
        (Place { id, evicted: rx, waiting: self.clone() }, evicted)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.inner.lock().expect("waiting lock").holders.len()
    }
}

/// One connection's place; given back when dropped.
pub(super) struct Place {
    id: u64,
    evicted: oneshot::Receiver<()>,
    waiting: Arc<Waiting>,
}

impl Place {
    /// Resolves once a newer connection has taken this place.
    pub(super) async fn evicted(&mut self) {
        // Nothing is ever sent: the sender is only dropped, at eviction.
        let _ = (&mut self.evicted).await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Already gone when evicted; then this removes nothing.
        self.waiting.inner.lock().expect("waiting lock").holders.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_place_is_taken_when_all_are_held() {
        let w = Waiting::new(2);
        let (mut a, ea) = w.enter();
        let (mut b, eb) = w.enter();
        assert!(!ea && !eb);
        let (c, ec) = w.enter();
        assert!(ec, "a third place in two evicts one");
        a.evicted().await; // resolves: the oldest went
        assert_eq!(w.len(), 2);
        // A place given back makes room without evicting anyone.
        drop(c);
        let (_d, ed) = w.enter();
        assert!(!ed);
        let (_e, ee) = w.enter();
        assert!(ee);
        b.evicted().await;
        drop(a); // an evicted place's drop removes nothing else
        assert_eq!(w.len(), 2);
    }
}
