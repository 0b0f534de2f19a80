//! Many exact lookups at once ([`SockDiag::find_many`]): one send, and the
//! answers read with `recvmmsg`.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use nix::errno::Errno;

use super::{lookup_request, parse_answer, DiagError, SockDiag, TcpSocket, MANY, NLMSG_HDR, REQ_V2};

impl SockDiag {
    /// [`Self::find_tcp`] for many tuples (`(local, remote)`, at most
    /// [`MANY`]) at once: one send carries every request, and the answers
    /// are read with `recvmmsg`, as many per call as have come. Answers that
    /// did not fit the socket's buffer are asked for again one by one.
    pub fn find_many(
        &mut self,
        tuples: &[(SocketAddr, SocketAddr)],
    ) -> Vec<Result<Option<TcpSocket>, DiagError>> {
        assert!(tuples.len() <= MANY, "at most {MANY} lookups at once");
        let base = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(tuples.len() as u32);
        let mut req = Vec::with_capacity(tuples.len() * (NLMSG_HDR + REQ_V2));
        for (i, (l, r)) in tuples.iter().enumerate() {
            req.extend_from_slice(&lookup_request(*l, *r, base.wrapping_add(i as u32)));
        }
        let mut out: Vec<Option<Result<Option<TcpSocket>, DiagError>>> = vec![None; tuples.len()];
        let mut left = tuples.len();
        if !tuples.is_empty() && self.send(&req).is_ok() {
            let mut bufs = vec![[0u8; 512]; tuples.len().min(32)];
            while left > 0 {
                let got = match self.recv_many(&mut bufs) {
                    Ok(got) => got,
                    Err(_) => break, // ENOBUFS (answers dropped) or worse: the rest one by one
                };
                for (buf, n) in bufs.iter().zip(got) {
                    let got = &buf[..n];
                    if got.len() < NLMSG_HDR {
                        continue;
                    }
                    let seq = u32::from_ne_bytes(got[8..12].try_into().expect("4 bytes"));
                    let i = seq.wrapping_sub(base) as usize;
                    if i < tuples.len() && out[i].is_none() {
                        out[i] = Some(parse_answer(got, tuples[i].0, tuples[i].1));
                        left -= 1;
                    }
                }
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(i, r)| r.unwrap_or_else(|| self.find_tcp(tuples[i].0, tuples[i].1)))
            .collect()
    }

    /// The datagrams waiting (at least one; as many as `bufs` holds): their lengths.
    fn recv_many(&self, bufs: &mut [[u8; 512]]) -> Result<Vec<usize>, DiagError> {
        let mut iov: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: mmsghdr is plain data: all zeroes is a valid value.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        loop {
            // SAFETY: every mmsghdr points at one live iovec over a live buffer of its length.
            let n = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    msgs.len() as libc::c_uint,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                return Ok(msgs[..n as usize].iter().map(|m| m.msg_len as usize).collect());
            }
            match Errno::last() {
                Errno::EINTR => continue,
                e => return Err(e.into()),
            }
        }
    }
}
