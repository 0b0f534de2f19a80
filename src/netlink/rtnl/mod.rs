//! rtnetlink messages (pure): address, link and route dumps, the route
//! replace that host tuning uses, and parsers for what the kernel sends back
//! or multicasts. Numbers from the uapi `rtnetlink.h`, `if_addr.h`,
//! `if_link.h`; struct layouts: `ifinfomsg` 16 bytes, `ifaddrmsg` 8, `rtmsg` 12.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use neli::consts::nl::NlmF;
use neli::consts::rtnl::{RtAddrFamily, RtScope, RtTable, Rtn, Rtprot};
use neli::rtnl::{IfaddrmsgBuilder, IfinfomsgBuilder, RtmsgBuilder};

use super::{attr, attrs_bytes, ne_u32, to_bytes, AttrSet, NlError, NlRequest};

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_GETROUTE: u16 = 26;

pub const RTMGRP_LINK: u32 = 0x1;
pub const RTMGRP_IPV4_IFADDR: u32 = 0x10;
pub const RTMGRP_IPV6_IFADDR: u32 = 0x100;

pub const IFF_UP: u32 = 0x1;
pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_OPERSTATE: u16 = 16;
/// `IF_OPER_UP` in RFC 2863 operstate numbering.
pub const IF_OPER_UP: u8 = 6;

pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;

pub const RTA_DST: u16 = 1;
pub const RTA_OIF: u16 = 4;
pub const RTA_METRICS: u16 = 8;
pub const RTA_CACHEINFO: u16 = 12;
pub const RTA_TABLE: u16 = 15;
pub const RTA_MFC_STATS: u16 = 17;
pub const RTA_EXPIRES: u16 = 23;
pub const RTA_UID: u16 = 25;
pub const RTAX_INITCWND: u16 = 11;
pub const RTAX_RTO_MIN: u16 = 13;
pub const RTAX_QUICKACK: u16 = 15;
pub const RT_TABLE_MAIN: u32 = 254;
pub const RTN_UNICAST: u8 = 1;
/// The only `rtm_flags` bit a route add accepts back from a dump (the kernel
/// refuses DEAD/LINKDOWN, the rest are reply-only).
pub const RTNH_F_ONLINK: u32 = 4;

const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;

/// Dump of every address of every interface.
pub fn getaddr_dump() -> NlRequest {
    let msg = IfaddrmsgBuilder::default()
        .ifa_family(RtAddrFamily::Unspecified)
        .ifa_prefixlen(0)
        .ifa_scope(RtScope::Universe)
        .ifa_index(0)
        .build()
        .expect("all fields set");
    NlRequest { nl_type: RTM_GETADDR, flags: NlmF::DUMP, payload: to_bytes(&msg) }
}

/// Dump of every link.
pub fn getlink_dump() -> NlRequest {
    let msg = IfinfomsgBuilder::default().ifi_family(RtAddrFamily::Unspecified).build().expect("family set");
    NlRequest { nl_type: RTM_GETLINK, flags: NlmF::DUMP, payload: to_bytes(&msg) }
}

/// Dump of the routes of one family (`AF_INET` or `AF_INET6`).
pub fn getroute_dump(v6: bool) -> NlRequest {
    let msg = RtmsgBuilder::default()
        .rtm_family(if v6 { RtAddrFamily::Inet6 } else { RtAddrFamily::Inet })
        .rtm_dst_len(0)
        .rtm_src_len(0)
        .rtm_tos(0)
        .rtm_table(RtTable::Unspec)
        .rtm_protocol(Rtprot::Unspec)
        .rtm_scope(RtScope::Universe)
        .rtm_type(Rtn::Unspec)
        .build()
        .expect("all fields set");
    NlRequest { nl_type: RTM_GETROUTE, flags: NlmF::DUMP, payload: to_bytes(&msg) }
}

/// One address of one interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrMsg {
    pub index: u32,
    pub prefixlen: u8,
    pub addr: IpAddr,
}

fn ip_from(family: u8, b: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => <[u8; 4]>::try_from(b).ok().map(|o| Ipv4Addr::from(o).into()),
        AF_INET6 => <[u8; 16]>::try_from(b).ok().map(|o| Ipv6Addr::from(o).into()),
        _ => None,
    }
}

/// An RTM_NEWADDR/DELADDR payload; `None` for families other than IPv4/IPv6.
/// `IFA_LOCAL` is the interface's own address (`IFA_ADDRESS` is the peer on
/// point-to-point links), so it wins when both are present.
pub fn parse_addr(payload: &[u8]) -> Result<Option<AddrMsg>, NlError> {
    let hdr = payload.get(..8).ok_or_else(|| NlError::malformed("ifaddrmsg too short"))?;
    let (family, prefixlen) = (hdr[0], hdr[1]);
    let index = u32::from_ne_bytes(hdr[4..8].try_into().expect("4 bytes"));
    let attrs = AttrSet::parse(&payload[8..])?;
    let raw = attrs.get(IFA_LOCAL).or_else(|| attrs.get(IFA_ADDRESS));
    Ok(raw.and_then(|b| ip_from(family, b)).map(|addr| AddrMsg { index, prefixlen, addr }))
}

/// The parts of an RTM_NEWLINK/DELLINK payload the monitor looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMsg {
    pub index: u32,
    pub flags: u32,
    pub name: Option<String>,
    pub operstate: Option<u8>,
}

impl LinkMsg {
    pub fn admin_up(&self) -> bool {
        self.flags & IFF_UP != 0
    }
}

pub fn parse_link(payload: &[u8]) -> Result<LinkMsg, NlError> {
    let hdr = payload.get(..16).ok_or_else(|| NlError::malformed("ifinfomsg too short"))?;
    let index = u32::from_ne_bytes(hdr[4..8].try_into().expect("4 bytes"));
    let flags = u32::from_ne_bytes(hdr[8..12].try_into().expect("4 bytes"));
    let attrs = AttrSet::parse(&payload[16..])?;
    Ok(LinkMsg { index, flags, name: attrs.string(IFLA_IFNAME), operstate: attrs.u8(IFLA_OPERSTATE) })
}

/// A route as dumped: the raw `rtmsg` header and its attributes, kept whole
/// so that a replace puts back everything but what we change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub header: [u8; 12],
    pub attrs: Vec<(u16, Vec<u8>)>,
}

pub fn parse_route(payload: &[u8]) -> Result<Route, NlError> {
    let header: [u8; 12] =
        payload.get(..12).ok_or_else(|| NlError::malformed("rtmsg too short"))?.try_into().expect("12 bytes");
    let attrs = AttrSet::parse(&payload[12..])?.iter().map(|(t, p)| (t, p.to_vec())).collect();
    Ok(Route { header, attrs })
}

impl Route {
    fn get(&self, t: u16) -> Option<&[u8]> {
        self.attrs.iter().find(|(ty, _)| *ty == t).map(|(_, p)| p.as_slice())
    }

    pub fn family(&self) -> u8 {
        self.header[0]
    }

    /// `RTA_TABLE` when present (tables ≥ 256 only fit there), else `rtm_table`.
    pub fn table(&self) -> u32 {
        self.get(RTA_TABLE).and_then(ne_u32).unwrap_or(u32::from(self.header[4]))
    }

    pub fn route_type(&self) -> u8 {
        self.header[7]
    }

    /// Unicast routes of the main table: the ones `ip route show` lists and
    /// the reference tuned.
    pub fn is_tunable(&self) -> bool {
        self.table() == RT_TABLE_MAIN && self.route_type() == RTN_UNICAST
    }

    /// The `RTAX_*` metrics as `(type, payload)`.
    pub fn metrics(&self) -> Vec<(u16, Vec<u8>)> {
        self.get(RTA_METRICS)
            .and_then(|b| AttrSet::parse(b).ok())
            .map(|m| m.iter().map(|(t, p)| (t, p.to_vec())).collect())
            .unwrap_or_default()
    }

    /// A u32 metric (`RTAX_INITCWND` …), if set.
    pub fn metric(&self, t: u16) -> Option<u32> {
        self.metrics().into_iter().find(|(ty, _)| *ty == t).and_then(|(_, p)| ne_u32(&p))
    }

    /// The same route with the u32 metrics in `set` replaced or added.
    pub fn with_metrics(&self, set: &[(u16, u32)]) -> Route {
        let mut metrics: Vec<(u16, Vec<u8>)> =
            self.metrics().into_iter().filter(|(t, _)| !set.iter().any(|(s, _)| s == t)).collect();
        metrics.extend(set.iter().map(|(t, v)| (*t, v.to_ne_bytes().to_vec())));
        metrics.sort_by_key(|(t, _)| *t);
        let nest = attrs_bytes(metrics.iter().map(|(t, p)| attr(*t, p)).collect());
        let mut attrs: Vec<(u16, Vec<u8>)> =
            self.attrs.iter().filter(|(t, _)| *t != RTA_METRICS).cloned().collect();
        attrs.push((RTA_METRICS, nest));
        Route { header: self.header, attrs }
    }

    /// RTM_NEWROUTE with NLM_F_REPLACE (and no NLM_F_CREATE: a route that
    /// vanished meanwhile is not re-created) carrying this route whole. Reply-
    /// only attributes are dropped and reply-only flags cleared.
    pub fn replace_request(&self) -> NlRequest {
        let mut header = self.header;
        let flags = u32::from_ne_bytes(header[8..12].try_into().expect("4 bytes")) & RTNH_F_ONLINK;
        header[8..12].copy_from_slice(&flags.to_ne_bytes());
        let keep = |t: &u16| ![RTA_CACHEINFO, RTA_MFC_STATS, RTA_UID, RTA_EXPIRES].contains(t);
        let attrs = self
            .attrs
            .iter()
            .filter(|(t, _)| keep(t))
            // RTA_METRICS goes back as a plain nest, as the kernel dumps it.
            .map(|(t, p)| attr(*t, p))
            .collect();
        let mut payload = header.to_vec();
        payload.extend(attrs_bytes(attrs));
        NlRequest { nl_type: RTM_NEWROUTE, flags: NlmF::ACK | NlmF::REPLACE, payload }
    }

    /// `dst/len` (or `default`) and the output interface index, for logs.
    pub fn describe(&self) -> String {
        let dst = self.get(RTA_DST).and_then(|b| ip_from(self.family(), b));
        let oif = self.get(RTA_OIF).and_then(ne_u32);
        let dst = match dst {
            Some(ip) => format!("{ip}/{}", self.header[1]),
            None => "default".to_string(),
        };
        match oif {
            Some(i) => format!("{dst} oif {i}"),
            None => dst,
        }
    }
}

#[cfg(all(test, target_endian = "little"))]
mod tests;
