use super::*;
use std::net::{TcpListener, TcpStream};

#[test]
fn layouts_match_the_kernel_structs() {
    // struct inet_diag_sockid: 2 + 2 + 16 + 16 + 4 + 8.
    assert_eq!(SOCKID, 48);
    // struct inet_diag_req_v2: 4 bytes of u8s, u32 states, sockid.
    assert_eq!(REQ_V2, 56);
    // struct inet_diag_msg: 4 bytes of u8s, sockid, 5 × u32.
    assert_eq!(DIAG_MSG, 72);
    let local: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let remote: SocketAddr = "10.0.0.2:40001".parse().unwrap();
    let m = lookup_request(local, remote, 7);
    assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 72);
    assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), SOCK_DIAG_BY_FAMILY);
    assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), libc::NLM_F_REQUEST as u16, "no DUMP flag");
    assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
    assert_eq!(m[16], libc::AF_INET as u8);
    assert_eq!(m[17], libc::IPPROTO_TCP as u8);
    // The socket id: ports big-endian, local first.
    assert_eq!(&m[24..26], &5000u16.to_be_bytes());
    assert_eq!(&m[26..28], &40001u16.to_be_bytes());
    assert_eq!(&m[28..32], &[10, 0, 0, 1]);
    assert_eq!(&m[44..48], &[10, 0, 0, 2]);
    assert_eq!(&m[64..72], &[0xff; 8], "no cookie");
}

#[test]
fn answers_that_name_another_tuple_or_a_listener_are_not_the_socket() {
    let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let remote: SocketAddr = "127.0.0.1:40001".parse().unwrap();
    let answer = |state: u8, remote_port: u16| {
        let mut b = vec![0u8; NLMSG_HDR + DIAG_MSG + 12];
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        let body = &mut b[NLMSG_HDR..];
        body[0] = libc::AF_INET as u8;
        body[1] = state;
        body[4..6].copy_from_slice(&5000u16.to_be_bytes());
        body[6..8].copy_from_slice(&remote_port.to_be_bytes());
        body[8..12].copy_from_slice(&[127, 0, 0, 1]);
        body[24..28].copy_from_slice(&[127, 0, 0, 1]);
        body[DIAG_MSG..DIAG_MSG + 2].copy_from_slice(&12u16.to_ne_bytes());
        body[DIAG_MSG + 2..DIAG_MSG + 4].copy_from_slice(&INET_DIAG_CGROUP_ID.to_ne_bytes());
        body[DIAG_MSG + 4..DIAG_MSG + 12].copy_from_slice(&99u64.to_ne_bytes());
        b
    };
    let found = parse_answer(&answer(1, 40001), local, remote).unwrap().unwrap();
    assert_eq!((found.state, found.cgroup_id), (1, Some(99)));
    assert_eq!(parse_answer(&answer(TCP_LISTEN, 40001), local, remote).unwrap(), None);
    assert_eq!(parse_answer(&answer(1, 40002), local, remote).unwrap(), None);
    let mut enoent = vec![0u8; NLMSG_HDR + 20];
    let n = enoent.len() as u32;
    enoent[0..4].copy_from_slice(&n.to_ne_bytes());
    enoent[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
    enoent[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
    assert_eq!(parse_answer(&enoent, local, remote).unwrap(), None);
    enoent[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
    assert_eq!(parse_answer(&enoent, local, remote), Err(DiagError::Sys(Errno::EPERM)));
    // Codes no errno negates to (found by the netlink fuzz target: i32::MIN overflowed).
    for bad in [i32::MIN, 5] {
        enoent[16..20].copy_from_slice(&bad.to_ne_bytes());
        assert!(matches!(parse_answer(&enoent, local, remote), Err(DiagError::Malformed(_))), "{bad}");
    }
    assert!(parse_answer(&enoent[..10], local, remote).is_err());
}

/// The cgroup v2 id of this process: the inode of its cgroup's folder.
fn own_cgroup_id() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let root = mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    std::fs::metadata(format!("{root}{path}")).ok().map(|m| m.ino())
}

#[test]
fn finds_a_loopback_connection_and_its_cgroup() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, peer) = listener.accept().unwrap();
    let mut diag = SockDiag::open().unwrap();
    // From the server's side: local is the listener's address, remote the client's.
    let local = server.local_addr().unwrap();
    let found = diag.find_tcp(local, peer).unwrap().expect("the accepted socket");
    assert_eq!(found.state, 1, "established");
    if let Some(id) = own_cgroup_id() {
        assert_eq!(found.cgroup_id, Some(id), "the socket's cgroup is this process's");
    }
    // The client's end, seen the other way round.
    assert!(diag.find_tcp(client.local_addr().unwrap(), local).unwrap().is_some());
    // A tuple nobody holds; and one that only the listener's port matches.
    let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert_eq!(diag.find_tcp(local, nobody).unwrap(), None);
    drop((client, server));
}

#[test]
fn finds_an_ipv4_connection_on_a_dual_stack_socket() {
    // A listener on [::] without IPV6_V6ONLY takes IPv4 connections as
    // v4-mapped IPv6 sockets; the flow is still named in IPv4, as packets carry it.
    let Ok(listener) = TcpListener::bind("[::]:0") else { return };
    let port = listener.local_addr().unwrap().port();
    let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (server, peer) = listener.accept().unwrap();
    assert!(peer.ip().to_string().starts_with("::ffff:"), "a dual-stack socket: {peer}");
    let local = SocketAddr::from(([127, 0, 0, 1], port));
    let remote = client.local_addr().unwrap();
    let mut diag = SockDiag::open().unwrap();
    let found = diag.find_tcp(local, remote).unwrap().expect("the accepted dual-stack socket");
    assert_eq!(found.state, 1, "established");
    // Asked in its mapped form, it is the same socket.
    let mapped = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    };
    assert_eq!(diag.find_tcp(mapped(local), mapped(remote)).unwrap(), Some(found));
    // And another port still finds nothing.
    assert_eq!(diag.find_tcp(local, SocketAddr::from(([127, 0, 0, 1], 1))).unwrap(), None);
    drop(server);
}

#[test]
fn finds_an_ipv6_connection() {
    let Ok(listener) = TcpListener::bind("[::1]:0") else { return };
    let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, peer) = listener.accept().unwrap();
    let mut diag = SockDiag::open().unwrap();
    let found = diag.find_tcp(server.local_addr().unwrap(), peer).unwrap();
    assert!(found.is_some_and(|s| s.state == 1));
}

#[test]
fn a_dump_by_ports_finds_the_connection_and_only_it() {
    let Ok(listener) = TcpListener::bind("[::1]:0") else { return };
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, peer) = listener.accept().unwrap();
    let mut diag = SockDiag::open().unwrap();
    let local = server.local_addr().unwrap();
    let found = diag.by_ports(local.port(), peer.port()).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].local, found[0].remote), (local, peer));
    assert_eq!(found[0].socket.state, 1, "established");
    // The client's end, the other way round; a port pair nobody uses.
    let back = diag.by_ports(peer.port(), local.port()).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].local, client.local_addr().unwrap());
    assert!(diag.by_ports(local.port(), 1).unwrap().is_empty());
    // The socket still answers exact lookups after a dump.
    assert!(diag.find_tcp(local, peer).unwrap().is_some());
}

/// A dump answer of `msgs` (state, local port, remote port) then DONE, all of sequence `seq`.
fn dump_answer(seq: u32, msgs: &[(u8, u16, u16)]) -> Vec<u8> {
    let mut b = Vec::new();
    for &(state, lp, rp) in msgs {
        let mut m = vec![0u8; NLMSG_HDR + DIAG_MSG];
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        let body = &mut m[NLMSG_HDR..];
        body[0] = libc::AF_INET6 as u8;
        body[1] = state;
        body[4..6].copy_from_slice(&lp.to_be_bytes());
        body[6..8].copy_from_slice(&rp.to_be_bytes());
        body[8..24].copy_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        body[24..40].copy_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        b.extend(m);
    }
    let mut done = vec![0u8; NLMSG_HDR + 4];
    let n = done.len() as u32;
    done[0..4].copy_from_slice(&n.to_ne_bytes());
    done[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
    done[8..12].copy_from_slice(&seq.to_ne_bytes());
    b.extend(done);
    b
}

#[test]
fn a_dump_answer_keeps_held_sockets_of_the_ports_and_ends_at_done() {
    let m = ports_request(5000, 40001, 9);
    assert_eq!(
        u16::from_ne_bytes(m[6..8].try_into().unwrap()),
        (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16
    );
    assert_eq!(m[16], libc::AF_INET6 as u8);
    assert_eq!(&m[24..26], &5000u16.to_be_bytes());
    assert_eq!(&m[26..28], &40001u16.to_be_bytes());
    let states = u32::from_ne_bytes(m[20..24].try_into().unwrap());
    assert_eq!(states & (1 << TCP_LISTEN), 0, "no listeners asked for");
    assert_ne!(states & (1 << 1), 0, "established asked for");

    let mut out = Vec::new();
    let buf = dump_answer(9, &[(1, 5000, 40001), (TCP_LISTEN, 5000, 0), (1, 5000, 40002), (8, 5000, 40001)]);
    assert!(parse_dump(&buf, 9, (5000, 40001), &mut out).unwrap(), "done");
    assert_eq!(out.len(), 2, "the listener and the other port are left out: {out:?}");
    assert_eq!(out[1].socket.state, 8);
    assert_eq!(out[0].local, "[fd00::1]:5000".parse().unwrap());
    // Another request's messages are skipped; a buffer without DONE is not the end.
    let mut out = Vec::new();
    let stale = dump_answer(8, &[(1, 5000, 40001)]);
    assert!(!parse_dump(&stale[..NLMSG_HDR + DIAG_MSG], 9, (5000, 40001), &mut out).unwrap());
    assert!(parse_dump(&stale, 9, (5000, 40001), &mut out).is_ok_and(|done| !done) && out.is_empty());
    // Truncated and lying lengths are errors, never a panic.
    assert!(parse_dump(&buf[..NLMSG_HDR + 10], 9, (5000, 40001), &mut Vec::new()).is_err());
    let mut bad = buf.clone();
    bad[0..4].copy_from_slice(&9999u32.to_ne_bytes());
    assert!(parse_dump(&bad, 9, (5000, 40001), &mut Vec::new()).is_err());
}

#[test]
fn many_lookups_at_once_answer_each_as_one_would() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, peer) = listener.accept().unwrap();
    let local = server.local_addr().unwrap();
    let mut diag = SockDiag::open().unwrap();
    let tuples: Vec<(SocketAddr, SocketAddr)> = (0..MANY)
        .map(|i| match i % 5 {
            0 => (local, peer),
            _ => (local, SocketAddr::from(([10, 9, (i >> 8) as u8, i as u8], 1000 + i as u16))),
        })
        .collect();
    let many = diag.find_many(&tuples);
    assert_eq!(many.len(), MANY);
    for (i, (got, t)) in many.iter().zip(&tuples).enumerate() {
        let one = diag.find_tcp(t.0, t.1).unwrap();
        assert_eq!(got.as_ref().unwrap(), &one, "lookup {i}");
        assert_eq!(one.is_some(), i % 5 == 0, "lookup {i}");
    }
    assert!(diag.find_many(&[]).is_empty());
}
