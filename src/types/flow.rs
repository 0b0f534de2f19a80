//! TCP flows as NICs match them.

use std::net::SocketAddr;

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
