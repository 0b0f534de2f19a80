//! Which sockets a client process holds: how several connections that fit
//! a garbled IPv6 flow are narrowed to the client's own.
//!
//! A connection waiting in a listener's accept queue belongs to the
//! listener's cgroup but is held by no process; another process of the same
//! cgroup (or, with isolation off, of the namespace) may hold one that fits
//! too. The connection the client means is one it holds: its socket's inode
//! (the `sock_diag` answer's) is among the client's open files.
//!
//! The client is the process that opened the Unix connection the request
//! came on, held by the pidfd the kernel gives for it (`SO_PEERPIDFD`). Its
//! open files are read through its `/proc/<pid>` folder, opened while the
//! pidfd's process held that pid, or (a pid the daemon cannot see) one by one
//! through the pidfd; a process that has exited by the end of the read is
//! not believed. Only links are read (`socket:[inode]`), never a file the
//! client names, and at most [`SCAN`] descriptors. This runs only when
//! several connections fit, on a repair worker.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::dir::Dir;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::peer::{self, PidNow};
use super::tenant;

/// Descriptors looked at, at most.
pub const SCAN: usize = 65_536;

/// Which of `inodes` the process that opened Unix connection `conn` holds
/// among its open files; `None` when that cannot be told (no pidfd for it,
/// it exited, its files cannot be read).
pub fn held_by_opener(conn: BorrowedFd<'_>, inodes: &[u32]) -> Option<Vec<u32>> {
    let pidfd = peer::peer_pidfd(conn).ok()?;
    let held = match peer::pid_now(pidfd.as_fd()).ok()? {
        PidNow::Visible(pid) => {
            let dir = tenant::proc_dir(pidfd.as_fd(), pid.get()).ok()?;
            in_proc_dir(dir.as_fd(), inodes)?
        }
        PidNow::Hidden => through_pidfd(pidfd.as_fd(), inodes),
        PidNow::Reaped => return None,
    };
    // What was read of a process that has exited since may not be its.
    (!peer::exited(pidfd.as_fd())).then_some(held)
}

/// The socket inode a `/proc/<pid>/fd` link names (`socket:[N]`).
fn socket_inode(link: &[u8]) -> Option<u32> {
    std::str::from_utf8(link.strip_prefix(b"socket:[")?.strip_suffix(b"]")?).ok()?.parse().ok()
}

fn in_proc_dir(proc_dir: BorrowedFd<'_>, inodes: &[u32]) -> Option<Vec<u32>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut fds = Dir::openat(proc_dir, "fd", flags, Mode::empty()).ok()?;
    let dir_fd = fds.as_raw_fd();
    // SAFETY: `dir_fd` stays open while `fds` lives, which outlives this borrow.
    let dir = unsafe { BorrowedFd::borrow_raw(dir_fd) };
    let mut held = Vec::new();
    for entry in fds.iter().take(SCAN) {
        let Ok(entry) = entry else { return None };
        let Ok(link) = nix::fcntl::readlinkat(dir, entry.file_name()) else { continue };
        if let Some(ino) = socket_inode(link.as_encoded_bytes()) {
            if inodes.contains(&ino) && !held.contains(&ino) {
                held.push(ino);
                if held.len() == inodes.len() {
                    break;
                }
            }
        }
    }
    Some(held)
}

fn through_pidfd(pidfd: BorrowedFd<'_>, inodes: &[u32]) -> Vec<u32> {
    let mut held = Vec::new();
    for n in 0..super::held::PIDFD_SCAN {
        // SAFETY: plain syscall with integer arguments; on success it returns a new fd we own.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0 as libc::c_uint) };
        if r < 0 {
            continue;
        }
        // SAFETY: `r` is a new descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(r as i32) };
        let Ok(st) = nix::sys::stat::fstat(fd.as_fd()) else { continue };
        if st.st_mode & libc::S_IFMT == libc::S_IFSOCK {
            let ino = st.st_ino as u32;
            if inodes.contains(&ino) && !held.contains(&ino) {
                held.push(ino);
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn links_name_socket_inodes() {
        assert_eq!(socket_inode(b"socket:[12345]"), Some(12345));
        assert_eq!(socket_inode(b"pipe:[12345]"), None);
        assert_eq!(socket_inode(b"socket:[x]"), None);
        assert_eq!(socket_inode(b"/dev/null"), None);
    }

    #[test]
    fn the_opener_of_a_connection_holds_its_own_sockets() {
        // This process opened both ends: it is the opener of each.
        let (a, _b) = UnixStream::pair().unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ino = |fd: BorrowedFd<'_>| nix::sys::stat::fstat(fd).unwrap().st_ino as u32;
        let mine = ino(tcp.as_fd());
        let Some(held) = held_by_opener(a.as_fd(), &[mine, 1]) else {
            // No SO_PEERPIDFD (Linux < 6.5): nothing can be told.
            return;
        };
        assert_eq!(held, [mine], "its listener, and no socket of inode 1");
    }
}
