//! Golden bytes for the rtnetlink requests we send, and parsing of
//! hand-built kernel messages.

use super::*;
use crate::netlink::{attr_str, attr_u32, attr_u8};

/// nlmsghdr with flags REQUEST|DUMP (0x0301), seq 9, pid 0.
fn dump_hdr(len: u32, ty: u16) -> Vec<u8> {
    [&len.to_le_bytes()[..], &ty.to_le_bytes(), &[0x01, 0x03], &9u32.to_le_bytes(), &[0, 0, 0, 0]].concat()
}

#[test]
fn dump_requests_golden() {
    // RTM_GETADDR (22) + ifaddrmsg: family AF_UNSPEC, prefixlen, flags, scope, index u32 — all 0.
    let want = [dump_hdr(24, 22), vec![0, 0, 0, 0, 0, 0, 0, 0]].concat();
    assert_eq!(getaddr_dump().to_bytes(9), want);
    // RTM_GETLINK (18) + ifinfomsg: family, pad, type u16, index i32, flags u32, change u32 — all 0.
    let want = [dump_hdr(32, 18), vec![0; 16]].concat();
    assert_eq!(getlink_dump().to_bytes(9), want);
    // RTM_GETROUTE (26) + rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags u32.
    let want = [dump_hdr(28, 26), vec![2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]].concat(); // AF_INET = 2
    assert_eq!(getroute_dump(false).to_bytes(9), want);
    let want = [dump_hdr(28, 26), vec![10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]].concat(); // AF_INET6 = 10
    assert_eq!(getroute_dump(true).to_bytes(9), want);
}

/// `10.9.0.0/24 dev ifindex 3 proto kernel scope link src 10.9.0.1`, as the
/// kernel dumps it (with the LINKDOWN flag and an existing metric).
fn kernel_route() -> Vec<u8> {
    #[rustfmt::skip]
    let hdr = vec![
        2, 24, 0, 0,      // AF_INET, dst_len 24, src_len 0, tos 0
        254, 2, 253, 1,   // table main, proto kernel, scope link, type unicast
        16, 0, 0, 0,      // rtm_flags: RTNH_F_LINKDOWN (reply-only)
    ];
    let attrs = attrs_bytes(vec![
        attr_u32(RTA_TABLE, 254),
        attr(RTA_DST, &[10, 9, 0, 0]),
        attr(7, &[10, 9, 0, 1]), // RTA_PREFSRC
        attr_u32(RTA_OIF, 3),
        attr(RTA_METRICS, &attrs_bytes(vec![attr_u32(2, 1400)])), // RTAX_MTU 1400
        attr(RTA_CACHEINFO, &[0; 16]),
    ]);
    [hdr, attrs].concat()
}

#[test]
fn route_replace_golden() {
    let r = parse_route(&kernel_route()).unwrap();
    assert!(r.is_tunable());
    assert_eq!(r.describe(), "10.9.0.0/24 oif 3");
    assert_eq!(r.metric(2), Some(1400));
    let tuned = r.with_metrics(&[(RTAX_INITCWND, 128), (RTAX_RTO_MIN, 2), (RTAX_QUICKACK, 1)]);
    assert_eq!(tuned.metric(RTAX_INITCWND), Some(128));
    #[rustfmt::skip]
    let want: Vec<u8> = [
        vec![96, 0, 0, 0,  24, 0,  0x05, 0x01,  1, 0, 0, 0,  0, 0, 0, 0],
                           // nlmsghdr: 96 bytes, RTM_NEWROUTE, REQUEST|ACK|REPLACE (0x0105), seq 1
        vec![2, 24, 0, 0,  254, 2, 253, 1,  0, 0, 0, 0],
                           // rtmsg as dumped, flags cleared (LINKDOWN is refused on input)
        vec![8, 0, 15, 0,  254, 0, 0, 0],     // RTA_TABLE 254
        vec![8, 0, 1, 0,  10, 9, 0, 0],       // RTA_DST 10.9.0.0
        vec![8, 0, 7, 0,  10, 9, 0, 1],       // RTA_PREFSRC 10.9.0.1
        vec![8, 0, 4, 0,  3, 0, 0, 0],        // RTA_OIF 3
        vec![36, 0, 8, 0],                    // RTA_METRICS, plain nest as the kernel sends it
        vec![8, 0, 2, 0,  0x78, 0x05, 0, 0],  //   RTAX_MTU 1400 kept
        vec![8, 0, 11, 0,  128, 0, 0, 0],     //   RTAX_INITCWND 128
        vec![8, 0, 13, 0,  2, 0, 0, 0],       //   RTAX_RTO_MIN 2 (ms)
        vec![8, 0, 15, 0,  1, 0, 0, 0],       //   RTAX_QUICKACK 1
                                              // RTA_CACHEINFO dropped: reply-only
    ].concat();
    assert_eq!(tuned.replace_request().to_bytes(1), want);
    // Restoring = the original route whole, metrics as they were.
    let back = r.replace_request().to_bytes(1);
    assert_eq!(&back[16 + 12 + 32..16 + 12 + 32 + 12], &[12, 0, 8, 0, 8, 0, 2, 0, 0x78, 0x05, 0, 0]);
}

#[test]
fn route_filters() {
    let mut local = kernel_route();
    local[4] = 255; // rtm_table local
    local[7] = 2; // RTN_LOCAL
    let mut r = parse_route(&local).unwrap();
    r.attrs.retain(|(t, _)| *t != RTA_TABLE);
    assert!(!r.is_tunable());
    let mut default = parse_route(&kernel_route()).unwrap();
    default.attrs.retain(|(t, _)| *t != RTA_DST);
    assert_eq!(default.describe(), "default oif 3");
    assert_eq!(default.with_metrics(&[]).metrics(), vec![(2, 1400u32.to_le_bytes().to_vec())]);
}

#[test]
fn parses_addresses_and_links() {
    let v4 = [
        vec![2, 24, 0, 0, 5, 0, 0, 0], // AF_INET /24 on ifindex 5
        attrs_bytes(vec![attr(IFA_ADDRESS, &[10, 0, 0, 9]), attr(IFA_LOCAL, &[10, 0, 0, 1])]),
    ]
    .concat();
    let a = parse_addr(&v4).unwrap().unwrap();
    assert_eq!((a.index, a.prefixlen, a.addr), (5, 24, "10.0.0.1".parse().unwrap()));
    let v6 = [
        vec![10, 64, 0, 0, 5, 0, 0, 0],
        attrs_bytes(vec![attr(IFA_ADDRESS, &[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])]),
    ]
    .concat();
    assert_eq!(parse_addr(&v6).unwrap().unwrap().addr, "fe80::1".parse::<IpAddr>().unwrap());
    assert_eq!(parse_addr(&[7, 0, 0, 0, 1, 0, 0, 0]).unwrap(), None); // other family
    assert!(parse_addr(&[2, 0]).is_err());

    let link = [
        vec![0, 0, 1, 0, 4, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0], // ARPHRD_ETHER, ifindex 4, flags BROADCAST (not UP)
        attrs_bytes(vec![attr_str(IFLA_IFNAME, "eth1"), attr_u8(IFLA_OPERSTATE, 2)]),
    ]
    .concat();
    let l = parse_link(&link).unwrap();
    assert_eq!((l.index, l.admin_up(), l.name.as_deref(), l.operstate), (4, false, Some("eth1"), Some(2)));
}
