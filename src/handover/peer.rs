//! The process at the other end of a takeover, held by a pidfd. A pidfd
//! names one process and no other: whatever pid namespace either side runs
//! in, and whatever process later reuses the pid number. A pid a process
//! reports about itself is neither (it is the number in its own namespace).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::Signal;

use crate::pidfd::Pidfd;

/// One process, held by its pidfd.
#[derive(Debug)]
pub struct Process {
    pidfd: Pidfd,
}

impl Process {
    /// The peer of a connected Unix socket, as the kernel recorded it when
    /// the connection was made: `SO_PEERPIDFD`, or on kernels before 6.5 the
    /// pid of `SO_PEERCRED` opened at once. For the side that connected, the
    /// peer is the process that last called `listen` on the listener.
    pub fn of_peer(sock: BorrowedFd<'_>) -> Result<Process, Errno> {
        Pidfd::of_peer(sock).map(|pidfd| Process { pidfd })
    }

    /// The process with pid `pid` in this process's namespace (`pidfd_open`).
    pub fn of_pid(pid: u32) -> Result<Process, Errno> {
        Pidfd::open(pid).map(|pidfd| Process { pidfd })
    }

    /// The same process, held by a second pidfd.
    pub fn dup(&self) -> std::io::Result<Process> {
        Ok(Process { pidfd: self.pidfd.try_clone()? })
    }

    /// This process.
    pub fn own() -> Result<Process, Errno> {
        Pidfd::own().map(|pidfd| Process { pidfd })
    }

    /// Its pid in this process's pid namespace; `None` once it has been
    /// reaped, or where it lives in a namespace this process cannot see.
    pub fn pid_here(&self) -> Option<u32> {
        self.pidfd.pids()?.here
    }

    /// The pid it knows itself by (in its own pid namespace), as it would
    /// report it; `None` once it has been reaped or where the kernel does not say.
    pub fn own_pid(&self) -> Option<u32> {
        let p = self.pidfd.pids()?;
        p.innermost.or(p.here)
    }

    /// Whether it has exited (a zombie has).
    pub fn exited(&self) -> bool {
        self.pidfd.exited()
    }

    /// Waits up to `limit` for it to exit; whether it has.
    pub fn wait_exit(&self, limit: Duration) -> bool {
        self.pidfd.wait_exit(limit)
    }

    /// Sends `sig` to it (never to a process that reused its pid).
    pub fn signal(&self, sig: Signal) -> Result<(), Errno> {
        self.pidfd.signal(sig)
    }

    /// Makes sure it can run nothing more: SIGKILL, then up to `limit` for it
    /// to be gone. Once SIGKILL is pending a process never runs user code
    /// again, so it is harmless from the moment this returns, gone or not yet.
    pub fn kill(&self, limit: Duration) -> bool {
        if self.exited() {
            return true;
        }
        match self.signal(Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => self.wait_exit(limit),
            Err(_) => false,
        }
    }

    /// Its descriptor `fd`, duplicated into this process (close on exec).
    /// The kernel allows it only under a ptrace attach check with this
    /// process's real credentials.
    pub fn take_fd(&self, fd: u32) -> Result<OwnedFd, Errno> {
        self.pidfd.get_fd(i32::try_from(fd).map_err(|_| Errno::EBADF)?)
    }

    /// Its cgroup (the v2 path), for the log: read through its pid, and kept
    /// only if the pidfd still names a live process afterwards (else the pid
    /// may have named another one).
    pub fn cgroup(&self) -> Option<String> {
        let pid = self.pid_here()?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let path = text.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
        (self.pid_here() == Some(pid) && !self.exited()).then_some(path)
    }

    /// Whether `other` is the same process, both still running.
    pub fn is(&self, other: &Process) -> bool {
        match (self.pid_here(), other.pid_here()) {
            (Some(a), Some(b)) => a == b && !self.exited(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_process_is_held_until_it_exits_and_only_it_is_signalled() {
        let me = Process::own().unwrap();
        assert_eq!(me.pid_here(), Some(std::process::id()));
        assert_eq!(me.own_pid(), Some(std::process::id()));
        assert!(!me.exited());
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(me.cgroup().as_deref(), cgroup.lines().find_map(|l| l.strip_prefix("0::")));
        // The peer of a socket pair is this process, held the same way.
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(Process::of_peer(a.as_fd()).unwrap().is(&me));

        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let held = Process::of_pid(child.id()).unwrap();
        assert_eq!(held.pid_here(), Some(child.id()));
        assert!(!held.is(&me));
        assert!(!held.wait_exit(Duration::from_millis(20)), "sleep 30 still runs");
        assert!(held.kill(Duration::from_secs(10)), "killed and gone");
        // Exited (a zombie until reaped): no longer the same running process.
        assert!(held.exited());
        assert!(!held.is(&held));
        let st = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
        // Reaped: its pid may be anyone's now; the pidfd still names the dead one.
        assert!(held.exited());
        assert_eq!(held.pid_here(), None);
        assert_eq!(held.own_pid(), None);
        assert_eq!(held.signal(Signal::SIGTERM), Err(Errno::ESRCH));
        assert_eq!(held.cgroup(), None);
        assert_eq!(held.take_fd(0).unwrap_err(), Errno::ESRCH);
    }
}
