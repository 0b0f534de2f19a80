//! Unit tests of the flow lookup and the IPv6 repair.
use std::net::{IpAddr, Ipv6Addr, TcpListener, TcpStream};
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
        socket: TcpSocket { state: ESTABLISHED, cgroup_id: Some(cgroup), inode: 1 },
    }
}

fn fit(flow: FlowSpec, cgroup: u64, inode: u32) -> Fit {
    Fit { flow, cgroup, inode }
}

/// `a` with its last 8 bytes replaced by `junk`, as the plugin sends it.
fn garble(a: SocketAddr, junk: u64) -> SocketAddr {
    let IpAddr::V6(v6) = a.ip() else { panic!("IPv6 only") };
    let mut b = v6.octets();
    b[8..].copy_from_slice(&junk.to_be_bytes());
    SocketAddr::new(IpAddr::V6(Ipv6Addr::from(b)), a.port())
}

fn never(_: &[u32]) -> Option<Vec<u32>> {
    panic!("the open files are read only when several of the client's own fit")
}

#[test]
fn a_garbled_request_fits_the_connection_whose_prefixes_agree() {
    let real = FlowSpec { src: addr("[fd00:1:2:3::b]:40001"), dst: addr("[fd00:1:2:4::a]:5000") };
    let sent =
        FlowSpec { src: garble(real.src, 0xdead_beef_0000_0001), dst: garble(real.dst, 0x7fff_0000_1234) };
    assert!(repairable(&sent));
    assert!(crate::types::flow::fits_garbled(&sent, &real));
    let candidates = [
        conn("[fd00:1:2:4::a]:5000", "[fd00:1:2:3::b]:40001", 7),
        // Same ports, another /64 on either side: not it.
        conn("[fd00:1:2:5::a]:5000", "[fd00:1:2:3::b]:40001", 7),
        conn("[fd00:1:2:4::a]:5000", "[fd00:9:2:3::b]:40001", 7),
        // Another port.
        conn("[fd00:1:2:4::a]:5001", "[fd00:1:2:3::b]:40001", 7),
    ];
    let fits = fitting(&sent, &candidates);
    assert_eq!(fits, vec![fit(real, 7, 1)]);
    assert_eq!(choose(fits, None, never), Found::Repaired { flow: real, cgroup: 7 });
}

#[test]
fn only_an_established_connection_a_process_holds_fits() {
    let sent = FlowSpec { src: addr("[fd00::1:2:3:4]:40001"), dst: addr("[fd00::5:6:7:8]:5000") };
    let mut c = conn("[fd00::a]:5000", "[fd00::b]:40001", 7);
    assert_eq!(fitting(&sent, &[c]).len(), 1);
    // SYN-SENT (a decoy's connect that is never answered), SYN-RECV, FIN-WAIT1, TIME-WAIT, CLOSE-WAIT.
    for state in [2, 3, 4, 6, 8] {
        c.socket.state = state;
        assert!(fitting(&sent, &[c]).is_empty(), "state {state}");
    }
    // Established but in a listener's accept queue: no process holds it, no inode.
    c.socket = TcpSocket { state: ESTABLISHED, cgroup_id: Some(7), inode: 0 };
    assert!(fitting(&sent, &[c]).is_empty());
}

#[test]
fn several_fits_are_narrowed_to_the_tenants_then_to_what_its_process_holds() {
    let f = |l: &str, r: &str| FlowSpec { src: addr(r), dst: addr(l) };
    let a = f("[fd00::a]:5000", "[fd00::b]:40001");
    let b = f("[fd00::c]:5000", "[fd00::d]:40001");
    let c = f("[fd00::e]:5000", "[fd00::f]:40001");
    let amb = |v: &[(FlowSpec, u64)]| Found::Ambiguous(v.to_vec());
    assert_eq!(choose(vec![], Some(1), never), Found::Missing);
    // One fit that is another tenant's is still that connection: the flow check refuses it.
    assert_eq!(choose(vec![fit(a, 9, 1)], Some(1), never), Found::Repaired { flow: a, cgroup: 9 });
    // Another tenant's connection never makes the client's request ambiguous.
    assert_eq!(
        choose(vec![fit(a, 1, 1), fit(b, 2, 2)], Some(2), never),
        Found::Repaired { flow: b, cgroup: 2 }
    );
    assert_eq!(
        choose(vec![fit(a, 1, 1), fit(b, 2, 2)], Some(3), never),
        amb(&[(a, 1), (b, 2)]),
        "neither its own"
    );
    // Two of its own: the one its process holds.
    let two = vec![fit(a, 1, 11), fit(b, 1, 12), fit(c, 2, 13)];
    let asked = std::cell::RefCell::new(Vec::new());
    let holds = |held: &'static [u32]| {
        let asked = &asked;
        move |inodes: &[u32]| {
            asked.borrow_mut().extend_from_slice(inodes);
            Some(held.iter().copied().filter(|i| inodes.contains(i)).collect())
        }
    };
    assert_eq!(choose(two.clone(), Some(1), holds(&[12, 13])), Found::Repaired { flow: b, cgroup: 1 });
    assert_eq!(*asked.borrow(), [11, 12], "asked about its own only");
    // Both held, neither held, or its files unreadable: the daemon does not guess.
    let all = amb(&[(a, 1), (b, 1), (c, 2)]);
    assert_eq!(choose(two.clone(), Some(1), holds(&[11, 12])), all);
    assert_eq!(choose(two.clone(), Some(1), holds(&[])), all);
    assert_eq!(choose(two.clone(), Some(1), |_| None), all);
    // Tenant unknown (isolation off): all are its candidates, narrowed by what it holds.
    assert_eq!(choose(two, None, holds(&[13])), Found::Repaired { flow: c, cgroup: 2 });
}

#[test]
fn an_ipv4_connection_on_a_dual_stack_socket_is_repaired_to_ipv4() {
    // Prefix 0::/64 (a v4-mapped address's first 8 bytes), garbage after.
    let sent = FlowSpec { src: addr("[::1234:5678:9abc:def0]:40001"), dst: addr("[::ffff:1:2:3]:5000") };
    let candidates = [conn("[::ffff:10.0.0.1]:5000", "[::ffff:10.0.0.2]:40001", 4)];
    let want = FlowSpec { src: addr("10.0.0.2:40001"), dst: addr("10.0.0.1:5000") };
    assert_eq!(choose(fitting(&sent, &candidates), None, never), Found::Repaired { flow: want, cgroup: 4 });
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
    // ::1 is an address of this namespace: the exact lookups find it, no dump needed.
    assert!(matches!(look(&ns, &sent, None, never), Ok(Some(Found::Repaired { .. }))));
    let nobody = FlowSpec { src: SocketAddr::new(sent.src.ip(), 1), dst: sent.dst };
    assert_eq!(locate(&ns, &nobody, false, None), Ok(Found::Missing));
    assert_eq!(look(&ns, &nobody, None, never), Ok(None), "a dump must say");
    // An IPv4 flow is looked up only for a check.
    let v4 = FlowSpec { src: addr("10.9.9.9:1"), dst: addr("10.9.9.8:2") };
    assert_eq!(locate(&ns, &v4, false, None), Ok(Found::Missing));
    assert_eq!(ns.idle_diag(), 1, "one socket, given back after each lookup");
}

#[test]
fn a_connection_not_yet_accepted_fits_nothing() {
    let Ok(listener) = TcpListener::bind("[::1]:0") else { return };
    // Connected, never accepted: the kernel's child socket waits in the accept queue.
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let queued = FlowSpec { src: client.local_addr().unwrap(), dst: listener.local_addr().unwrap() };
    let sent = FlowSpec { src: garble(queued.src, 0x33), dst: garble(queued.dst, 0x44) };
    let ns = own_netns();
    assert_eq!(look(&ns, &sent, None, never), Ok(None), "found by an exact lookup, but no fit");
    let dumped = dump(&ns, &[(queued.dst.port(), queued.src.port())]).unwrap();
    assert_eq!(dumped.len(), 1, "the dump lists it: {dumped:?}");
    assert_eq!(dumped[0].socket.inode, 0, "held by no process");
    assert!(fitting(&sent, &dumped).is_empty());
    assert_eq!(locate(&ns, &sent, false, None), Ok(Found::Missing));
    // Accepted, it is the connection.
    let (_server, _) = listener.accept().unwrap();
    assert!(matches!(locate(&ns, &sent, false, None), Ok(Found::Repaired { flow, .. }) if flow == queued));
}
