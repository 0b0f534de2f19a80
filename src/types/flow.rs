//! TCP flows as NICs match them.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// ethtool `flow_type` of a TCP over IPv4 rule.
pub const TCP_V4_FLOW: u32 = 1;
/// ethtool `flow_type` of a TCP over IPv6 rule.
pub const TCP_V6_FLOW: u32 = 5;

/// A TCP flow as the NIC matches it. `src` is the remote peer, `dst` the local
/// receiving socket; both have the same address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowSpec {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

impl FlowSpec {
    pub fn is_v6(&self) -> bool {
        self.dst.is_ipv6()
    }
}

impl std::fmt::Display for FlowSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}", self.src, self.dst)
    }
}

/// `ip` as IPv6: a v4 address becomes v4-mapped (`::ffff:a.b.c.d`). Flows
/// whose two ends differ in family are keyed and programmed this way.
pub fn as_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The first 8 bytes of `ip` in its IPv6 form (v4-mapped for IPv4): on a
/// real network, its /64 prefix. All that the NCCL plugin's IPv6 requests
/// carry of an address (see `identity::flows`).
pub fn prefix64(ip: IpAddr) -> [u8; 8] {
    let o = as_v6(ip).octets();
    [o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]]
}

/// Whether connection `c` (`src` remote, `dst` local) fits `garbled`, a
/// flow named with only the first 8 bytes of each address: the same two
/// ports and the same prefixes.
pub fn fits_garbled(garbled: &FlowSpec, c: &FlowSpec) -> bool {
    garbled.src.port() == c.src.port()
        && garbled.dst.port() == c.dst.port()
        && prefix64(garbled.src.ip()) == prefix64(c.src.ip())
        && prefix64(garbled.dst.ip()) == prefix64(c.dst.ip())
}
