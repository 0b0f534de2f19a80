//! Flow-steering rules as `struct ethtool_rx_flow_spec` (pure encoding).
//!
//! The 52-byte flow unions hold, for `TCP_V4_FLOW`, `struct ethtool_tcpip4_spec`
//! (ip4src @0, ip4dst @4, psrc @8, pdst @10, tos @12) and, for `TCP_V6_FLOW`,
//! `struct ethtool_tcpip6_spec` (ip6src @0, ip6dst @16, psrc @32, pdst @34,
//! tclass @36); addresses and ports in network byte order. In the kernel ABI a
//! 1 bit in `m_u` means "this bit must match" (`ethtool_rx_flow_rule_create`
//! copies `m_u` as the match mask); the ethtool CLI's inverted masks are a
//! user-interface convention only. Exact 4-tuple match = all-ones masks on
//! the address and port fields, zero on tos/tclass.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::ioctl::{EthtoolRxFlowSpec, EthtoolRxnfc, ETHTOOL_SRXCLSRLINS};
use crate::nic::{FlowSpec, NicRule};
use crate::types::flow::{as_v6, TCP_V4_FLOW, TCP_V6_FLOW};

/// High bits of `flow_type` that qualify it (FLOW_EXT, FLOW_MAC_EXT, FLOW_RSS).
pub const FLOW_TYPE_FLAGS: u32 = 0x8000_0000 | 0x4000_0000 | 0x2000_0000;

/// The rule steering `flow` to `queue` at slot `loc`.
pub fn flow_spec(flow: &FlowSpec, queue: u32, loc: u32) -> EthtoolRxFlowSpec {
    let mut fs = EthtoolRxFlowSpec { ring_cookie: u64::from(queue), location: loc, ..Default::default() };
    match (flow.src.ip(), flow.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            fs.flow_type = TCP_V4_FLOW;
            fs.h_u[0..4].copy_from_slice(&s.octets());
            fs.h_u[4..8].copy_from_slice(&d.octets());
            fs.h_u[8..10].copy_from_slice(&flow.src.port().to_be_bytes());
            fs.h_u[10..12].copy_from_slice(&flow.dst.port().to_be_bytes());
            fs.m_u[0..12].fill(0xff);
        }
        (s, d) => {
            // Mixed families cannot come from a real socket; map both to v6
            // (a v4 address becomes v4-mapped) so the driver decides.
            fs.flow_type = TCP_V6_FLOW;
            fs.h_u[0..16].copy_from_slice(&as_v6(s).octets());
            fs.h_u[16..32].copy_from_slice(&as_v6(d).octets());
            fs.h_u[32..34].copy_from_slice(&flow.src.port().to_be_bytes());
            fs.h_u[34..36].copy_from_slice(&flow.dst.port().to_be_bytes());
            fs.m_u[0..36].fill(0xff);
        }
    }
    fs
}

/// The request inserting `flow` → `queue` at `loc` (ETHTOOL_SRXCLSRLINS).
pub fn insert(flow: &FlowSpec, queue: u32, loc: u32) -> EthtoolRxnfc {
    let fs = flow_spec(flow, queue, loc);
    EthtoolRxnfc { cmd: ETHTOOL_SRXCLSRLINS, flow_type: fs.flow_type, fs, ..Default::default() }
}

/// A rule read back from the NIC, if it is a TCP flow rule (others are not ours).
pub fn decode(fs: &EthtoolRxFlowSpec) -> Option<NicRule> {
    let h = &fs.h_u;
    let port = |at: usize| u16::from_be_bytes([h[at], h[at + 1]]);
    let (src, dst) = match fs.flow_type & !FLOW_TYPE_FLAGS {
        TCP_V4_FLOW => {
            let a = |at: usize| Ipv4Addr::new(h[at], h[at + 1], h[at + 2], h[at + 3]);
            (SocketAddr::new(a(0).into(), port(8)), SocketAddr::new(a(4).into(), port(10)))
        }
        TCP_V6_FLOW => {
            let a = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&h[at..at + 16]).expect("16 bytes"));
            (SocketAddr::new(a(0).into(), port(32)), SocketAddr::new(a(16).into(), port(34)))
        }
        _ => return None,
    };
    // The queue is the low 32 bits of ring_cookie (the next byte names a VF).
    Some(NicRule { loc: fs.location, queue: fs.ring_cookie as u32, src, dst })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 192 bytes of a `struct ethtool_rxnfc` exactly as the ioctl passes them.
    fn rxnfc_bytes(n: &EthtoolRxnfc) -> Vec<u8> {
        let mut b = Vec::with_capacity(192);
        b.extend_from_slice(&n.cmd.to_ne_bytes());
        b.extend_from_slice(&n.flow_type.to_ne_bytes());
        b.extend_from_slice(&n.data.to_ne_bytes());
        let fs = &n.fs;
        b.extend_from_slice(&fs.flow_type.to_ne_bytes());
        b.extend_from_slice(&fs.h_u);
        b.extend_from_slice(&[0; 20]); // h_ext unused
        b.extend_from_slice(&fs.m_u);
        b.extend_from_slice(&[0; 20]); // m_ext unused
        b.extend_from_slice(&[0; 4]); // padding before the u64
        b.extend_from_slice(&fs.ring_cookie.to_ne_bytes());
        b.extend_from_slice(&fs.location.to_ne_bytes());
        b.extend_from_slice(&[0; 4]); // tail padding of the flow spec
        b.extend_from_slice(&n.rule_cnt.to_ne_bytes());
        b.extend_from_slice(&[0; 4]); // tail padding of rxnfc
        b
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn tcp4_insert_golden_bytes() {
        let flow =
            FlowSpec { src: "10.1.2.3:40000".parse().unwrap(), dst: "192.168.1.2:5000".parse().unwrap() };
        let nfc = insert(&flow, 9, 7);
        let mut want = vec![0u8; 192];
        want[0] = 0x32; // cmd ETHTOOL_SRXCLSRLINS
        want[4] = 1; // flow_type TCP_V4_FLOW
        want[16] = 1; // fs.flow_type TCP_V4_FLOW
        want[20..24].copy_from_slice(&[10, 1, 2, 3]); // h_u.ip4src: the remote peer
        want[24..28].copy_from_slice(&[192, 168, 1, 2]); // h_u.ip4dst: the local socket
        want[28..30].copy_from_slice(&[0x9c, 0x40]); // h_u.psrc 40000, big endian
        want[30..32].copy_from_slice(&[0x13, 0x88]); // h_u.pdst 5000, big endian
        want[92..104].fill(0xff); // m_u (@16+76): ip4src, ip4dst, psrc, pdst must match; tos free
        want[168] = 9; // fs.ring_cookie (@16+152): queue 9
        want[176] = 7; // fs.location (@16+160): slot 7
        assert_eq!(rxnfc_bytes(&nfc), want);
        assert_eq!(decode(&nfc.fs), Some(NicRule { loc: 7, queue: 9, src: flow.src, dst: flow.dst }));
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn tcp6_insert_golden_bytes() {
        let flow =
            FlowSpec { src: "[2001:db8::1]:443".parse().unwrap(), dst: "[fd00::2]:8080".parse().unwrap() };
        let nfc = insert(&flow, 12, 100_000);
        let mut want = vec![0u8; 192];
        want[0] = 0x32;
        want[4] = 5; // TCP_V6_FLOW
        want[16] = 5;
        want[20..36].copy_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets()); // ip6src
        want[36..52].copy_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets()); // ip6dst
        want[52..54].copy_from_slice(&[0x01, 0xbb]); // psrc 443
        want[54..56].copy_from_slice(&[0x1f, 0x90]); // pdst 8080
        want[92..128].fill(0xff); // m_u: both addresses and both ports; tclass free
        want[168] = 12; // ring_cookie
        want[176..180].copy_from_slice(&100_000u32.to_le_bytes()); // location
        assert_eq!(rxnfc_bytes(&nfc), want);
        assert_eq!(decode(&nfc.fs).unwrap().dst, flow.dst);
    }

    #[test]
    fn non_tcp_rules_are_not_decoded() {
        let mut fs = EthtoolRxFlowSpec { flow_type: 2, ..Default::default() }; // UDP_V4_FLOW
        assert_eq!(decode(&fs), None);
        fs.flow_type = TCP_V4_FLOW | 0x8000_0000; // FLOW_EXT still a TCP rule
        assert!(decode(&fs).is_some());
    }
}
