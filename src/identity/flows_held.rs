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
//! pidfd's process held that pid; a process that has exited by the end of
//! the read is not believed. Only links are read (`socket:[inode]`, which
//! the kernel writes without asking any file system), never a file the
//! client names, and at most [`SCAN`] descriptors. Where the pid is not
//! visible (no such folder), or the folder cannot be listed, nothing can be
//! told: the descriptors are never copied out of the client, since closing
//! the copy of a FUSE file waits on its server, perhaps for good. This runs
//! only when several connections fit, on a repair worker.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use nix::dir::Dir;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::tenant;
use crate::pidfd::{PidNow, Pidfd};

/// Descriptors looked at, at most.
pub const SCAN: usize = 65_536;

/// Which of `inodes` the process that opened Unix connection `conn` holds
/// among its open files; `None` when that cannot be told (no pidfd for it,
/// it exited, its pid is not visible, its files cannot be listed).
pub fn held_by_opener(conn: BorrowedFd<'_>, inodes: &[u32]) -> Option<Vec<u32>> {
    let pidfd = Pidfd::of_socket_peer(conn).ok()?;
    let held = match pidfd.pid_now().ok()? {
        PidNow::Visible(pid) => {
            let dir = tenant::proc_dir(&pidfd, pid.get()).ok()?;
            in_proc_dir(dir.as_fd(), inodes)?
        }
        PidNow::Hidden | PidNow::Reaped => return None,
    };
    // What was read of a process that has exited since may not be its.
    (!pidfd.exited()).then_some(held)
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
