//! Per-queue receive counters through the real kernel, on a veth pair in a
//! network namespace of their own (root): the kernel parses the netdev
//! `QSTATS_GET` dump the ethtool backend sends (the device it names is looked
//! up; veth has no queue stats, so it is unsupported there), and the backend
//! answers for a driver without per-queue counters with none.

mod common;

use common::netns::Netns;
use neli::consts::socket::NlFamily;
use nix::errno::Errno;
use tcpx_rxdm::gpu::netdev_family;
use tcpx_rxdm::netlink::NlConn;
use tcpx_rxdm::nic::ethtool::EthtoolNic;
use tcpx_rxdm::nic::queue_stats::{parse_qstats, qstats_request};
use tcpx_rxdm::nic::NicInfo;

#[test]
#[ignore = "needs root: network namespaces, veth"]
fn the_kernel_takes_the_qstats_dump_and_veth_reports_no_queue_counters() {
    common::require_root("network namespaces, veth");
    let ns = Netns::with_veth("qstats");
    let index = ns.ifindex("eth1");
    ns.run(|| {
        let mut conn = NlConn::open(NlFamily::Generic).unwrap();
        match netdev_family(&mut conn) {
            Err(e) => eprintln!("SKIPPED (qstats part): no netdev family on this kernel: {e}"),
            Ok(family) => {
                // A well-formed request for a device without queue stats ops:
                // refused as unsupported (or an empty dump), never as invalid.
                match conn.transact(&qstats_request(family, index)) {
                    Ok(replies) => assert_eq!(parse_qstats(&replies).unwrap(), []),
                    Err(e) => assert_eq!(e.errno(), Errno::EOPNOTSUPP, "{e}"),
                }
                // The ifindex is read: an unknown device is refused.
                let err = conn.transact(&qstats_request(family, 999_999)).unwrap_err();
                assert_eq!(err.errno(), Errno::ENODEV, "{err}");
            }
        }
        // The backend: neither qstats nor per-queue ethtool strings on veth.
        let nic = EthtoolNic::open().unwrap();
        assert_eq!(nic.queue_rx_bytes("eth1").unwrap(), []);
        assert_eq!(nic.queue_rx_bytes("nope0").unwrap_err().errno, Errno::ENODEV);
    });
}
