//! Identifying the process behind a Unix socket peer, with pidfds: the
//! kernel calls the lease tracker is built on.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// `PID_FS_MAGIC` from `<linux/magic.h>`: pidfds live on pidfs (Linux 6.9).
const PID_FS_MAGIC: i64 = 0x5049_4446;

pub(super) use crate::handover::peer::peer_pidfd;

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

/// The pidfd's inode number when pidfds live on pidfs (then it names the process).
pub(super) fn pidfs_inode(pidfd: &OwnedFd) -> Option<u64> {
    let fs = nix::sys::statfs::fstatfs(pidfd.as_fd()).ok()?;
    if fs.filesystem_type().0 as i64 != PID_FS_MAGIC {
        return None;
    }
    nix::sys::stat::fstat(pidfd.as_fd()).ok().map(|st| st.st_ino)
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
