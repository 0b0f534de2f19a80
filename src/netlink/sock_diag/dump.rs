//! One dump for many port pairs ([`SockDiag::established_by_ports`]): the
//! established IPv6 TCP connections whose (local, remote) ports are any of
//! the pairs asked for.
//!
//! The kernel filters a dump by one port pair on its own (the request's
//! socket id); for several it runs a filter program (`INET_DIAG_REQ_BYTECODE`)
//! on each socket it walks. The program built here is, per pair, "local port
//! equals, then remote port equals", the pairs joined by "or": a failed
//! comparison jumps to the next pair, a match jumps to the end (accept), and
//! running past the end is a rejection. Each pair is 16 bytes, each "or" 4
//! (`struct inet_diag_bc_op` is a code, a forward jump when the comparison
//! holds, one when it does not; a port comparison carries the port in the
//! `no` field of a second op). The kernel checks a program before it runs it
//! (every jump lands on an op or on the end); the layouts are tested here.

use super::{parse_dump_of, write_header, Connection, DiagError, SockDiag, NLMSG_HDR, NO_COOKIE, REQ_V2};

/// `INET_DIAG_REQ_BYTECODE` from `<linux/inet_diag.h>`.
const INET_DIAG_REQ_BYTECODE: u16 = 1;
/// `INET_DIAG_BC_JMP`, `INET_DIAG_BC_S_EQ`, `INET_DIAG_BC_D_EQ`.
const BC_JMP: u8 = 1;
const BC_S_EQ: u8 = 11;
const BC_D_EQ: u8 = 12;
/// `TCP_ESTABLISHED`.
pub const ESTABLISHED: u8 = 1;
/// Port pairs one dump asks for, at most (a 1.3 KiB program).
pub const PAIRS: usize = 64;

fn op(out: &mut Vec<u8>, code: u8, yes: u8, no: u16) {
    out.push(code);
    out.push(yes);
    out.extend_from_slice(&no.to_ne_bytes());
}

/// The filter program that accepts a socket whose (local, remote) ports
/// are one of `pairs` (1 to [`PAIRS`] of them).
pub fn ports_filter(pairs: &[(u16, u16)]) -> Vec<u8> {
    assert!(!pairs.is_empty() && pairs.len() <= PAIRS, "1 to {PAIRS} port pairs");
    let n = pairs.len();
    let mut out = Vec::with_capacity(n * 20);
    for (i, &(local, remote)) in pairs.iter().enumerate() {
        // A miss jumps 4 bytes past this pair's end: over its "or" to the
        // next pair, or (the last pair) past the program's end: rejected.
        op(&mut out, BC_S_EQ, 8, 20);
        op(&mut out, 0, 0, local);
        op(&mut out, BC_D_EQ, 8, 12);
        op(&mut out, 0, 0, remote);
        if i + 1 < n {
            // Both held: jump to the end (accepted). A jump op always takes `no`.
            let after = (n - i - 1) * 20 - 4;
            op(&mut out, BC_JMP, 4, (after + 4) as u16);
        }
    }
    out
}

/// The dump request for the established IPv6 TCP connections (IPv4 ones on
/// dual-stack sockets included) whose ports are one of `pairs`, sequence
/// number `seq`.
pub fn established_request(pairs: &[(u16, u16)], seq: u32) -> Vec<u8> {
    let program = ports_filter(pairs);
    let len = NLMSG_HDR + REQ_V2 + 4 + program.len();
    let mut m = vec![0u8; NLMSG_HDR + REQ_V2];
    write_header(&mut m, len, libc::NLM_F_REQUEST | libc::NLM_F_DUMP, seq);
    let r = &mut m[NLMSG_HDR..];
    r[0] = libc::AF_INET6 as u8;
    r[1] = libc::IPPROTO_TCP as u8;
    r[4..8].copy_from_slice(&(1u32 << ESTABLISHED).to_ne_bytes());
    r[8 + 40..8 + 44].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    r[8 + 44..8 + 48].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    m.extend_from_slice(&((4 + program.len()) as u16).to_ne_bytes());
    m.extend_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
    m.extend_from_slice(&program);
    m
}

impl SockDiag {
    /// Every established IPv6 TCP connection (IPv4 ones on dual-stack
    /// sockets included, v4-mapped) whose (local, remote) ports are one of
    /// `pairs` (1 to [`PAIRS`]): one walk of the kernel's table for all of them.
    pub fn established_by_ports(&mut self, pairs: &[(u16, u16)]) -> Result<Vec<Connection>, DiagError> {
        self.seq = self.seq.wrapping_add(1);
        self.send(&established_request(pairs, self.seq))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let got = self.recv(&mut buf)?;
            if parse_dump_of(got, self.seq, pairs, &mut out)? {
                out.retain(|c| c.socket.state == ESTABLISHED);
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// Runs `program` as the kernel does (`inet_diag_bc_run`) on a socket
    /// with ports `local` and `remote`: `None` when a jump lands where no
    /// op starts (the kernel's check refuses such a program).
    fn run(program: &[u8], local: u16, remote: u16) -> Option<bool> {
        let mut at = 0usize;
        let len = program.len();
        while at < len {
            let code = program[at];
            let (yes, no) =
                (program[at + 1] as usize, u16::from_ne_bytes([program[at + 2], program[at + 3]]));
            let port = || u16::from_ne_bytes([program[at + 6], program[at + 7]]);
            let holds = match code {
                BC_JMP => false,
                BC_S_EQ => local == port(),
                BC_D_EQ => remote == port(),
                _ => return None,
            };
            at += if holds { yes } else { no as usize };
            if at > len + 4 || (at < len && at % 4 != 0) {
                return None;
            }
        }
        Some(at == len)
    }

    #[test]
    fn the_filter_accepts_exactly_the_pairs_asked_for() {
        let pairs = [(5000, 40001), (5000, 40002), (6000, 40001)];
        let p = ports_filter(&pairs);
        assert_eq!(p.len(), 3 * 16 + 2 * 4);
        for (l, r) in [(5000, 40001), (5000, 40002), (6000, 40001)] {
            assert_eq!(run(&p, l, r), Some(true), "{l} {r}");
        }
        for (l, r) in [(5000, 40003), (6000, 40002), (40001, 5000), (0, 0)] {
            assert_eq!(run(&p, l, r), Some(false), "{l} {r}");
        }
        let one = ports_filter(&[(7, 8)]);
        assert_eq!(one.len(), 16);
        assert_eq!(
            (run(&one, 7, 8), run(&one, 7, 9), run(&one, 8, 8)),
            (Some(true), Some(false), Some(false))
        );
        let all: Vec<(u16, u16)> = (0..PAIRS as u16).map(|i| (1000 + i, 2000 + i)).collect();
        let p = ports_filter(&all);
        assert_eq!(run(&p, 1063, 2063), Some(true));
        assert_eq!(run(&p, 1063, 2062), Some(false));
        // Bytes: the first comparison, its port, the second, its port, the "or".
        let p = ports_filter(&pairs[..2]);
        assert_eq!((p[0], p[1], u16::from_ne_bytes([p[2], p[3]])), (BC_S_EQ, 8, 20));
        assert_eq!(u16::from_ne_bytes([p[6], p[7]]), 5000);
        assert_eq!((p[8], p[9], u16::from_ne_bytes([p[10], p[11]])), (BC_D_EQ, 8, 12));
        assert_eq!((p[16], p[17], u16::from_ne_bytes([p[18], p[19]])), (BC_JMP, 4, 20));
    }

    #[test]
    fn the_request_carries_the_program_after_the_header() {
        let m = established_request(&[(5000, 40001), (5001, 40002)], 9);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(m.len(), NLMSG_HDR + REQ_V2 + 4 + 36);
        assert_eq!(
            u16::from_ne_bytes(m[6..8].try_into().unwrap()),
            (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16
        );
        assert_eq!(m[16], libc::AF_INET6 as u8);
        assert_eq!(u32::from_ne_bytes(m[20..24].try_into().unwrap()), 1 << ESTABLISHED, "established only");
        assert_eq!(&m[24..28], &[0; 4], "no ports in the socket id: the program filters");
        let attr = NLMSG_HDR + REQ_V2;
        assert_eq!(u16::from_ne_bytes(m[attr..attr + 2].try_into().unwrap()), 40);
        assert_eq!(u16::from_ne_bytes(m[attr + 2..attr + 4].try_into().unwrap()), INET_DIAG_REQ_BYTECODE);
    }

    #[test]
    fn the_kernel_runs_the_filter() {
        let Ok(listener) = TcpListener::bind("[::1]:0") else { return };
        let mut ends = Vec::new();
        for _ in 0..3 {
            let c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (s, peer) = listener.accept().unwrap();
            ends.push((s.local_addr().unwrap(), peer, c, s));
        }
        let mut diag = SockDiag::open().unwrap();
        let pairs: Vec<(u16, u16)> = ends[..2].iter().map(|e| (e.0.port(), e.1.port())).collect();
        let mut found = diag.established_by_ports(&pairs).unwrap();
        found.sort_by_key(|c| c.remote.port());
        let mut want: Vec<_> = ends[..2].iter().map(|e| (e.0, e.1)).collect();
        want.sort_by_key(|w| w.1.port());
        assert_eq!(found.iter().map(|c| (c.local, c.remote)).collect::<Vec<_>>(), want);
        assert!(found.iter().all(|c| c.socket.state == ESTABLISHED && c.socket.inode != 0));
        // A pair nobody uses: nothing.
        assert!(diag.established_by_ports(&[(1, 2)]).unwrap().is_empty());
        // The socket answers exact lookups after it.
        assert!(diag.find_tcp(ends[2].0, ends[2].1).unwrap().is_some());
    }
}
