//! The NCCL plugin's IPv6 requests, for the repair tests: flows named with
//! the first 8 bytes of each address and fresh garbage after them, and two
//! network namespaces joined by a veth pair in one /64. Root only.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use tcpx_rxdm::wire::client;
use tcpx_rxdm::wire::proto::UnixSocketProto;

use super::netns::Netns;
use super::{metric, Daemon};

pub const GPU_A: &str = "0000:04:00.0";
pub const RX: &str = "fd00:77:1:2::1";
pub const TX: &str = "fd00:77:1:2::2";
/// A second, third and fourth address of the receiving side, in the same /64.
pub const RX2: &str = "fd00:77:1:2::3";
pub const RX3: &str = "fd00:77:1:2::4";
pub const RX4: &str = "fd00:77:1:2::5";
/// A second address of the sending side, in the same /64.
pub const TX2: &str = "fd00:77:1:2::6";
/// An address of the /64 that no interface has: a connect to it stays SYN-SENT.
pub const NOWHERE: &str = "fd00:77:1:2::99";
pub const PERMISSION_DENIED: i32 = 7;
pub const FAILED_PRECONDITION: i32 = 9;
pub const UNAVAILABLE: i32 = 14;

/// `a` with its last 8 address bytes replaced by fresh garbage.
pub fn garble(a: SocketAddr) -> SocketAddr {
    let IpAddr::V6(v6) = a.ip() else { panic!("an IPv6 end: {a}") };
    let mut b = v6.octets();
    let mut junk = [0u8; 8];
    getrandom(&mut junk);
    b[8..].copy_from_slice(&junk);
    SocketAddr::new(IpAddr::V6(Ipv6Addr::from(b)), a.port())
}

fn getrandom(buf: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom").unwrap().read_exact(buf).unwrap();
}

/// The plugin's request for the accepted socket with ends `local`/`remote`:
/// src the peer, dst the local end, both garbled anew.
pub fn plugin_rule(local: SocketAddr, remote: SocketAddr, gpu: &str) -> UnixSocketProto {
    let (src, dst) = (garble(remote), garble(local));
    assert_ne!((src, dst), (remote, local));
    client::rule_request(
        5,
        (&src.ip().to_string(), src.port() as i32),
        (&dst.ip().to_string(), dst.port() as i32),
        Some(gpu),
        None,
    )
}

/// The booked rules: (src, dst, repaired).
pub fn booked(d: &Daemon) -> Vec<(String, String, bool)> {
    let text = |v: &serde_json::Value| v.as_str().unwrap().to_string();
    d.flows_of_all_nics("rules")
        .iter()
        .map(|r| (text(&r["src"]), text(&r["dst"]), r["repaired"] == true))
        .collect()
}

/// What the simulated NICs themselves hold: each rule as JSON text.
pub fn on_nic(d: &Daemon) -> Vec<String> {
    d.flows_of_all_nics("nic_rules").iter().map(|r| r.to_string()).collect()
}

/// A metric of the daemon's, which must be there.
pub fn counter(d: &Daemon, series: &str) -> f64 {
    let (_, body) = d.http_get("/metrics");
    metric(&body, series).unwrap_or_else(|| panic!("{series} missing"))
}

pub fn repaired(d: &Daemon, op: &str) -> f64 {
    counter(d, &format!("tcpx_rxdm_ipv6_flows_repaired_total{{op=\"{op}\"}}"))
}

/// Two namespaces joined by a veth pair: the receiving side (`RX` to `RX4`)
/// and the sending side (`TX`, `TX2`), one /64.
pub fn link() -> (Netns, Netns) {
    let (rx, tx) = (Netns::new("v6rx"), Netns::new("v6tx"));
    rx.add_veth("v6r", "v6t", None);
    rx.ip(&["link", "set", "v6t", "netns", tx.name()]);
    tx.ip(&["link", "set", "v6t", "up"]);
    for a in [RX, RX2, RX3, RX4] {
        rx.ip(&["addr", "add", &format!("{a}/64"), "dev", "v6r", "nodad"]);
    }
    for a in [TX, TX2] {
        tx.ip(&["addr", "add", &format!("{a}/64"), "dev", "v6t", "nodad"]);
    }
    rx.wait_oper_up("v6r");
    (rx, tx)
}
