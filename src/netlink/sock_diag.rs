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

/// `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_sockid`: sport, dport, src[4], dst[4], if, cookie[2].
const SOCKID: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, id.
pub const REQ_V2: usize = 8 + SOCKID;
/// `struct inet_diag_msg`: family, state, timer, retrans, id, expires,
/// rqueue, wqueue, uid, inode.
pub const DIAG_MSG: usize = 4 + SOCKID + 20;

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

/// The exact-lookup request for the TCP socket whose local end is `local`
/// and remote end `remote` (both of one family), sequence number `seq`.
pub fn lookup_request(local: SocketAddr, remote: SocketAddr, seq: u32) -> [u8; NLMSG_HDR + REQ_V2] {
    let mut m = [0u8; NLMSG_HDR + REQ_V2];
    m[0..4].copy_from_slice(&((NLMSG_HDR + REQ_V2) as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
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
    if buf.len() < NLMSG_HDR {
        return Err(DiagError::Malformed("short header"));
    }
    let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    let kind = u16::from_ne_bytes(buf[4..6].try_into().expect("2 bytes"));
    if len < NLMSG_HDR || len > buf.len() {
        return Err(DiagError::Malformed("bad length"));
    }
    let body = &buf[NLMSG_HDR..len];
    if kind == NLMSG_ERROR {
        let code = body.get(0..4).ok_or(DiagError::Malformed("short error"))?;
        let code = i32::from_ne_bytes(code.try_into().expect("4 bytes"));
        // i32::MIN has no negation: no errno, a malformed answer.
        return match code.checked_neg() {
            Some(0) => Err(DiagError::Malformed("ack without an answer")),
            Some(libc::ENOENT) => Ok(None),
            Some(e) if e > 0 => Err(DiagError::Sys(Errno::from_raw(e))),
            _ => Err(DiagError::Malformed("error code out of range")),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY || body.len() < DIAG_MSG {
        return Err(DiagError::Malformed("not an inet_diag_msg"));
    }
    let (fam, state) = (body[0], body[1]);
    let id = &body[4..4 + SOCKID];
    let sport = u16::from_be_bytes([id[0], id[1]]);
    let dport = u16::from_be_bytes([id[2], id[3]]);
    // An IPv4 flow on a dual-stack (IPv6) socket comes back v4-mapped
    // (`::ffff:a.b.c.d`): both sides are compared in their IPv4 form.
    let found_local = addr_of(&id[4..20], fam, sport).map(canonical);
    let found_remote = addr_of(&id[20..36], fam, dport).map(canonical);
    let same = found_local == Some(canonical(local)) && found_remote == Some(canonical(remote));
    if state == TCP_LISTEN || !same {
        return Ok(None);
    }
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
    Ok(Some(TcpSocket { state, cgroup_id, inode }))
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
        let req = lookup_request(local, remote, self.seq);
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
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                match Errno::last() {
                    Errno::EINTR => continue,
                    e => return Err(e.into()),
                }
            }
            let got = &buf[..n as usize];
            // An answer to an earlier, abandoned request: skip it.
            if got.len() >= NLMSG_HDR
                && u32::from_ne_bytes(got[8..12].try_into().expect("4 bytes")) != self.seq
            {
                continue;
            }
            return parse_answer(got, local, remote);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn layouts_match_the_kernel_structs() {
        // struct inet_diag_sockid: 2 + 2 + 16 + 16 + 4 + 8.
        assert_eq!(SOCKID, 48);
        // struct inet_diag_req_v2: 4 bytes of u8s, u32 states, sockid.
        assert_eq!(REQ_V2, 56);
        // struct inet_diag_msg: 4 bytes of u8s, sockid, 5 × u32.
        assert_eq!(DIAG_MSG, 72);
        let local: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let remote: SocketAddr = "10.0.0.2:40001".parse().unwrap();
        let m = lookup_request(local, remote, 7);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 72);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), SOCK_DIAG_BY_FAMILY);
        assert_eq!(
            u16::from_ne_bytes(m[6..8].try_into().unwrap()),
            libc::NLM_F_REQUEST as u16,
            "no DUMP flag"
        );
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(m[16], libc::AF_INET as u8);
        assert_eq!(m[17], libc::IPPROTO_TCP as u8);
        // The socket id: ports big-endian, local first.
        assert_eq!(&m[24..26], &5000u16.to_be_bytes());
        assert_eq!(&m[26..28], &40001u16.to_be_bytes());
        assert_eq!(&m[28..32], &[10, 0, 0, 1]);
        assert_eq!(&m[44..48], &[10, 0, 0, 2]);
        assert_eq!(&m[64..72], &[0xff; 8], "no cookie");
    }

    #[test]
    fn answers_that_name_another_tuple_or_a_listener_are_not_the_socket() {
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let remote: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        let answer = |state: u8, remote_port: u16| {
            let mut b = vec![0u8; NLMSG_HDR + DIAG_MSG + 12];
            let len = b.len() as u32;
            b[0..4].copy_from_slice(&len.to_ne_bytes());
            b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
            let body = &mut b[NLMSG_HDR..];
            body[0] = libc::AF_INET as u8;
            body[1] = state;
            body[4..6].copy_from_slice(&5000u16.to_be_bytes());
            body[6..8].copy_from_slice(&remote_port.to_be_bytes());
            body[8..12].copy_from_slice(&[127, 0, 0, 1]);
            body[24..28].copy_from_slice(&[127, 0, 0, 1]);
            body[DIAG_MSG..DIAG_MSG + 2].copy_from_slice(&12u16.to_ne_bytes());
            body[DIAG_MSG + 2..DIAG_MSG + 4].copy_from_slice(&INET_DIAG_CGROUP_ID.to_ne_bytes());
            body[DIAG_MSG + 4..DIAG_MSG + 12].copy_from_slice(&99u64.to_ne_bytes());
            b
        };
        let found = parse_answer(&answer(1, 40001), local, remote).unwrap().unwrap();
        assert_eq!((found.state, found.cgroup_id), (1, Some(99)));
        assert_eq!(parse_answer(&answer(TCP_LISTEN, 40001), local, remote).unwrap(), None);
        assert_eq!(parse_answer(&answer(1, 40002), local, remote).unwrap(), None);
        let mut enoent = vec![0u8; NLMSG_HDR + 20];
        let n = enoent.len() as u32;
        enoent[0..4].copy_from_slice(&n.to_ne_bytes());
        enoent[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        enoent[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_answer(&enoent, local, remote).unwrap(), None);
        enoent[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse_answer(&enoent, local, remote), Err(DiagError::Sys(Errno::EPERM)));
        // Codes no errno negates to (found by the netlink fuzz target: i32::MIN overflowed).
        for bad in [i32::MIN, 5] {
            enoent[16..20].copy_from_slice(&bad.to_ne_bytes());
            assert!(matches!(parse_answer(&enoent, local, remote), Err(DiagError::Malformed(_))), "{bad}");
        }
        assert!(parse_answer(&enoent[..10], local, remote).is_err());
    }

    /// The cgroup v2 id of this process: the inode of its cgroup's folder.
    fn own_cgroup_id() -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        let root = mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
        })?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        std::fs::metadata(format!("{root}{path}")).ok().map(|m| m.ino())
    }

    #[test]
    fn finds_a_loopback_connection_and_its_cgroup() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let mut diag = SockDiag::open().unwrap();
        // From the server's side: local is the listener's address, remote the client's.
        let local = server.local_addr().unwrap();
        let found = diag.find_tcp(local, peer).unwrap().expect("the accepted socket");
        assert_eq!(found.state, 1, "established");
        if let Some(id) = own_cgroup_id() {
            assert_eq!(found.cgroup_id, Some(id), "the socket's cgroup is this process's");
        }
        // The client's end, seen the other way round.
        assert!(diag.find_tcp(client.local_addr().unwrap(), local).unwrap().is_some());
        // A tuple nobody holds; and one that only the listener's port matches.
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(diag.find_tcp(local, nobody).unwrap(), None);
        drop((client, server));
    }

    #[test]
    fn finds_an_ipv4_connection_on_a_dual_stack_socket() {
        // A listener on [::] without IPV6_V6ONLY takes IPv4 connections as
        // v4-mapped IPv6 sockets; the flow is still named in IPv4, as packets carry it.
        let Ok(listener) = TcpListener::bind("[::]:0") else { return };
        let port = listener.local_addr().unwrap().port();
        let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (server, peer) = listener.accept().unwrap();
        assert!(peer.ip().to_string().starts_with("::ffff:"), "a dual-stack socket: {peer}");
        let local = SocketAddr::from(([127, 0, 0, 1], port));
        let remote = client.local_addr().unwrap();
        let mut diag = SockDiag::open().unwrap();
        let found = diag.find_tcp(local, remote).unwrap().expect("the accepted dual-stack socket");
        assert_eq!(found.state, 1, "established");
        // Asked in its mapped form, it is the same socket.
        let mapped = |a: SocketAddr| match a.ip() {
            IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
            IpAddr::V6(_) => a,
        };
        assert_eq!(diag.find_tcp(mapped(local), mapped(remote)).unwrap(), Some(found));
        // And another port still finds nothing.
        assert_eq!(diag.find_tcp(local, SocketAddr::from(([127, 0, 0, 1], 1))).unwrap(), None);
        drop(server);
    }

    #[test]
    fn finds_an_ipv6_connection() {
        let Ok(listener) = TcpListener::bind("[::1]:0") else { return };
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let mut diag = SockDiag::open().unwrap();
        let found = diag.find_tcp(server.local_addr().unwrap(), peer).unwrap();
        assert!(found.is_some_and(|s| s.state == 1));
    }
}
