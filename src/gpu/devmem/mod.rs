//! `--bind_backend devmem`: upstream devmem TCP (Linux ≥ 6.12). The pool's
//! dma-buf is bound to RX queues with generic netlink family `netdev`, command
//! `BIND_RX`; numbers from `include/uapi/linux/netdev.h`.
//!
//! The kernel keeps the binding for as long as the netlink socket that created
//! it stays open, so [`DevmemBinding`] owns that socket; dropping it unbinds.

use std::os::fd::AsRawFd;

use neli::consts::socket::NlFamily;
use nix::errno::Errno;

use super::{BindError, Binding, QueueBinder, RxPool};
use crate::netlink::genl;
use crate::netlink::{attr_nest, attr_u32, NlConn, NlError, NlRequest};
use crate::types::pci::PciAddr;

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

#[derive(Debug, thiserror::Error)]
pub enum DevmemError {
    #[error("pool has no dma-buf to bind ({0})")]
    NoDmaBuf(String),
    #[error("interface {ifname}: {errno}")]
    NoInterface {
        ifname: String,
        #[source]
        errno: Errno,
    },
    #[error("netlink {op}: {source}")]
    Netlink { op: &'static str, source: NlError },
    #[error("generic netlink family \"netdev\" not found: kernel too old for devmem TCP (needs ≥ 6.12)")]
    NoFamily,
    #[error("kernel refused netdev BIND_RX on {ifname} (ifindex {ifindex}): {errno}{}{hint}",
            extack.as_ref().map(|m| format!(": {m}")).unwrap_or_default())]
    Refused {
        ifname: String,
        ifindex: u32,
        #[source]
        errno: Errno,
        extack: Option<String>,
        hint: String,
    },
    #[error("no queues to bind")]
    NoQueues,
    #[error("netdev BIND_RX reply carried no NETDEV_A_DMABUF_ID")]
    NoDmabufId,
}

/// The `BIND_RX` request: ifindex, dma-buf fd, then one nested
/// `NETDEV_A_DMABUF_QUEUES` (id + type RX) per queue, flagged `NLA_F_NESTED`
/// as strict validation requires.
pub fn bind_rx_request(family: u16, ifindex: u32, dmabuf_fd: u32, queues: &[u32]) -> NlRequest {
    let mut attrs = vec![attr_u32(NETDEV_A_DMABUF_IFINDEX, ifindex), attr_u32(NETDEV_A_DMABUF_FD, dmabuf_fd)];
    attrs.extend(queues.iter().map(|&q| {
        let queue = vec![attr_u32(NETDEV_A_QUEUE_ID, q), attr_u32(NETDEV_A_QUEUE_TYPE, NETDEV_QUEUE_TYPE_RX)];
        attr_nest(NETDEV_A_DMABUF_QUEUES, queue)
    }));
    genl::request(family, NETDEV_CMD_BIND_RX, NETDEV_FAMILY_VERSION, attrs)
}

/// The binding's id from the `BIND_RX` reply.
pub fn parse_dmabuf_id(replies: &[Vec<u8>]) -> Result<u32, DevmemError> {
    let attrs =
        genl::single_reply(replies).map_err(|source| DevmemError::Netlink { op: "BIND_RX reply", source })?;
    attrs.u32(NETDEV_A_DMABUF_ID).ok_or(DevmemError::NoDmabufId)
}

/// The `netdev` family id, asked on the generic netlink socket `conn`.
pub fn netdev_family(conn: &mut NlConn) -> Result<u16, DevmemError> {
    genl::resolve_family(conn, NETDEV_FAMILY_NAME).map_err(|e| match e {
        NlError::Kernel { errno: Errno::ENOENT, .. } => DevmemError::NoFamily,
        source => DevmemError::Netlink { op: "CTRL_CMD_GETFAMILY", source },
    })
}

/// A hint for the common refusals, appended to the error.
fn hint(errno: Errno) -> String {
    match errno {
        Errno::EPERM => format!(" ({})", crate::caps::lacking(crate::caps::Cap::NetAdmin)),
        Errno::EOPNOTSUPP => " (driver lacks queue management / devmem TCP support)".into(),
        Errno::EBUSY => " (queue already bound, or XDP/AF_XDP attached)".into(),
        _ => String::new(),
    }
}

/// `--bind_backend devmem`.
#[derive(Debug, Default)]
pub struct DevmemBinder;

impl QueueBinder for DevmemBinder {
    fn backend(&self) -> &'static str {
        "devmem"
    }

    /// The kernel takes its own reference on the pool's dma-buf during the call.
    fn bind(
        &self,
        pool: &dyn RxPool,
        gpu: PciAddr,
        ifname: &str,
        _nic_pci: Option<PciAddr>,
        queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError> {
        let fail = |e: DevmemError| BindError::new(gpu, ifname, queues, e);
        let dmabuf = pool.dmabuf_fd().ok_or_else(|| fail(DevmemError::NoDmaBuf(pool.describe())))?;
        if queues.is_empty() {
            return Err(fail(DevmemError::NoQueues));
        }
        let ifindex = nix::net::if_::if_nametoindex(ifname)
            .map_err(|errno| fail(DevmemError::NoInterface { ifname: ifname.into(), errno }))?;
        let mut conn = NlConn::open(NlFamily::Generic)
            .map_err(|source| fail(DevmemError::Netlink { op: "socket", source }))?;
        let family = netdev_family(&mut conn).map_err(fail)?;
        let fd = u32::try_from(dmabuf.as_raw_fd()).expect("open fds are non-negative");
        let replies = conn.transact(&bind_rx_request(family, ifindex, fd, queues)).map_err(|e| {
            fail(match e {
                NlError::Kernel { errno, msg } => DevmemError::Refused {
                    ifname: ifname.into(),
                    ifindex,
                    errno,
                    extack: msg,
                    hint: hint(errno),
                },
                source => DevmemError::Netlink { op: "BIND_RX", source },
            })
        })?;
        let dmabuf_id = parse_dmabuf_id(&replies).map_err(fail)?;
        Ok(Box::new(DevmemBinding {
            _socket: conn,
            dmabuf_id,
            ifname: ifname.into(),
            ifindex,
            queues: queues.to_vec(),
        }))
    }
}

/// A live devmem binding; the kernel drops it when `_socket` closes.
#[derive(Debug)]
pub struct DevmemBinding {
    _socket: NlConn,
    dmabuf_id: u32,
    ifname: String,
    ifindex: u32,
    queues: Vec<u32>,
}

impl Binding for DevmemBinding {
    fn describe(&self) -> String {
        format!(
            "devmem: dmabuf id {} on {} (ifindex {}) queues {}",
            self.dmabuf_id,
            self.ifname,
            self.ifindex,
            crate::types::list(&self.queues)
        )
    }

    fn dmabuf_id(&self) -> Option<u32> {
        Some(self.dmabuf_id)
    }

    fn handover_fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        vec![self._socket.as_fd()]
    }
}

#[cfg(test)]
mod tests;
