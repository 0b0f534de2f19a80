//! Netlink plumbing shared by the ethtool backend, the link monitor and host
//! tuning: a blocking socket that owns its fd ([`NlConn`]), one request and
//! its replies per call (ack, dump end and extended-ack errors handled), and
//! small attribute encode/decode helpers over neli's types.
//!
//! Requests are built as [`NlRequest`] values so that tests can compare the
//! exact bytes that go to the kernel.

pub(crate) mod genl;
pub mod rtnl;
pub mod sock_diag;

use std::io::{self, Cursor};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;

use neli::consts::nl::{NlmF, Nlmsg, NlmsgerrAttr};
use neli::consts::socket::NlFamily;
use neli::err::SocketError;
use neli::genl::{AttrTypeBuilder, Nlattr, NlattrBuilder};
use neli::nl::{NlPayload, Nlmsghdr, NlmsghdrBuilder};
use neli::socket::synchronous::NlSocketHandle;
use neli::types::{Buffer, GenlBuffer};
use neli::utils::Groups;
use neli::{FromBytesWithInput, Size, ToBytes};
use nix::errno::Errno;

/// `NLA_F_NESTED`: set on every nested attribute we send (strict genl policies
/// such as ethtool's reject nests without it).
pub const NLA_F_NESTED: u16 = 1 << 15;

/// A failed netlink exchange.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    #[error("netlink socket: {0}")]
    Socket(#[source] Arc<io::Error>),
    #[error("kernel: {errno}{}", msg.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Kernel { errno: Errno, msg: Option<String> },
    /// A message neli could not encode or decode.
    #[error("malformed netlink message: {0}")]
    Codec(#[source] SocketError),
    /// A message that decoded but does not hold what it should.
    #[error("malformed netlink message: {0}")]
    Malformed(String),
}

impl NlError {
    /// The errno this failure maps to, for the NIC layer's errors.
    pub fn errno(&self) -> Errno {
        match self {
            NlError::Socket(io) => io.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::EIO),
            NlError::Kernel { errno, .. } => *errno,
            NlError::Codec(_) | NlError::Malformed(_) => Errno::EPROTO,
        }
    }

    /// The kernel's extended-ack message or our description, for `NicError::detail`.
    pub fn detail(&self) -> Option<String> {
        match self {
            NlError::Kernel { msg, .. } => msg.clone(),
            other => Some(other.to_string()),
        }
    }

    pub(crate) fn malformed(what: impl Into<String>) -> Self {
        NlError::Malformed(what.into())
    }
}

impl From<SocketError> for NlError {
    fn from(e: SocketError) -> Self {
        match e {
            SocketError::Io(io) => NlError::Socket(io),
            other => NlError::Codec(other),
        }
    }
}

/// One netlink request: message type, flags (REQUEST is added on encoding),
/// and the already-serialized payload (genl header or rtnetlink struct plus
/// attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlRequest {
    pub nl_type: u16,
    pub flags: NlmF,
    pub payload: Vec<u8>,
}

impl NlRequest {
    /// The message with header as it goes on the wire (`nl_pid` 0: the kernel).
    pub fn message(&self, seq: u32) -> Nlmsghdr<u16, Buffer> {
        NlmsghdrBuilder::default()
            .nl_type(self.nl_type)
            .nl_flags(self.flags | NlmF::REQUEST)
            .nl_seq(seq)
            .nl_pid(0)
            .nl_payload(NlPayload::Payload(Buffer::from(self.payload.clone())))
            .build()
            .expect("all header fields are set")
    }

    /// The wire bytes with sequence number `seq` (golden tests compare these).
    pub fn to_bytes(&self, seq: u32) -> Vec<u8> {
        to_bytes(&self.message(seq))
    }
}

/// Serializes any neli value (a header, a struct with attributes).
pub fn to_bytes<T: ToBytes + Size>(v: &T) -> Vec<u8> {
    let mut cur = Cursor::new(Vec::with_capacity(v.padded_size()));
    v.to_bytes(&mut cur).expect("serializing into a Vec cannot fail");
    cur.into_inner()
}

/// A blocking netlink socket of one protocol; owns its fd.
pub struct NlConn {
    sock: NlSocketHandle,
    seq: u32,
}

impl std::fmt::Debug for NlConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NlConn").field("fd", &self.sock.as_raw_fd()).field("seq", &self.seq).finish()
    }
}

impl NlConn {
    /// Opens a socket of `family` in the calling thread's network namespace.
    pub fn open(family: NlFamily) -> Result<Self, NlError> {
        Self::open_groups(family, 0)
    }

    /// Opens a socket subscribed to the multicast groups in `groups` (a
    /// `RTMGRP_*`-style bitmask).
    pub fn open_groups(family: NlFamily, groups: u32) -> Result<Self, NlError> {
        let sock = NlSocketHandle::connect(family, None, Groups::new_bitmask(groups))?;
        // Kernel error strings make failures self-explaining; older kernels
        // without extended acks just do not send them.
        let _ = sock.enable_ext_ack(true);
        Ok(NlConn { sock, seq: 0 })
    }

    /// Sends `req` and collects the payloads of its replies, until the ack
    /// (requests) or the end of the dump (`NLM_F_DUMP`). A kernel error becomes
    /// [`NlError::Kernel`] with the extended-ack message if there is one.
    pub fn transact(&mut self, req: &NlRequest) -> Result<Vec<Vec<u8>>, NlError> {
        self.seq = self.seq.wrapping_add(1).max(1);
        let seq = self.seq;
        self.sock.send(&req.message(seq))?;
        let mut out = Vec::new();
        loop {
            let (msgs, _) = self.sock.recv::<u16, Buffer>()?;
            for msg in msgs {
                let msg = msg?;
                // Replies to an earlier request that was abandoned mid-way.
                if *msg.nl_seq() != seq {
                    continue;
                }
                let done = *msg.nl_type() == u16::from(Nlmsg::Done);
                match msg.nl_payload() {
                    NlPayload::Err(e) => {
                        return Err(kernel_error(*e.error(), e.ext_ack()));
                    }
                    NlPayload::DumpExtAck(e) if *e.error() != 0 => {
                        return Err(kernel_error(*e.error(), e.ext_ack()));
                    }
                    NlPayload::Ack(_) => return Ok(out),
                    _ if done => return Ok(out),
                    NlPayload::Payload(p) => out.push(p.as_ref().to_vec()),
                    NlPayload::DumpExtAck(_) | NlPayload::Empty => {}
                }
            }
        }
    }

    /// Receives one datagram of (multicast) messages: `(nl_type, payload)`
    /// pairs. Blocks until something arrives.
    pub fn recv_events(&self) -> Result<Vec<(u16, Vec<u8>)>, NlError> {
        let (msgs, _) = self.sock.recv::<u16, Buffer>()?;
        let mut out = Vec::new();
        for msg in msgs {
            let msg = msg?;
            if let NlPayload::Payload(p) = msg.nl_payload() {
                out.push((*msg.nl_type(), p.as_ref().to_vec()));
            }
        }
        Ok(out)
    }
}

impl AsFd for NlConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is owned by `self.sock` and stays open for as long
        // as the returned borrow (tied to `&self`) lives.
        unsafe { BorrowedFd::borrow_raw(self.sock.as_raw_fd()) }
    }
}

/// `NLMSGERR_ATTR_MISS_TYPE` (not in neli's enum): the attribute the request lacked.
const NLMSGERR_ATTR_MISS_TYPE: u16 = 5;

/// An error message as [`NlError::Kernel`]: the errno, and as text the
/// extended ack's message and the missing attribute, if the kernel sent them.
pub(crate) fn kernel_error(code: i32, ext_ack: &GenlBuffer<NlmsgerrAttr, Buffer>) -> NlError {
    let parts: Vec<String> = ext_ack
        .iter()
        .filter_map(|a| {
            let raw = a.nla_payload().as_ref();
            match u16::from(*a.nla_type().nla_type()) {
                t if t == u16::from(NlmsgerrAttr::Msg) => Some(c_string(raw)),
                NLMSGERR_ATTR_MISS_TYPE => {
                    raw.try_into().ok().map(|b| format!("missing attribute {}", u32::from_ne_bytes(b)))
                }
                _ => None,
            }
        })
        .collect();
    NlError::Kernel { errno: Errno::from_raw(code.abs()), msg: (!parts.is_empty()).then(|| parts.join("; ")) }
}

/// A NUL-terminated (or not) byte string as Rust text.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The native-endian u32 at the start of `bytes`, if there are four bytes.
pub fn ne_u32(bytes: &[u8]) -> Option<u32> {
    bytes.get(..4).map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

// ---- attribute encoding ----------------------------------------------------

/// An attribute with a raw payload.
pub fn attr(nla_type: u16, payload: &[u8]) -> Nlattr<u16, Buffer> {
    let nested = nla_type & NLA_F_NESTED != 0;
    NlattrBuilder::default()
        .nla_type(
            AttrTypeBuilder::default()
                .nla_type(nla_type & !NLA_F_NESTED)
                .nla_nested(nested)
                .build()
                .expect("nla_type is set"),
        )
        .nla_payload(Buffer::from(payload))
        .build()
        .expect("type and payload are set")
}

pub fn attr_u8(t: u16, v: u8) -> Nlattr<u16, Buffer> {
    attr(t, &[v])
}

pub fn attr_u32(t: u16, v: u32) -> Nlattr<u16, Buffer> {
    attr(t, &v.to_ne_bytes())
}

/// A NUL-terminated string attribute (`NLA_NUL_STRING` / `NLA_STRING`).
pub fn attr_str(t: u16, s: &str) -> Nlattr<u16, Buffer> {
    let mut b = Vec::with_capacity(s.len() + 1);
    b.extend_from_slice(s.as_bytes());
    b.push(0);
    attr(t, &b)
}

/// A flag attribute: present means true.
pub fn attr_flag(t: u16) -> Nlattr<u16, Buffer> {
    attr(t, &[])
}

/// A nested attribute (`NLA_F_NESTED` set) holding `children`.
pub fn attr_nest(t: u16, children: Vec<Nlattr<u16, Buffer>>) -> Nlattr<u16, Buffer> {
    attr(t | NLA_F_NESTED, &attrs_bytes(children))
}

/// Serialized attributes, each padded to 4 bytes.
pub fn attrs_bytes(attrs: Vec<Nlattr<u16, Buffer>>) -> Vec<u8> {
    to_bytes(&attrs.into_iter().collect::<GenlBuffer<u16, Buffer>>())
}

// ---- attribute decoding ----------------------------------------------------

/// Parsed attributes of one level (types with the nested/byte-order bits masked off).
#[derive(Debug, Clone)]
pub struct AttrSet(GenlBuffer<u16, Buffer>);

impl AttrSet {
    pub fn parse(bytes: &[u8]) -> Result<Self, NlError> {
        GenlBuffer::from_bytes_with_input(&mut Cursor::new(bytes), bytes.len())
            .map(AttrSet)
            .map_err(|e| NlError::malformed(format!("attributes: {e}")))
    }

    /// All attributes in order, as `(type, payload)`.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &[u8])> {
        self.0.iter().map(|a| (*a.nla_type().nla_type(), a.nla_payload().as_ref()))
    }

    pub fn get(&self, t: u16) -> Option<&[u8]> {
        self.iter().find(|(ty, _)| *ty == t).map(|(_, p)| p)
    }

    pub fn has(&self, t: u16) -> bool {
        self.get(t).is_some()
    }

    pub fn u8(&self, t: u16) -> Option<u8> {
        self.get(t).and_then(|p| p.first().copied())
    }

    pub fn u32(&self, t: u16) -> Option<u32> {
        self.get(t).and_then(ne_u32)
    }

    pub fn string(&self, t: u16) -> Option<String> {
        self.get(t).map(c_string)
    }

    pub fn nested(&self, t: u16) -> Result<Option<AttrSet>, NlError> {
        self.get(t).map(AttrSet::parse).transpose()
    }
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;

    #[test]
    fn request_header_golden_bytes() {
        let req = NlRequest { nl_type: 0x10, flags: NlmF::ACK, payload: vec![1, 2, 3, 4] };
        #[rustfmt::skip]
        let want = [
            20, 0, 0, 0,     // nlmsg_len: 16 header + 4 payload
            0x10, 0,         // nlmsg_type
            0x05, 0,         // flags: REQUEST (1) | ACK (4)
            7, 0, 0, 0,      // seq
            0, 0, 0, 0,      // pid: 0 = the kernel
            1, 2, 3, 4,      // payload
        ];
        assert_eq!(req.to_bytes(7), want);
    }

    #[test]
    fn attributes_encode_with_padding_and_nesting() {
        let bytes = attrs_bytes(vec![
            attr_u32(1, 0x0a0b0c0d),
            attr_str(2, "eth1"),
            attr_flag(3),
            attr_nest(4, vec![attr_u8(5, 9)]),
        ]);
        #[rustfmt::skip]
        let want = [
            8, 0, 1, 0,  0x0d, 0x0c, 0x0b, 0x0a,       // u32, native order
            9, 0, 2, 0,  b'e', b't', b'h', b'1', 0, 0, 0, 0, // "eth1\0" + 3 pad
            4, 0, 3, 0,                                // flag: header only
            12, 0, 4, 0x80,                            // nest: type 4 | NLA_F_NESTED
              5, 0, 5, 0,  9, 0, 0, 0,                 //   u8 + 3 pad
        ];
        assert_eq!(bytes, want);
        let set = AttrSet::parse(&bytes).unwrap();
        assert_eq!(set.u32(1), Some(0x0a0b0c0d));
        assert_eq!(set.string(2).as_deref(), Some("eth1"));
        assert!(set.has(3));
        assert_eq!(set.nested(4).unwrap().unwrap().u8(5), Some(9));
        assert!(set.nested(6).unwrap().is_none());
    }

    #[test]
    fn malformed_attributes_are_an_error() {
        assert!(AttrSet::parse(&[200, 0, 1, 0, 0, 0, 0, 0]).is_err());
    }
}
