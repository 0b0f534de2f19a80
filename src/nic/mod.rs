//! NIC control: the traits the daemon programs NICs through ([`NicInfo`],
//! [`RuleControl`] and [`NicSetup`], together [`NicControl`]), what a backend
//! can do ([`NicCapabilities`]), the backends (`ethtool` for real NICs, `sim`),
//! a recording test double ([`RecordingNic`]), and what is built on top:
//! header-split probing, prime/restore, claims and the link monitor.
//!
//! Backends are synchronous: every call is one short kernel round trip (an ioctl
//! or a netlink request). Rule calls run on that NIC's own rule thread
//! (`steering::apply`), in arrival order: a slow driver call holds up only
//! that NIC's requests, never a thread that serves connections.

pub(crate) mod claim;
pub mod ethtool;
mod header_split;
pub(crate) mod monitor;
pub(crate) mod prime;
pub mod queue_stats;
mod recording;
pub mod sim;
pub mod steering_miss;
pub(crate) mod veth_standin;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use nix::errno::Errno;
use serde::Serialize;

pub use self::claim::{ClaimError, NicClaim};
pub use self::header_split::HeaderSplit;
pub use self::monitor::{spawn_link_monitor, MonitorError, MonitorHandle};
pub use self::recording::{NicCall, RecordingNic};
pub use crate::types::flow::FlowSpec;

/// One steering rule as the NIC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NicRule {
    pub loc: u32,
    pub queue: u32,
    #[serde(serialize_with = "ser_sock")]
    pub src: SocketAddr,
    #[serde(serialize_with = "ser_sock")]
    pub dst: SocketAddr,
}

fn ser_sock<S: serde::Serializer>(a: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(a)
}

/// Which operation failed; names match the `--sim_fault` op names where one exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NicOp {
    AddRule,
    DelRule,
    ListRules,
    RuleCapacity,
    Channels,
    GetRss,
    SetRss,
    GetFeature,
    SetFeature,
    GetPrivFlags,
    SetPrivFlag,
    GetTcpDataSplit,
    SetTcpDataSplit,
    Stat,
    Ifindex,
    Addresses,
    GetRing,
    SetRing,
}

impl NicOp {
    pub fn name(self) -> &'static str {
        match self {
            NicOp::AddRule => "add_rule",
            NicOp::DelRule => "del_rule",
            NicOp::ListRules => "list_rules",
            NicOp::RuleCapacity => "rule_capacity",
            NicOp::Channels => "channels",
            NicOp::GetRss => "get_rss",
            NicOp::SetRss => "set_rss",
            NicOp::GetFeature => "get_feature",
            NicOp::SetFeature => "set_feature",
            NicOp::GetPrivFlags => "get_priv_flags",
            NicOp::SetPrivFlag => "set_priv_flag",
            NicOp::GetTcpDataSplit => "get_tcp_data_split",
            NicOp::SetTcpDataSplit => "set_tcp_data_split",
            NicOp::Stat => "stat",
            NicOp::Ifindex => "ifindex",
            NicOp::Addresses => "addresses",
            NicOp::GetRing => "get_ring",
            NicOp::SetRing => "set_ring",
        }
    }

    pub fn from_name(s: &str) -> Option<NicOp> {
        ALL_OPS.iter().copied().find(|op| op.name() == s)
    }
}

pub const ALL_OPS: [NicOp; 18] = [
    NicOp::AddRule,
    NicOp::DelRule,
    NicOp::ListRules,
    NicOp::RuleCapacity,
    NicOp::Channels,
    NicOp::GetRss,
    NicOp::SetRss,
    NicOp::GetFeature,
    NicOp::SetFeature,
    NicOp::GetPrivFlags,
    NicOp::SetPrivFlag,
    NicOp::GetTcpDataSplit,
    NicOp::SetTcpDataSplit,
    NicOp::Stat,
    NicOp::Ifindex,
    NicOp::Addresses,
    NicOp::GetRing,
    NicOp::SetRing,
];

impl fmt::Display for NicOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed NIC operation: which interface, which operation, the kernel's errno,
/// and optional detail (e.g. a netlink extended ack message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} on {ifname} failed: {errno}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
pub struct NicError {
    pub ifname: String,
    pub op: NicOp,
    pub errno: Errno,
    pub detail: Option<String>,
}

impl NicError {
    pub fn new(ifname: &str, op: NicOp, errno: Errno) -> Self {
        NicError { ifname: ifname.to_string(), op, errno, detail: None }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

pub type NicResult<T> = Result<T, NicError>;

/// tcp-data-split as ethtool rings report it (`ETHTOOL_A_RINGS_TCP_DATA_SPLIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum DataSplit {
    Unknown,
    Disabled,
    Enabled,
}

/// RX ring size as ethtool rings report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RxRing {
    pub current: u32,
    pub max: u32,
}

/// What a NIC backend can do. Callers decide on these, never on
/// [`NicInfo::backend`], so that a new backend (or a test double) only has
/// to say what it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicCapabilities {
    /// The kernel reports link and address changes of these NICs, so the
    /// link monitor can run.
    pub link_events: bool,
    /// The NICs are the host's own, so tuning the host's TCP stack for them
    /// means something.
    pub host_tuning: bool,
    /// The NICs are simulated: no hardware is touched, and claims on them
    /// never block a daemon on real NICs.
    pub simulated: bool,
}

impl NicCapabilities {
    /// Real NICs of this host.
    pub const HARDWARE: NicCapabilities =
        NicCapabilities { link_events: true, host_tuning: true, simulated: false };
    /// Simulated NICs: no kernel events, nothing of the host's to tune.
    pub const SIMULATED: NicCapabilities =
        NicCapabilities { link_events: false, host_tuning: false, simulated: true };
}

/// What a NIC is and reports: its index, addresses, queues and driver stats.
pub trait NicInfo {
    /// Backend name, for logs and `/debug/config` only.
    fn backend(&self) -> &'static str;
    /// What this backend can do.
    fn capabilities(&self) -> NicCapabilities;

    fn ifindex(&self, ifname: &str) -> NicResult<u32>;
    /// Addresses currently configured on the interface.
    fn addresses(&self, ifname: &str) -> NicResult<Vec<IpAddr>>;
    /// Number of combined (or rx) channels currently configured.
    fn channels(&self, ifname: &str) -> NicResult<u32>;
    /// One driver statistic by name (e.g. `reset_cnt`); `None` if the driver has no such stat.
    fn stat(&self, ifname: &str, name: &str) -> NicResult<Option<u64>>;
    /// Bytes received so far by each receive queue (`(queue, bytes)`, by
    /// queue); empty when the driver does not count per queue.
    fn queue_rx_bytes(&self, ifname: &str) -> NicResult<queue_stats::QueueBytes> {
        Err(NicError::new(ifname, NicOp::Stat, Errno::EOPNOTSUPP))
    }
}

/// The NIC's flow-steering rule table (ntuple rules).
pub trait RuleControl {
    /// Inserts a rule steering `flow` to `queue` at slot `loc`.
    fn add_rule(&self, ifname: &str, flow: &FlowSpec, queue: u32, loc: u32) -> NicResult<()>;
    fn del_rule(&self, ifname: &str, loc: u32) -> NicResult<()>;
    fn list_rules(&self, ifname: &str) -> NicResult<Vec<NicRule>>;
    /// How many rule slots the NIC has.
    fn rule_capacity(&self, ifname: &str) -> NicResult<u32>;
    /// Whether slot `loc` holds a rule (anyone's). Asked only after an insert
    /// into that slot failed, to tell a foreign rule apart from other errors.
    fn slot_in_use(&self, ifname: &str, loc: u32) -> NicResult<bool> {
        Ok(self.list_rules(ifname)?.iter().any(|r| r.loc == loc))
    }
}

/// The settings prime changes and restore puts back: RSS, features,
/// private flags, header split and ring sizes.
pub trait NicSetup {
    /// The RSS indirection table.
    fn rss_table(&self, ifname: &str) -> NicResult<Vec<u32>>;
    fn set_rss_table(&self, ifname: &str, table: &[u32]) -> NicResult<()>;
    /// Spreads RSS evenly over queues `0..n` (`ethtool -X equal n`).
    fn set_rss_equal(&self, ifname: &str, n: u32) -> NicResult<()> {
        let size = self.rss_table(ifname)?.len();
        let table: Vec<u32> = (0..size as u32).map(|i| i % n.max(1)).collect();
        self.set_rss_table(ifname, &table)
    }

    fn feature(&self, ifname: &str, name: &str) -> NicResult<bool>;
    fn set_feature(&self, ifname: &str, name: &str, on: bool) -> NicResult<()>;
    /// Private flags in driver order with their current values.
    fn priv_flags(&self, ifname: &str) -> NicResult<Vec<(String, bool)>>;
    fn set_priv_flag(&self, ifname: &str, name: &str, on: bool) -> NicResult<()>;
    fn tcp_data_split(&self, ifname: &str) -> NicResult<DataSplit>;
    fn set_tcp_data_split(&self, ifname: &str, on: bool) -> NicResult<()>;

    /// RX ring size, for the ring-size fallback of drivers without header
    /// split. Backends without ring control report EOPNOTSUPP.
    fn rx_ring(&self, ifname: &str) -> NicResult<RxRing> {
        Err(NicError::new(ifname, NicOp::GetRing, Errno::EOPNOTSUPP))
    }
    fn set_rx_ring(&self, ifname: &str, _size: u32) -> NicResult<()> {
        Err(NicError::new(ifname, NicOp::SetRing, Errno::EOPNOTSUPP))
    }
}

/// Everything the daemon needs from a NIC. Implemented by the ethtool backend
/// (real hardware) and the simulated NIC, through the three traits above;
/// code that needs only one of them takes only that one.
pub trait NicControl: NicInfo + RuleControl + NicSetup + Send + Sync {}

impl<T: NicInfo + RuleControl + NicSetup + Send + Sync> NicControl for T {}

/// A link-level event on a managed NIC, fed to the daemon by a monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicEvent {
    /// Link went down (operstate not up / IFF_UP cleared).
    LinkDown(String),
    /// Interface disappeared.
    Removed(String),
    /// The driver's reset counter increased (VF reset).
    Reset { ifname: String, before: u64, after: u64 },
    /// Some interface's addresses changed: the dst-address map must be rebuilt.
    AddressesChanged,
}

pub const FEATURE_NTUPLE: &str = "rx-ntuple-filter";
pub const PRIV_HEADER_SPLIT: &str = "enable-header-split";
pub const PRIV_STRICT_HEADER_SPLIT: &str = "enable-strict-header-split";
pub const PRIV_MAX_RX_BUFFER: &str = "enable-max-rx-buffer-size";
pub const STAT_RESET_CNT: &str = "reset_cnt";
