//! The pause of a takeover: every serving path stops taking new work,
//! finishes what it already read, and parks its open connections here for
//! the handover; then the pause either ends (the takeover failed: serve on
//! as before) or is committed (the successor serves; this process exits).
//!
//! Listeners stay open throughout: clients that connect meanwhile wait in
//! the kernel's backlog, and whoever serves next accepts them.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Endpoint;

/// Where the gate stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateState {
    Open = 0,
    Paused = 1,
    /// Handed over: nothing here serves again.
    Committed = 2,
}

/// An open connection, parked between two requests for the handover.
#[derive(Debug)]
pub struct Parked {
    /// A duplicate of the connection's socket (the original stays with its
    /// owner, which serves on if the pause ends).
    pub fd: OwnedFd,
    pub endpoint: Endpoint,
    /// The client registered on it (registry endpoint).
    pub registered: bool,
    /// Received, not yet a whole request.
    pub input: Vec<u8>,
    /// Bytes at the head of the socket already answered but not consumed
    /// (see `steering::intake`).
    pub peeked: usize,
}

/// The pause shared by every serving path.
#[derive(Debug)]
pub struct Gate {
    state: watch::Sender<GateState>,
    /// The state, for threads that only poll it.
    quick: AtomicU8,
    /// Async connection tasks alive now.
    live: AtomicUsize,
    /// Rule I/O threads, and how many have parked everything they hold.
    io_threads: AtomicUsize,
    parked: Mutex<ParkedSet>,
}

#[derive(Debug, Default)]
struct ParkedSet {
    conns: Vec<Parked>,
    /// Async connection tasks parked.
    tasks: usize,
    /// I/O threads parked.
    threads: usize,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            state: watch::Sender::new(GateState::Open),
            quick: AtomicU8::new(GateState::Open as u8),
            live: AtomicUsize::new(0),
            io_threads: AtomicUsize::new(0),
            parked: Mutex::new(ParkedSet::default()),
        }
    }
}

/// Held by an async connection task while it lives.
pub struct LiveConn(std::sync::Arc<Gate>);

impl Drop for LiveConn {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gate {
    fn set(&self, s: GateState) {
        self.quick.store(s as u8, Ordering::Release);
        self.state.send_replace(s);
    }

    pub fn state(&self) -> GateState {
        match self.quick.load(Ordering::Acquire) {
            0 => GateState::Open,
            1 => GateState::Paused,
            _ => GateState::Committed,
        }
    }

    /// Whether serving paths must hold back (paused or handed over).
    pub fn closed(&self) -> bool {
        self.quick.load(Ordering::Acquire) != GateState::Open as u8
    }

    pub fn subscribe(&self) -> watch::Receiver<GateState> {
        self.state.subscribe()
    }

    /// Starts the pause.
    pub fn pause(&self) {
        *self.parked.lock().expect("gate lock") = ParkedSet::default();
        self.set(GateState::Paused);
    }

    /// Ends the pause: everything serves on; the parked duplicates close.
    pub fn resume(&self) {
        *self.parked.lock().expect("gate lock") = ParkedSet::default();
        self.set(GateState::Open);
    }

    /// The successor serves from here on.
    pub fn commit(&self) {
        self.set(GateState::Committed);
    }

    /// Counts an async connection task for as long as the guard lives.
    pub fn enter(self: &std::sync::Arc<Self>) -> LiveConn {
        self.live.fetch_add(1, Ordering::AcqRel);
        LiveConn(self.clone())
    }

    /// Announces a rule I/O thread (at start).
    pub fn add_io_thread(&self) {
        self.io_threads.fetch_add(1, Ordering::AcqRel);
    }

    /// An async connection task parks its connection (`None`: it holds none
    /// worth handing over) and waits for the pause to end.
    pub fn park_task(&self, conn: Option<Parked>) {
        let mut p = self.parked.lock().expect("gate lock");
        p.conns.extend(conn);
        p.tasks += 1;
    }

    /// A rule I/O thread parks all its connections.
    pub fn park_thread(&self, conns: Vec<Parked>) {
        let mut p = self.parked.lock().expect("gate lock");
        p.conns.extend(conns);
        p.threads += 1;
    }

    /// Waits until every connection task and I/O thread has parked, and takes
    /// the parked connections; `None` after `limit`.
    pub async fn quiesced(&self, limit: Duration) -> Option<Vec<Parked>> {
        let until = Instant::now() + limit;
        loop {
            {
                let mut p = self.parked.lock().expect("gate lock");
                let all_tasks = p.tasks >= self.live.load(Ordering::Acquire);
                let all_threads = p.threads >= self.io_threads.load(Ordering::Acquire);
                if all_tasks && all_threads {
                    return Some(std::mem::take(&mut p.conns));
                }
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
}

/// Waits while the gate is not open; never returns once it is committed
/// (the process exits then).
pub async fn wait_open(rx: &mut watch::Receiver<GateState>) {
    loop {
        let now = *rx.borrow_and_update();
        match now {
            GateState::Open => return,
            GateState::Paused => {}
            GateState::Committed => std::future::pending::<()>().await,
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Waits while the gate is paused: `true` once it is open again, `false`
/// once it is committed (the successor serves: let go of what is held here).
pub async fn settled(rx: &mut watch::Receiver<GateState>) -> bool {
    loop {
        let now = *rx.borrow_and_update();
        match now {
            GateState::Open => return true,
            GateState::Committed => return false,
            GateState::Paused => {}
        }
        if rx.changed().await.is_err() {
            return false;
        }
    }
}

/// Resolves once the gate closes (pause or commit).
pub async fn closing(rx: &mut watch::Receiver<GateState>) {
    loop {
        let now = *rx.borrow_and_update();
        if now != GateState::Open {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked() -> Parked {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        Parked { fd: a.into(), endpoint: Endpoint::Registry, registered: true, input: vec![1], peeked: 0 }
    }

    #[tokio::test]
    async fn quiesced_waits_for_every_task_and_thread() {
        let gate = std::sync::Arc::new(Gate::default());
        let a = gate.enter();
        let b = gate.enter();
        gate.add_io_thread();
        gate.pause();
        assert!(gate.closed());
        gate.park_task(Some(parked()));
        assert!(gate.quiesced(Duration::from_millis(5)).await.is_none(), "one task and the thread are out");
        drop(b); // that connection ended instead of parking
        gate.park_thread(vec![parked(), parked()]);
        let got = gate.quiesced(Duration::from_millis(50)).await.expect("all parked");
        assert_eq!(got.len(), 3);
        gate.resume();
        assert_eq!(gate.state(), GateState::Open);
        gate.pause();
        assert!(gate.quiesced(Duration::from_millis(5)).await.is_none(), "a new pause counts anew");
        drop(a);
    }

    #[tokio::test]
    async fn waiters_follow_the_state() {
        let gate = std::sync::Arc::new(Gate::default());
        let mut rx = gate.subscribe();
        wait_open(&mut rx).await;
        gate.pause();
        let mut rx2 = gate.subscribe();
        closing(&mut rx2).await;
        let g = gate.clone();
        let waiter = tokio::spawn(async move { wait_open(&mut g.subscribe()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "paused: nobody passes");
        gate.resume();
        tokio::time::timeout(Duration::from_secs(2), waiter).await.unwrap().unwrap();
        gate.commit();
        let mut rx3 = gate.subscribe();
        let stuck = tokio::time::timeout(Duration::from_millis(20), wait_open(&mut rx3)).await;
        assert!(stuck.is_err(), "committed: never open again");
    }
}
