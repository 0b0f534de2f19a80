//! Bytes received per receive queue, from the two places a kernel reports
//! them: the netdev generic-netlink family's `QSTATS_GET` dump with queue
//! scope (drivers that implement the per-queue stats ops, Linux ≥ 6.10), or
//! the driver's `ethtool -S` strings. Numbers from `include/uapi/linux/netdev.h`.
//! Pure: requests are built and replies parsed here; the backends send them.

use neli::consts::nl::NlmF;

use crate::netlink::{attr_u32, genl, AttrSet, NlError, NlRequest};

pub const NETDEV_CMD_QSTATS_GET: u8 = 12;
pub const NETDEV_A_QSTATS_IFINDEX: u16 = 1;
pub const NETDEV_A_QSTATS_QUEUE_TYPE: u16 = 2;
pub const NETDEV_A_QSTATS_QUEUE_ID: u16 = 3;
pub const NETDEV_A_QSTATS_SCOPE: u16 = 4;
pub const NETDEV_A_QSTATS_RX_BYTES: u16 = 9;
/// `NETDEV_QSTATS_SCOPE_QUEUE`: one reply per queue instead of a device sum.
pub const NETDEV_QSTATS_SCOPE_QUEUE: u32 = 1;
pub const NETDEV_QUEUE_TYPE_RX: u32 = 0;

/// Bytes received so far by each receive queue: `(queue id, bytes)`, by queue id.
pub type QueueBytes = Vec<(u32, u64)>;

/// The `QSTATS_GET` dump of `ifindex`'s queues, one reply per queue.
pub fn qstats_request(family: u16, ifindex: u32) -> NlRequest {
    let attrs = vec![
        attr_u32(NETDEV_A_QSTATS_IFINDEX, ifindex),
        attr_u32(NETDEV_A_QSTATS_SCOPE, NETDEV_QSTATS_SCOPE_QUEUE),
    ];
    let mut req = genl::request(family, NETDEV_CMD_QSTATS_GET, 1, attrs);
    req.flags = NlmF::DUMP;
    req
}

/// Receive-queue byte counts from the dump's replies (transmit queues and
/// queues without a byte count are skipped).
pub fn parse_qstats(replies: &[Vec<u8>]) -> Result<QueueBytes, NlError> {
    let mut out = Vec::new();
    for r in replies {
        let attrs: AttrSet = genl::reply_attrs(r)?;
        if attrs.u32(NETDEV_A_QSTATS_QUEUE_TYPE) != Some(NETDEV_QUEUE_TYPE_RX) {
            continue;
        }
        let Some(queue) = attrs.u32(NETDEV_A_QSTATS_QUEUE_ID) else { continue };
        // An NLA_UINT: 4 or 8 bytes, whichever holds the value.
        let bytes = match attrs.get(NETDEV_A_QSTATS_RX_BYTES) {
            Some(b) if b.len() == 8 => u64::from_ne_bytes(b.try_into().expect("8 bytes")),
            Some(b) if b.len() == 4 => u64::from(u32::from_ne_bytes(b.try_into().expect("4 bytes"))),
            _ => continue,
        };
        out.push((queue, bytes));
    }
    out.sort_unstable();
    Ok(out)
}

/// The queue of a per-queue receive-bytes stat name, in the forms drivers
/// use: gve's `rx_bytes[3]`, `rx_queue_3_bytes` (Intel drivers, virtio),
/// `rx3_bytes` (mlx5). `None` for any other name.
pub fn rx_bytes_queue(name: &str) -> Option<u32> {
    let num =
        |s: &str| s.parse::<u32>().ok().filter(|_| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    if let Some(q) = name.strip_prefix("rx_bytes[").and_then(|r| r.strip_suffix(']')) {
        return num(q);
    }
    if let Some(q) = name.strip_prefix("rx_queue_").and_then(|r| r.strip_suffix("_bytes")) {
        return num(q);
    }
    name.strip_prefix("rx").and_then(|r| r.strip_suffix("_bytes")).and_then(num)
}

/// Per-queue receive bytes from a driver's stat names and values (as
/// `ETHTOOL_GSTRINGS` and `ETHTOOL_GSTATS` give them, index for index).
pub fn from_ethtool_stats(names: &[String], values: &[u64]) -> QueueBytes {
    let mut out: QueueBytes =
        names.iter().zip(values).filter_map(|(n, &v)| rx_bytes_queue(n).map(|q| (q, v))).collect();
    out.sort_unstable();
    out.dedup_by_key(|(q, _)| *q);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{attr, attrs_bytes};

    #[test]
    fn stat_names_of_each_driver_family() {
        assert_eq!(rx_bytes_queue("rx_bytes[0]"), Some(0));
        assert_eq!(rx_bytes_queue("rx_bytes[15]"), Some(15));
        assert_eq!(rx_bytes_queue("rx_queue_7_bytes"), Some(7));
        assert_eq!(rx_bytes_queue("rx12_bytes"), Some(12));
        for other in [
            "rx_bytes",
            "rx_hsplit_bytes[3]",
            "tx_bytes[3]",
            "rx_bytes[x]",
            "rx_bytes[]",
            "rx__bytes",
            "rx_bytes[-1]",
        ] {
            assert_eq!(rx_bytes_queue(other), None, "{other}");
        }
    }

    #[test]
    fn gve_strings_give_one_count_per_queue() {
        let names: Vec<String> = [
            "rx_packets",
            "rx_bytes",
            "rx_posted_desc[0]",
            "rx_bytes[0]",
            "rx_bytes[1]",
            "tx_bytes[0]",
            "rx_bytes[1]",
        ]
        .map(String::from)
        .to_vec();
        let values = [9, 999, 5, 100, 200, 300, 201];
        assert_eq!(from_ethtool_stats(&names, &values), [(0, 100), (1, 200)]);
    }

    #[test]
    fn the_qstats_request_is_a_queue_scoped_dump_of_one_device() {
        let req = qstats_request(0x1d, 7);
        assert_eq!(req.nl_type, 0x1d);
        assert_eq!(req.flags, NlmF::DUMP);
        // genl header: cmd 12, version 1, reserved 0; then ifindex 7, scope 1.
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            12, 1, 0, 0,
            8, 0, 1, 0, 7, 0, 0, 0,
            8, 0, 4, 0, 1, 0, 0, 0,
        ];
        assert_eq!(req.payload, want);
    }

    fn reply(attrs: Vec<neli::genl::Nlattr<u16, neli::types::Buffer>>) -> Vec<u8> {
        let mut r = vec![NETDEV_CMD_QSTATS_GET, 1, 0, 0];
        r.extend(attrs_bytes(attrs));
        r
    }

    #[test]
    fn qstats_replies_parse_with_either_width_and_skip_tx() {
        let replies = vec![
            reply(vec![
                attr_u32(NETDEV_A_QSTATS_IFINDEX, 7),
                attr_u32(NETDEV_A_QSTATS_QUEUE_TYPE, NETDEV_QUEUE_TYPE_RX),
                attr_u32(NETDEV_A_QSTATS_QUEUE_ID, 9),
                attr(NETDEV_A_QSTATS_RX_BYTES, &(5u64 << 32).to_ne_bytes()),
            ]),
            reply(vec![
                attr_u32(NETDEV_A_QSTATS_QUEUE_TYPE, NETDEV_QUEUE_TYPE_RX),
                attr_u32(NETDEV_A_QSTATS_QUEUE_ID, 0),
                attr(NETDEV_A_QSTATS_RX_BYTES, &1234u32.to_ne_bytes()),
            ]),
            reply(vec![
                attr_u32(NETDEV_A_QSTATS_QUEUE_TYPE, 1),
                attr_u32(NETDEV_A_QSTATS_QUEUE_ID, 0),
                attr(NETDEV_A_QSTATS_RX_BYTES, &1u32.to_ne_bytes()),
            ]),
        ];
        assert_eq!(parse_qstats(&replies).unwrap(), [(0, 1234), (9, 5 << 32)]);
        assert!(parse_qstats(&[vec![1, 2]]).is_err());
    }
}
