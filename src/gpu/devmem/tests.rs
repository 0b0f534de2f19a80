use std::io::Cursor;

use neli::nl::{NlPayload, Nlmsghdr};
use neli::types::Buffer;
use neli::FromBytes;

use super::*;
use crate::netlink::kernel_error;

/// `BIND_RX` for ifindex 5, dma-buf fd 9, queues 8 and 9; family 0x1c, seq 7.
/// Written out from `include/uapi/linux/netdev.h` and `linux/netlink.h`, not
/// from the encoder.
const BIND_RX_GOLDEN: [u8; 76] = [
    0x4c, 0, 0, 0, // nlmsg_len 76
    0x1c, 0, // nlmsg_type: the netdev family id
    0x05, 0, // NLM_F_REQUEST | NLM_F_ACK
    7, 0, 0, 0, // seq
    0, 0, 0, 0, // pid (kernel fills in)
    13, 1, 0, 0, // genl: cmd NETDEV_CMD_BIND_RX, version 1
    8, 0, 1, 0, 5, 0, 0, 0, // NETDEV_A_DMABUF_IFINDEX = 5
    8, 0, 3, 0, 9, 0, 0, 0, // NETDEV_A_DMABUF_FD = 9
    20, 0, 2, 0x80, // NETDEV_A_DMABUF_QUEUES | NLA_F_NESTED
    8, 0, 1, 0, 8, 0, 0, 0, //   NETDEV_A_QUEUE_ID = 8
    8, 0, 3, 0, 0, 0, 0, 0, //   NETDEV_A_QUEUE_TYPE = RX
    20, 0, 2, 0x80, // NETDEV_A_DMABUF_QUEUES | NLA_F_NESTED
    8, 0, 1, 0, 9, 0, 0, 0, //   NETDEV_A_QUEUE_ID = 9
    8, 0, 3, 0, 0, 0, 0, 0, //   NETDEV_A_QUEUE_TYPE = RX
];

#[test]
fn bind_rx_request_golden_bytes() {
    assert_eq!(bind_rx_request(0x1c, 5, 9, &[8, 9]).to_bytes(7), BIND_RX_GOLDEN);
}

#[test]
fn bind_rx_request_without_queues_has_no_nest() {
    let bytes = bind_rx_request(0x1c, 5, 9, &[]).to_bytes(1);
    assert_eq!(bytes.len(), 16 + 4 + 16);
    assert_eq!(bytes[0], 36);
}

#[test]
fn reply_with_dmabuf_id_parses() {
    let reply: [u8; 28] = [
        28, 0, 0, 0, 0x1c, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, // header
        13, 1, 0, 0, // genl
        8, 0, 4, 0, 42, 0, 0, 0, // NETDEV_A_DMABUF_ID = 42
    ];
    // What `NlConn::transact` hands back: the payload after the nlmsghdr.
    assert_eq!(parse_dmabuf_id(&[reply[16..].to_vec()]).unwrap(), 42);
    assert!(matches!(parse_dmabuf_id(&[reply[16..20].to_vec()]), Err(DevmemError::NoDmabufId)));
}

#[test]
fn error_with_extack_message_parses() {
    let mut bytes = vec![0u8; 16];
    bytes[4] = 2; // NLMSG_ERROR
    bytes[6..8].copy_from_slice(&0x200u16.to_ne_bytes()); // NLM_F_ACK_TLVS
    bytes[8] = 7;
    bytes.extend_from_slice(&(-22i32).to_ne_bytes()); // -EINVAL
    bytes.extend_from_slice(&BIND_RX_GOLDEN); // the echoed request
    bytes.extend_from_slice(&[13, 0, 1, 0]); // NLMSGERR_ATTR_MSG, 9-byte string
    bytes.extend_from_slice(b"no queue\0\0\0\0");
    bytes.extend_from_slice(&[8, 0, 5, 0, 2, 0, 0, 0]); // NLMSGERR_ATTR_MISS_TYPE = 2
    let len = bytes.len() as u32;
    bytes[0..4].copy_from_slice(&len.to_ne_bytes());
    let msg = Nlmsghdr::<u16, Buffer>::from_bytes(&mut Cursor::new(&bytes[..])).unwrap();
    let NlPayload::Err(e) = msg.nl_payload() else { panic!("not an error message: {msg:?}") };
    match kernel_error(*e.error(), e.ext_ack()) {
        NlError::Kernel { errno, msg } => {
            assert_eq!((errno, msg.as_deref()), (Errno::EINVAL, Some("no queue; missing attribute 2")))
        }
        other => panic!("expected a kernel error, got {other:?}"),
    }
}

#[test]
fn refusal_message_names_interface_errno_and_extack() {
    let e = DevmemError::Refused {
        ifname: "eth1".into(),
        ifindex: 3,
        errno: Errno::EOPNOTSUPP,
        extack: Some("no queue API".into()),
        hint: hint(Errno::EOPNOTSUPP),
    };
    let s = e.to_string();
    assert!(s.starts_with("kernel refused netdev BIND_RX on eth1 (ifindex 3): EOPNOTSUPP"), "{s}");
    assert!(s.contains(": no queue API (driver lacks"), "{s}");
}
