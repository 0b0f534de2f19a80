//! The process at the other end of a takeover, held by a pidfd. A pidfd
//! names one process and no other: whatever pid namespace either side runs
//! in, and whatever process later reuses the pid number. A pid a process
//! reports about itself is neither (it is the number in its own namespace).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

/// `SO_PEERPIDFD` from `<asm-generic/socket.h>` (Linux 6.5).
const SO_PEERPIDFD: libc::c_int = 77;

/// One process, held by its pidfd.
#[derive(Debug)]
pub struct Process {
    pidfd: OwnedFd,
}

impl Process {
    /// The peer of a connected Unix socket, as the kernel recorded it when
    /// the connection was made: `SO_PEERPIDFD`, or on kernels before 6.5 the
    /// pid of `SO_PEERCRED` opened at once. For the side that connected, the
    /// peer is the process that last called `listen` on the listener.
    pub fn of_peer(sock: BorrowedFd<'_>) -> Result<Process, Errno> {
        match peer_pidfd(sock) {
            Ok(pidfd) => Ok(Process { pidfd }),
            Err(Errno::ENOPROTOOPT) => {
                let cred = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)?;
                // 0: the peer lives in a pid namespace this process cannot see.
                match u32::try_from(cred.pid()) {
                    Ok(pid) if pid > 0 => Process::of_pid(pid),
                    _ => Err(Errno::ESRCH),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The process with pid `pid` in this process's namespace (`pidfd_open`).
    pub fn of_pid(pid: u32) -> Result<Process, Errno> {
        // SAFETY: a plain syscall with integer arguments; on success it
        // returns a new fd that nothing else owns.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(Process { pidfd: unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) } })
    }

    /// The same process, held by a second pidfd.
    pub fn dup(&self) -> std::io::Result<Process> {
        Ok(Process { pidfd: self.pidfd.try_clone()? })
    }

    /// This process.
    pub fn own() -> Result<Process, Errno> {
        Process::of_pid(std::process::id())
    }

    fn fdinfo(&self) -> Option<Pids> {
        let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.pidfd.as_raw_fd())).ok()?;
        Some(Pids::parse(&text))
    }

    /// Its pid in this process's pid namespace; `None` once it has been
    /// reaped, or where it lives in a namespace this process cannot see.
    pub fn pid_here(&self) -> Option<u32> {
        self.fdinfo()?.here
    }

    /// The pid it knows itself by (in its own pid namespace), as it would
    /// report it; `None` once it has been reaped or where the kernel does not say.
    pub fn own_pid(&self) -> Option<u32> {
        let p = self.fdinfo()?;
        p.innermost.or(p.here)
    }

    /// Whether it has exited (a zombie has).
    pub fn exited(&self) -> bool {
        self.wait_exit(Duration::ZERO)
    }

    /// Waits up to `limit` for it to exit; whether it has.
    pub fn wait_exit(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(n) if n > 0 => return true,
                Ok(_) if left.is_zero() => return false,
                Ok(_) | Err(Errno::EINTR) => {}
                // A pidfd that cannot be polled names nothing that runs.
                Err(_) => return true,
            }
        }
    }

    /// Sends `sig` to it (`pidfd_send_signal`: never to a process that reused its pid).
    pub fn signal(&self, sig: Signal) -> Result<(), Errno> {
        // SAFETY: a plain syscall on a pidfd we own; no siginfo (NULL) and no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                sig as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        };
        if r < 0 {
            return Err(Errno::last());
        }
        Ok(())
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

    /// Its descriptor `fd`, duplicated into this process (`pidfd_getfd`, close
    /// on exec). The kernel allows it only under a ptrace attach check with
    /// this process's real credentials.
    pub fn take_fd(&self, fd: u32) -> Result<OwnedFd, Errno> {
        // SAFETY: a plain syscall on a pidfd we own, with integer arguments;
        // on success it returns a new fd that nothing else owns.
        let r = unsafe {
            libc::syscall(libc::SYS_pidfd_getfd, self.pidfd.as_raw_fd(), fd as libc::c_int, 0 as libc::c_uint)
        };
        if r < 0 {
            return Err(Errno::last());
        }
        // SAFETY: `r` was just returned by the kernel and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) })
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

/// `getsockopt(SO_PEERPIDFD)`: a pidfd for the peer of a Unix socket.
pub fn peer_pidfd(sock: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` and `len` are valid for writes of the sizes given; the
    // kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(Errno::last());
    }
    if fd < 0 {
        return Err(Errno::EBADF);
    }
    // SAFETY: the kernel just installed `fd` in our table and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What a pidfd's fdinfo says of its process's pids.
#[derive(Debug, PartialEq, Eq)]
struct Pids {
    /// `Pid:`, in the reader's namespace.
    here: Option<u32>,
    /// The last `NSpid:` entry: its own namespace's.
    innermost: Option<u32>,
}

impl Pids {
    /// `Pid:` is -1 once the process has exited and 0 where the reader
    /// cannot see it; either is `None`.
    fn parse(text: &str) -> Pids {
        let num = |s: &str| s.parse::<i64>().ok().filter(|&n| n > 0).and_then(|n| u32::try_from(n).ok());
        let mut p = Pids { here: None, innermost: None };
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("Pid:") {
                p.here = num(v.trim());
            } else if let Some(v) = line.strip_prefix("NSpid:") {
                p.innermost = v.split_whitespace().last().and_then(num);
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn fdinfo_names_the_pid_here_and_in_its_own_namespace() {
        let p = Pids::parse("pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1\nPid:\t4242\nNSpid:\t4242\t7\n");
        assert_eq!(p, Pids { here: Some(4242), innermost: Some(7) });
        let gone = Pids::parse("Pid:\t-1\nNSpid:\t-1\n");
        assert_eq!(gone, Pids { here: None, innermost: None });
        let unseen = Pids::parse("Pid:\t0\n");
        assert_eq!(unseen, Pids { here: None, innermost: None });
    }

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
