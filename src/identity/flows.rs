//! Finding the TCP connection a rule request names, in the client's own
//! network namespace, and repairing the IPv6 flows the NCCL plugin names
//! with half their address bytes.
//!
//! The plugin reads both ends of an accepted socket with a buffer the size
//! of an IPv4 `sockaddr_in` (16 bytes). For an IPv6 socket the kernel fills
//! it with the family, the port, the flow label and the first 8 bytes of the
//! address; the plugin then prints all 16 bytes of its `sockaddr_in6`, whose
//! last 8 are whatever its stack held, different on every call. So an
//! install and its uninstall never name the same flow, and neither names the
//! connection.
//!
//! What both still carry is enough to find it: the ports, and each address's
//! first 8 bytes (on a real network, the /64 prefix). A request whose exact
//! tuple is no connection is looked up by its ports (one `sock_diag` dump
//! that the kernel filters by port) and kept if the first 8 bytes of both
//! addresses agree. Exactly one such connection: the request means it, and
//! the rule gets its true addresses. Several: the daemon does not guess
//! (with a tenant known, only the tenant's own connections are candidates).
//! None: the request stays as it was sent.
//!
//! Each lookup takes one of the namespace's idle `sock_diag` sockets (or
//! opens one) and gives it back: no lock is held while the kernel answers.

use std::net::{IpAddr, SocketAddr};

use super::tenant::NetNs;
use crate::netlink::sock_diag::{Connection, DiagError, SockDiag, MANY};
use crate::types::flow::FlowSpec;

/// What the client's network namespace says of a requested flow (`dst` the
/// local end, `src` the remote, as rule requests name them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The connection exactly as named; the cgroup id of its creator (0
    /// where the kernel does not say).
    Exact { cgroup: u64 },
    /// A garbled IPv6 request that fits exactly one connection: the flow
    /// with that connection's true addresses.
    Repaired { flow: FlowSpec, cgroup: u64 },
    /// No connection fits.
    Missing,
    /// A garbled IPv6 request that fits several connections, all listed
    /// with the cgroup id of their creators (some may be other tenants'
    /// connections: a refusal names only the client's own).
    Ambiguous(Vec<(FlowSpec, u64)>),
}

/// Whether `flow` is one a repair may apply to: IPv6 on both ends (an IPv4
/// request names its addresses whole).
pub fn repairable(flow: &FlowSpec) -> bool {
    flow.src.is_ipv6() && flow.dst.is_ipv6()
}

/// The first 8 bytes of `ip` as an IPv6 address (v4-mapped for IPv4).
fn prefix(ip: IpAddr) -> [u8; 8] {
    let v6 = match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    v6.octets()[..8].try_into().expect("8 bytes")
}

/// The flow of connection `c` as a rule names it: the remote end as `src`,
/// the local as `dst`, an IPv4 connection on a dual-stack socket in IPv4.
fn flow_of(c: &Connection) -> FlowSpec {
    let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (src, dst) = (canon(c.remote), canon(c.local));
    match src.is_ipv4() == dst.is_ipv4() {
        true => FlowSpec { src, dst },
        false => FlowSpec { src: c.remote, dst: c.local },
    }
}

/// The connections of `candidates` whose addresses start with the
/// request's first 8 bytes, as flows.
pub fn fitting(request: &FlowSpec, candidates: &[Connection]) -> Vec<(FlowSpec, u64)> {
    let (want_local, want_remote) = (prefix(request.dst.ip()), prefix(request.src.ip()));
    candidates
        .iter()
        .filter(|c| prefix(c.local.ip()) == want_local && prefix(c.remote.ip()) == want_remote)
        .map(|c| (flow_of(c), c.socket.cgroup_id.unwrap_or(0)))
        .collect()
}

/// Decides among the connections that fit a garbled request: one is it;
/// several are narrowed to those of tenant `own`, where known.
pub fn choose(fits: Vec<(FlowSpec, u64)>, own: Option<u64>) -> Found {
    match fits.len() {
        0 => Found::Missing,
        1 => Found::Repaired { flow: fits[0].0, cgroup: fits[0].1 },
        _ => {
            let mine: Vec<_> = fits.iter().filter(|(_, cg)| Some(*cg) == own).collect();
            match mine.as_slice() {
                [(flow, cgroup)] => Found::Repaired { flow: *flow, cgroup: *cgroup },
                _ => Found::Ambiguous(fits),
            }
        }
    }
}

/// Looks `flow` up in namespace `ns`: exactly as named when `exact` (a
/// tenant check needs it) or when it may be repaired; then, for an IPv6
/// flow named as no connection, by its ports and address prefixes. `own`:
/// the client's tenant, which narrows several fits.
pub fn locate(ns: &NetNs, flow: &FlowSpec, exact: bool, own: Option<u64>) -> Result<Found, String> {
    let repair = repairable(flow);
    if !exact && !repair {
        return Ok(Found::Missing);
    }
    let mut diag = diag_of(ns)?;
    let looked = (|| -> Result<Found, DiagError> {
        if let Some(s) = diag.find_tcp(flow.dst, flow.src)? {
            return Ok(Found::Exact { cgroup: s.cgroup_id.unwrap_or(0) });
        }
        if !repair {
            return Ok(Found::Missing);
        }
        let candidates = diag.by_ports(flow.dst.port(), flow.src.port())?;
        Ok(choose(fitting(flow, &candidates), own))
    })();
    match looked {
        Ok(found) => {
            ns.put_diag(diag);
            Ok(found)
        }
        // A socket that failed is not given back.
        Err(e) => Err(format!("the connection could not be looked up: {e}")),
    }
}

/// Exact lookups of many flows in namespace `ns` at once (no repair: for
/// IPv4 flows), in the order given.
pub fn locate_many(ns: &NetNs, flows: &[FlowSpec]) -> Vec<Result<Found, String>> {
    let mut diag = match diag_of(ns) {
        Ok(d) => d,
        Err(why) => return flows.iter().map(|_| Err(why.clone())).collect(),
    };
    let mut out = Vec::with_capacity(flows.len());
    let mut failed = false;
    for chunk in flows.chunks(MANY) {
        let tuples: Vec<_> = chunk.iter().map(|f| (f.dst, f.src)).collect();
        for r in diag.find_many(&tuples) {
            out.push(match r {
                Ok(Some(s)) => Ok(Found::Exact { cgroup: s.cgroup_id.unwrap_or(0) }),
                Ok(None) => Ok(Found::Missing),
                Err(e) => {
                    failed = true;
                    Err(format!("the connection could not be looked up: {e}"))
                }
            });
        }
    }
    // A socket that failed is not given back.
    if !failed {
        ns.put_diag(diag);
    }
    out
}

/// An idle `sock_diag` socket of `ns`, or a new one.
fn diag_of(ns: &NetNs) -> Result<SockDiag, String> {
    match ns.take_diag() {
        Some(d) => Ok(d),
        None => open_in(ns).map_err(|e| format!("cannot look into its network namespace: {e}")),
    }
}

/// A new `sock_diag` socket in `ns`: opened right here when this thread is
/// already in it, else from a short-lived thread that enters it.
fn open_in(ns: &NetNs) -> Result<SockDiag, nix::errno::Errno> {
    let own = nix::sys::stat::stat("/proc/thread-self/ns/net").map(|s| s.st_ino).ok();
    if own == Some(ns.inode) {
        SockDiag::open()
    } else {
        SockDiag::open_in(std::os::fd::AsFd::as_fd(&ns.fd))
    }
}

#[cfg(test)]
#[path = "flows_tests.rs"]
mod tests;
