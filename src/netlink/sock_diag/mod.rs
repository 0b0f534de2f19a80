//! Finding one TCP socket by its four-tuple through `NETLINK_SOCK_DIAG`
//! (`inet_diag`), and reading the cgroup it belongs to.
//!
//! The request is an exact lookup (`SOCK_DIAG_BY_FAMILY` without
//! `NLM_F_DUMP`): the kernel looks the tuple up the way it would for an
//! incoming packet and answers one `inet_diag_msg`, or `ENOENT`. Such a
//! lookup falls back to a listening socket on the local port, so the answer
//! is checked: it must name the same four-tuple and not be a listener.
//!
//! The cgroup is `INET_DIAG_CGROUP_ID`: the id of the cgroup v2 of the
//! process that created the socket (an accepted socket inherits its
//! listener's). The messages are built and parsed here by hand over byte
//! buffers, with layout tests against the kernel's structs; a lookup is one
//! `send` and one `recv` on a socket the caller keeps.
//!
//! [`SockDiag::unix_peer`] asks `unix_diag` instead: which socket is the
//! other end of a Unix connection.
//!
//! The dumps serve the repair of flows named with half their address bytes
//! (see `identity::flows`): [`SockDiag::by_ports`], every IPv6 TCP
//! connection with a given local and remote port (the kernel compares the
//! ports while it walks its connection table, so only those come back), and
//! [`SockDiag::established_by_ports`], the established ones of any of many
//! port pairs (a filter program the kernel runs on each socket). Either walks
//! the whole table, every namespace's sockets included: what a lookup costs
//! grows with the host's connections, which is why the repair tries exact
//! lookups first.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// `NETLINK_SOCK_DIAG` from `<linux/netlink.h>`.
const NETLINK_SOCK_DIAG: libc::c_int = 4;
/// `SOCK_DIAG_BY_FAMILY` from `<linux/sock_diag.h>`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `INET_DIAG_CGROUP_ID` from `<linux/inet_diag.h>` (Linux 5.7).
const INET_DIAG_CGROUP_ID: u16 = 21;
/// `INET_DIAG_NOCOOKIE`.
const NO_COOKIE: u32 = !0;
/// `TCP_LISTEN` from `<net/tcp_states.h>`.
const TCP_LISTEN: u8 = 10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `TCP_TIME_WAIT` and `TCP_NEW_SYN_RECV`: no connection a process holds.
const TCP_TIME_WAIT: u8 = 6;
const TCP_NEW_SYN_RECV: u8 = 12;
/// The states a dump asks for: every state a socket a process holds can be
/// in (not listeners, time-wait or half-open request sockets).
const HELD_STATES: u32 = !((1 << TCP_LISTEN) | (1 << TCP_TIME_WAIT) | (1 << TCP_NEW_SYN_RECV)) & 0x1fff;

/// `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_sockid`: sport, dport, src[4], dst[4], if, cookie[2].
const SOCKID: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, id.
pub const REQ_V2: usize = 8 + SOCKID;
/// `struct inet_diag_msg`: family, state, timer, retrans, id, expires,
/// rqueue, wqueue, uid, inode.
pub const DIAG_MSG: usize = 4 + SOCKID + 20;

/// Lookups [`SockDiag::find_many`] takes at once, at most: their answers
/// fit a netlink socket's default receive buffer.
pub const MANY: usize = 64;

/// A TCP socket the kernel reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    /// `TCP_ESTABLISHED` is 1, ... (`<net/tcp_states.h>`).
    pub state: u8,
    /// The cgroup v2 id of its creator; `None` on kernels without the attribute.
    pub cgroup_id: Option<u64>,
    pub inode: u32,
}

/// Why a lookup found nothing usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiagError {
    #[error("sock_diag: {0}")]
    Sys(#[from] Errno),
    #[error("sock_diag: malformed answer ({0})")]
    Malformed(&'static str),
}

fn put_addr(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out[..16].copy_from_slice(&v6.octets()),
    }
}

fn family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// Writes a request's netlink header into `m`: its whole length `len`, our
/// one message type, `flags` (`NLM_F_REQUEST`, with `NLM_F_DUMP` for a dump)
/// and sequence number `seq`.
fn write_header(m: &mut [u8], len: usize, flags: libc::c_int, seq: u32) {
    m[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&(flags as u16).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
}

/// An exact lookup's answer: the first netlink message in `buf`, as the
/// kernel's error number (`Err(Ok(errno))`, 0 for a bare ack) or as the
/// message's type and body.
fn first_message(buf: &[u8]) -> Result<(u16, &[u8]), Result<i32, DiagError>> {
    if buf.len() < NLMSG_HDR {
        return Err(Err(DiagError::Malformed("short header")));
    }
    let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    let kind = u16::from_ne_bytes(buf[4..6].try_into().expect("2 bytes"));
    if len < NLMSG_HDR || len > buf.len() {
        return Err(Err(DiagError::Malformed("bad length")));
    }
    let body = &buf[NLMSG_HDR..len];
    if kind != NLMSG_ERROR {
        return Ok((kind, body));
    }
    let code = body.get(0..4).ok_or(DiagError::Malformed("short error")).map_err(Err)?;
    let code = i32::from_ne_bytes(code.try_into().expect("4 bytes"));
    // i32::MIN has no negation: no errno, a malformed answer.
    match code.checked_neg() {
        Some(e) if e >= 0 => Err(Ok(e)),
        _ => Err(Err(DiagError::Malformed("error code out of range"))),
    }
}

/// The exact-lookup request for the TCP socket whose local end is `local`
/// and remote end `remote` (both of one family), sequence number `seq`.
pub fn lookup_request(local: SocketAddr, remote: SocketAddr, seq: u32) -> [u8; NLMSG_HDR + REQ_V2] {
    let mut m = [0u8; NLMSG_HDR + REQ_V2];
    write_header(&mut m, NLMSG_HDR + REQ_V2, libc::NLM_F_REQUEST, seq);
    let r = &mut m[NLMSG_HDR..];
    r[0] = family(local.ip());
    r[1] = libc::IPPROTO_TCP as u8;
    r[2] = 0; // no extensions: the cgroup id comes with every answer
    r[4..8].copy_from_slice(&(!0u32).to_ne_bytes()); // any state
    let id = &mut r[8..];
    id[0..2].copy_from_slice(&local.port().to_be_bytes());
    id[2..4].copy_from_slice(&remote.port().to_be_bytes());
    put_addr(&mut id[4..20], local.ip());
    put_addr(&mut id[20..36], remote.ip());
    id[40..44].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    id[44..48].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    m
}

/// The dump request for every IPv6 TCP connection whose local port is
/// `local_port` and remote port `remote_port`, sequence number `seq`.
pub fn ports_request(local_port: u16, remote_port: u16, seq: u32) -> [u8; NLMSG_HDR + REQ_V2] {
    let mut m = [0u8; NLMSG_HDR + REQ_V2];
    write_header(&mut m, NLMSG_HDR + REQ_V2, libc::NLM_F_REQUEST | libc::NLM_F_DUMP, seq);
    let r = &mut m[NLMSG_HDR..];
    r[0] = libc::AF_INET6 as u8;
    r[1] = libc::IPPROTO_TCP as u8;
    r[4..8].copy_from_slice(&HELD_STATES.to_ne_bytes());
    let id = &mut r[8..];
    id[0..2].copy_from_slice(&local_port.to_be_bytes());
    id[2..4].copy_from_slice(&remote_port.to_be_bytes());
    id[40..44].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    id[44..48].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    m
}

/// A connection a dump reported: its two ends as the kernel keeps them
/// (IPv6, v4-mapped for IPv4 on a dual-stack socket) and the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub socket: TcpSocket,
}

/// One `inet_diag_msg` (the body after its `nlmsghdr`).
fn parse_msg(body: &[u8]) -> Result<Connection, DiagError> {
    if body.len() < DIAG_MSG {
        return Err(DiagError::Malformed("not an inet_diag_msg"));
    }
    let (fam, state) = (body[0], body[1]);
    let id = &body[4..4 + SOCKID];
    let sport = u16::from_be_bytes([id[0], id[1]]);
    let dport = u16::from_be_bytes([id[2], id[3]]);
    let local = addr_of(&id[4..20], fam, sport).ok_or(DiagError::Malformed("unknown address family"))?;
    let remote = addr_of(&id[20..36], fam, dport).ok_or(DiagError::Malformed("unknown address family"))?;
    let inode = u32::from_ne_bytes(body[DIAG_MSG - 4..DIAG_MSG].try_into().expect("4 bytes"));
    let mut cgroup_id = None;
    let mut attrs = &body[DIAG_MSG..];
    while attrs.len() >= 4 {
        let alen = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let atype = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if alen < 4 || alen > attrs.len() {
            break;
        }
        if atype == INET_DIAG_CGROUP_ID && alen >= 12 {
            cgroup_id = Some(u64::from_ne_bytes(attrs[4..12].try_into().expect("8 bytes")));
        }
        attrs = &attrs[alen.div_ceil(4) * 4..];
        if attrs.len() < 4 {
            break;
        }
    }
    Ok(Connection { local, remote, socket: TcpSocket { state, cgroup_id, inode } })
}

/// Parses one buffer of a dump's answer into `out`: `true` once the dump
/// is done. Messages of another sequence number (an abandoned request) are
/// skipped; listeners and sockets of other ports are left out.
pub fn parse_dump(
    buf: &[u8],
    seq: u32,
    ports: (u16, u16),
    out: &mut Vec<Connection>,
) -> Result<bool, DiagError> {
    parse_dump_of(buf, seq, &[ports], out)
}

/// [`parse_dump`] for a dump of several port pairs (local, remote): a
/// socket of any of them is kept.
pub fn parse_dump_of(
    buf: &[u8],
    seq: u32,
    pairs: &[(u16, u16)],
    out: &mut Vec<Connection>,
) -> Result<bool, DiagError> {
    let mut rest = buf;
    while rest.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(rest[4..6].try_into().expect("2 bytes"));
        let mseq = u32::from_ne_bytes(rest[8..12].try_into().expect("4 bytes"));
        if len < NLMSG_HDR || len > rest.len() {
            return Err(DiagError::Malformed("bad length"));
        }
        let body = &rest[NLMSG_HDR..len];
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        if mseq != seq {
            continue;
        }
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = body.get(0..4).ok_or(DiagError::Malformed("short error"))?;
                let code = i32::from_ne_bytes(code.try_into().expect("4 bytes"));
                return match code.checked_neg() {
                    Some(0) => Ok(true),
                    Some(e) if e > 0 => Err(DiagError::Sys(Errno::from_raw(e))),
                    _ => Err(DiagError::Malformed("error code out of range")),
                };
            }
            SOCK_DIAG_BY_FAMILY => {
                let c = parse_msg(body)?;
                if c.socket.state != TCP_LISTEN && pairs.contains(&(c.local.port(), c.remote.port())) {
                    out.push(c);
                }
            }
            _ => return Err(DiagError::Malformed("not an inet_diag_msg")),
        }
    }
    Ok(false)
}

fn addr_of(bytes: &[u8], fam: u8, port: u16) -> Option<SocketAddr> {
    let ip = match fam as i32 {
        libc::AF_INET => IpAddr::from(<[u8; 4]>::try_from(&bytes[..4]).ok()?),
        libc::AF_INET6 => IpAddr::from(<[u8; 16]>::try_from(&bytes[..16]).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// `addr` with a v4-mapped IPv6 address as the IPv4 address it carries.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// Parses the kernel's answer to [`lookup_request`]: the socket, `None` for
/// "no such socket" (an error `ENOENT`, or only a listener on the port), or
/// an error.
pub fn parse_answer(
    buf: &[u8],
    local: SocketAddr,
    remote: SocketAddr,
) -> Result<Option<TcpSocket>, DiagError> {
    let (kind, body) = match first_message(buf) {
        Ok(message) => message,
        Err(Ok(0)) => return Err(DiagError::Malformed("ack without an answer")),
        Err(Ok(libc::ENOENT)) => return Ok(None),
        Err(Ok(e)) => return Err(DiagError::Sys(Errno::from_raw(e))),
        Err(Err(e)) => return Err(e),
    };
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(DiagError::Malformed("not an inet_diag_msg"));
    }
    let c = parse_msg(body)?;
    // An IPv4 flow on a dual-stack (IPv6) socket comes back v4-mapped
    // (`::ffff:a.b.c.d`): both sides are compared in their IPv4 form.
    let same = canonical(c.local) == canonical(local) && canonical(c.remote) == canonical(remote);
    if c.socket.state == TCP_LISTEN || !same {
        return Ok(None);
    }
    Ok(Some(c.socket))
}

/// A `NETLINK_SOCK_DIAG` socket of one network namespace (the one of the
/// thread that opened it).
#[derive(Debug)]
pub struct SockDiag {
    fd: OwnedFd,
    seq: u32,
}

impl SockDiag {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<SockDiag, Errno> {
        // SAFETY: plain syscall with integer arguments; on success it returns a new fd we own.
        let fd =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: `fd` is a new descriptor owned by nobody else.
        Ok(SockDiag { fd: unsafe { OwnedFd::from_raw_fd(fd) }, seq: 0 })
    }

    /// Opens a socket in the network namespace `netns` (an nsfs fd), on a
    /// short-lived thread of its own so that no other thread changes
    /// namespace. Needs `CAP_SYS_ADMIN` over that namespace.
    pub fn open_in(netns: BorrowedFd<'_>) -> Result<SockDiag, Errno> {
        let raw = netns.as_raw_fd();
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: `raw` stays open for the scope (borrowed by the caller).
                let ns = unsafe { BorrowedFd::borrow_raw(raw) };
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
                SockDiag::open()
            })
            .join()
            .unwrap_or(Err(Errno::EINTR))
        })
    }

    /// The TCP socket with local end `local` and remote end `remote`, if any.
    /// IPv4 tuples also find IPv6 sockets that carry them v4-mapped.
    pub fn find_tcp(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Result<Option<TcpSocket>, DiagError> {
        self.seq = self.seq.wrapping_add(1);
        self.send(&lookup_request(local, remote, self.seq))?;
        let mut buf = [0u8; 512];
        loop {
            let got = self.recv(&mut buf)?;
            // An answer to an earlier, abandoned request: skip it.
            if got.len() >= NLMSG_HDR
                && u32::from_ne_bytes(got[8..12].try_into().expect("4 bytes")) != self.seq
            {
                continue;
            }
            return parse_answer(got, local, remote);
        }
    }

    /// Every IPv6 TCP connection (IPv4 ones on dual-stack sockets included,
    /// v4-mapped) whose local port is `local_port` and remote port
    /// `remote_port`, listeners left out.
    pub fn by_ports(&mut self, local_port: u16, remote_port: u16) -> Result<Vec<Connection>, DiagError> {
        self.seq = self.seq.wrapping_add(1);
        self.send(&ports_request(local_port, remote_port, self.seq))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let got = self.recv(&mut buf)?;
            if parse_dump(got, self.seq, (local_port, remote_port), &mut out)? {
                return Ok(out);
            }
        }
    }

    fn send(&self, req: &[u8]) -> Result<(), DiagError> {
        // SAFETY: sockaddr_nl is plain data: all zeroes is a valid value.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: `req` and `kernel` are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                req.as_ptr().cast(),
                req.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(Errno::last().into());
        }
        Ok(())
    }

    /// One datagram of the kernel's answer into `buf`.
    fn recv<'b>(&self, buf: &'b mut [u8]) -> Result<&'b [u8], DiagError> {
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(&buf[..n as usize]);
            }
            match Errno::last() {
                Errno::EINTR => continue,
                e => return Err(e.into()),
            }
        }
    }
}

mod dump;
pub use dump::{established_request, ports_filter, ESTABLISHED, PAIRS};
mod many;
mod unix;

#[cfg(test)]
mod tests;
