//! Identifying the process behind a Unix socket peer, with pidfds: the
//! kernel calls the lease tracker is built on.
//!
//! A pidfd names one process and no other, for as long as it is open; a pid
//! number names whichever process holds it at the moment it is used. So
//! everything here either works on a pidfd, or reads by pid and then checks
//! that the pidfd's process is still there (not reaped): a process keeps its
//! pid until it is reaped, so a read that began after the pidfd named a
//! process with that pid and ended before it was reaped read that process.

use std::num::NonZeroU32;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// `PID_FS_MAGIC` from `<linux/magic.h>`: pidfds live on pidfs (Linux 6.9).
const PID_FS_MAGIC: libc::__fsword_t = 0x5049_4446;

/// `PIDFD_GET_INFO`: `_IOWR(0xFF, 11, struct pidfd_info)`, 64 bytes.
const PIDFD_GET_INFO: libc::c_ulong =
    (3 << 30) | ((PIDFD_INFO_SIZE as libc::c_ulong) << 16) | (0xFF << 8) | 11;
const PIDFD_INFO_SIZE: usize = 64;
/// `PIDFD_INFO_CGROUPID`.
const PIDFD_INFO_CGROUPID: u64 = 1 << 2;

pub(super) use crate::handover::peer::peer_pidfd;

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

/// `pidfd_open(pid, 0)` (Linux 5.3).
pub fn pidfd_open(pid: u32) -> Result<OwnedFd, Errno> {
    // SAFETY: plain syscall with integer arguments; on success it returns a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `fd` is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Whether pidfds live on pidfs here (Linux 6.9+): then a pidfd's inode
/// number names its process, unique for the life of the system. Asked once.
pub(super) fn pidfds_on_pidfs() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        pidfd_open(std::process::id()).is_ok_and(|own| {
            nix::sys::statfs::fstatfs(own.as_fd()).is_ok_and(|fs| fs.filesystem_type().0 == PID_FS_MAGIC)
        })
    })
}

/// The pidfs inode number of `pidfd`, which names its process; `None` where
/// pidfds do not live on pidfs ([`pidfds_on_pidfs`]).
pub(super) fn pidfs_inode(pidfd: BorrowedFd<'_>) -> Option<u64> {
    if !pidfds_on_pidfs() {
        return None;
    }
    nix::sys::stat::fstat(pidfd).ok().map(|st| st.st_ino)
}

/// Where the process behind a pidfd is, by pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PidNow {
    /// Not reaped yet, with this pid in the daemon's pid namespace.
    Visible(NonZeroU32),
    /// Not reaped yet, in a pid namespace the daemon cannot see.
    Hidden,
    /// Reaped: no pid names it any more.
    Reaped,
}

/// The pid of the process behind `pidfd` now, from the pidfd's own fdinfo
/// (`Pid:` is -1 once reaped, 0 where not visible). The number is the one
/// of the pid namespace the daemon's `/proc` was mounted for (its own, in a
/// container), so `/proc/<pid>` names that process. Works on every kernel
/// with pidfds; `PIDFD_GET_INFO` is not used for this, as it fails for a
/// process whose parent the daemon cannot see.
pub(super) fn pid_now(pidfd: BorrowedFd<'_>) -> Result<PidNow, Errno> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    parse_pid_line(&text).ok_or(Errno::EINVAL)
}

fn parse_pid_line(fdinfo: &str) -> Option<PidNow> {
    let v: i64 = fdinfo.lines().find_map(|l| l.strip_prefix("Pid:"))?.trim().parse().ok()?;
    Some(match v {
        n if n < 0 => PidNow::Reaped,
        0 => PidNow::Hidden,
        n => PidNow::Visible(NonZeroU32::new(u32::try_from(n).ok()?)?),
    })
}

/// Whether the process behind `pidfd` has exited (a zombie has; a pidfd
/// turns readable then). One `poll` that does not wait.
pub(super) fn exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) => n > 0,
        // A pidfd that cannot be polled names nothing that runs.
        Err(_) => true,
    }
}

/// Whether the process behind `pidfd` is not reaped yet (running, or a
/// zombie): then it still holds its pid.
pub(super) fn unreaped(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: plain syscall: signal 0 only checks that the process exists.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    r == 0 || Errno::last() == Errno::EPERM
}

/// The cgroup v2 id of the process behind `pidfd` (`PIDFD_GET_INFO`, Linux
/// 6.13). It fails for a reaped process, and for one whose pid or parent
/// the daemon cannot see.
pub(super) fn pidfd_cgroup_id(pidfd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut info = PidfdInfo { mask: PIDFD_INFO_CGROUPID, ..PidfdInfo::default() };
    // SAFETY: `info` is a valid, writable pidfd_info of the size the request encodes.
    let r = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_INFO as _, &mut info as *mut PidfdInfo) };
    if r != 0 {
        return Err(Errno::last());
    }
    if info.mask & PIDFD_INFO_CGROUPID == 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(info.cgroupid)
}

/// Asks for `SO_PEERPIDFD` on a throwaway socket pair: `Ok` where this kernel
/// has it (Linux 6.5+), else why not (`ENOPROTOOPT`: too old).
pub fn probe_peer_pidfd() -> Result<(), Errno> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (a, _b) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
    peer_pidfd(a.as_fd()).map(drop)
}

/// Whether this kernel has `SO_PEERPIDFD`.
#[cfg(test)]
pub fn kernel_has_peer_pidfd() -> bool {
    probe_peer_pidfd().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_info_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<PidfdInfo>(), PIDFD_INFO_SIZE);
        assert_eq!(std::mem::offset_of!(PidfdInfo, cgroupid), 8);
        assert_eq!(std::mem::offset_of!(PidfdInfo, pid), 16);
        assert_eq!(std::mem::offset_of!(PidfdInfo, fsgid), 56);
        assert_eq!(PIDFD_GET_INFO, 0xC040_FF0B);
    }

    #[test]
    fn a_pidfds_fdinfo_says_where_its_process_is() {
        let pid = |t: &str| parse_pid_line(t);
        assert_eq!(
            pid("pos:\t0\nflags:\t02000002\nPid:\t4242\nNSpid:\t4242\t7\n"),
            NonZeroU32::new(4242).map(PidNow::Visible)
        );
        assert_eq!(pid("Pid:\t0\n"), Some(PidNow::Hidden));
        assert_eq!(pid("Pid:\t-1\nNSpid:\t-1\n"), Some(PidNow::Reaped));
        assert_eq!(pid("pos:\t0\n"), None);
    }

    #[test]
    fn a_child_is_there_until_it_exits_and_then_until_it_is_reaped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pidfd = pidfd_open(child.id()).unwrap();
        assert_eq!(pid_now(pidfd.as_fd()), Ok(PidNow::Visible(NonZeroU32::new(child.id()).unwrap())));
        assert!(!exited(pidfd.as_fd()) && unreaped(pidfd.as_fd()));
        child.kill().unwrap();
        // A zombie has exited but keeps its pid until it is reaped.
        while !exited(pidfd.as_fd()) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(unreaped(pidfd.as_fd()), "a zombie still holds its pid");
        child.wait().unwrap();
        assert!(exited(pidfd.as_fd()) && !unreaped(pidfd.as_fd()));
        assert_eq!(pid_now(pidfd.as_fd()), Ok(PidNow::Reaped));
    }

    #[test]
    fn a_pidfds_inode_names_its_process_on_pidfs() {
        if !pidfds_on_pidfs() {
            return;
        }
        let (a, b) = (pidfd_open(std::process::id()).unwrap(), pidfd_open(std::process::id()).unwrap());
        assert_eq!(pidfs_inode(a.as_fd()), pidfs_inode(b.as_fd()), "one process, one inode");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let c = pidfd_open(child.id()).unwrap();
        assert_ne!(pidfs_inode(a.as_fd()), pidfs_inode(c.as_fd()));
        child.wait().unwrap();
    }
}
