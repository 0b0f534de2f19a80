//! The proof a successor that connects to the handover socket gives before
//! anything else: that it could already take the serving daemon's
//! descriptors. The daemon names a descriptor of its own table holding a
//! fresh secret; the successor takes that descriptor with `pidfd_getfd`
//! (which the kernel allows only under a ptrace attach check: the daemon's
//! user with a superset of its capabilities, or `CAP_SYS_PTRACE` over it, and
//! any security module agreeing), reads the secret and sends it back. A
//! process that passes could take every descriptor the handover hands it
//! anyway, so the handover gives it nothing new.
//!
//! The secret sits in a socket (a datagram queued on one end of a pair whose
//! other end is closed): a socket cannot be opened again through
//! `/proc/<pid>/fd/N`, which a weaker (read) ptrace check would allow for a
//! pipe or a memfd.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

use super::peer::Process;

/// The secret's length.
pub const SECRET_LEN: usize = 32;

/// The daemon's side: one challenge per connection, closed when dropped.
pub struct Challenge {
    held: OwnedFd,
    secret: [u8; SECRET_LEN],
}

impl std::fmt::Debug for Challenge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Challenge").field("fd", &self.fd()).finish_non_exhaustive()
    }
}

impl Challenge {
    /// A fresh secret from the kernel's random source, queued on a socket of its own.
    pub fn new() -> io::Result<Challenge> {
        let mut secret = [0u8; SECRET_LEN];
        fill_random(&mut secret)?;
        let (held, writer) =
            socketpair(AddressFamily::Unix, SockType::Datagram, None, SockFlag::SOCK_CLOEXEC)?;
        if send(writer.as_raw_fd(), &secret, MsgFlags::MSG_DONTWAIT)? != SECRET_LEN {
            return Err(io::Error::other("the secret was not queued whole"));
        }
        drop(writer);
        Ok(Challenge { held, secret })
    }

    /// The descriptor's number in this process's table (what the peer asks `pidfd_getfd` for).
    pub fn fd(&self) -> u32 {
        self.held.as_raw_fd() as u32
    }

    /// Whether `proof` is the secret (compared in constant time).
    pub fn answered_by(&self, proof: &[u8]) -> bool {
        proof.len() == SECRET_LEN
            && proof.iter().zip(&self.secret).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// The successor's side: takes descriptor `fd` of `daemon` (`pidfd_getfd`)
/// and reads the secret from it.
pub fn answer(daemon: &Process, fd: u32) -> Result<Vec<u8>, Errno> {
    let taken = daemon.take_fd(fd)?;
    let mut buf = [0u8; SECRET_LEN + 1];
    let n = recv(taken.as_fd().as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)?;
    Ok(buf[..n].to_vec())
}

/// Fills `buf` from `getrandom(2)`.
fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`, valid for writes of that size.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match n {
            n if n > 0 => done += n as usize,
            _ if Errno::last() == Errno::EINTR => {}
            _ => return Err(io::Error::last_os_error()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secret_answers_a_challenge_and_each_is_fresh() {
        let c = Challenge::new().unwrap();
        let d = Challenge::new().unwrap();
        assert_ne!(c.secret, d.secret);
        assert_ne!(c.fd(), d.fd());
        // This process may take its own descriptors: the honest path.
        let me = Process::own().unwrap();
        let got = answer(&me, c.fd()).unwrap();
        assert!(c.answered_by(&got));
        assert!(!d.answered_by(&got));
        // Read once: the secret is not there a second time.
        assert_eq!(answer(&me, c.fd()), Err(Errno::EAGAIN));
        assert!(!c.answered_by(&[]));
        assert!(!c.answered_by(&got[..SECRET_LEN - 1]));
        let mut longer = got.clone();
        longer.push(0);
        assert!(!c.answered_by(&longer));
        // A socket cannot be opened again by its /proc name (a weaker check than pidfd_getfd's).
        let through_proc = std::fs::File::open(format!("/proc/self/fd/{}", d.fd()));
        assert!(through_proc.is_err());
        // A number that names nothing.
        assert_eq!(answer(&me, 1 << 20).unwrap_err(), Errno::EBADF);
    }
}
