//! The other end of a Unix socket ([`SockDiag::unix_peer`]): `unix_diag`'s
//! exact lookup by inode, asking for `UNIX_DIAG_PEER`. On kernels without
//! `SO_PEERPIDFD` it is how the daemon proves that a process holds the
//! client end of a connection (see `identity::leases`).

use super::{first_message, write_header, DiagError, SockDiag, NLMSG_HDR, NO_COOKIE, SOCK_DIAG_BY_FAMILY};

/// `struct unix_diag_req`: family, protocol, pad, states, ino, show, cookie[2].
pub const UNIX_REQ: usize = 24;
/// `struct unix_diag_msg`: family, type, state, pad, ino, cookie[2].
pub const UNIX_MSG: usize = 16;
/// `UDIAG_SHOW_PEER` from `<linux/unix_diag.h>`.
const UDIAG_SHOW_PEER: u32 = 0x4;
/// `UNIX_DIAG_PEER`: the peer's inode, a `u32`.
const UNIX_DIAG_PEER: u16 = 2;

/// The exact-lookup request for the Unix socket of inode `ino`, asking for
/// its peer, sequence number `seq`.
pub fn unix_peer_request(ino: u32, seq: u32) -> [u8; NLMSG_HDR + UNIX_REQ] {
    let mut m = [0u8; NLMSG_HDR + UNIX_REQ];
    write_header(&mut m, NLMSG_HDR + UNIX_REQ, libc::NLM_F_REQUEST, seq);
    let r = &mut m[NLMSG_HDR..];
    r[0] = libc::AF_UNIX as u8;
    r[4..8].copy_from_slice(&(!0u32).to_ne_bytes()); // any state
    r[8..12].copy_from_slice(&ino.to_ne_bytes());
    r[12..16].copy_from_slice(&UDIAG_SHOW_PEER.to_ne_bytes());
    r[16..20].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    r[20..24].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    m
}

/// Parses the answer to [`unix_peer_request`] for inode `ino`: the peer's
/// inode, `None` where the socket has no peer (or no longer exists).
pub fn parse_unix_peer(buf: &[u8], ino: u32) -> Result<Option<u32>, DiagError> {
    let (kind, body) = match first_message(buf) {
        Ok(message) => message,
        Err(Ok(libc::ENOENT)) => return Ok(None),
        Err(Ok(0)) => return Err(DiagError::Malformed("ack without an answer")),
        Err(Ok(e)) => return Err(DiagError::Sys(nix::errno::Errno::from_raw(e))),
        Err(Err(e)) => return Err(e),
    };
    if kind != SOCK_DIAG_BY_FAMILY || body.len() < UNIX_MSG || body[0] != libc::AF_UNIX as u8 {
        return Err(DiagError::Malformed("not a unix_diag_msg"));
    }
    if u32::from_ne_bytes(body[4..8].try_into().expect("4 bytes")) != ino {
        return Err(DiagError::Malformed("an answer for another socket"));
    }
    let mut attrs = &body[UNIX_MSG..];
    while attrs.len() >= 4 {
        let alen = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let atype = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if alen < 4 || alen > attrs.len() {
            break;
        }
        if atype == UNIX_DIAG_PEER && alen >= 8 {
            return Ok(Some(u32::from_ne_bytes(attrs[4..8].try_into().expect("4 bytes"))));
        }
        attrs = &attrs[alen.div_ceil(4).saturating_mul(4).min(attrs.len())..];
    }
    Ok(None)
}

impl SockDiag {
    /// The inode of the socket at the other end of the Unix socket of inode
    /// `ino` (in this socket's network namespace); `None` where it has none.
    pub fn unix_peer(&mut self, ino: u32) -> Result<Option<u32>, DiagError> {
        self.seq = self.seq.wrapping_add(1);
        self.send(&unix_peer_request(ino, self.seq))?;
        let mut buf = [0u8; 256];
        loop {
            let got = self.recv(&mut buf)?;
            // An answer to an earlier, abandoned request: skip it.
            if got.len() >= NLMSG_HDR
                && u32::from_ne_bytes(got[8..12].try_into().expect("4 bytes")) != self.seq
            {
                continue;
            }
            return parse_unix_peer(got, ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn inode(s: &UnixStream) -> u32 {
        nix::sys::stat::fstat(s.as_fd()).unwrap().st_ino as u32
    }

    #[test]
    fn the_request_has_the_kernel_layout() {
        let m = unix_peer_request(0x1234, 9);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 40);
        assert_eq!(
            u16::from_ne_bytes(m[6..8].try_into().unwrap()),
            libc::NLM_F_REQUEST as u16,
            "no DUMP flag"
        );
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9);
        assert_eq!(m[16], libc::AF_UNIX as u8);
        assert_eq!(u32::from_ne_bytes(m[24..28].try_into().unwrap()), 0x1234, "udiag_ino");
        assert_eq!(u32::from_ne_bytes(m[28..32].try_into().unwrap()), UDIAG_SHOW_PEER);
        assert_eq!(&m[32..40], &[0xff; 8], "no cookie");
    }

    #[test]
    fn the_kernel_names_each_ends_peer() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut diag = SockDiag::open().unwrap();
        assert_eq!(diag.unix_peer(inode(&a)).unwrap(), Some(inode(&b)));
        assert_eq!(diag.unix_peer(inode(&b)).unwrap(), Some(inode(&a)));
        let gone = inode(&a);
        drop((a, b));
        assert_eq!(diag.unix_peer(gone).unwrap(), None, "no such socket any more");
    }

    #[test]
    fn answers_for_another_socket_or_cut_short_are_refused() {
        let mut b = vec![0u8; NLMSG_HDR + UNIX_MSG + 8];
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        b[NLMSG_HDR] = libc::AF_UNIX as u8;
        b[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&7u32.to_ne_bytes());
        let at = NLMSG_HDR + UNIX_MSG;
        b[at..at + 2].copy_from_slice(&8u16.to_ne_bytes());
        b[at + 2..at + 4].copy_from_slice(&UNIX_DIAG_PEER.to_ne_bytes());
        b[at + 4..at + 8].copy_from_slice(&99u32.to_ne_bytes());
        assert_eq!(parse_unix_peer(&b, 7), Ok(Some(99)));
        assert!(parse_unix_peer(&b, 8).is_err(), "another socket's answer");
        assert!(parse_unix_peer(&b[..NLMSG_HDR + 4], 7).is_err(), "cut short");
    }
}
