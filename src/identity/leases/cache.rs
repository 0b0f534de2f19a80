//! The clients one thread of the rule path has seen, so that a known
//! process's next connection costs no lock shared with other threads.

use std::time::Instant;

use foldhash::HashMap;

use crate::identity::Client;

/// The clients one thread has seen, by their process's pidfs inode, so that
/// a known process's next connection costs no lock shared with other
/// threads. An entry counts while its process's lease is alive.
#[derive(Default)]
pub struct ClientCache {
    by_inode: HashMap<u64, Client>,
    /// The same clients by their pid as the daemon sees it, with when each
    /// was first known here (see [`ClientTracker::ask_queued`]).
    pub(super) by_pid: HashMap<u32, (Client, Instant)>,
    /// The tracker's count of exited processes when this cache last let go
    /// of its exited entries.
    exits_seen: u64,
}

/// Entries a [`ClientCache`] keeps, at most; past that it starts over.
const CACHE_MOST: usize = 4096;

impl ClientCache {
    /// Lets go of the clients whose process has exited, when any has since
    /// the last look (`exits`: the tracker's count of exits): per-client
    /// state lives as long as the client, not until the cache is full.
    pub(super) fn forget_exited(&mut self, exits: u64) {
        if exits == self.exits_seen {
            return;
        }
        self.exits_seen = exits;
        let alive = |c: &Client| c.process.as_ref().is_some_and(|l| l.alive());
        self.by_inode.retain(|_, c| alive(c));
        self.by_pid.retain(|_, (c, _)| alive(c));
    }

    /// Clients remembered (by inode and by pid).
    pub fn len(&self) -> usize {
        self.by_inode.len() + self.by_pid.len()
    }

    /// Whether it remembers no client.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The client of process `inode`, while its process lives.
    pub(super) fn get(&mut self, inode: u64) -> Option<Client> {
        let c = self.by_inode.get(&inode)?;
        if c.process.as_ref().is_some_and(|l| l.alive()) {
            return Some(c.clone());
        }
        self.by_inode.remove(&inode);
        None
    }

    pub(super) fn put(&mut self, inode: u64, c: &Client) {
        if self.by_inode.len() >= CACHE_MOST || self.by_pid.len() >= CACHE_MOST {
            let alive = |c: &Client| c.process.as_ref().is_some_and(|l| l.alive());
            self.by_inode.retain(|_, c| alive(c));
            self.by_pid.retain(|_, (c, _)| alive(c));
            if self.by_inode.len() >= CACHE_MOST || self.by_pid.len() >= CACHE_MOST {
                self.by_inode.clear();
                self.by_pid.clear();
            }
        }
        self.by_inode.insert(inode, c.clone());
        if let Some(pid) = c.process.as_ref().and_then(|l| l.pid) {
            // Known from now on: the process has existed since before this instant.
            self.by_pid.insert(pid.get(), (c.clone(), Instant::now()));
        }
    }

    /// The client known here as pid `pid` since before `queued_after`, if
    /// its process has not exited (asked of the kernel now, not of the
    /// exit watcher, which may be a moment late).
    pub(super) fn by_pid_since(&mut self, pid: u32, queued_after: Instant) -> Option<Client> {
        let (c, seen) = self.by_pid.get(&pid)?;
        if *seen >= queued_after {
            return None;
        }
        let lease = c.process.as_ref()?;
        let running = lease.alive() && lease.with_pidfd(|fd| !fd.exited()).unwrap_or(false);
        if running {
            return Some(c.clone());
        }
        self.by_pid.remove(&pid);
        None
    }
}
