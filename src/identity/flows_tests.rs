//! Unit tests of the flow lookup and the IPv6 repair.
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};

use super::*;
use crate::netlink::sock_diag::TcpSocket;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn conn(local: &str, remote: &str, cgroup: u64) -> Connection {
    Connection {
        local: addr(local),
        remote: addr(remote),
        socket: TcpSocket { state: 1, cgroup_id: Some(cgroup), inode: 1 },
    }
}

/// `a` with its last 8 bytes replaced by `junk`, as the plugin sends it.
fn garble(a: SocketAddr, junk: u64) -> SocketAddr {
    let IpAddr::V6(v6) = a.ip() else { panic!("IPv6 only") };
    let mut b = v6.octets();
    b[8..].copy_from_slice(&junk.to_be_bytes());
    SocketAddr::new(IpAddr::V6(Ipv6Addr::from(b)), a.port())
}

#[test]
fn a_garbled_request_fits_the_connection_whose_prefixes_agree() {
    let real = FlowSpec { src: addr("[fd00:1:2:3::b]:40001"), dst: addr("[fd00:1:2:4::a]:5000") };
    let sent =
        FlowSpec { src: garble(real.src, 0xdead_beef_0000_0001), dst: garble(real.dst, 0x7fff_0000_1234) };
    assert!(repairable(&sent));
    let candidates = [
        conn("[fd00:1:2:4::a]:5000", "[fd00:1:2:3::b]:40001", 7),
        // Same ports, another /64 on either side: not it.
        conn("[fd00:1:2:5::a]:5000", "[fd00:1:2:3::b]:40001", 7),
        conn("[fd00:1:2:4::a]:5000", "[fd00:9:2:3::b]:40001", 7),
    ];
    let fits = fitting(&sent, &candidates);
    assert_eq!(fits, vec![(real, 7)]);
    assert_eq!(choose(fits, None), Found::Repaired { flow: real, cgroup: 7 });
}

#[test]
fn several_fits_are_never_guessed_unless_one_is_the_tenants_own() {
    let f = |l: &str, r: &str| FlowSpec { src: addr(r), dst: addr(l) };
    let a = f("[fd00::a]:5000", "[fd00::b]:40001");
    let b = f("[fd00::c]:5000", "[fd00::d]:40001");
    assert_eq!(choose(vec![], Some(1)), Found::Missing);
    assert_eq!(choose(vec![(a, 1), (b, 2)], None), Found::Ambiguous(vec![(a, 1), (b, 2)]));
    assert_eq!(choose(vec![(a, 1), (b, 1)], Some(1)), Found::Ambiguous(vec![(a, 1), (b, 1)]), "both its own");
    assert_eq!(choose(vec![(a, 1), (b, 2)], Some(2)), Found::Repaired { flow: b, cgroup: 2 });
    assert_eq!(
        choose(vec![(a, 1), (b, 2)], Some(3)),
        Found::Ambiguous(vec![(a, 1), (b, 2)]),
        "neither its own"
    );
    // One fit that is another tenant's is still that connection: the flow check refuses it.
    assert_eq!(choose(vec![(a, 9)], Some(1)), Found::Repaired { flow: a, cgroup: 9 });
}

#[test]
fn an_ipv4_connection_on_a_dual_stack_socket_is_repaired_to_ipv4() {
    // Prefix 0::/64 (a v4-mapped address's first 8 bytes), garbage after.
    let sent = FlowSpec { src: addr("[::1234:5678:9abc:def0]:40001"), dst: addr("[::ffff:1:2:3]:5000") };
    let candidates = [conn("[::ffff:10.0.0.1]:5000", "[::ffff:10.0.0.2]:40001", 4)];
    let want = FlowSpec { src: addr("10.0.0.2:40001"), dst: addr("10.0.0.1:5000") };
    assert_eq!(choose(fitting(&sent, &candidates), None), Found::Repaired { flow: want, cgroup: 4 });
    assert!(!repairable(&want), "an IPv4 request is never repaired");
}

fn own_netns() -> NetNs {
    let fd: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net").unwrap().into();
    let inode = nix::sys::stat::fstat(fd.as_fd()).unwrap().st_ino;
    NetNs::new(inode, fd)
}

#[test]
fn a_real_connection_is_found_exactly_and_by_its_halves() {
    let Ok(listener) = TcpListener::bind("[::1]:0") else { return };
    let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, peer) = listener.accept().unwrap();
    let real = FlowSpec { src: peer, dst: server.local_addr().unwrap() };
    let ns = own_netns();
    assert!(matches!(locate(&ns, &real, true, None), Ok(Found::Exact { .. })));
    // ::1 is 0::/64 + ::1: garbage in its last 8 bytes still has that prefix.
    let sent = FlowSpec { src: garble(real.src, 0x1111), dst: garble(real.dst, 0x2222) };
    match locate(&ns, &sent, false, None).unwrap() {
        Found::Repaired { flow, .. } => assert_eq!(flow, real),
        other => panic!("not repaired: {other:?}"),
    }
    let nobody = FlowSpec { src: SocketAddr::new(sent.src.ip(), 1), dst: sent.dst };
    assert_eq!(locate(&ns, &nobody, false, None), Ok(Found::Missing));
    // An IPv4 flow is looked up only for a check.
    let v4 = FlowSpec { src: addr("10.9.9.9:1"), dst: addr("10.9.9.8:2") };
    assert_eq!(locate(&ns, &v4, false, None), Ok(Found::Missing));
    assert_eq!(ns.idle_diag(), 1, "one socket, given back after each lookup");
}
