//! What the daemon knows of one network namespace's addresses, so that a
//! garbled IPv6 flow (see [`super`]) is found by a few exact lookups instead
//! of a walk of the kernel's whole connection table.
//!
//! A garbled request names the ports and each address's /64 prefix. The
//! full addresses it stands for are few: its local end is one of the
//! namespace's own addresses with that prefix (read with an `RTM_GETADDR`
//! dump of the namespace), its remote end one of the peers the namespace's
//! connections were seen with (learned from earlier repairs and dumps) or,
//! for a connection inside the namespace, one of its own addresses again.
//! NCCL opens many connections between the same two hosts, so after a
//! host's first connection each repair is a handful of exact lookups, O(1)
//! in the kernel, whatever else the host holds.
//!
//! One [`FlowSpace`] per namespace (by its nsfs inode), shared by every
//! client process in it; bounded: [`LOCALS`] own addresses, the [`REMOTES`]
//! peers seen last.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::netlink::sock_diag::MANY;
use crate::netlink::{rtnl, NlConn};
use crate::types::flow::{as_v6, prefix64, FlowSpec};

/// Own addresses kept per namespace, at most.
pub const LOCALS: usize = 256;
/// Remote peers kept per namespace, at most (the ones seen last).
pub const REMOTES: usize = 512;
/// The own addresses are read again at most this often (and only when a
/// lookup found nothing with them).
const REREAD: Duration = Duration::from_secs(1);

/// One network namespace's known addresses.
#[derive(Debug)]
pub struct FlowSpace {
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// Its own addresses (IPv4 ones v4-mapped), as last read.
    locals: Vec<Ipv6Addr>,
    read_at: Option<Instant>,
    /// Peers seen, the most recent last.
    remotes: VecDeque<Ipv6Addr>,
}

impl FlowSpace {
    /// The namespace of nsfs inode `inode`: the one every client process
    /// in it shares while any holds it (a namespace alive keeps its inode).
    pub fn of(inode: u64) -> Arc<FlowSpace> {
        static ALL: Mutex<Option<HashMap<u64, Weak<FlowSpace>>>> = Mutex::new(None);
        let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
        let all = all.get_or_insert_with(HashMap::new);
        if let Some(s) = all.get(&inode).and_then(Weak::upgrade) {
            return s;
        }
        if all.len() >= 64 {
            all.retain(|_, w| w.strong_count() > 0);
        }
        let s = Arc::new(FlowSpace { known: Mutex::default() });
        all.insert(inode, Arc::downgrade(&s));
        s
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the own addresses should be read (again): never read, or read
    /// more than a second ago and `missed` (a lookup found nothing with them).
    pub fn stale(&self, missed: bool) -> bool {
        match self.known().read_at {
            None => true,
            Some(at) => missed && at.elapsed() >= REREAD,
        }
    }

    /// Sets the namespace's own addresses (as read now).
    pub fn set_locals(&self, addrs: impl IntoIterator<Item = IpAddr>) {
        let mut k = self.known();
        k.locals = addrs.into_iter().map(as_v6).take(LOCALS).collect();
        k.read_at = Some(Instant::now());
    }

    /// Notes the peers of connections seen in the namespace.
    pub fn learn(&self, remotes: impl IntoIterator<Item = IpAddr>) {
        let mut k = self.known();
        for ip in remotes {
            let ip = as_v6(ip);
            if k.remotes.back() == Some(&ip) {
                continue;
            }
            if let Some(i) = k.remotes.iter().position(|r| *r == ip) {
                k.remotes.remove(i);
            }
            if k.remotes.len() == REMOTES {
                k.remotes.pop_front();
            }
            k.remotes.push_back(ip);
        }
    }

    /// The 4-tuples (local, remote) that garbled `flow` may stand for, as far
    /// as the namespace is known: at most `max` (up to [`MANY`]), the peers
    /// seen last first.
    pub fn candidates(&self, flow: &FlowSpec, max: usize) -> Vec<(SocketAddr, SocketAddr)> {
        let (want_local, want_remote) = (prefix64(flow.dst.ip()), prefix64(flow.src.ip()));
        let fits = |ip: &&Ipv6Addr, want: [u8; 8]| prefix64(IpAddr::V6(**ip)) == want;
        let k = self.known();
        let locals: Vec<Ipv6Addr> = k.locals.iter().filter(|ip| fits(ip, want_local)).copied().collect();
        let mut remotes: Vec<Ipv6Addr> =
            k.remotes.iter().rev().filter(|ip| fits(ip, want_remote)).copied().collect();
        for own in k.locals.iter().filter(|ip| fits(ip, want_remote)) {
            if !remotes.contains(own) {
                remotes.push(*own);
            }
        }
        drop(k);
        let sock = |ip: Ipv6Addr, port| SocketAddr::new(IpAddr::V6(ip), port);
        let mut out = Vec::new();
        'all: for r in &remotes {
            for l in &locals {
                if out.len() == max.min(MANY) {
                    break 'all;
                }
                out.push((sock(*l, flow.dst.port()), sock(*r, flow.src.port())));
            }
        }
        out
    }
}

/// The addresses of every interface of network namespace `ns` (an nsfs
/// fd): one `RTM_GETADDR` dump from a short-lived thread that enters it.
/// Read right here when this thread is in it already (no privilege needed).
pub fn read_addresses(ns: BorrowedFd<'_>) -> Result<Vec<IpAddr>, String> {
    let inode = |fd: BorrowedFd<'_>| nix::sys::stat::fstat(fd).map(|s| s.st_ino).ok();
    let own = nix::sys::stat::stat("/proc/thread-self/ns/net").map(|s| s.st_ino).ok();
    if own.is_some() && own == inode(ns) {
        return addresses_here();
    }
    let raw = ns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: `raw` stays open for the scope (borrowed by the caller).
            let ns = unsafe { BorrowedFd::borrow_raw(raw) };
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())?;
            addresses_here()
        })
        .join()
        .unwrap_or_else(|_| Err("the address reader failed".to_string()))
    })
}

/// The addresses of the calling thread's network namespace.
fn addresses_here() -> Result<Vec<IpAddr>, String> {
    let mut conn = NlConn::open(neli::consts::socket::NlFamily::Route).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for payload in conn.transact(&rtnl::getaddr_dump()).map_err(|e| e.to_string())? {
        if let Some(a) = rtnl::parse_addr(&payload).map_err(|e| e.to_string())? {
            out.push(a.addr);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn garbled(src: &str, dst: &str) -> FlowSpec {
        FlowSpec { src: src.parse().unwrap(), dst: dst.parse().unwrap() }
    }

    #[test]
    fn candidates_pair_own_addresses_with_peers_of_the_same_prefixes() {
        let s = FlowSpace { known: Mutex::default() };
        assert!(s.stale(false), "never read");
        s.set_locals([
            "fd00:1::1".parse().unwrap(),
            "fd00:1::2".parse().unwrap(),
            "fd00:9::1".parse().unwrap(),
        ]);
        assert!(!s.stale(true), "read just now");
        s.learn([IpAddr::V6(v6("fd00:2::7")), IpAddr::V6(v6("fd00:3::7")), IpAddr::V6(v6("fd00:2::8"))]);
        let f = garbled("[fd00:2::dead:beef:1:2]:40001", "[fd00:1::ffff:1234:0:1]:5000");
        let c = s.candidates(&f, MANY);
        let sa = |ip: &str, p: u16| SocketAddr::new(IpAddr::V6(v6(ip)), p);
        assert_eq!(
            c,
            [
                (sa("fd00:1::1", 5000), sa("fd00:2::8", 40001)),
                (sa("fd00:1::2", 5000), sa("fd00:2::8", 40001)),
                (sa("fd00:1::1", 5000), sa("fd00:2::7", 40001)),
                (sa("fd00:1::2", 5000), sa("fd00:2::7", 40001)),
            ],
            "the peer seen last first; fd00:3:: and fd00:9:: do not fit"
        );
        assert_eq!(s.candidates(&f, 3).len(), 3);
        // A connection inside the namespace: its peer is one of its own addresses.
        let inside = garbled("[fd00:1::77:1]:40001", "[fd00:1::88:2]:5000");
        assert_eq!(s.candidates(&inside, MANY).len(), 2 * 2);
    }

    #[test]
    fn peers_are_bounded_and_the_last_seen_kept() {
        let s = FlowSpace { known: Mutex::default() };
        let peer = |i: u32| IpAddr::V6(Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, (i >> 16) as u16, i as u16));
        s.learn((0..REMOTES as u32 + 10).map(peer));
        s.learn([peer(3)]);
        let k = s.known();
        assert_eq!(k.remotes.len(), REMOTES);
        assert_eq!(k.remotes.back(), Some(&as_v6(peer(3))), "seen again: last");
        assert!(!k.remotes.contains(&as_v6(peer(0))), "the oldest went");
    }

    #[test]
    fn a_namespace_is_one_space_while_held() {
        let a = FlowSpace::of(u64::MAX - 7);
        let b = FlowSpace::of(u64::MAX - 7);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &FlowSpace::of(u64::MAX - 8)));
    }

    #[test]
    fn the_own_namespace_lists_its_loopback_address() {
        let ns = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let addrs = read_addresses(ns.as_fd()).unwrap();
        assert!(addrs.contains(&"127.0.0.1".parse().unwrap()), "{addrs:?}");
    }
}
