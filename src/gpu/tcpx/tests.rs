use std::mem::{offset_of, size_of};
use std::sync::Mutex;

use nix::sys::memfd::{memfd_create, MFdFlags};

use super::*;

fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: reads exactly size_of::<T>() bytes of a live, padding-free
    // `#[repr(C)]` value (layouts pinned by `layouts_match_the_kernel`).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

#[test]
fn layouts_match_the_kernel() {
    assert_eq!(size_of::<CreatePagesInfo>(), 32);
    assert_eq!(offset_of!(CreatePagesInfo, pci_bdf), 0);
    assert_eq!(offset_of!(CreatePagesInfo, dma_buf_fd), 24);
    assert_eq!(offset_of!(CreatePagesInfo, create_page_pool), 28);
    assert_eq!(size_of::<BindRxQueue>(), 20);
    assert_eq!(offset_of!(BindRxQueue, ifname), 0);
    assert_eq!(offset_of!(BindRxQueue, rxq_idx), 16);
}

#[test]
fn request_codes_are_iow_b_2_and_3() {
    // _IOW('b', 2, 32 bytes) and _IOW('b', 3, 20 bytes), written out by hand:
    // dir write (1) << 30 | size << 16 | 'b' (0x62) << 8 | nr.
    assert_eq!(nix::request_code_write!(b'b', 2, size_of::<CreatePagesInfo>()), 0x4020_6202);
    assert_eq!(nix::request_code_write!(b'b', 3, size_of::<BindRxQueue>()), 0x4014_6203);
}

#[test]
fn create_pages_golden_bytes() {
    let nic: PciAddr = "0000:8c:1f.3".parse().unwrap();
    let info = CreatePagesInfo::new(nic, 9);
    let mut want = vec![0x8c, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0];
    want.extend_from_slice(&[9, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(bytes_of(&info), want);
}

#[test]
fn bind_rx_golden_bytes_and_name_limits() {
    let req = BindRxQueue::new("eth1", 9).unwrap();
    let mut want = b"eth1".to_vec();
    want.extend_from_slice(&[0; 12]);
    want.extend_from_slice(&[9, 0, 0, 0]);
    assert_eq!(bytes_of(&req), want);
    assert!(BindRxQueue::new("fifteen-chars-x", 0).is_some());
    assert!(BindRxQueue::new("sixteen-chars-xx", 0).is_none());
    assert!(BindRxQueue::new("", 0).is_none());
    assert!(BindRxQueue::new("a\0b", 0).is_none());
}

use crate::gpu::host::HostPool;
use crate::gpu::BindFailure;

#[derive(Debug, PartialEq, Eq)]
enum Call {
    CreatePages(CreatePagesInfo),
    BindRx { pages_is_ours: bool, queue: u32, ifname: Vec<u8> },
}

/// Records every ioctl; fails create with `create_err` or the bind of queue
/// `fail_queue`.
#[derive(Default)]
struct FakeKernel {
    calls: Mutex<Vec<Call>>,
    create_err: Option<Errno>,
    fail_queue: Option<u32>,
    pages_ino: Mutex<Option<u64>>,
}

impl DmaBufPages for FakeKernel {
    fn create_pages(&self, _dmabuf: BorrowedFd<'_>, info: &CreatePagesInfo) -> Result<OwnedFd, Errno> {
        self.calls.lock().unwrap().push(Call::CreatePages(*info));
        if let Some(e) = self.create_err {
            return Err(e);
        }
        let fd = memfd_create("fake-pages", MFdFlags::MFD_CLOEXEC).unwrap();
        *self.pages_ino.lock().unwrap() = Some(nix::sys::stat::fstat(&fd).unwrap().st_ino);
        Ok(fd)
    }

    fn bind_rx_queue(&self, pages: BorrowedFd<'_>, req: &BindRxQueue) -> Result<(), Errno> {
        let ino = nix::sys::stat::fstat(pages).unwrap().st_ino;
        let pages_is_ours = Some(ino) == *self.pages_ino.lock().unwrap();
        let ifname = req.ifname.iter().copied().take_while(|&c| c != 0).collect();
        self.calls.lock().unwrap().push(Call::BindRx { pages_is_ours, queue: req.rxq_idx, ifname });
        if self.fail_queue == Some(req.rxq_idx) {
            return Err(Errno::EBUSY);
        }
        Ok(())
    }
}

fn nic() -> Option<PciAddr> {
    Some("0000:06:00.0".parse().unwrap())
}

fn gpu() -> PciAddr {
    "0000:04:00.0".parse().unwrap()
}

/// The TCPX error inside a bind failure.
fn tcpx_error(e: BindError) -> TcpxError {
    match e.cause {
        BindFailure::Tcpx(e) => e,
        other => panic!("expected a tcpx error, got {other:?}"),
    }
}

#[test]
fn binds_pages_then_each_queue_in_order() {
    let pool = HostPool::with_fake_dmabuf();
    let dmabuf_raw = pool.dmabuf_fd().unwrap().as_raw_fd();
    let binder = TcpxBinder::with_kernel(FakeKernel::default());
    let binding = binder.bind(&pool, gpu(), "eth1", nic(), &[8, 9, 10, 11]).unwrap();
    let calls = binder.kernel.calls.lock().unwrap();
    let mut want = vec![Call::CreatePages(CreatePagesInfo {
        pci_bdf: [6, 0, 0],
        dma_buf_fd: dmabuf_raw,
        create_page_pool: 1,
    })];
    for q in 8..12 {
        want.push(Call::BindRx { pages_is_ours: true, queue: q, ifname: b"eth1".to_vec() });
    }
    assert_eq!(*calls, want);
    assert!(binding.describe().contains("eth1"), "{}", binding.describe());
}

#[test]
fn enotty_means_not_a_tcpx_kernel() {
    let pool = HostPool::with_fake_dmabuf();
    let binder =
        TcpxBinder::with_kernel(FakeKernel { create_err: Some(Errno::ENOTTY), ..Default::default() });
    let err = tcpx_error(binder.bind(&pool, gpu(), "eth1", nic(), &[8]).unwrap_err());
    assert!(matches!(err, TcpxError::NotSupported(Errno::ENOTTY)), "{err}");
    let binder =
        TcpxBinder::with_kernel(FakeKernel { create_err: Some(Errno::EINVAL), ..Default::default() });
    let err = tcpx_error(binder.bind(&pool, gpu(), "eth1", nic(), &[8]).unwrap_err());
    assert!(matches!(err, TcpxError::CreatePages { errno: Errno::EINVAL, .. }), "{err}");
}

#[test]
fn a_failed_queue_names_the_queue_and_stops() {
    let pool = HostPool::with_fake_dmabuf();
    let binder = TcpxBinder::with_kernel(FakeKernel { fail_queue: Some(9), ..Default::default() });
    let err = binder.bind(&pool, gpu(), "eth1", nic(), &[8, 9, 10]).unwrap_err();
    let cause = err.cause.to_string();
    assert!(cause.contains("queue 9") && cause.contains("EBUSY"), "{err}");
    assert!(matches!(err.cause, BindFailure::Tcpx(TcpxError::BindQueue { queue: 9, .. })), "{err}");
    assert_eq!(binder.kernel.calls.lock().unwrap().len(), 3, "stops after the failing queue");
}

#[test]
fn missing_inputs_are_refused_before_any_ioctl() {
    let binder = TcpxBinder::with_kernel(FakeKernel::default());
    let try_bind = |pool: &HostPool, ifname, nic_pci| {
        tcpx_error(binder.bind(pool, gpu(), ifname, nic_pci, &[8]).map(drop).unwrap_err())
    };
    let no_dmabuf = HostPool::new(gpu(), 4096).unwrap();
    assert!(matches!(try_bind(&no_dmabuf, "eth1", nic()), TcpxError::NoDmaBuf(_)));
    let pool = HostPool::with_fake_dmabuf();
    assert!(matches!(try_bind(&pool, "eth1", None), TcpxError::NoNicPci));
    let long = "a-very-long-ifname";
    assert!(matches!(try_bind(&pool, long, nic()), TcpxError::BadIfname(_)));
    assert!(binder.kernel.calls.lock().unwrap().is_empty());
}

#[test]
fn real_kernel_without_tcpx_answers_enotty() {
    // A memfd stands in for a dma-buf: on a kernel without the COS patches
    // (and on any non-dma-buf file) the ioctl is unknown.
    let memfd = memfd_create("not-a-dmabuf", MFdFlags::MFD_CLOEXEC).unwrap();
    let info = CreatePagesInfo::new(nic().unwrap(), memfd.as_raw_fd());
    let err = KernelDmaBufPages.create_pages(memfd.as_fd(), &info).unwrap_err();
    assert_eq!(err, Errno::ENOTTY);
}
