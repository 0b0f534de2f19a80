//! A process held by a pidfd, and every pidfd system call of the crate.
//!
//! A pidfd names one process and no other, for as long as it is open: in
//! whatever pid namespace either side lives, and whatever process later
//! reuses the pid number. A pid number names whichever process holds it at
//! the moment it is used. So the daemon holds processes by [`Pidfd`], and
//! what it reads by pid it checks afterwards against the pidfd (a process
//! keeps its pid until it is reaped). The lease of a client process and the
//! process at the other end of a takeover both wrap a [`Pidfd`]; the raw
//! calls (and their `unsafe`) are here alone, to be audited in one place.

use std::num::NonZeroU32;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

/// `SO_PEERPIDFD` from `<asm-generic/socket.h>` (Linux 6.5).
const SO_PEERPIDFD: libc::c_int = 77;
/// `PID_FS_MAGIC` from `<linux/magic.h>`: pidfds live on pidfs (Linux 6.9).
const PID_FS_MAGIC: libc::__fsword_t = 0x5049_4446;
/// `PIDFD_GET_INFO`: `_IOWR(0xFF, 11, struct pidfd_info)`, 64 bytes.
const PIDFD_GET_INFO: libc::c_ulong =
    (3 << 30) | ((PIDFD_INFO_SIZE as libc::c_ulong) << 16) | (0xFF << 8) | 11;
const PIDFD_INFO_SIZE: usize = 64;
/// `PIDFD_INFO_CGROUPID`.
const PIDFD_INFO_CGROUPID: u64 = 1 << 2;
/// `PIDFD_GET_NET_NAMESPACE`: `_IO(0xFF, 4)`.
const PIDFD_GET_NET_NAMESPACE: libc::c_ulong = 0xFF04;

/// `struct pidfd_info` (`<linux/pidfd.h>`, version 0).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    spare0: u32,
}

/// Where the process behind a pidfd is, by pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidNow {
    /// Not reaped yet, with this pid in the pid namespace of this process's `/proc`.
    Visible(NonZeroU32),
    /// Not reaped yet, in a pid namespace this process cannot see.
    Hidden,
    /// Reaped: no pid names it any more.
    Reaped,
}

/// What a pidfd's fdinfo says of its process's pids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pids {
    /// `Pid:`, in the reader's namespace; `None` once reaped or where unseen.
    pub here: Option<u32>,
    /// The last `NSpid:` entry: its own namespace's.
    pub innermost: Option<u32>,
}

/// A namespace of a process that its pidfd can give (Linux 6.11): a
/// client's network namespace, where its flows are looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    Net,
}

/// One process, held by its pidfd.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A new descriptor from a system call's return value, or its error.
fn new_fd(r: libc::c_long) -> Result<OwnedFd, Errno> {
    if r < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(r).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just installed `fd` in this process's table and
    // nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Pidfd {
    /// The process with pid `pid` in this process's pid namespace (`pidfd_open`, Linux 5.3).
    pub fn open(pid: u32) -> Result<Pidfd, Errno> {
        // SAFETY: a plain system call with integer arguments.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
        new_fd(r).map(Pidfd)
    }

    /// This process.
    pub fn own() -> Result<Pidfd, Errno> {
        Pidfd::open(std::process::id())
    }

    /// The peer of a connected Unix socket as the kernel recorded it when
    /// the connection was made (`SO_PEERPIDFD`, Linux 6.5; `ENOPROTOOPT`
    /// before). For the side that connected, the peer is the process that
    /// last called `listen` on the listener.
    pub fn of_socket_peer(sock: BorrowedFd<'_>) -> Result<Pidfd, Errno> {
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
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// [`Pidfd::of_socket_peer`], or on kernels without it the pid of
    /// `SO_PEERCRED` opened at once: a pid the peer may have left since, so
    /// only for peers that cannot be replaced meanwhile (a daemon's own
    /// handover partner), not for clients.
    pub fn of_peer(sock: BorrowedFd<'_>) -> Result<Pidfd, Errno> {
        match Pidfd::of_socket_peer(sock) {
            Err(Errno::ENOPROTOOPT) => {
                let cred = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)?;
                // 0: the peer lives in a pid namespace this process cannot see.
                match u32::try_from(cred.pid()) {
                    Ok(pid) if pid > 0 => Pidfd::open(pid),
                    _ => Err(Errno::ESRCH),
                }
            }
            other => other,
        }
    }

    /// A pidfd received from elsewhere (a takeover hands its leases on).
    pub fn from_owned(fd: OwnedFd) -> Pidfd {
        Pidfd(fd)
    }

    /// The descriptor itself (to watch it for the process's exit).
    pub fn into_owned(self) -> OwnedFd {
        self.0
    }

    /// The same process, held by a second pidfd.
    pub fn try_clone(&self) -> std::io::Result<Pidfd> {
        Ok(Pidfd(self.0.try_clone()?))
    }

    /// Whether it has exited (a zombie has; a pidfd turns readable then).
    /// One `poll` that does not wait.
    pub fn exited(&self) -> bool {
        self.wait_exit(Duration::ZERO)
    }

    /// Waits up to `limit` for it to exit; whether it has.
    pub fn wait_exit(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(n) if n > 0 => return true,
                Ok(_) if left.is_zero() => return false,
                Ok(_) | Err(Errno::EINTR) => {}
                // A pidfd that cannot be polled names nothing that runs.
                Err(_) => return true,
            }
        }
    }

    /// `pidfd_send_signal` (never to a process that reused its pid); `None`
    /// sends nothing and only asks whether the process is still there.
    fn send(&self, sig: Option<Signal>) -> Result<(), Errno> {
        let sig = sig.map_or(0, |s| s as libc::c_int);
        // SAFETY: a plain system call on a pidfd we own; no siginfo (NULL), no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        };
        if r < 0 {
            return Err(Errno::last());
        }
        Ok(())
    }

    /// Sends `sig` to it.
    pub fn signal(&self, sig: Signal) -> Result<(), Errno> {
        self.send(Some(sig))
    }

    /// Whether it is not reaped yet (running, or a zombie): then it still holds its pid.
    pub fn unreaped(&self) -> bool {
        matches!(self.send(None), Ok(()) | Err(Errno::EPERM))
    }

    /// Its descriptor `fd`, duplicated into this process (`pidfd_getfd`,
    /// Linux 5.6; close on exec). The kernel allows it only under a ptrace
    /// attach check with this process's real credentials. Only for a
    /// process the daemon trusts (a takeover's other daemon), never for a
    /// client: closing the copy runs the file's `flush`, which for a FUSE
    /// file waits on its server, and a server that never answers holds the
    /// closing thread for good, past the daemon's own exit.
    pub fn get_fd(&self, fd: i32) -> Result<OwnedFd, Errno> {
        // SAFETY: a plain system call on a pidfd we own, with integer arguments.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.0.as_raw_fd(), fd, 0 as libc::c_uint) };
        new_fd(r)
    }

    /// Its fdinfo, as the kernel writes it.
    fn fdinfo(&self) -> Result<String, Errno> {
        std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.0.as_raw_fd()))
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    /// Its pid now, from the pidfd's own fdinfo (`Pid:` is -1 once reaped,
    /// 0 where not visible). The number is the one of the pid namespace this
    /// process's `/proc` was mounted for, so `/proc/<pid>` names that
    /// process. Works on every kernel with pidfds (`PIDFD_GET_INFO` fails for
    /// a process whose parent this one cannot see).
    pub fn pid_now(&self) -> Result<PidNow, Errno> {
        parse_pid_line(&self.fdinfo()?).ok_or(Errno::EINVAL)
    }

    /// Its pids here and in its own namespace; both `None` once reaped.
    pub fn pids(&self) -> Option<Pids> {
        self.fdinfo().ok().map(|t| parse_pids(&t))
    }

    /// Its pidfs inode number, which names the process for the life of the
    /// system; `None` where pidfds do not live on pidfs ([`on_pidfs`]).
    pub fn inode(&self) -> Option<u64> {
        if !on_pidfs() {
            return None;
        }
        nix::sys::stat::fstat(self.0.as_fd()).ok().map(|st| st.st_ino)
    }

    /// Its cgroup v2 id (`PIDFD_GET_INFO`, Linux 6.13). Fails for a reaped
    /// process, and for one whose pid or parent this process cannot see.
    pub fn cgroup_id(&self) -> Result<u64, Errno> {
        let mut info = PidfdInfo { mask: PIDFD_INFO_CGROUPID, ..PidfdInfo::default() };
        // SAFETY: `info` is a valid, writable pidfd_info of the size the request encodes.
        let r = unsafe { libc::ioctl(self.0.as_raw_fd(), PIDFD_GET_INFO as _, &mut info as *mut PidfdInfo) };
        if r != 0 {
            return Err(Errno::last());
        }
        if info.mask & PIDFD_INFO_CGROUPID == 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        Ok(info.cgroupid)
    }

    /// A handle on one of its namespaces (Linux 6.11).
    pub fn namespace(&self, which: Namespace) -> Result<OwnedFd, Errno> {
        let cmd = match which {
            Namespace::Net => PIDFD_GET_NET_NAMESPACE,
        };
        // SAFETY: the namespace ioctls take no argument and return a new fd.
        let r = unsafe { libc::ioctl(self.0.as_raw_fd(), cmd as _, 0) };
        new_fd(r.into())
    }
}

/// Whether pidfds live on pidfs here (Linux 6.9+): then a pidfd's inode
/// number names its process, unique for the life of the system. Asked once.
pub fn on_pidfs() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        Pidfd::own().is_ok_and(|own| {
            nix::sys::statfs::fstatfs(own.as_fd()).is_ok_and(|fs| fs.filesystem_type().0 == PID_FS_MAGIC)
        })
    })
}

/// Whether `/proc` (where a pidfd's fdinfo and `/proc/<pid>` are read) is
/// mounted for this process's own pid namespace: then a pid read there is
/// the pid `SO_PEERCRED` and `getpid` give. A daemon in a pid namespace of
/// its own with the host's `/proc` sees other numbers there. Asked once:
/// neither changes while the process runs (a takeover's successor asks anew).
pub fn proc_is_own_pid_namespace() -> bool {
    static OWN: OnceLock<bool> = OnceLock::new();
    *OWN.get_or_init(|| {
        let shown = std::fs::read_link("/proc/self").ok();
        let shown = shown.as_ref().and_then(|p| p.to_str()).and_then(|p| p.parse::<u32>().ok());
        shown == Some(std::process::id())
    })
}

/// Asks for `SO_PEERPIDFD` on a throwaway socket pair: `Ok` where this kernel
/// has it (Linux 6.5+), else why not (`ENOPROTOOPT`: too old).
pub fn probe_peer_pidfd() -> Result<(), Errno> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (a, _b) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
    Pidfd::of_socket_peer(a.as_fd()).map(drop)
}

fn parse_pid_line(fdinfo: &str) -> Option<PidNow> {
    let v: i64 = fdinfo.lines().find_map(|l| l.strip_prefix("Pid:"))?.trim().parse().ok()?;
    Some(match v {
        n if n < 0 => PidNow::Reaped,
        0 => PidNow::Hidden,
        n => PidNow::Visible(NonZeroU32::new(u32::try_from(n).ok()?)?),
    })
}

/// `Pid:` is -1 once the process has exited and 0 where the reader cannot
/// see it; either is `None`.
fn parse_pids(text: &str) -> Pids {
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

#[cfg(test)]
mod tests;
