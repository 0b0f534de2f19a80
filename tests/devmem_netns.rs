//! devmem binder against the real kernel, in a fresh network namespace with a
//! veth pair (`common::netns`). Needs root and `ip`: ignored by a plain
//! `cargo test`, run with `cargo test -- --include-ignored` (CI, as root). A veth has
//! no queue-management ops and a memfd is no dma-buf, so the kernel must refuse
//! `BIND_RX`; the test pins how that refusal is reported.

mod common;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use common::netns::Netns;
use neli::consts::socket::NlFamily;
use nix::sys::memfd::{memfd_create, MFdFlags};
use tcpx_rxdm::gpu::{
    bind_rx_request, netdev_family, BindError, BindFailure, DevmemBinder, DevmemError, QueueBinder, RxPool,
    NETDEV_A_DMABUF_QUEUES,
};
use tcpx_rxdm::netlink::{NlConn, NlError};
use tcpx_rxdm::types::pci::PciAddr;

/// A fresh namespace holding `v0` ↔ `v1`, up (`common::netns`).
fn veth_ns(tag: &str) -> Netns {
    let ns = Netns::new(&format!("gpu-{tag}"));
    ns.add_veth("v0", "v1", None);
    ns
}

/// A pool whose "dma-buf" is a plain memfd (or absent).
#[derive(Debug)]
struct MemfdPool(Option<OwnedFd>);

impl RxPool for MemfdPool {
    fn share_fd(&self) -> Option<BorrowedFd<'_>> {
        self.0.as_ref().map(|f| f.as_fd())
    }
    fn size(&self) -> u64 {
        0
    }
    fn alignment(&self) -> u64 {
        4096
    }
    fn dmabuf_fd(&self) -> Option<BorrowedFd<'_>> {
        self.0.as_ref().map(|f| f.as_fd())
    }
    fn describe(&self) -> String {
        "memfd pool".into()
    }
}

/// Binds `queues` of `ifname` for GPU 0000:04:00.0 and returns the devmem error.
fn devmem_error(pool: &MemfdPool, ifname: &str, queues: &[u32]) -> DevmemError {
    let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
    match DevmemBinder.bind(pool, gpu, ifname, None, queues).map(drop) {
        Err(BindError { cause: BindFailure::Devmem(e), .. }) => *e,
        other => panic!("expected a devmem bind error, got {other:?}"),
    }
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_veth_bind_rx_is_refused_with_a_clear_error() {
    let ns = veth_ns("a");
    let pool = MemfdPool(Some(memfd_create("not-a-dmabuf", MFdFlags::MFD_CLOEXEC).unwrap()));
    let err = ns.run(|| devmem_error(&pool, "v0", &[0]));
    eprintln!("kernel said: {err}");
    match &err {
        DevmemError::Refused { ifname, errno, .. } => {
            assert_eq!(ifname, "v0");
            assert_ne!(*errno as i32, 0);
        }
        other => panic!("expected a kernel refusal, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.starts_with("kernel refused netdev BIND_RX on v0 (ifindex "), "{text}");

    // Through the trait: the BindError names GPU, interface, queues and cause.
    let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
    let bind_err = ns.run(|| DevmemBinder.bind(&pool, gpu, "v0", None, &[0, 1]).unwrap_err());
    let text = bind_err.to_string();
    assert!(text.contains("0000:04:00.0") && text.contains("v0 queues 0, 1:"), "{text}");
    assert!(text.contains("devmem: kernel refused netdev BIND_RX"), "{text}");
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_missing_interface_and_missing_dmabuf_fail_before_binding() {
    let ns = veth_ns("b");
    let no_dmabuf = MemfdPool(None);
    let err = ns.run(|| devmem_error(&no_dmabuf, "v0", &[0]));
    assert!(matches!(err, DevmemError::NoDmaBuf(_)), "{err:?}");
    let pool = MemfdPool(Some(memfd_create("x", MFdFlags::MFD_CLOEXEC).unwrap()));
    let err = ns.run(|| devmem_error(&pool, "eth-none", &[0]));
    assert!(matches!(err, DevmemError::NoInterface { .. }), "{err:?}");
    let err = ns.run(|| devmem_error(&pool, "v0", &[]));
    assert!(matches!(err, DevmemError::NoQueues), "{err:?}");
}

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn netns_kernel_extack_is_decoded() {
    let ns = veth_ns("c");
    // BIND_RX without queues: the kernel's attribute check refuses it and
    // names the missing attribute in the extended ACK.
    let err = ns.run(|| {
        let mut conn = NlConn::open(NlFamily::Generic).unwrap();
        let family = netdev_family(&mut conn).unwrap();
        let ifindex = nix::net::if_::if_nametoindex("v0").unwrap();
        conn.transact(&bind_rx_request(family, ifindex, 0, &[])).unwrap_err()
    });
    let NlError::Kernel { errno, msg: extack } = err else { panic!("expected a kernel error, got {err:?}") };
    assert_eq!(errno, nix::errno::Errno::EINVAL);
    assert_eq!(extack.as_deref(), Some(format!("missing attribute {NETDEV_A_DMABUF_QUEUES}").as_str()));
}
