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
//! tuple is no connection is looked for among the connections with those
//! ports whose addresses start with those bytes:
//!
//! - first by exact lookups ([`look`]) of the full addresses the namespace
//!   is known to use (`flows_space`): O(1) each in the kernel, whatever else
//!   the host holds;
//! - when none of them is such a connection, in a dump of the namespace's
//!   established connections with those ports ([`dump`]; the kernel walks its
//!   whole table, every namespace's sockets included), shared by every request
//!   of the namespace waiting at the time (see `steering::repair`).
//!
//! Only an established connection that a process holds fits ([`fitting`]):
//! not one being opened (a decoy's `SYN-SENT`), closing, or waiting in a
//! listener's accept queue (held by nobody: the kernel reports no inode).
//! Exactly one fit: the request means it, and the rule gets its true
//! addresses. Several: those of the client's tenant count, where it is known;
//! still several, those its process holds (`flows_held`); still several, the
//! daemon does not guess ([`choose`]). None: the request stays as it was sent.
//!
//! Each lookup takes one of the namespace's idle `sock_diag` sockets (or
//! opens one) and gives it back: no lock is held while the kernel answers.

use std::net::SocketAddr;

use super::flows_space::{read_addresses, FlowSpace};
use super::tenant::NetNs;
use crate::netlink::sock_diag::{Connection, DiagError, SockDiag, ESTABLISHED, MANY, PAIRS};
use crate::types::flow::{prefix64, FlowSpec};

pub use super::flows_held::held_by_opener;

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

/// A connection that fits a garbled request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fit {
    pub flow: FlowSpec,
    /// The cgroup id of its creator (0 where the kernel does not say).
    pub cgroup: u64,
    /// Its socket's inode (what a process holding it has open).
    pub inode: u32,
}

/// Whether `flow` is one a repair may apply to: IPv6 on both ends (an IPv4
/// request names its addresses whole).
pub fn repairable(flow: &FlowSpec) -> bool {
    flow.src.is_ipv6() && flow.dst.is_ipv6()
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

/// The connections of `candidates` that fit `request`: the same ports,
/// addresses that start with the request's first 8 bytes, established, and
/// held by a process (a socket in an accept queue has no inode yet).
pub fn fitting(request: &FlowSpec, candidates: &[Connection]) -> Vec<Fit> {
    let (want_local, want_remote) = (prefix64(request.dst.ip()), prefix64(request.src.ip()));
    let ports = (request.dst.port(), request.src.port());
    candidates
        .iter()
        .filter(|c| (c.local.port(), c.remote.port()) == ports)
        .filter(|c| prefix64(c.local.ip()) == want_local && prefix64(c.remote.ip()) == want_remote)
        .filter(|c| c.socket.state == ESTABLISHED && c.socket.inode != 0)
        .map(|c| Fit { flow: flow_of(c), cgroup: c.socket.cgroup_id.unwrap_or(0), inode: c.socket.inode })
        .collect()
}

/// Decides among the connections that fit a garbled request: one is it.
/// Several are narrowed to those of tenant `own`, where known (another
/// tenant's connection never makes the request ambiguous), then to those
/// whose socket the client's process holds (`held`: which of the inodes it
/// is given it holds, `None` when that cannot be told), read only then.
pub fn choose(fits: Vec<Fit>, own: Option<u64>, held: impl FnOnce(&[u32]) -> Option<Vec<u32>>) -> Found {
    let one = |f: &Fit| Found::Repaired { flow: f.flow, cgroup: f.cgroup };
    let all = |fits: &[Fit]| Found::Ambiguous(fits.iter().map(|f| (f.flow, f.cgroup)).collect());
    match fits.as_slice() {
        [] => return Found::Missing,
        [f] => return one(f),
        _ => {}
    }
    let mine: Vec<&Fit> = fits.iter().filter(|f| own.is_none_or(|o| f.cgroup == o)).collect();
    match mine.as_slice() {
        [] => all(&fits),
        [f] => one(f),
        _ => {
            let inodes: Vec<u32> = mine.iter().map(|f| f.inode).collect();
            let Some(held) = held(&inodes) else { return all(&fits) };
            match mine.iter().filter(|f| held.contains(&f.inode)).collect::<Vec<_>>().as_slice() {
                [f] => one(f),
                _ => all(&fits),
            }
        }
    }
}

/// Looks garbled IPv6 `flow` up in namespace `ns` without a dump: as named,
/// then at the full addresses the namespace is known to use. `Ok(None)`:
/// nothing found that settles it (no fit, or only other tenants' connections
/// where `own` is known): a dump must say. `own` and `held` as for [`choose`].
pub fn look(
    ns: &NetNs,
    flow: &FlowSpec,
    own: Option<u64>,
    held: impl FnOnce(&[u32]) -> Option<Vec<u32>>,
) -> Result<Option<Found>, String> {
    let space = ns.space();
    let addresses = || {
        ns.with_fd(read_addresses)
            .unwrap_or_else(|| Err("its process exited: the namespace is let go".to_string()))
    };
    let read = |space: &FlowSpace| match addresses() {
        Ok(a) => space.set_locals(a),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read a client namespace's addresses");
            space.set_locals([]);
        }
    };
    if space.stale(false) {
        read(space);
    }
    let mut tuples = vec![(flow.dst, flow.src)];
    tuples.extend(space.candidates(flow, MANY - 1));
    let answers = find_many(ns, &tuples)?;
    if let Some(s) = answers[0] {
        return Ok(Some(Found::Exact { cgroup: s.cgroup_id.unwrap_or(0) }));
    }
    let seen: Vec<Connection> = tuples[1..]
        .iter()
        .zip(&answers[1..])
        .filter_map(|(&(local, remote), s)| Some(Connection { local, remote, socket: (*s)? }))
        .collect();
    let fits = fitting(flow, &seen);
    let settles = fits.iter().any(|f| own.is_none_or(|o| f.cgroup == o));
    if !settles {
        if space.stale(true) {
            read(space);
        }
        return Ok(None);
    }
    space.learn(fits.iter().map(|f| f.flow.src.ip()));
    Ok(Some(choose(fits, own, held)))
}

/// The established connections of namespace `ns` whose (local, remote)
/// ports are one of `pairs`: one walk of the kernel's table per [`PAIRS`]
/// pairs. Their peers are remembered for later [`look`]s.
pub fn dump(ns: &NetNs, pairs: &[(u16, u16)]) -> Result<Vec<Connection>, String> {
    let mut diag = diag_of(ns)?;
    let mut out = Vec::new();
    for chunk in pairs.chunks(PAIRS) {
        match diag.established_by_ports(chunk) {
            Ok(c) => out.extend(c),
            // A socket that failed is not given back.
            Err(e) => return Err(format!("the connections could not be listed: {e}")),
        }
    }
    ns.put_diag(diag);
    ns.space().learn(out.iter().map(|c| c.remote.ip()));
    Ok(out)
}

/// Looks `flow` up in namespace `ns` then and there: exactly as named when
/// `exact` (a tenant check needs it) or when it may be repaired; then, for an
/// IPv6 flow named as no connection, as [`look`] and, failing that, a dump of
/// its ports. `own`: the client's tenant, which narrows several fits.
pub fn locate(ns: &NetNs, flow: &FlowSpec, exact: bool, own: Option<u64>) -> Result<Found, String> {
    if !repairable(flow) {
        if !exact {
            return Ok(Found::Missing);
        }
        let found = find_many(ns, &[(flow.dst, flow.src)])?;
        return Ok(match found[0] {
            Some(s) => Found::Exact { cgroup: s.cgroup_id.unwrap_or(0) },
            None => Found::Missing,
        });
    }
    if let Some(found) = look(ns, flow, own, |_| None)? {
        return Ok(found);
    }
    let all = dump(ns, &[(flow.dst.port(), flow.src.port())])?;
    Ok(choose(fitting(flow, &all), own, |_| None))
}

/// Exact lookups of `tuples` (local, remote; at most [`MANY`]) in `ns`.
fn find_many(
    ns: &NetNs,
    tuples: &[(SocketAddr, SocketAddr)],
) -> Result<Vec<Option<crate::netlink::sock_diag::TcpSocket>>, String> {
    let mut diag = diag_of(ns)?;
    let mut out = Vec::with_capacity(tuples.len());
    for r in diag.find_many(tuples) {
        match r {
            Ok(s) => out.push(s),
            // A socket that failed is not given back.
            Err(e) => return Err(lookup_failed(e)),
        }
    }
    ns.put_diag(diag);
    Ok(out)
}

fn lookup_failed(e: DiagError) -> String {
    format!("the connection could not be looked up: {e}")
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
                    Err(lookup_failed(e))
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
        None => {
            open_in(ns).map_err(|e| format!("cannot look into its network namespace: {e}{}", setns_hint(e)))
        }
    }
}

/// Why entering a client's network namespace was refused: `setns` needs
/// `CAP_SYS_ADMIN`, which no deployment gives the daemon on purpose
/// (`SECURITY.md`, *Privileges*).
fn setns_hint(e: nix::errno::Errno) -> String {
    use crate::caps::{lacking, Cap, Held};
    match e {
        nix::errno::Errno::EPERM if Held::this_thread().is_some_and(|h| h.effective.has(Cap::SysAdmin)) => {
            format!(" ({})", lacking(Cap::SysAdmin))
        }
        nix::errno::Errno::EPERM => " (entering another network namespace needs CAP_SYS_ADMIN, which the \
                                     daemon is not given, on purpose: run the client in the daemon's network \
                                     namespace: the node's, as hostNetwork: true does, or the Pod's that \
                                     holds the daemon and its NICs)"
            .into(),
        _ => String::new(),
    }
}

/// A new `sock_diag` socket in `ns`: opened right here when this thread is
/// already in it, else from a short-lived thread that enters it.
fn open_in(ns: &NetNs) -> Result<SockDiag, nix::errno::Errno> {
    let own = nix::sys::stat::stat("/proc/thread-self/ns/net").map(|s| s.st_ino).ok();
    if own == Some(ns.inode) {
        SockDiag::open()
    } else {
        // Released: its process exited, and nothing of it is looked up any more.
        ns.with_fd(SockDiag::open_in).unwrap_or(Err(nix::errno::Errno::ESRCH))
    }
}

#[cfg(test)]
mod tests;
