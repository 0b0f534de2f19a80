//! `--bind_backend tcpx`: GPUDirect-TCPX queue binding through the dma-buf
//! ioctls of Google's COS kernels.
//!
//! 1. `ioctl(dmabuf_fd, DMA_BUF_CREATE_PAGES, {pci_bdf[3], dma_buf_fd,
//!    create_page_pool})` with the NIC's bus/device/function returns a "pages"
//!    fd: the GPU memory cut into NIC-mappable pages (a page pool for receive).
//! 2. `ioctl(pages_fd, DMA_BUF_PAGES_BIND_RX, {ifname, rxq_idx})` per queue.
//!
//! The binding lives as long as the pages fd; the [`TcpxBinding`] owns it.
//! Kernels without these ioctls answer `ENOTTY` (the dma-buf does not know the
//! command), which `auto` takes as "not a TCPX kernel".

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use super::{BindError, Binding, QueueBinder, RxPool};
use crate::types::ifname::{ifname_field, IFNAMSIZ};
use crate::types::pci::PciAddr;

/// `struct dma_buf_create_pages_info` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatePagesInfo {
    /// NIC bus, device, function, one per u64.
    pub pci_bdf: [u64; 3],
    pub dma_buf_fd: i32,
    /// 1 for receive pools: the kernel builds a page pool the NIC refills from.
    pub create_page_pool: i32,
}

/// `struct dma_buf_pages_bind_rx_queue` (20 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindRxQueue {
    /// NUL-terminated interface name.
    pub ifname: [u8; IFNAMSIZ],
    pub rxq_idx: u32,
}

nix::ioctl_write_ptr!(ioctl_create_pages, b'b', 2, CreatePagesInfo);
nix::ioctl_write_ptr!(ioctl_bind_rx, b'b', 3, BindRxQueue);

impl CreatePagesInfo {
    pub fn new(nic: PciAddr, dma_buf_fd: i32) -> Self {
        CreatePagesInfo {
            pci_bdf: [nic.bus.into(), nic.device.into(), nic.function.into()],
            dma_buf_fd,
            create_page_pool: 1,
        }
    }
}

impl BindRxQueue {
    /// `None` if the name does not fit `IFNAMSIZ` with its NUL, or holds a NUL.
    pub fn new(ifname: &str, rxq_idx: u32) -> Option<Self> {
        Some(BindRxQueue { ifname: ifname_field(ifname)?, rxq_idx })
    }
}

/// The two kernel calls, behind a trait so tests can record the sequence.
pub trait DmaBufPages: Send + Sync {
    fn create_pages(&self, dmabuf: BorrowedFd<'_>, info: &CreatePagesInfo) -> Result<OwnedFd, Errno>;
    fn bind_rx_queue(&self, pages: BorrowedFd<'_>, req: &BindRxQueue) -> Result<(), Errno>;
}

/// The real ioctls.
#[derive(Debug, Default)]
pub struct KernelDmaBufPages;

impl DmaBufPages for KernelDmaBufPages {
    fn create_pages(&self, dmabuf: BorrowedFd<'_>, info: &CreatePagesInfo) -> Result<OwnedFd, Errno> {
        // SAFETY: `info` is a live, correctly laid out `#[repr(C)]` struct that
        // the kernel only reads; `dmabuf` is an open descriptor.
        let fd = unsafe { ioctl_create_pages(dmabuf.as_raw_fd(), info) }?;
        // SAFETY: on success the ioctl returns a new descriptor owned by us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn bind_rx_queue(&self, pages: BorrowedFd<'_>, req: &BindRxQueue) -> Result<(), Errno> {
        // SAFETY: `req` is a live `#[repr(C)]` struct the kernel only reads;
        // `pages` is an open descriptor.
        unsafe { ioctl_bind_rx(pages.as_raw_fd(), req) }.map(drop)
    }
}

/// Why a TCPX bind failed; `NotSupported` lets `auto` move on to devmem.
#[derive(Debug, thiserror::Error)]
pub enum TcpxError {
    #[error("pool has no dma-buf to bind ({0})")]
    NoDmaBuf(String),
    #[error("the NIC's PCI address is unknown (needed for DMA_BUF_CREATE_PAGES)")]
    NoNicPci,
    #[error("interface name \"{}\" does not fit IFNAMSIZ", .0.escape_debug())]
    BadIfname(String),
    #[error(
        "kernel lacks the GPUDirect-TCPX dma-buf ioctls (DMA_BUF_CREATE_PAGES: {0}); not a COS TCPX kernel"
    )]
    NotSupported(#[source] Errno),
    #[error("DMA_BUF_CREATE_PAGES for NIC {nic} failed: {errno}")]
    CreatePages {
        nic: PciAddr,
        #[source]
        errno: Errno,
    },
    #[error("DMA_BUF_PAGES_BIND_RX queue {queue} failed: {errno}")]
    BindQueue {
        queue: u32,
        #[source]
        errno: Errno,
    },
}

/// `--bind_backend tcpx`.
#[derive(Debug, Default)]
pub struct TcpxBinder<K = KernelDmaBufPages> {
    kernel: K,
}

impl<K: DmaBufPages> TcpxBinder<K> {
    pub fn with_kernel(kernel: K) -> Self {
        TcpxBinder { kernel }
    }
}

impl<K: DmaBufPages> QueueBinder for TcpxBinder<K> {
    fn backend(&self) -> &'static str {
        "tcpx"
    }

    fn bind(
        &self,
        pool: &dyn RxPool,
        gpu: PciAddr,
        ifname: &str,
        nic_pci: Option<PciAddr>,
        queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError> {
        let fail = |e: TcpxError| BindError::new(gpu, ifname, queues, e);
        let dmabuf = pool.dmabuf_fd().ok_or_else(|| fail(TcpxError::NoDmaBuf(pool.describe())))?;
        let nic = nic_pci.ok_or_else(|| fail(TcpxError::NoNicPci))?;
        // Every name is checked before the first ioctl, so a bad one leaves nothing behind.
        let requests = queues
            .iter()
            .map(|&q| BindRxQueue::new(ifname, q).ok_or_else(|| fail(TcpxError::BadIfname(ifname.into()))))
            .collect::<Result<Vec<_>, _>>()?;
        let info = CreatePagesInfo::new(nic, dmabuf.as_raw_fd());
        let pages = self.kernel.create_pages(dmabuf, &info).map_err(|errno| {
            fail(match errno {
                Errno::ENOTTY => TcpxError::NotSupported(errno),
                errno => TcpxError::CreatePages { nic, errno },
            })
        })?;
        for req in &requests {
            self.kernel
                .bind_rx_queue(pages.as_fd(), req)
                .map_err(|errno| fail(TcpxError::BindQueue { queue: req.rxq_idx, errno }))?;
        }
        Ok(Box::new(TcpxBinding { pages, ifname: ifname.into(), nic, queues: queues.to_vec() }))
    }
}

/// A bound pool: the kernel keeps the queues on the GPU pages while the pages
/// fd is open; dropping closes it.
#[derive(Debug)]
pub struct TcpxBinding {
    pages: OwnedFd,
    ifname: String,
    nic: PciAddr,
    queues: Vec<u32>,
}

impl Binding for TcpxBinding {
    fn describe(&self) -> String {
        format!(
            "tcpx: pages fd {} on {} ({}) queues {}",
            self.pages.as_raw_fd(),
            self.ifname,
            self.nic,
            crate::types::list(&self.queues)
        )
    }

    fn handover_fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        vec![self.pages.as_fd()]
    }
}

#[cfg(test)]
mod tests;
