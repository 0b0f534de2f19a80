//! Who holds the webhook's connections, and which one is closed when a new
//! one needs room. Two bounds under one lock: connections in their TLS
//! handshake (or waiting for a place to be served), and connections being
//! served. When one is full, the connection that has waited longest on its
//! client (a handshake not finished, an idle keep-alive, a request still
//! arriving, a reply not taken) is closed to make room once it has had
//! [`EVICT_AFTER`]; one whose request the server is working on (a review
//! queued or running) is never closed for room, nor is a handshake whose
//! ClientHello came whole (its client did its part; the server's handshake
//! deadline bounds it), however slowly a loaded server answers it. So clients that connect and stall cannot keep a new
//! connection waiting longer than that: a legitimate handshake takes
//! milliseconds, and it is the youngest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// A connection that waits on its client is closed to make room only once
/// it has waited this long: time for a handshake or a request to arrive,
/// many times over, on a loaded node.
pub const EVICT_AFTER: Duration = Duration::from_millis(250);

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// In its TLS handshake, or waiting for a place among the served.
    Handshake,
    /// Served, waiting on its client: between requests, a request still
    /// arriving, or a reply not yet taken.
    Client,
    /// Served, the server's turn: a review queued or running, a reply
    /// waiting for room.
    Server,
}

struct Entry {
    stage: Stage,
    since: Instant,
    /// Its ClientHello came whole (a handshake under way, or done).
    hello: bool,
    close: Arc<Notify>,
}

#[derive(Default)]
struct Table {
    next: u64,
    entries: HashMap<u64, Entry>,
    handshakes: usize,
    served: usize,
}

impl Table {
    /// The connection in `stage` that has been there longest, if it has
    /// been there [`EVICT_AFTER`] by `now`; else when the first will have.
    /// A handshake whose ClientHello came whole is not one: its client
    /// did its part, and the handshake deadline bounds it.
    fn oldest(&self, stage: Stage, now: Instant) -> Result<u64, Option<Instant>> {
        let oldest = self
            .entries
            .iter()
            .filter(|(_, e)| e.stage == stage && !(stage == Stage::Handshake && e.hello))
            .min_by_key(|(_, e)| e.since);
        match oldest {
            Some((id, e)) if now.duration_since(e.since) >= EVICT_AFTER => Ok(*id),
            Some((_, e)) => Err(Some(e.since + EVICT_AFTER)),
            None => Err(None),
        }
    }

    /// Takes `id` out of the table; its connection is told to close.
    fn evict(&mut self, id: u64) {
        if let Some(e) = self.remove(id) {
            e.close.notify_one();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        match e.stage {
            Stage::Handshake => self.handshakes -= 1,
            Stage::Client | Stage::Server => self.served -= 1,
        }
        Some(e)
    }
}

/// The server's connections.
pub struct Conns {
    table: Mutex<Table>,
    /// Told whenever room may have appeared: a connection left, or one
    /// started waiting on its client.
    changed: Notify,
    max_handshakes: usize,
    max_served: usize,
}

impl Conns {
    pub fn new(max_handshakes: usize, max_served: usize) -> Arc<Conns> {
        Arc::new(Conns { table: Mutex::default(), changed: Notify::new(), max_handshakes, max_served })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table is consistent after every statement: a panic elsewhere
        // leaves nothing half done.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (handshakes, served) now.
    pub fn counts(&self) -> (usize, usize) {
        let t = self.lock();
        (t.handshakes, t.served)
    }

    /// Waits until [`Conns::admit`] can take a new connection: a handshake
    /// place is free, or the oldest handshake has had its time.
    pub async fn room_for_handshake(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let wake = {
                let t = self.lock();
                if t.handshakes < self.max_handshakes {
                    return;
                }
                match t.oldest(Stage::Handshake, Instant::now()) {
                    Ok(_) => return,
                    Err(wake) => wake,
                }
            };
            changed_or(changed, wake).await;
        }
    }

    /// A new connection in its handshake. Where the handshakes are full,
    /// the oldest one that has had its time is closed for it (the returned
    /// `true`). Call it after [`Conns::room_for_handshake`]: places only
    /// free up and ages only grow in between (should that one's ClientHello
    /// come whole in between, this one is taken all the same: one over).
    pub fn admit(self: &Arc<Self>) -> (Ticket, bool) {
        let mut t = self.lock();
        let mut evicted = false;
        if t.handshakes >= self.max_handshakes {
            if let Ok(id) = t.oldest(Stage::Handshake, Instant::now()) {
                t.evict(id);
                evicted = true;
            }
        }
        let id = t.next;
        t.next += 1;
        let close = Arc::new(Notify::new());
        let entry =
            Entry { stage: Stage::Handshake, since: Instant::now(), hello: false, close: close.clone() };
        t.entries.insert(id, entry);
        t.handshakes += 1;
        (Ticket { conns: self.clone(), id, close }, evicted)
    }
}

/// One connection's place, given back when it is dropped.
pub struct Ticket {
    conns: Arc<Conns>,
    id: u64,
    close: Arc<Notify>,
}

impl Ticket {
    /// Ready once the connection was closed to make room for another.
    pub async fn closed(&self) {
        self.close.notified().await
    }

    /// Its ClientHello came whole: no longer closed for room.
    pub fn said_hello(&self) {
        if let Some(e) = self.conns.lock().entries.get_mut(&self.id) {
            e.hello = true;
        }
    }

    /// What the connection's requests report their stage through.
    pub fn track(&self) -> Track {
        Track { conns: self.conns.clone(), id: self.id }
    }

    /// Moves the connection from the handshakes to the served, waiting on
    /// its client, once there is a place: a free one, or the oldest served
    /// connection waiting on its client that has had its time, closed for
    /// it (the returned `true`). Pending forever if this one was closed.
    pub async fn serve(&self) -> bool {
        let conns = &self.conns;
        loop {
            let changed = conns.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let wake = {
                let mut t = conns.lock();
                let now = Instant::now();
                if !t.entries.contains_key(&self.id) {
                    None
                } else {
                    let mut evicted = false;
                    let room = if t.served < conns.max_served {
                        Ok(())
                    } else {
                        t.oldest(Stage::Client, now).map(|victim| {
                            t.evict(victim);
                            evicted = true;
                        })
                    };
                    match room {
                        Ok(()) => {
                            let e = t.entries.get_mut(&self.id).expect("checked above");
                            (e.stage, e.since) = (Stage::Client, now);
                            t.handshakes -= 1;
                            t.served += 1;
                            drop(t);
                            // A handshake place came free.
                            conns.changed.notify_waiters();
                            return evicted;
                        }
                        Err(wake) => wake,
                    }
                }
            };
            changed_or(changed, wake).await;
        }
    }
}

/// Waits until `changed` fires or, where there is one, `at` comes.
async fn changed_or(changed: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>, at: Option<Instant>) {
    match at {
        Some(at) => tokio::select! {
            () = changed => {}
            () = tokio::time::sleep_until(at) => {}
        },
        None => changed.await,
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let gone = self.conns.lock().remove(self.id).is_some();
        if gone {
            self.conns.changed.notify_waiters();
        }
    }
}

/// A served connection's stage, as its requests go.
#[derive(Clone)]
pub struct Track {
    conns: Arc<Conns>,
    id: u64,
}

impl Track {
    /// The connection is now at `stage` (as of now). Nothing for a
    /// connection not yet served, or gone.
    pub fn set(&self, stage: Stage) {
        debug_assert_ne!(stage, Stage::Handshake);
        {
            let mut t = self.conns.lock();
            match t.entries.get_mut(&self.id) {
                Some(e) if e.stage != Stage::Handshake => (e.stage, e.since) = (stage, Instant::now()),
                _ => return,
            }
        }
        if stage == Stage::Client {
            self.conns.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `t` was closed for room (without waiting).
    fn was_closed(t: &Ticket) -> bool {
        let closed = t.closed();
        tokio::pin!(closed);
        let waker = std::task::Waker::noop();
        closed.as_mut().poll(&mut std::task::Context::from_waker(waker)).is_ready()
    }

    use std::future::Future as _;

    #[tokio::test(start_paused = true)]
    async fn a_full_set_of_handshakes_gives_up_its_oldest_once_it_had_its_time() {
        let conns = Conns::new(2, 4);
        let (a, _) = conns.admit();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (b, _) = conns.admit();
        // Full, and the oldest is 100 ms old: room in 150 ms, not before.
        let t = Instant::now();
        conns.room_for_handshake().await;
        assert_eq!(t.elapsed(), EVICT_AFTER - Duration::from_millis(100));
        let (c, evicted) = conns.admit();
        assert!(evicted);
        assert!(was_closed(&a) && !was_closed(&b) && !was_closed(&c));
        assert_eq!(conns.counts(), (2, 0));
        // A place that frees up is room at once.
        drop(b);
        let t = Instant::now();
        conns.room_for_handshake().await;
        assert_eq!(t.elapsed(), Duration::ZERO);
        let (_d, evicted) = conns.admit();
        assert!(!evicted && !was_closed(&c));
        drop(a);
        assert_eq!(conns.counts(), (2, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_handshake_under_way_is_not_closed_for_room() {
        let conns = Conns::new(2, 4);
        let (under_way, _) = conns.admit();
        under_way.said_hello();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (stalled, _) = conns.admit();
        // The one under way is older, but the stalled one goes, once it had its time.
        let t = Instant::now();
        conns.room_for_handshake().await;
        assert_eq!(t.elapsed(), EVICT_AFTER);
        let (next, evicted) = conns.admit();
        assert!(evicted && was_closed(&stalled) && !was_closed(&under_way));
        // With none stalled, room comes only when one ends.
        next.said_hello();
        let waiting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.room_for_handshake().await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished());
        drop(under_way);
        waiting.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_served_place_goes_to_the_oldest_client_wait_and_never_from_work_in_progress() {
        let conns = Conns::new(4, 2);
        let (busy, _) = conns.admit();
        assert!(!busy.serve().await);
        busy.track().set(Stage::Server);
        let (idle, _) = conns.admit();
        assert!(!idle.serve().await);
        assert_eq!(conns.counts(), (0, 2));

        // Full: the idle one is closed once it has waited on its client
        // long enough; the busy one (older) stays.
        let (new, _) = conns.admit();
        let t = Instant::now();
        assert!(new.serve().await);
        assert_eq!(t.elapsed(), EVICT_AFTER);
        assert!(was_closed(&idle) && !was_closed(&busy));
        assert_eq!(conns.counts(), (0, 2));

        // Both at work: a newcomer waits as long as that lasts, then takes
        // the place that frees up; a request arriving resets the clock.
        new.track().set(Stage::Server);
        let (next, _) = conns.admit();
        let waiting = tokio::spawn(async move {
            let evicted = next.serve().await;
            (next, evicted)
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!waiting.is_finished());
        new.track().set(Stage::Client);
        tokio::time::sleep(EVICT_AFTER / 2).await;
        new.track().set(Stage::Client);
        tokio::time::sleep(EVICT_AFTER / 2).await;
        assert!(!waiting.is_finished());
        drop(busy);
        let (next, evicted) = waiting.await.unwrap();
        assert!(!evicted && !was_closed(&new) && !was_closed(&next));
        assert_eq!(conns.counts(), (0, 2));
        drop((new, next, idle));
        assert_eq!(conns.counts(), (0, 0));
    }
}
