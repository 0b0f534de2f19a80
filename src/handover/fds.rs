//! Many fds over one Unix connection: SCM_RIGHTS in chunks, each chunk
//! carried by one byte, so a reader never mixes chunks (the kernel stops a
//! stream read at a message that carries fds).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::HandoverError;

/// The kernel's limit per message is 253 (`SCM_MAX_FD`); we stay under it.
pub const FDS_PER_MESSAGE: usize = 250;

/// The fds a message names, by index; duplicated when pushed, so the list
/// owns what it sends.
#[derive(Debug, Default)]
pub struct FdList {
    fds: Vec<OwnedFd>,
}

impl FdList {
    /// Adds a duplicate of `fd`; its index in the message.
    pub fn push(&mut self, fd: BorrowedFd<'_>) -> std::io::Result<u32> {
        self.fds.push(fd.try_clone_to_owned()?);
        Ok(self.fds.len() as u32 - 1)
    }

    /// Adds `fd` itself.
    pub fn push_owned(&mut self, fd: OwnedFd) -> u32 {
        self.fds.push(fd);
        self.fds.len() as u32 - 1
    }

    pub fn len(&self) -> u32 {
        self.fds.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    pub fn fds(&self) -> &[OwnedFd] {
        &self.fds
    }
}

/// The fds that came with a message, each taken once by its index.
#[derive(Debug, Default)]
pub struct FdSet {
    fds: Vec<Option<OwnedFd>>,
}

impl FdSet {
    pub fn new(fds: Vec<OwnedFd>) -> FdSet {
        FdSet { fds: fds.into_iter().map(Some).collect() }
    }

    /// The fd at `index`; an error if there is none or it was taken already.
    pub fn take(&mut self, index: u32, what: &str) -> Result<OwnedFd, String> {
        self.fds
            .get_mut(index as usize)
            .and_then(Option::take)
            .ok_or_else(|| format!("{what}: fd {index} missing or named twice"))
    }

    /// Like [`Self::take`] for an optional index.
    pub fn take_opt(&mut self, index: Option<u32>, what: &str) -> Result<Option<OwnedFd>, String> {
        index.map(|i| self.take(i, what)).transpose()
    }
}

fn io(what: &'static str, e: nix::errno::Errno) -> HandoverError {
    HandoverError::Io { what, source: e.into() }
}

/// Sends `fds` in chunks.
pub fn send_fds(s: &UnixStream, fds: &[OwnedFd]) -> Result<(), HandoverError> {
    for chunk in fds.chunks(FDS_PER_MESSAGE) {
        let raw: Vec<RawFd> = chunk.iter().map(|f| f.as_raw_fd()).collect();
        let carrier = [0u8];
        let iov = [IoSlice::new(&carrier)];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        loop {
            match sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
                Ok(1) => break,
                Ok(_) => {
                    return Err(HandoverError::Protocol("an fd chunk's carrier byte was not sent".into()))
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io("sending fds", e)),
            }
        }
    }
    Ok(())
}

/// Receives exactly `count` fds.
pub fn recv_fds(s: &UnixStream, count: usize) -> Result<Vec<OwnedFd>, HandoverError> {
    let mut out = Vec::with_capacity(count);
    let mut space = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
    while out.len() < count {
        let mut byte = [0u8];
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        let msg = match recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io("receiving fds", e)),
        };
        if msg.bytes == 0 {
            return Err(HandoverError::Protocol(format!(
                "the peer closed after {} of {count} fds",
                out.len()
            )));
        }
        let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        let mut got = 0;
        for c in msg.cmsgs().map_err(|e| io("reading fds", e))? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                got += fds.len();
                // SAFETY: the kernel just installed these descriptors for us; nothing else owns them.
                out.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if truncated || got == 0 {
            return Err(HandoverError::Protocol(
                "an fd chunk arrived cut short (out of descriptors?)".into(),
            ));
        }
    }
    if out.len() != count {
        return Err(HandoverError::Protocol(format!("{} fds arrived, {count} were announced", out.len())));
    }
    Ok(out)
}
