//! Identifying the process behind a Unix socket peer, with pidfds: the
//! kernel calls the lease tracker is built on.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// `SO_PEERPIDFD` from `<asm-generic/socket.h>` (Linux 6.5).
const SO_PEERPIDFD: libc::c_int = 77;
/// `PID_FS_MAGIC` from `<linux/magic.h>`: pidfds live on pidfs (Linux 6.9).
const PID_FS_MAGIC: i64 = 0x5049_4446;

/// `getsockopt(SO_PEERPIDFD)`: a pidfd for the peer of a Unix socket.
pub(super) fn peer_pidfd(sock: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
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
