//! The protocol's floor: a server that does only the socket work one rule
//! request needs (accept, read one length-prefixed frame, write the fixed
//! reply, read EOF, close), with nothing else: no parsing, no rule, no
//! bookkeeping, and each of those steps done the cheapest way the daemon
//! knows, so that no server can beat it on the same machine:
//! - each thread has its own epoll set; all of them watch the listening
//!   socket with `EPOLLEXCLUSIVE`, and a connection stays on the thread
//!   that accepted it. A thread accepts one connection per listener event
//!   unless the batch before also accepted (then it drains the backlog),
//!   so that connections spread over the threads instead of piling onto
//!   the one that woke first;
//! - connections are edge-triggered with `EPOLLRDHUP`, and a whole request
//!   is peeked (`MSG_PEEK`), answered, and consumed by the read that finds
//!   the client's end of stream: reading it first would free the client's
//!   sent data and wake the client once for nothing (the daemon does the
//!   same, see its `steering::intake`).
//!
//! It runs on as many threads as the daemon has rule I/O threads (one per
//! core): a floor with fewer threads than the daemon keeps busy is no floor.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::socket::{accept4, recv, MsgFlags, SockFlag};

const LISTENER: u64 = u64::MAX;

/// A running floor server; [`Floor::stop`] ends its threads.
pub struct Floor {
    // Read by `stop`, which only the tests call; the benchmark's floor process ends by signal.
    #[cfg_attr(not(test), allow(dead_code))]
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<io::Result<()>>>,
}

/// Binds `path` and serves it on `threads` threads, answering the first frame
/// of every connection with `reply` (already framed).
pub fn serve(path: &Path, threads: usize, reply: Vec<u8>) -> io::Result<Floor> {
    let listener = Arc::new(UnixListener::bind(path)?);
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let reply: Arc<[u8]> = reply.into();
    let threads = (0..threads.max(1))
        .map(|i| {
            let (listener, stop, reply) = (listener.clone(), stop.clone(), reply.clone());
            std::thread::Builder::new()
                .name(format!("floor-{i}"))
                .spawn(move || worker(&listener, &reply, &stop))
        })
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Floor { stop, threads })
}

impl Floor {
    /// Stops the threads (within one epoll timeout) and returns the first error any hit.
    #[cfg(test)]
    pub fn stop(self) -> io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.join()
    }

    /// Waits for the threads without stopping them: they return only on an error.
    pub fn join(self) -> io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t.join().unwrap_or_else(|_| Err(io::Error::other("floor thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

struct Conn {
    fd: OwnedFd,
    /// Bytes of a request that came in pieces (read, not peeked).
    buf: Vec<u8>,
    /// The reply is written; what is left is the client's EOF.
    replied: bool,
    /// Bytes at the socket's head already answered: the EOF read drops them.
    peeked: usize,
    /// Epoll saw the client's FIN: a read ends in EOF.
    peer_shut: bool,
}

fn worker(listener: &UnixListener, reply: &[u8], stop: &AtomicBool) -> io::Result<()> {
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    ep.add(listener, EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE, LISTENER))?;
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut events = vec![EpollEvent::empty(); 256];
    let mut scratch = [0u8; 4096];
    let (mut accepted_now, mut accepted_before) = (false, false);
    while !stop.load(Ordering::Relaxed) {
        let n = match ep.wait(&mut events, 50u16) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for ev in &events[..n] {
            if ev.data() == LISTENER {
                accepted_now |= accept(listener, &ep, &mut conns, accepted_before)?;
                continue;
            }
            let key = ev.data();
            let Some(conn) = conns.get_mut(&key) else { continue };
            if ev.events().intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
                conn.peer_shut = true;
            }
            if let Step::Close = on_readable(conn, reply, &mut scratch) {
                // Closing the only descriptor also takes it out of the epoll set.
                conns.remove(&key);
            }
        }
        accepted_before = std::mem::take(&mut accepted_now);
    }
    Ok(())
}

/// Accepts one connection, or, under load (`drain`), all that wait; whether any was.
fn accept(
    listener: &UnixListener,
    ep: &Epoll,
    conns: &mut HashMap<u64, Conn>,
    drain: bool,
) -> io::Result<bool> {
    let mut any = false;
    loop {
        match accept4(listener.as_raw_fd(), SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC) {
            Ok(raw) => {
                // SAFETY: accept4 just returned this descriptor; nothing else owns it.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
                ep.add(fd.as_fd(), EpollEvent::new(flags, raw as u64))?;
                let conn = Conn { fd, buf: Vec::new(), replied: false, peeked: 0, peer_shut: false };
                conns.insert(raw as u64, conn);
                any = true;
                if !drain {
                    return Ok(true);
                }
            }
            Err(Errno::EAGAIN) => return Ok(any),
            Err(Errno::EINTR | Errno::ECONNABORTED) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

enum Step {
    Wait,
    Close,
}

/// Whether `buf` starts with a whole frame.
fn whole(buf: &[u8]) -> bool {
    buf.len() >= 2 && buf.len() >= 2 + u16::from_be_bytes([buf[0], buf[1]]) as usize
}

/// Runs a connection as far as it goes: a whole request is peeked and
/// answered; its bytes and the EOF come back from one read later.
fn on_readable(conn: &mut Conn, reply: &[u8], scratch: &mut [u8]) -> Step {
    if !conn.replied && conn.buf.is_empty() {
        match recv(conn.fd.as_raw_fd(), scratch, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(k) if k > 0 && whole(&scratch[..k]) => {
                conn.peeked = k;
                return match answer(conn, reply) {
                    Step::Wait if conn.peer_shut => finish(conn, scratch),
                    step => step,
                };
            }
            // Part of a frame, EOF or an error: a plain read says which.
            _ => {}
        }
    }
    if conn.replied {
        return match conn.peer_shut {
            true => finish(conn, scratch),
            // Edge-triggered: the EOF raises the next event.
            false => Step::Wait,
        };
    }
    loop {
        match nix::unistd::read(conn.fd.as_fd(), scratch) {
            Ok(0) => return Step::Close,
            Ok(k) => {
                conn.buf.extend_from_slice(&scratch[..k]);
                if whole(&conn.buf) {
                    return answer(conn, reply);
                }
            }
            Err(Errno::EAGAIN) => return Step::Wait,
            Err(Errno::EINTR) => continue,
            Err(_) => return Step::Close,
        }
    }
}

fn answer(conn: &mut Conn, reply: &[u8]) -> Step {
    match nix::unistd::write(conn.fd.as_fd(), reply) {
        Ok(w) if w == reply.len() => {
            conn.replied = true;
            Step::Wait
        }
        // A 7-byte write into a fresh socket does not block; if it ever
        // does, the client sees the close and counts an error.
        _ => Step::Close,
    }
}

/// Consumes what is left (the peeked request) and the EOF, then closes.
fn finish(conn: &mut Conn, scratch: &mut [u8]) -> Step {
    loop {
        match nix::unistd::read(conn.fd.as_fd(), scratch) {
            Ok(0) => return Step::Close,
            Ok(k) => conn.peeked = conn.peeked.saturating_sub(k),
            Err(Errno::EAGAIN) => return Step::Wait,
            Err(Errno::EINTR) => continue,
            Err(_) => return Step::Close,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use tcpx_rxdm::wire::frame;

    use tcpx_rxdm::types::status::StatusCode;

    use super::*;
    use crate::load::{drive, rule_frames, Target};

    fn targets() -> Vec<Target> {
        vec![Target { gpu: None, dst: "192.168.1.2".into() }]
    }

    #[test]
    fn floor_and_client_agree() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("floor");
        let ok = Arc::new(frame::encode(&frame::ok()).unwrap());
        let floor = serve(&sock, 2, ok.to_vec()).unwrap();
        let reqs = Arc::new(rule_frames(0, 300, &targets()));
        let run = drive(&sock, 8, &reqs, &ok);
        assert_eq!((run.lat.len(), run.errors), (300, 0), "{:?}", run.error_kinds);
        assert!(run.wall > Duration::ZERO);
        floor.stop().unwrap();
    }

    #[test]
    fn a_server_with_the_wrong_reply_cannot_look_fast() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("floor");
        let wrong = frame::encode(&frame::error(StatusCode::Unavailable, "busy")).unwrap();
        let floor = serve(&sock, 1, wrong).unwrap();
        let ok = Arc::new(frame::encode(&frame::ok()).unwrap());
        let run = drive(&sock, 4, &Arc::new(rule_frames(0, 50, &targets())), &ok);
        assert_eq!((run.lat.len(), run.errors), (0, 50));
        assert_eq!(run.error_kinds.len(), 1, "{:?}", run.error_kinds);
        assert!(run.error_kinds.keys().next().unwrap().contains("status 14"));
        floor.stop().unwrap();
    }

    #[test]
    fn floor_waits_for_the_whole_frame_and_closes_after_eof() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("floor");
        let ok = frame::encode(&frame::ok()).unwrap();
        let floor = serve(&sock, 1, ok.clone()).unwrap();
        let req = &rule_frames(0, 1, &targets())[0];
        let mut s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        s.write_all(&req[..req.len() / 2]).unwrap();
        let mut buf = [0u8; 64];
        let e = s.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "no reply before the frame is whole");
        s.write_all(&req[req.len() / 2..]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = vec![0u8; ok.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, ok);
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(s.read(&mut buf).unwrap(), 0, "the floor closes once it reads EOF");
        floor.stop().unwrap();
    }
}
