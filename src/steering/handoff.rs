//! A rule request in flight between the I/O thread that owns its connection
//! and whoever answers it (the NIC's rule thread, or a runtime task for an
//! uninstall that asks every NIC).
//!
//! The answerer writes the reply to the client's socket itself, so the owner
//! is not woken per request. The owner must still know when the answer went
//! out before it writes anything else or closes the connection; it learns it
//! from an atomic flag in the common case (the client read its reply and
//! closed, so the answer is long done), and only asks to be told, through its
//! [`Inbox`], when it has to wait:
//!
//! - the answerer sets `DONE` after writing; if the owner had set `WANT`
//!   first, or part of the reply could not be written, it posts the
//!   connection's key to the owner's inbox;
//! - the owner sets `WANT` when it needs the answer to be out; if `DONE` was
//!   already set it goes on at once, else it waits for the inbox.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

use nix::errno::Errno;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{send, MsgFlags};

/// The answer is written (or could not be, the client being gone).
const DONE: u8 = 1;
/// The owner waits for the answer and wants to be told through its inbox.
const WANT: u8 = 2;

/// The shared part of one rule connection.
pub struct Handoff {
    sock: OwnedFd,
    state: AtomicU8,
    /// Reply bytes the answerer could not write without blocking.
    rest: Mutex<Vec<u8>>,
    inbox: Arc<Inbox>,
    key: u64,
}

impl Handoff {
    pub(super) fn new(sock: OwnedFd, inbox: Arc<Inbox>, key: u64) -> Self {
        Handoff { sock, state: AtomicU8::new(0), rest: Mutex::new(Vec::new()), inbox, key }
    }

    /// The client's socket.
    pub fn sock(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// The connection's key on its thread.
    pub(super) fn key(&self) -> u64 {
        self.key
    }

    /// A waker that asks the connection's thread to look at it again
    /// (through its inbox): for work done elsewhere, such as reading the
    /// client's tenant.
    pub(super) fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(self.clone())
    }

    /// Owner: a request is handed over from now on.
    pub(super) fn begin(&self) {
        self.state.store(0, Ordering::Release);
    }

    /// Answerer: writes `reply` (one whole frame) without blocking and marks
    /// the request answered. Bytes that do not fit go to the owner; a client
    /// that has gone gets nothing (its connection is closing anyway).
    pub fn answer(&self, reply: &[u8]) {
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        let mut sent = 0;
        let left = loop {
            match send(self.sock.as_raw_fd(), &reply[sent..], flags) {
                Ok(n) if sent + n == reply.len() => break None,
                Ok(0) => break None,
                Ok(n) => sent += n,
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break Some(&reply[sent..]),
                // EPIPE, ECONNRESET: nobody to answer.
                Err(_) => break None,
            }
        };
        if let Some(left) = left {
            self.rest.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(left);
        }
        let before = self.state.fetch_or(DONE, Ordering::AcqRel);
        if before & WANT != 0 || left.is_some() {
            self.inbox.post(self.key);
        }
    }

    /// Owner: whether the answer is out, without asking to be told (see
    /// [`Self::settle`]).
    pub(super) fn answered(&self) -> bool {
        self.state.load(Ordering::Acquire) & DONE != 0
    }

    /// Owner: `Some(bytes still owed to the client)` once the answer is out;
    /// `None` means it is not yet, and the inbox will say when.
    pub(super) fn settle(&self) -> Option<Vec<u8>> {
        let before = self.state.fetch_or(WANT, Ordering::AcqRel);
        if before & DONE == 0 {
            return None;
        }
        Some(std::mem::take(&mut *self.rest.lock().unwrap_or_else(|p| p.into_inner())))
    }
}

impl Wake for Handoff {
    fn wake(self: Arc<Self>) {
        self.inbox.post(self.key);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.inbox.post(self.key);
    }
}

/// Where answerers tell an I/O thread which of its connections to look at
/// again, and where the thread is poked at shutdown: an eventfd in its epoll
/// set plus the keys posted since it last looked.
pub struct Inbox {
    keys: Mutex<Vec<u64>>,
    efd: EventFd,
}

impl Inbox {
    pub fn new() -> io::Result<Self> {
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Inbox { keys: Mutex::new(Vec::new()), efd })
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    /// Asks the thread to look at connection `key` again.
    pub(super) fn post(&self, key: u64) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let first = keys.is_empty();
        keys.push(key);
        drop(keys);
        // A non-empty list means a wake-up is already pending.
        if first {
            self.poke();
        }
    }

    /// Wakes the thread without a key (shutdown).
    pub fn poke(&self) {
        // Fails only if the counter would overflow: then a wake-up is pending anyway.
        let _ = self.efd.write(1);
    }

    /// Thread: resets the wake-up and takes the keys posted so far.
    pub(super) fn take(&self, into: &mut Vec<u64>) {
        let _ = self.efd.read();
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *keys, into);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    fn pair(key: u64) -> (Arc<Inbox>, Handoff, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let inbox = Arc::new(Inbox::new().unwrap());
        (inbox.clone(), Handoff::new(a.into(), inbox, key), b)
    }

    fn posted(inbox: &Inbox) -> Vec<u64> {
        let mut v = Vec::new();
        inbox.take(&mut v);
        v
    }

    #[test]
    fn an_answer_before_the_owner_asks_posts_nothing() {
        let (inbox, h, mut client) = pair(7);
        h.begin();
        h.answer(b"\x00\x05\x0a\x03Ok.");
        assert_eq!(h.settle(), Some(Vec::new()));
        assert!(posted(&inbox).is_empty(), "the common case costs no wake-up");
        let mut got = [0u8; 7];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"\x00\x05\x0a\x03Ok.");
    }

    #[test]
    fn an_owner_that_asks_first_is_told_through_the_inbox() {
        let (inbox, h, _client) = pair(9);
        h.begin();
        assert_eq!(h.settle(), None);
        h.answer(b"\x00\x01\x00");
        assert_eq!(posted(&inbox), [9]);
        assert_eq!(h.settle(), Some(Vec::new()));
        // The next request starts from a clean state.
        h.begin();
        assert_eq!(h.settle(), None);
    }

    #[test]
    fn what_does_not_fit_goes_back_to_the_owner() {
        let (inbox, h, client) = pair(3);
        // Fill the client's receive side so that the answer cannot be written whole.
        let filler = vec![0u8; 4096];
        while send(h.sock().as_raw_fd(), &filler, MsgFlags::MSG_DONTWAIT).is_ok() {}
        h.begin();
        h.answer(b"\x00\x05\x0a\x03Ok.");
        assert_eq!(posted(&inbox), [3], "a partial answer always wakes the owner");
        assert_eq!(h.settle().unwrap(), b"\x00\x05\x0a\x03Ok.");
        drop(client);
    }

    #[test]
    fn a_gone_client_is_answered_harmlessly() {
        let (inbox, h, client) = pair(4);
        drop(client);
        h.begin();
        h.answer(b"\x00\x05\x0a\x03Ok.");
        assert_eq!(h.settle(), Some(Vec::new()));
        assert!(posted(&inbox).is_empty());
    }
}
