//! Who opened a connection: the process the kernel recorded when the
//! connection was made, held by a pidfd, and the lease it already has.
//!
//! A pid number is never taken for the process: the connection's opener
//! may have exited and its pid gone to a process of another tenant. With
//! `SO_PEERPIDFD` the kernel hands over a pidfd of the opener itself; before
//! Linux 6.5 it records only the opener's pid, and the process holding that
//! pid now is the client only if it holds the connection's other end.

use std::num::NonZeroU32;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::errno::Errno;

use super::cache::ClientCache;
use super::tenant;
use super::{same_process, ClientTracker, Lease, ProcKey, SockDiag};
use crate::identity::{credentials, held, Client};
use crate::pidfd::{PidNow, Pidfd};

/// The process that opened a connection.
pub(super) enum Opener {
    /// Known to the calling thread already: the client it recorded.
    Cached(Client),
    /// Watched already: its lease.
    Known(Arc<Lease>),
    /// Seen for the first time: held by `pidfd`, told apart from other
    /// processes by `key`; `pid` its pid now, where the daemon sees it.
    New { pidfd: Pidfd, key: ProcKey, pid: Option<NonZeroU32> },
    /// It has exited, or (before Linux 6.5) the process holding its pid now
    /// does not hold the connection: nobody is the client.
    Gone,
    /// The kernel cannot say (before Linux 6.5: a pid the daemon cannot see,
    /// or no `unix_diag`); the connection's user, for the log.
    Unseen(u32),
}

impl ClientTracker {
    /// The process that opened the connection `sock`; `cache`: what the
    /// calling thread remembers of processes it has seen.
    pub(super) fn opener(&self, sock: BorrowedFd<'_>, cache: Option<&mut ClientCache>) -> Opener {
        if !self.no_peer_pidfd.load(Ordering::Relaxed) {
            match Pidfd::of_socket_peer(sock) {
                Ok(pidfd) => return self.opener_of_pidfd(pidfd, cache),
                Err(Errno::ENOPROTOOPT) => {
                    tracing::info!(
                        "this kernel has no SO_PEERPIDFD (Linux 6.5+): a client is the process at the \
                         connection's pid only while it holds the connection, and clients in other pid \
                         namespaces get no lease"
                    );
                    self.no_peer_pidfd.store(true, Ordering::Relaxed);
                }
                // The kernel has it, but no longer for this peer: it was reaped.
                Err(e) => {
                    tracing::debug!(error = %e, "no pidfd for a connection's opener: it has exited");
                    return Opener::Gone;
                }
            }
        }
        self.opener_by_pid(sock)
    }

    /// The opener behind its `SO_PEERPIDFD` pidfd.
    fn opener_of_pidfd(&self, pidfd: Pidfd, cache: Option<&mut ClientCache>) -> Opener {
        // Linux 6.9+: the pidfd's inode names the process; a known one costs
        // this `fstat` and a lookup (in the calling thread's own cache first).
        if let Some(ino) = pidfd.inode() {
            if let Some(c) = cache.and_then(|c| c.get(ino)) {
                return Opener::Cached(c);
            }
            let key = ProcKey::Inode(ino);
            if let Some(l) = self.lookup(key, |_| true) {
                return Opener::Known(l);
            }
            self.pidfds.fetch_add(1, Ordering::Relaxed);
            return match pidfd.exited() {
                true => Opener::Gone,
                false => match pidfd.pid_now() {
                    Ok(PidNow::Visible(p)) => Opener::New { pidfd, key, pid: Some(p) },
                    Ok(PidNow::Hidden) => Opener::New { pidfd, key, pid: None },
                    Ok(PidNow::Reaped) | Err(_) => Opener::Gone,
                },
            };
        }
        // Linux 6.5-6.8: its pid names it until it is reaped.
        self.pidfds.fetch_add(1, Ordering::Relaxed);
        match pidfd.pid_now() {
            Ok(PidNow::Visible(p)) => {
                let key = ProcKey::Pid(p.get());
                if let Some(l) = self.lookup(key, |l| same_process(l, &pidfd)) {
                    return Opener::Known(l);
                }
                match pidfd.exited() {
                    true => Opener::Gone,
                    false => Opener::New { pidfd, key, pid: Some(p) },
                }
            }
            Ok(PidNow::Hidden) => Opener::New { pidfd, key: self.unique_key(), pid: None },
            Ok(PidNow::Reaped) | Err(_) => Opener::Gone,
        }
    }

    /// Before Linux 6.5: the process holding the pid `SO_PEERCRED` recorded,
    /// if it holds the connection's other end.
    fn opener_by_pid(&self, sock: BorrowedFd<'_>) -> Opener {
        let cred = credentials(sock);
        let uid = cred.map_or(u32::MAX, |c| c.uid);
        let Some(pid) = cred.and_then(|c| c.pid) else { return Opener::Unseen(uid) };
        let Some(end) = self.client_end(sock) else { return Opener::Unseen(uid) };
        let key = ProcKey::Pid(pid.get());
        let holds = |pidfd: &Pidfd| {
            tenant::proc_dir(pidfd, pid.get()).is_ok_and(|dir| held::holds_socket(dir.as_fd(), end))
        };
        if let Some(l) = self.lookup(key, |l| l.with_pidfd(holds).unwrap_or(false)) {
            return Opener::Known(l);
        }
        self.pidfds.fetch_add(1, Ordering::Relaxed);
        match Pidfd::open(pid.get()) {
            Ok(pidfd) if holds(&pidfd) => Opener::New { pidfd, key, pid: Some(pid) },
            _ => Opener::Gone,
        }
    }

    /// The inode of the client's end of the connection `sock`, from
    /// `unix_diag`; `None` where the kernel cannot say.
    fn client_end(&self, sock: BorrowedFd<'_>) -> Option<u32> {
        let ours = u32::try_from(nix::sys::stat::fstat(sock).ok()?.st_ino).ok()?;
        let mut diag = self.unix_diag.lock().expect("unix_diag lock");
        if diag.is_none() {
            *diag = SockDiag::open().ok();
        }
        match diag.as_mut()?.unix_peer(ours) {
            Ok(end) => end,
            Err(e) => {
                tracing::debug!(error = %e, "unix_diag cannot name a connection's client end");
                *diag = None;
                None
            }
        }
    }

    fn unique_key(&self) -> ProcKey {
        let mut t = self.table.lock().expect("lease table lock");
        t.next_unique += 1;
        ProcKey::Unique(t.next_unique)
    }
}
