//! The channel a daemon opens to a successor it starts itself (SIGUSR2):
//! one end of a socket pair, inherited by that child alone and named to it
//! by [`ENV`]. No file in the socket folder is involved and nothing needs
//! proving: the daemon made both the process and the channel.
//!
//! A value of [`ENV`] is believed only for what the kernel says of the
//! descriptor: a connected Unix stream socket (not stdin, stdout or stderr)
//! whose peer, as recorded when the pair was made, is this process's parent,
//! still running. Anything else is set aside with a reason, and the daemon
//! asks on the handover socket like any other successor.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::sync::Mutex;

use nix::sys::socket::{getsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};

use super::peer::Process;

/// The variable that names the inherited descriptor to the child.
pub const ENV: &str = "TCPX_RXDM_HANDOVER_FD";

/// What this process was started with.
#[derive(Debug)]
pub enum Inherited {
    /// No channel named: a successor asks on the handover socket.
    None,
    /// The channel to the daemon that started this one, and that daemon.
    Channel { conn: UnixStream, parent: Process },
    /// [`ENV`] was set but names no channel to a running parent: why.
    Unusable(String),
}

static INHERITED: Mutex<Option<Inherited>> = Mutex::new(None);

/// A connected pair: the parent's end, and the child's (both close on exec).
pub fn pair() -> io::Result<(UnixStream, OwnedFd)> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
    Ok((UnixStream::from(ours), theirs))
}

/// Makes `cmd` hand `fd` to its child, and to it alone: the descriptor stays
/// close-on-exec in this process (another child started meanwhile does not
/// get it) and is made inheritable only in the forked child, just before it
/// runs the new program; [`ENV`] names its number there.
pub fn pass(cmd: &mut std::process::Command, fd: &OwnedFd) {
    let raw = fd.as_raw_fd();
    cmd.env(ENV, raw.to_string());
    // SAFETY: the closure runs in the forked child before exec and only
    // calls fcntl(2), which is async-signal-safe; `raw` stays open in the
    // parent (the caller holds `fd` until spawn returns), so the child has it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Takes the channel [`ENV`] names, once, at startup (before any thread or
/// child is started): checked, made close-on-exec again, and [`ENV`] removed
/// so that nothing this process starts sees it.
pub fn claim() {
    let found = match std::env::var_os(ENV) {
        None => Inherited::None,
        Some(v) => {
            std::env::remove_var(ENV);
            let v = v.to_string_lossy().into_owned();
            match v.parse::<i32>() {
                Ok(fd) if fd > 2 => {
                    check(fd).unwrap_or_else(|why| Inherited::Unusable(format!("{ENV}={v}: {why}")))
                }
                _ => Inherited::Unusable(format!("{ENV}={v}: not a descriptor number above 2")),
            }
        }
    };
    *INHERITED.lock().unwrap_or_else(|e| e.into_inner()) = Some(found);
}

/// What [`claim`] found; [`Inherited::None`] the second time, or without a claim.
pub fn take() -> Inherited {
    INHERITED.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or(Inherited::None)
}

/// Whether `fd` is a channel to this process's running parent; taken over if so.
fn check(fd: i32) -> Result<Inherited, String> {
    // SAFETY: only borrowed for the checks below; the descriptor is taken
    // over (owned) only once they pass, so a number that names something
    // else of this process is left as it was.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let st = nix::sys::stat::fstat(borrowed).map_err(|e| format!("not an open descriptor ({e})"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err("not a socket".into());
    }
    let unix = domain(borrowed).map_err(|e| format!("reading its socket family: {e}"))? == libc::AF_UNIX;
    let stream = getsockopt(&borrowed, sockopt::SockType).map_err(|e| e.to_string())? == SockType::Stream;
    if !unix || !stream {
        return Err("not a Unix stream socket".into());
    }
    let peer = Process::of_peer(borrowed).map_err(|e| format!("no peer process ({e})"))?;
    let parent = nix::unistd::getppid().as_raw() as u32;
    if peer.exited() {
        return Err("the process at its other end has exited".into());
    }
    if peer.pid_here() != Some(parent) {
        return Err(format!("its other end is not this process's parent (pid {parent})"));
    }
    // SAFETY: `fd` is open (checked above) and nothing else in this process
    // owns it: it was inherited for this purpose alone.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(&owned, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
        .map_err(|e| format!("making it close-on-exec: {e}"))?;
    Ok(Inherited::Channel { conn: UnixStream::from(owned), parent: peer })
}

/// `SO_DOMAIN` of a socket.
fn domain(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn only_a_stream_to_the_parent_is_a_channel() {
        // A pair made here: its peer is this process, which is not its own parent.
        let (_ours, theirs) = pair().unwrap();
        let err = check(theirs.as_raw_fd()).unwrap_err();
        assert!(err.contains("not this process's parent"), "{err}");
        // Not a socket, not a stream, nothing open.
        let file = tempfile::tempfile().unwrap();
        assert_eq!(check(file.as_raw_fd()).unwrap_err(), "not a socket");
        let (dgram, _b) =
            socketpair(AddressFamily::Unix, SockType::Datagram, None, SockFlag::SOCK_CLOEXEC).unwrap();
        assert_eq!(check(dgram.as_raw_fd()).unwrap_err(), "not a Unix stream socket");
        assert!(check(1 << 20).unwrap_err().contains("not an open descriptor"));
        // A refused value leaves the descriptor open.
        assert!(nix::sys::stat::fstat(theirs.as_fd()).is_ok());
        assert!(nix::sys::stat::fstat(dgram.as_fd()).is_ok());
    }
}
