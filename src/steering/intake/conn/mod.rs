//! One rule connection on its I/O thread: a state machine run on every
//! readiness event, inbox hint, idle sweep and at shutdown. It keeps the
//! guarantees of the other endpoints: requests are answered in order, every
//! request read gets exactly one reply before the connection closes, malformed
//! input gets INVALID_ARGUMENT and then the close, and after shutdown begins
//! what was already sent is answered UNAVAILABLE.
//!
//! The connection is registered edge-triggered, so the machine remembers
//! whether the socket may hold unread bytes (`may_read`) instead of being
//! told again.
//!
//! A lone request is *peeked*, not read, and its bytes are consumed only
//! after its answer went out, by the read that finds the client's EOF. The
//! kernel wakes a client blocked in `read()` whenever the server frees the
//! client's sent data (the socket's write space grows), so reading a request
//! before answering it costs the client a wake-up for nothing and a second one
//! for the reply; a peek frees nothing. It costs no extra call: the bytes and
//! the EOF come back from one read.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::EpollFlags;
use nix::sys::socket::{recv, send, MsgFlags};

use super::Cx;
use crate::endpoint::pause::Parked;
use crate::endpoint::{budget, memory, shutting_down, Endpoint};
use crate::steering::Handoff;
use crate::types::status::StatusCode;
use crate::wire::frame;
use crate::wire::proto::UnixSocketProto;

mod serve;
use serve::Who;

/// Bytes read from a client after shutdown began, at most: enough for every
/// request a well-behaved client can have in flight.
const SHUTDOWN_READ_LIMIT: usize = 256 * 1024;

/// What the thread does with the connection after a run of the machine.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Wait for the next event or hint.
    Keep,
    /// Bytes are owed and the socket is full: also wait for writability.
    WantWrite,
    Close,
}

pub(super) struct Conn {
    pub(super) shared: Arc<Handoff>,
    /// Index of the listener it came from (its endpoint and metric series).
    pub(super) listener: usize,
    endpoint: Endpoint,
    /// Received bytes not yet parsed.
    buf: Vec<u8>,
    /// Reply bytes owed to the client, not yet written.
    out: Vec<u8>,
    /// Who the client is (asked when the connection was taken in).
    who: Who,
    /// The connection counted against its workload's share, once known.
    share: Option<budget::WorkloadShare>,
    /// The refusal for its first request: its workload held its most already.
    over_share: Option<String>,
    /// A request parsed while its client's tenant was still being read.
    stashed: Option<UnixSocketProto>,
    /// What its requests take turns by: its tenant, else its process.
    pub(super) turn: u64,
    /// It waits in its thread's queue of connections to run.
    pub(super) queued: bool,
    last_request: Instant,
    /// A request is with a NIC thread or a runtime task.
    handed: bool,
    /// The client has shut its sending side (read returned 0).
    eof: bool,
    /// The socket may hold bytes not read yet.
    may_read: bool,
    /// The peer's FIN has been seen by epoll: a read will end in EOF.
    peer_shut: bool,
    /// Close once `out` is written (after an error reply).
    closing: bool,
    /// Bytes at the head of the socket that were peeked and parsed already:
    /// the next read drops them.
    peeked: usize,
    /// Writability is also watched (set once, kept: the registration is edge-triggered).
    pub(super) watching_out: bool,
    /// It is in its thread's epoll set.
    pub(super) in_set: bool,
    read_after_stop: usize,
    /// It holds one of its thread's permits of the connection budget.
    pub(super) counted: bool,
    /// Its listening socket was seen empty at this instant before it was
    /// accepted (see `ClientTracker::ask_queued`); `None` when not known.
    pub(super) queued_after: Option<Instant>,
}

/// The end of the first whole frame in `buf`, if one has arrived.
fn whole_frame(buf: &[u8]) -> Option<usize> {
    let end = frame::HEADER_LEN + frame::body_len(buf)?;
    (buf.len() >= end).then_some(end)
}

impl Conn {
    pub(super) fn new(
        shared: Arc<Handoff>,
        listener: usize,
        endpoint: Endpoint,
        now: Instant,
        counted: bool,
    ) -> Self {
        Conn {
            shared,
            listener,
            endpoint,
            buf: Vec::new(),
            out: Vec::new(),
            who: Who::Unasked,
            share: None,
            over_share: None,
            stashed: None,
            turn: serve::NOBODY,
            queued: false,
            last_request: now,
            handed: false,
            eof: false,
            may_read: false,
            peer_shut: false,
            closing: false,
            peeked: 0,
            watching_out: false,
            in_set: false,
            read_after_stop: 0,
            counted,
            queued_after: None,
        }
    }

    /// Notes what epoll reported.
    pub(super) fn on_event(&mut self, ev: EpollFlags) {
        let input =
            EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR;
        if ev.intersects(input) {
            self.may_read = true;
        }
        if ev.intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP) {
            self.peer_shut = true;
        }
    }

    /// A connection taken over from another daemon, with what that daemon
    /// had read of it.
    pub(super) fn adopted(mut self, input: Vec<u8>, peeked: usize) -> Self {
        self.buf = input;
        self.peeked = peeked;
        self.may_read = true;
        self
    }

    /// Whether it sits between two requests: nothing in flight, nothing
    /// owed, no whole request unanswered, not closing.
    pub(super) fn parkable(&self) -> bool {
        !self.handed
            && self.stashed.is_none()
            && self.out.is_empty()
            && !self.closing
            && !self.eof
            && whole_frame(&self.buf).is_none()
    }

    /// What a takeover hands on of it (a duplicate of its socket).
    pub(super) fn park(&self) -> io::Result<Parked> {
        Ok(Parked {
            fd: self.shared.sock().try_clone_to_owned()?,
            endpoint: self.endpoint,
            registered: false,
            input: self.buf.clone(),
            peeked: self.peeked,
        })
    }

    /// Takes in an answer the NIC thread finished meanwhile (it writes to
    /// the socket itself and wakes this thread only when it must).
    pub(super) fn settle_now(&mut self) {
        self.settle();
    }

    /// Just accepted, its client known: the socket is worth a look before
    /// epoll says so (marks it readable; `false` while its client is being read).
    pub(super) fn fresh(&mut self) -> bool {
        if matches!(self.who, Who::Reading(..)) {
            return false;
        }
        self.may_read = true;
        true
    }

    /// The pause ended: look at the socket again.
    pub(super) fn unpause(&mut self) {
        self.may_read = true;
    }

    /// Shutdown began: read what the client already sent, answer it, close.
    pub(super) fn begin_stop(&mut self) {
        self.may_read = true;
    }

    /// Whether the connection has gone `limit` without a complete request
    /// (and nothing is in flight or owed).
    pub(super) fn idle_for(&self, limit: Duration, now: Instant) -> bool {
        !self.handed
            && self.stashed.is_none()
            && self.out.is_empty()
            && !self.closing
            && now.duration_since(self.last_request) >= limit
    }

    /// Ends an idle connection: silently with nothing pending, with
    /// INVALID_ARGUMENT naming the bytes received when part of a frame is.
    pub(super) fn expire(&mut self, limit: Duration) {
        if !self.buf.is_empty() {
            self.reply(&budget::incomplete_reply(&self.buf, limit));
        }
        self.closing = true;
    }

    /// Runs the connection as far as it can go without waiting.
    pub(super) fn drive(&mut self, cx: &mut Cx) -> Next {
        loop {
            if self.waiting_for_who(cx) {
                return Next::Keep;
            }
            if !self.out.is_empty() {
                match self.write_out() {
                    Ok(true) => {}
                    Ok(false) => return Next::WantWrite,
                    Err(_) => return Next::Close,
                }
            }
            if self.closing {
                self.discard_peeked(cx);
                return Next::Close;
            }
            let frame_end = whole_frame(&self.buf);
            // Paused for a takeover: what was read is answered, nothing more is read.
            let reading =
                self.may_read && !cx.paused && (!cx.stopping || self.read_after_stop < SHUTDOWN_READ_LIMIT);
            // An answer in flight goes out before anything else happens on the
            // connection: the next frame is answered in order, the close comes
            // after the answer (a half-closed client still waits for it),
            // and peeked bytes are consumed only once their request is
            // answered (see the module's notes).
            let next_step_needs_answer =
                frame_end.is_some() || self.eof || (reading && self.peeked > 0) || (!reading && cx.stopping);
            if next_step_needs_answer {
                if !self.settle() {
                    return Next::Keep;
                }
                if !self.out.is_empty() {
                    continue;
                }
            }
            if let Some(end) = frame_end {
                match frame::parse(&self.buf[..end]) {
                    Ok(Some((msg, used))) => {
                        self.buf.drain(..used);
                        memory::shrink_buffer(&mut self.buf);
                        self.last_request = cx.now;
                        self.serve(msg, cx);
                    }
                    Ok(None) => unreachable!("whole_frame found a whole frame"),
                    Err(e) => {
                        self.reply(&frame::error(StatusCode::InvalidArgument, e.to_string()));
                        self.closing = true;
                    }
                }
                continue;
            }
            if self.eof {
                if !self.buf.is_empty() {
                    tracing::debug!(
                        endpoint = self.endpoint.kind(),
                        pending = self.buf.len(),
                        "client closed mid-frame"
                    );
                }
                return Next::Close;
            }
            if reading {
                if self.read(cx).is_err() {
                    // The client is gone (reset): nobody to answer. A NIC thread
                    // still holding the socket writes into it harmlessly.
                    return Next::Close;
                }
                continue;
            }
            if cx.stopping {
                if !self.buf.is_empty() {
                    // Part of a request arrived: answer it rather than close on the client.
                    self.buf.clear();
                    self.reply(&shutting_down());
                    self.closing = true;
                    continue;
                }
                self.discard_peeked(cx);
                return Next::Close;
            }
            return Next::Keep;
        }
    }

    /// One read into the thread's scratch buffer; a lone whole request is
    /// peeked instead (see the module's notes).
    fn read(&mut self, cx: &mut Cx) -> io::Result<()> {
        if self.peeked == 0 && self.buf.is_empty() && !cx.stopping {
            let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
            match recv(self.shared.sock().as_raw_fd(), &mut cx.scratch[..], flags) {
                Ok(k) if k > 0 && whole_frame(&cx.scratch[..k]) == Some(k) => {
                    self.peeked = k;
                    self.buf.extend_from_slice(&cx.scratch[..k]);
                    if !self.peer_shut {
                        self.may_read = false;
                    }
                    return Ok(());
                }
                // Part of a frame, more than one, EOF or an error: an ordinary read says which.
                _ => {}
            }
        }
        match nix::unistd::read(self.shared.sock(), &mut cx.scratch[..]) {
            Ok(0) => {
                self.eof = true;
                self.may_read = false;
            }
            Ok(k) => {
                let skip = self.peeked.min(k);
                self.peeked -= skip;
                self.buf.extend_from_slice(&cx.scratch[skip..k]);
                if cx.stopping {
                    self.read_after_stop += k;
                }
                // A short read emptied the socket: bytes arriving later raise a
                // new edge. If epoll already saw the FIN, nothing can follow it:
                // that was the end of the stream (no read just to get 0).
                if k < cx.scratch.len() {
                    self.may_read = false;
                    self.eof = self.peer_shut;
                }
            }
            Err(Errno::EAGAIN) => self.may_read = false,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// A connection taken in this round and not put in the epoll set yet:
    /// once its answer is out, whether the client has closed already. A
    /// client reads its reply and closes, so under load its EOF is usually
    /// there by the end of the round: the connection is then finished
    /// without ever entering the epoll set, which saves adding it and taking
    /// it out again. The look is a `poll` (the peer's shutdown shows even
    /// before the request's bytes are consumed): consuming them while the
    /// client still waits for its reply would wake it for nothing (see the
    /// module's notes). `true` when it is done and to be closed.
    pub(super) fn finish_unwatched(&mut self, cx: &mut Cx) -> bool {
        let waiting = self.stashed.is_some() || (self.handed && !self.shared.answered());
        if waiting || self.closing || self.watching_out || !self.out.is_empty() {
            return false;
        }
        let mut pfd =
            libc::pollfd { fd: self.shared.sock().as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call; a zero timeout never blocks.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        if n != 1 || pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) == 0 {
            return false;
        }
        self.on_event(nix::sys::epoll::EpollFlags::EPOLLRDHUP);
        self.drive(cx) == Next::Close
    }

    /// Consumes the peeked bytes before a close the daemon starts: closing a
    /// Unix socket with unread bytes makes the client's next read fail with
    /// ECONNRESET instead of seeing the end of the stream after its reply.
    fn discard_peeked(&mut self, cx: &mut Cx) {
        while self.peeked > 0 {
            let n = self.peeked.min(cx.scratch.len());
            match nix::unistd::read(self.shared.sock(), &mut cx.scratch[..n]) {
                Ok(0) | Err(_) => break,
                Ok(k) => self.peeked -= k,
            }
        }
    }

    /// `true` once no answer is in flight; what it could not write is now owed.
    fn settle(&mut self) -> bool {
        if !self.handed {
            return true;
        }
        match self.shared.settle() {
            None => false,
            Some(rest) => {
                self.handed = false;
                self.out.extend_from_slice(&rest);
                true
            }
        }
    }

    /// `Ok(true)` when everything owed is written, `Ok(false)` when the socket is full.
    fn write_out(&mut self) -> io::Result<bool> {
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        while !self.out.is_empty() {
            match send(self.shared.sock().as_raw_fd(), &self.out, flags) {
                Ok(n) => drop(self.out.drain(..n)),
                Err(Errno::EAGAIN) => return Ok(false),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        memory::shrink_buffer(&mut self.out);
        Ok(true)
    }

    fn reply(&mut self, msg: &UnixSocketProto) {
        if let Err(e) = frame::encode_into(msg, &mut self.out) {
            // Still a reply: a client waits for one.
            let fallback = frame::error(StatusCode::Internal, format!("reply not sent: {e}"));
            frame::encode_into(&fallback, &mut self.out).expect("a short reply fits");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_frame_needs_the_header_and_the_body() {
        assert_eq!(whole_frame(&[]), None);
        assert_eq!(whole_frame(&[0]), None);
        assert_eq!(whole_frame(&[0, 2, 1]), None);
        assert_eq!(whole_frame(&[0, 2, 1, 2]), Some(4));
        assert_eq!(whole_frame(&[0, 0, 9]), Some(2), "an empty body is a whole frame");
        assert_eq!(whole_frame(frame::OK_FRAME), Some(7));
    }
}
