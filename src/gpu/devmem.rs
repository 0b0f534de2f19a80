//! `--bind_backend devmem`: upstream devmem TCP (Linux ≥ 6.12). The pool's
//! dma-buf is bound to RX queues with generic netlink family `netdev`, command
//! `BIND_RX` (SPEC §7); numbers from `include/uapi/linux/netdev.h`.
//!
//! The kernel keeps the binding for as long as the netlink socket that created
//! it stays open, so [`DevmemBinding`] owns that socket; dropping it unbinds.

use std::io::Cursor;

use neli::consts::genl::{CtrlAttr, CtrlCmd};
use neli::consts::nl::{NlmF, NlmsgerrAttr};
use neli::consts::socket::NlFamily;
use neli::err::SocketError;
use neli::genl::{AttrTypeBuilder, Genlmsghdr, GenlmsghdrBuilder, Nlattr, NlattrBuilder};
use neli::nl::{NlPayload, Nlmsghdr, NlmsghdrBuilder};
use neli::socket::synchronous::NlSocketHandle;
use neli::types::{Buffer, GenlBuffer};
use neli::utils::Groups;
use neli::{Size, ToBytes};
use nix::errno::Errno;
use std::os::fd::AsRawFd;

use super::{BindError, Binding, QueueBinder, RxPool};
use crate::config::pci::PciAddr;

pub const NETDEV_FAMILY_NAME: &str = "netdev";
pub const NETDEV_FAMILY_VERSION: u8 = 1;
pub const NETDEV_CMD_BIND_RX: u8 = 13;
pub const NETDEV_A_DMABUF_IFINDEX: u16 = 1;
pub const NETDEV_A_DMABUF_QUEUES: u16 = 2;
pub const NETDEV_A_DMABUF_FD: u16 = 3;
pub const NETDEV_A_DMABUF_ID: u16 = 4;
pub const NETDEV_A_QUEUE_ID: u16 = 1;
pub const NETDEV_A_QUEUE_TYPE: u16 = 3;
pub const NETDEV_QUEUE_TYPE_RX: u32 = 0;
/// `GENL_ID_CTRL`: the controller family that resolves family names.
const GENL_ID_CTRL: u16 = 0x10;

type GenlMsg = Genlmsghdr<u8, u16>;
/// Reply attributes: type and raw payload.
pub type Attrs = Vec<(u16, Vec<u8>)>;
/// A kernel refusal: errno and the extended-ACK text, if any.
pub type Refusal = (Errno, Option<String>);

#[derive(Debug, thiserror::Error)]
pub enum DevmemError {
    #[error("pool has no dma-buf to bind ({0})")]
    NoDmaBuf(String),
    #[error("interface {ifname}: {errno}")]
    NoInterface { ifname: String, errno: Errno },
    #[error("netlink {op}: {msg}")]
    Netlink { op: &'static str, msg: String },
    #[error("generic netlink family \"netdev\" not found: kernel too old for devmem TCP (needs ≥ 6.12)")]
    NoFamily,
    #[error("kernel refused netdev BIND_RX on {ifname} (ifindex {ifindex}): {errno}{}{hint}",
            extack.as_ref().map(|m| format!(": {m}")).unwrap_or_default())]
    Refused { ifname: String, ifindex: u32, errno: Errno, extack: Option<String>, hint: &'static str },
    #[error("no queues to bind")]
    NoQueues,
    #[error("netdev BIND_RX reply carried no NETDEV_A_DMABUF_ID")]
    NoDmabufId,
}

/// Builds one u32 attribute.
fn attr_u32(kind: u16, value: u32) -> Result<Nlattr<u16, Buffer>, DevmemError> {
    let err = |e: &dyn std::fmt::Display| DevmemError::Netlink { op: "build", msg: e.to_string() };
    NlattrBuilder::default()
        .nla_type(AttrTypeBuilder::default().nla_type(kind).build().map_err(|e| err(&e))?)
        .nla_payload(value)
        .build()
        .map_err(|e| err(&e))
}

/// The `BIND_RX` request: ifindex, dma-buf fd, then one nested
/// `NETDEV_A_DMABUF_QUEUES` (id + type RX) per queue, flagged `NLA_F_NESTED`
/// as strict validation requires.
pub fn bind_rx_request(
    family: u16,
    seq: u32,
    ifindex: u32,
    dmabuf_fd: u32,
    queues: &[u32],
) -> Result<Nlmsghdr<u16, GenlMsg>, DevmemError> {
    let err = |e: &dyn std::fmt::Display| DevmemError::Netlink { op: "build", msg: e.to_string() };
    let mut attrs = GenlBuffer::new();
    attrs.push(attr_u32(NETDEV_A_DMABUF_IFINDEX, ifindex)?);
    attrs.push(attr_u32(NETDEV_A_DMABUF_FD, dmabuf_fd)?);
    for &q in queues {
        let (id, kind) =
            (attr_u32(NETDEV_A_QUEUE_ID, q)?, attr_u32(NETDEV_A_QUEUE_TYPE, NETDEV_QUEUE_TYPE_RX)?);
        let nest = NlattrBuilder::default()
            .nla_type(
                AttrTypeBuilder::default().nla_type(NETDEV_A_DMABUF_QUEUES).build().map_err(|e| err(&e))?,
            )
            .nla_payload(Vec::<u8>::new())
            .build()
            .map_err(|e| err(&e))?
            .nest(&id)
            .and_then(|n| n.nest(&kind))
            .map_err(|e| err(&e))?;
        attrs.push(nest);
    }
    let genl = GenlmsghdrBuilder::default()
        .cmd(NETDEV_CMD_BIND_RX)
        .version(NETDEV_FAMILY_VERSION)
        .attrs(attrs)
        .build()
        .map_err(|e| err(&e))?;
    NlmsghdrBuilder::default()
        .nl_type(family)
        .nl_flags(NlmF::REQUEST | NlmF::ACK)
        .nl_seq(seq)
        .nl_payload(NlPayload::Payload(genl))
        .build()
        .map_err(|e| err(&e))
}

/// Serialises a message exactly as it goes on the socket.
pub fn encode<P: Size + ToBytes>(msg: &Nlmsghdr<u16, P>) -> Result<Vec<u8>, DevmemError> {
    let mut buf = Cursor::new(vec![0; msg.padded_size()]);
    msg.to_bytes(&mut buf).map_err(|e| DevmemError::Netlink { op: "encode", msg: e.to_string() })?;
    Ok(buf.into_inner())
}

/// What one received message means for a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A reply carrying attributes (type, u32 value if 4 bytes long).
    Reply(Attrs),
    /// The final ACK: the request succeeded.
    Done,
    /// The kernel refused: errno and the extended-ACK message, if any.
    Failed(Errno, Option<String>),
}

pub fn outcome<P>(msg: &Nlmsghdr<u16, Genlmsghdr<u8, u16, P>>) -> Outcome {
    match msg.nl_payload() {
        NlPayload::Payload(genl) => Outcome::Reply(
            genl.attrs()
                .iter()
                .map(|a| (*a.nla_type().nla_type(), a.nla_payload().as_ref().to_vec()))
                .collect(),
        ),
        NlPayload::Ack(_) | NlPayload::Empty | NlPayload::DumpExtAck(_) => Outcome::Done,
        NlPayload::Err(e) => Outcome::Failed(Errno::from_raw(-*e.error()), extack_text(e.ext_ack())),
    }
}

/// `NLMSGERR_ATTR_MISS_TYPE` (not in neli's enum): the attribute the request lacked.
const NLMSGERR_ATTR_MISS_TYPE: u16 = 5;

/// The extended ACK as text: the kernel's message, and the missing attribute
/// if it reported one.
fn extack_text(attrs: &GenlBuffer<NlmsgerrAttr, Buffer>) -> Option<String> {
    let mut parts = Vec::new();
    for a in attrs.iter() {
        let raw = a.nla_payload().as_ref();
        match u16::from(*a.nla_type().nla_type()) {
            t if t == u16::from(NlmsgerrAttr::Msg) => parts.push(
                String::from_utf8_lossy(raw.split(|&b| b == 0).next().unwrap_or_default()).into_owned(),
            ),
            NLMSGERR_ATTR_MISS_TYPE if raw.len() == 4 => parts
                .push(format!("missing attribute {}", u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]))),
            _ => {}
        }
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// A generic netlink socket with extended ACKs on, for the `netdev` family.
pub struct NetdevSocket {
    sock: NlSocketHandle,
    seq: u32,
}

impl NetdevSocket {
    pub fn open() -> Result<NetdevSocket, DevmemError> {
        let nl_err = |op, e: SocketError| DevmemError::Netlink { op, msg: e.to_string() };
        let sock = NlSocketHandle::connect(NlFamily::Generic, None, Groups::empty())
            .map_err(|e| nl_err("socket", e))?;
        sock.enable_ext_ack(true).map_err(|e| nl_err("NETLINK_EXT_ACK", e))?;
        Ok(NetdevSocket { sock, seq: 0 })
    }

    /// Sends one request and collects reply attributes until the ACK; a
    /// refusal comes back as errno and extended-ACK text.
    pub fn transact(&mut self, msg: Nlmsghdr<u16, GenlMsg>) -> Result<Attrs, Refusal> {
        let io = |e: SocketError| (Errno::EIO, Some(e.to_string()));
        self.sock.send(&msg).map_err(io)?;
        let mut attrs = Vec::new();
        loop {
            let (msgs, _) = self.sock.recv::<u16, GenlMsg>().map_err(io)?;
            for m in msgs {
                let m = m.map_err(io)?;
                if *m.nl_seq() != *msg.nl_seq() {
                    continue; // a stray message for an earlier request
                }
                match outcome(&m) {
                    Outcome::Reply(a) => attrs.extend(a),
                    Outcome::Done => return Ok(attrs),
                    Outcome::Failed(errno, extack) => return Err((errno, extack)),
                }
            }
        }
    }

    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// The `netdev` family id (`CTRL_CMD_GETFAMILY`).
    pub fn resolve_family(&mut self) -> Result<u16, DevmemError> {
        let err = |e: &dyn std::fmt::Display| DevmemError::Netlink { op: "build", msg: e.to_string() };
        let name = NlattrBuilder::default()
            .nla_type(
                AttrTypeBuilder::default()
                    .nla_type(u16::from(CtrlAttr::FamilyName))
                    .build()
                    .map_err(|e| err(&e))?,
            )
            .nla_payload(NETDEV_FAMILY_NAME)
            .build()
            .map_err(|e| err(&e))?;
        let genl = GenlmsghdrBuilder::default()
            .cmd(u8::from(CtrlCmd::Getfamily))
            .version(2)
            .attrs(std::iter::once(name).collect::<GenlBuffer<u16, Buffer>>())
            .build()
            .map_err(|e| err(&e))?;
        let msg = NlmsghdrBuilder::default()
            .nl_type(GENL_ID_CTRL)
            .nl_flags(NlmF::REQUEST | NlmF::ACK)
            .nl_seq(self.next_seq())
            .nl_payload(NlPayload::Payload(genl))
            .build()
            .map_err(|e| err(&e))?;
        match self.transact(msg) {
            Ok(attrs) => attrs
                .iter()
                .find(|(t, v)| *t == u16::from(CtrlAttr::FamilyId) && v.len() >= 2)
                .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]))
                .ok_or(DevmemError::NoFamily),
            Err((Errno::ENOENT, _)) => Err(DevmemError::NoFamily),
            Err((errno, extack)) => Err(DevmemError::Netlink {
                op: "CTRL_CMD_GETFAMILY",
                msg: format!("{errno}{}", extack.map(|m| format!(": {m}")).unwrap_or_default()),
            }),
        }
    }
}

/// A hint for the common refusals, appended to the error.
fn hint(errno: Errno) -> &'static str {
    match errno {
        Errno::EPERM => " (needs CAP_NET_ADMIN)",
        Errno::EOPNOTSUPP => " (driver lacks queue management / devmem TCP support)",
        Errno::EBUSY => " (queue already bound, or XDP/AF_XDP attached)",
        _ => "",
    }
}

/// `--bind_backend devmem`.
#[derive(Debug, Default)]
pub struct DevmemBinder;

impl DevmemBinder {
    /// The typed form of [`QueueBinder::bind`]. `dmabuf_fd` is the pool's
    /// dma-buf; the kernel takes its own reference during the call.
    pub fn try_bind(
        &self,
        pool: &dyn RxPool,
        ifname: &str,
        queues: &[u32],
    ) -> Result<DevmemBinding, DevmemError> {
        let dmabuf = pool.dmabuf_fd().ok_or_else(|| DevmemError::NoDmaBuf(pool.describe()))?;
        if queues.is_empty() {
            return Err(DevmemError::NoQueues);
        }
        let ifindex = nix::net::if_::if_nametoindex(ifname)
            .map_err(|errno| DevmemError::NoInterface { ifname: ifname.into(), errno })?;
        let mut genl = NetdevSocket::open()?;
        let family = genl.resolve_family()?;
        let fd = u32::try_from(dmabuf.as_raw_fd()).expect("open fds are non-negative");
        let seq = genl.next_seq();
        let request = bind_rx_request(family, seq, ifindex, fd, queues)?;
        let attrs = genl.transact(request).map_err(|(errno, extack)| DevmemError::Refused {
            ifname: ifname.into(),
            ifindex,
            errno,
            extack,
            hint: hint(errno),
        })?;
        let dmabuf_id = attrs
            .iter()
            .find(|(t, v)| *t & 0x3fff == NETDEV_A_DMABUF_ID && v.len() == 4)
            .map(|(_, v)| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
            .ok_or(DevmemError::NoDmabufId)?;
        Ok(DevmemBinding {
            _socket: genl.sock,
            dmabuf_id,
            ifname: ifname.into(),
            ifindex,
            queues: queues.to_vec(),
        })
    }
}

impl QueueBinder for DevmemBinder {
    fn backend(&self) -> &'static str {
        "devmem"
    }

    fn bind(
        &self,
        pool: &dyn RxPool,
        gpu: PciAddr,
        ifname: &str,
        _nic_pci: Option<PciAddr>,
        queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError> {
        match self.try_bind(pool, ifname, queues) {
            Ok(b) => Ok(Box::new(b)),
            Err(e) => Err(BindError::new(gpu, ifname, queues, format!("devmem: {e}"))),
        }
    }
}

/// A live devmem binding; the kernel drops it when `_socket` closes.
pub struct DevmemBinding {
    _socket: NlSocketHandle,
    pub dmabuf_id: u32,
    pub ifname: String,
    pub ifindex: u32,
    pub queues: Vec<u32>,
}

impl std::fmt::Debug for DevmemBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevmemBinding")
            .field("dmabuf_id", &self.dmabuf_id)
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("queues", &self.queues)
            .finish()
    }
}

impl Binding for DevmemBinding {
    fn describe(&self) -> String {
        format!(
            "devmem: dmabuf id {} on {} (ifindex {}) queues {:?}",
            self.dmabuf_id, self.ifname, self.ifindex, self.queues
        )
    }

    fn dmabuf_id(&self) -> Option<u32> {
        Some(self.dmabuf_id)
    }
}

#[cfg(test)]
#[path = "devmem_tests.rs"]
mod tests;
