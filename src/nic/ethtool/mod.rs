//! The `ethtool` backend: real NICs through ethtool generic netlink (features,
//! private flags, rings, channels, string sets) and the `SIOCETHTOOL` ioctl
//! for what netlink lacks (ntuple rules, RSS indirection, driver stats).
//! Never runs the `ethtool` binary.
//!
//! Sockets are opened in [`EthtoolNic::open`] and belong to the network
//! namespace of the thread that opened them.

pub(crate) mod bitset;
pub mod genl;
pub(crate) mod ioctl;
mod rxnfc;

use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, OnceLock};

use neli::consts::socket::NlFamily;
use nix::errno::Errno;

use self::genl::Channels;
use self::ioctl::{EthtoolIoctl, EthtoolRxnfc, ETH_SS_STATS, RX_CLS_LOC_SPECIAL};
use super::queue_stats::{self, QueueBytes};
use super::{
    DataSplit, FlowSpec, NicCapabilities, NicError, NicInfo, NicOp, NicResult, NicRule, NicSetup,
    RuleControl, RxRing,
};
use crate::netlink::genl::resolve_family;
use crate::netlink::rtnl;
use crate::netlink::{NlConn, NlError, NlRequest};

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum EthtoolError {
    #[error("opening a generic netlink socket: {0}")]
    GenlSocket(#[source] NlError),
    #[error("opening a route netlink socket: {0}")]
    RouteSocket(#[source] NlError),
    #[error("resolving the ethtool netlink family (kernel ≥ 5.6 with CONFIG_ETHTOOL_NETLINK needed): {0}")]
    Family(#[source] NlError),
    #[error("opening the SIOCETHTOOL socket: {0}")]
    IoctlSocket(#[source] Errno),
}

/// Real NIC control. One genl and one rtnetlink socket shared under locks
/// (prime/restore/monitor traffic, not the hot path), one ioctl socket shared
/// without a lock (rule insert/delete: one ioctl each).
#[derive(Debug)]
pub struct EthtoolNic {
    family: u16,
    genl: Mutex<NlConn>,
    route: Mutex<NlConn>,
    ioctl: EthtoolIoctl,
    /// `ETH_SS_FEATURES`: the kernel's feature names, the same for every device.
    feature_names: OnceLock<Vec<String>>,
    /// The netdev family's id, `None` on kernels without it (asked once).
    netdev_family: OnceLock<Option<u16>>,
}

fn nl_err(ifname: &str, op: NicOp, e: NlError) -> NicError {
    let err = NicError::new(ifname, op, e.errno());
    privilege(match e.detail() {
        Some(d) => err.with_detail(d),
        None => err,
    })
}

fn io_err<'a>(ifname: &'a str, op: NicOp, what: &'a str) -> impl FnOnce(Errno) -> NicError + 'a {
    move |e| {
        let err = NicError::new(ifname, op, e);
        privilege(match e {
            Errno::EOPNOTSUPP => err.with_detail(format!("driver does not support {what}")),
            _ => err.with_detail(what.to_string()),
        })
    }
}

/// A refusal (`EPERM`) names the capability: every change of a NIC
/// (ethtool ioctls and netlink, rtnetlink) needs `CAP_NET_ADMIN`, reads need none.
fn privilege(err: NicError) -> NicError {
    if err.errno != Errno::EPERM {
        return err;
    }
    let why = crate::caps::lacking(crate::caps::Cap::NetAdmin);
    let detail = match &err.detail {
        Some(d) => format!("{d}; {why}"),
        None => why,
    };
    err.with_detail(detail)
}

/// Locks one of the netlink sockets. A panic while holding the lock cannot
/// leave the socket half-used in a way the next request does not recover
/// from (stale replies are skipped by sequence number).
fn unpoisoned(conn: &Mutex<NlConn>) -> MutexGuard<'_, NlConn> {
    conn.lock().unwrap_or_else(|p| p.into_inner())
}

impl EthtoolNic {
    /// Opens the sockets and resolves the ethtool family, in the calling
    /// thread's network namespace.
    pub fn open() -> Result<Self, EthtoolError> {
        let mut genl = NlConn::open(NlFamily::Generic).map_err(EthtoolError::GenlSocket)?;
        let family = resolve_family(&mut genl, genl::FAMILY_NAME).map_err(EthtoolError::Family)?;
        let route = NlConn::open(NlFamily::Route).map_err(EthtoolError::RouteSocket)?;
        let ioctl = EthtoolIoctl::open().map_err(EthtoolError::IoctlSocket)?;
        Ok(EthtoolNic {
            family,
            genl: Mutex::new(genl),
            route: Mutex::new(route),
            ioctl,
            feature_names: OnceLock::new(),
            netdev_family: OnceLock::new(),
        })
    }

    fn genl(&self) -> MutexGuard<'_, NlConn> {
        unpoisoned(&self.genl)
    }

    fn ask(&self, ifname: &str, op: NicOp, req: NlRequest) -> NicResult<Vec<Vec<u8>>> {
        self.genl().transact(&req).map_err(|e| nl_err(ifname, op, e))
    }

    /// Channel counts (rx, tx, combined and their maxima).
    pub fn channel_counts(&self, ifname: &str) -> NicResult<Channels> {
        let r = self.ask(ifname, NicOp::Channels, genl::channels_get(self.family, ifname))?;
        genl::parse_channels(&r).map_err(|e| nl_err(ifname, NicOp::Channels, e))
    }

    /// Changes the rx and/or combined channel counts (not used by the daemon,
    /// which never changes queue counts; tests and tools).
    pub fn set_channels(&self, ifname: &str, rx: Option<u32>, combined: Option<u32>) -> NicResult<()> {
        self.ask(ifname, NicOp::Channels, genl::channels_set(self.family, ifname, rx, combined)).map(drop)
    }

    /// Every kernel feature with its state on `ifname`, in bit order (for
    /// snapshots and `/debug`).
    pub fn feature_states(&self, ifname: &str) -> NicResult<Vec<(String, bool)>> {
        let op = NicOp::GetFeature;
        let names = self.feature_names(ifname, op)?;
        let active = self.features(ifname, op)?.active;
        Ok(names.iter().zip(active).map(|(n, on)| (n.clone(), on)).collect())
    }

    fn feature_names(&self, ifname: &str, op: NicOp) -> NicResult<&[String]> {
        if let Some(n) = self.feature_names.get() {
            return Ok(n);
        }
        let r = self.ask(ifname, op, genl::strset_features(self.family, ifname))?;
        let names = genl::parse_strset(&r).map_err(|e| nl_err(ifname, op, e))?;
        Ok(self.feature_names.get_or_init(|| names))
    }

    fn features_index(&self, ifname: &str, op: NicOp, name: &str) -> NicResult<usize> {
        self.feature_names(ifname, op)?.iter().position(|n| n == name).ok_or_else(|| {
            NicError::new(ifname, op, Errno::EOPNOTSUPP).with_detail(format!("kernel has no feature {name}"))
        })
    }

    fn features(&self, ifname: &str, op: NicOp) -> NicResult<genl::Features> {
        let r = self.ask(ifname, op, genl::features_get(self.family, ifname))?;
        genl::parse_features(&r).map_err(|e| nl_err(ifname, op, e))
    }

    fn rings(&self, ifname: &str, op: NicOp) -> NicResult<genl::Rings> {
        let r = self.ask(ifname, op, genl::rings_get(self.family, ifname))?;
        genl::parse_rings(&r).map_err(|e| nl_err(ifname, op, e))
    }

    fn rxnfc(&self, ifname: &str, op: NicOp, what: &str, nfc: &mut EthtoolRxnfc) -> NicResult<()> {
        self.ioctl.rxnfc(ifname, nfc).map_err(io_err(ifname, op, what))
    }

    /// GRXCLSRLCNT: `(rules installed, table size)`.
    /// Every driver statistic: names and values, index for index (both empty
    /// when the driver has none).
    fn all_stats(&self, ifname: &str) -> NicResult<(Vec<String>, Vec<u64>)> {
        let err = io_err(ifname, NicOp::Stat, "driver statistics (ETHTOOL_GSTATS)");
        let Some(count) = self.ioctl.sset_count(ifname, ETH_SS_STATS).map_err(err)? else {
            return Ok((Vec::new(), Vec::new()));
        };
        let err = io_err(ifname, NicOp::Stat, "driver statistics (ETHTOOL_GSTRINGS)");
        let names = self.ioctl.strings(ifname, ETH_SS_STATS, count).map_err(err)?;
        let err = io_err(ifname, NicOp::Stat, "driver statistics (ETHTOOL_GSTATS)");
        let values = self.ioctl.stats(ifname, count).map_err(err)?;
        // Stat names and values come from two calls; a count change in
        // between (driver reconfigured) makes the index meaningless.
        if values.len() != names.len() {
            return Err(NicError::new(ifname, NicOp::Stat, Errno::EAGAIN).with_detail("stat count changed"));
        }
        Ok((names, values))
    }

    fn rule_count(&self, ifname: &str, op: NicOp) -> NicResult<(u32, u32)> {
        let mut nfc = EthtoolRxnfc { cmd: ioctl::ETHTOOL_GRXCLSRLCNT, ..Default::default() };
        self.rxnfc(ifname, op, "ntuple rules (ETHTOOL_GRXCLSRLCNT)", &mut nfc)?;
        Ok((nfc.rule_cnt, (nfc.data & !RX_CLS_LOC_SPECIAL) as u32))
    }
}

impl NicInfo for EthtoolNic {
    fn backend(&self) -> &'static str {
        "ethtool"
    }

    fn capabilities(&self) -> NicCapabilities {
        NicCapabilities::HARDWARE
    }

    fn ifindex(&self, ifname: &str) -> NicResult<u32> {
        nix::net::if_::if_nametoindex(ifname)
            .map_err(|e| NicError::new(ifname, NicOp::Ifindex, e).with_detail("no such interface"))
    }

    fn addresses(&self, ifname: &str) -> NicResult<Vec<IpAddr>> {
        let index = self.ifindex(ifname).map_err(|e| NicError { op: NicOp::Addresses, ..e })?;
        let err = |e: NlError| nl_err(ifname, NicOp::Addresses, e);
        let replies = unpoisoned(&self.route).transact(&rtnl::getaddr_dump()).map_err(err)?;
        let mut out = Vec::new();
        for r in replies {
            if let Some(a) = rtnl::parse_addr(&r).map_err(err)? {
                if a.index == index {
                    out.push(a.addr);
                }
            }
        }
        Ok(out)
    }

    fn channels(&self, ifname: &str) -> NicResult<u32> {
        self.channel_counts(ifname).map(|c| c.rx_queues())
    }

    /// Netdev per-queue stats where the driver has them, else the driver's
    /// per-queue `ethtool -S` strings.
    fn queue_rx_bytes(&self, ifname: &str) -> NicResult<QueueBytes> {
        let family = *self.netdev_family.get_or_init(|| resolve_family(&mut self.genl(), "netdev").ok());
        if let Some(family) = family {
            let ifindex = self.ifindex(ifname)?;
            // Drivers without the queue stats ops answer an empty dump or EOPNOTSUPP.
            if let Ok(r) = self.genl().transact(&queue_stats::qstats_request(family, ifindex)) {
                let q = queue_stats::parse_qstats(&r).map_err(|e| nl_err(ifname, NicOp::Stat, e))?;
                if !q.is_empty() {
                    return Ok(q);
                }
            }
        }
        let (names, values) = self.all_stats(ifname)?;
        Ok(queue_stats::from_ethtool_stats(&names, &values))
    }

    fn stat(&self, ifname: &str, name: &str) -> NicResult<Option<u64>> {
        let (names, values) = self.all_stats(ifname)?;
        Ok(names.iter().position(|n| n == name).and_then(|i| values.get(i).copied()))
    }
}

impl RuleControl for EthtoolNic {
    fn add_rule(&self, ifname: &str, flow: &FlowSpec, queue: u32, loc: u32) -> NicResult<()> {
        let mut nfc = rxnfc::insert(flow, queue, loc);
        self.rxnfc(ifname, NicOp::AddRule, "ntuple rule insertion (ETHTOOL_SRXCLSRLINS)", &mut nfc)
    }

    fn del_rule(&self, ifname: &str, loc: u32) -> NicResult<()> {
        let mut nfc = EthtoolRxnfc { cmd: ioctl::ETHTOOL_SRXCLSRLDEL, ..Default::default() };
        nfc.fs.location = loc;
        self.rxnfc(ifname, NicOp::DelRule, "ntuple rule deletion (ETHTOOL_SRXCLSRLDEL)", &mut nfc)
    }

    fn list_rules(&self, ifname: &str) -> NicResult<Vec<NicRule>> {
        let op = NicOp::ListRules;
        let (count, _) = self.rule_count(ifname, op)?;
        let (_, locs) = self.ioctl.rule_locs(ifname, count).map_err(io_err(
            ifname,
            op,
            "ntuple rules (ETHTOOL_GRXCLSRLALL)",
        ))?;
        let mut rules = Vec::with_capacity(locs.len());
        for loc in locs {
            let mut nfc = EthtoolRxnfc { cmd: ioctl::ETHTOOL_GRXCLSRULE, ..Default::default() };
            nfc.fs.location = loc;
            match self.ioctl.rxnfc(ifname, &mut nfc) {
                Ok(()) => rules.extend(rxnfc::decode(&nfc.fs)),
                // Deleted between the listing and this read.
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(io_err(ifname, op, "ntuple rules (ETHTOOL_GRXCLSRULE)")(e)),
            }
        }
        Ok(rules)
    }

    fn rule_capacity(&self, ifname: &str) -> NicResult<u32> {
        self.rule_count(ifname, NicOp::RuleCapacity).map(|(_, size)| size)
    }

    fn slot_in_use(&self, ifname: &str, loc: u32) -> NicResult<bool> {
        // One read of that slot: any rule there, of any flow type, counts.
        let mut nfc = EthtoolRxnfc { cmd: ioctl::ETHTOOL_GRXCLSRULE, ..Default::default() };
        nfc.fs.location = loc;
        match self.ioctl.rxnfc(ifname, &mut nfc) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(io_err(ifname, NicOp::ListRules, "ntuple rule (ETHTOOL_GRXCLSRULE)")(e)),
        }
    }
}

impl NicSetup for EthtoolNic {
    fn rss_table(&self, ifname: &str) -> NicResult<Vec<u32>> {
        self.ioctl.rss_get(ifname).map_err(io_err(
            ifname,
            NicOp::GetRss,
            "RSS indirection (ETHTOOL_GRXFHINDIR)",
        ))
    }

    fn set_rss_table(&self, ifname: &str, table: &[u32]) -> NicResult<()> {
        self.ioctl.rss_set(ifname, table).map_err(io_err(
            ifname,
            NicOp::SetRss,
            "RSS indirection (ETHTOOL_SRXFHINDIR)",
        ))
    }

    fn feature(&self, ifname: &str, name: &str) -> NicResult<bool> {
        let idx = self.features_index(ifname, NicOp::GetFeature, name)?;
        Ok(self.features(ifname, NicOp::GetFeature)?.active.get(idx).copied().unwrap_or(false))
    }

    fn set_feature(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        let op = NicOp::SetFeature;
        let idx = self.features_index(ifname, op, name)?;
        let state = |f: &genl::Features| f.active.get(idx).copied().unwrap_or(false);
        let before = self.features(ifname, op)?;
        if state(&before) == on {
            return Ok(());
        }
        let onoff = if on { "on" } else { "off" };
        if !before.hw.get(idx).copied().unwrap_or(false) {
            return Err(NicError::new(ifname, op, Errno::EOPNOTSUPP)
                .with_detail(format!("{name} is fixed {} on this device", if on { "off" } else { "on" })));
        }
        self.ask(ifname, op, genl::features_set(self.family, ifname, name, on))?;
        // The kernel accepts any wanted set and reports what it could do
        // only through the resulting state.
        if state(&self.features(ifname, op)?) != on {
            return Err(NicError::new(ifname, op, Errno::EIO)
                .with_detail(format!("driver did not turn {name} {onoff}")));
        }
        Ok(())
    }

    fn priv_flags(&self, ifname: &str) -> NicResult<Vec<(String, bool)>> {
        match self.ask(ifname, NicOp::GetPrivFlags, genl::privflags_get(self.family, ifname)) {
            Ok(r) => genl::parse_privflags(&r).map_err(|e| nl_err(ifname, NicOp::GetPrivFlags, e)),
            // A driver without private flags has none (veth, most upstream drivers).
            Err(e) if e.errno == Errno::EOPNOTSUPP => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn set_priv_flag(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        let op = NicOp::SetPrivFlag;
        let flags = self.priv_flags(ifname).map_err(|e| NicError { op, ..e })?;
        if !flags.iter().any(|(n, _)| n == name) {
            return Err(
                NicError::new(ifname, op, Errno::EOPNOTSUPP).with_detail(format!("no private flag {name}"))
            );
        }
        self.ask(ifname, op, genl::privflags_set(self.family, ifname, name, on)).map(drop)
    }

    fn tcp_data_split(&self, ifname: &str) -> NicResult<DataSplit> {
        self.rings(ifname, NicOp::GetTcpDataSplit).map(|r| r.data_split)
    }

    fn set_tcp_data_split(&self, ifname: &str, on: bool) -> NicResult<()> {
        self.ask(ifname, NicOp::SetTcpDataSplit, genl::rings_set_data_split(self.family, ifname, on))
            .map(drop)
    }

    fn rx_ring(&self, ifname: &str) -> NicResult<RxRing> {
        let r = self.rings(ifname, NicOp::GetRing)?;
        match (r.rx, r.rx_max) {
            (Some(current), Some(max)) => Ok(RxRing { current, max }),
            _ => Err(NicError::new(ifname, NicOp::GetRing, Errno::EOPNOTSUPP)
                .with_detail("driver reports no rx ring")),
        }
    }

    fn set_rx_ring(&self, ifname: &str, size: u32) -> NicResult<()> {
        self.ask(ifname, NicOp::SetRing, genl::rings_set_rx(self.family, ifname, size)).map(drop)
    }
}
