//! A stand-in for the ethtool backend on veth interfaces, for tests only:
//! debug builds, with `TCPX_RXDM_TEST_VETH_NICS=1`.
//!
//! A veth has no ntuple rule table, no RSS indirection table and no header
//! split, so the real backend's priming refuses it (exit 1, "rule_capacity on
//! eth1 failed: EOPNOTSUPP") and no daemon on real NICs can be brought up in
//! a network namespace of veths. The stand-in answers what a veth lacks
//! (rule slots and the rule list, RSS, features, private flags, header split,
//! rings, channels) from a simulated NIC of the same name, and takes the rest
//! from the kernel: the interface must exist in the daemon's own network
//! namespace (its index and addresses are the kernel's, its link events
//! reach the link monitor, the host is tuned as for real NICs), and each rule
//! install goes to the driver through the real ioctl first, whose refusal is
//! the install's (a veth answers EOPNOTSUPP: the request was encoded and
//! reached the driver).
//!
//! Release builds never read the variable.

use std::sync::Arc;

use super::ethtool::EthtoolNic;
use super::sim::SimNic;
use super::{
    DataSplit, FlowSpec, NicCapabilities, NicControl, NicInfo, NicResult, NicRule, NicSetup, RuleControl,
    RxRing,
};

/// The variable that turns the stand-in on (debug builds only).
pub const VAR: &str = "TCPX_RXDM_TEST_VETH_NICS";

/// The real backend, or (debug builds, [`VAR`] set to `1`) the stand-in over
/// it for `ifnames`.
pub fn real_or_standin(real: EthtoolNic, ifnames: &[&str]) -> Arc<dyn NicControl> {
    if cfg!(debug_assertions) && std::env::var(VAR).is_ok_and(|v| v == "1") {
        tracing::warn!(
            variable = VAR,
            "a test build's stand-in: what these veths lack is simulated; their presence, addresses, \
             links and rule installs are the kernel's"
        );
        return Arc::new(VethStandIn { real, sim: SimNic::new(ifnames) });
    }
    Arc::new(real)
}

/// The kernel's veths, with a simulated NIC for what they lack.
pub struct VethStandIn {
    real: EthtoolNic,
    sim: SimNic,
}

impl NicInfo for VethStandIn {
    fn backend(&self) -> &'static str {
        "ethtool (veth stand-in)"
    }
    fn capabilities(&self) -> NicCapabilities {
        NicCapabilities::HARDWARE
    }
    fn ifindex(&self, ifname: &str) -> NicResult<u32> {
        self.real.ifindex(ifname)
    }
    fn addresses(&self, ifname: &str) -> NicResult<Vec<std::net::IpAddr>> {
        self.real.addresses(ifname)
    }
    fn channels(&self, ifname: &str) -> NicResult<u32> {
        self.sim.channels(ifname)
    }
    fn stat(&self, ifname: &str, name: &str) -> NicResult<Option<u64>> {
        self.real.stat(ifname, name)
    }
    fn queue_rx_bytes(&self, ifname: &str) -> NicResult<super::queue_stats::QueueBytes> {
        self.real.queue_rx_bytes(ifname)
    }
}

impl RuleControl for VethStandIn {
    fn add_rule(&self, ifname: &str, flow: &FlowSpec, queue: u32, loc: u32) -> NicResult<()> {
        self.real.add_rule(ifname, flow, queue, loc)?;
        self.sim.add_rule(ifname, flow, queue, loc)
    }
    fn del_rule(&self, ifname: &str, loc: u32) -> NicResult<()> {
        self.sim.del_rule(ifname, loc)?;
        self.real.del_rule(ifname, loc)
    }
    fn list_rules(&self, ifname: &str) -> NicResult<Vec<NicRule>> {
        self.sim.list_rules(ifname)
    }
    fn rule_capacity(&self, ifname: &str) -> NicResult<u32> {
        self.sim.rule_capacity(ifname)
    }
    fn slot_in_use(&self, ifname: &str, loc: u32) -> NicResult<bool> {
        self.sim.slot_in_use(ifname, loc)
    }
}

impl NicSetup for VethStandIn {
    fn rss_table(&self, ifname: &str) -> NicResult<Vec<u32>> {
        self.sim.rss_table(ifname)
    }
    fn set_rss_table(&self, ifname: &str, table: &[u32]) -> NicResult<()> {
        self.sim.set_rss_table(ifname, table)
    }
    fn feature(&self, ifname: &str, name: &str) -> NicResult<bool> {
        self.sim.feature(ifname, name)
    }
    fn set_feature(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        self.sim.set_feature(ifname, name, on)
    }
    fn priv_flags(&self, ifname: &str) -> NicResult<Vec<(String, bool)>> {
        self.sim.priv_flags(ifname)
    }
    fn set_priv_flag(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        self.sim.set_priv_flag(ifname, name, on)
    }
    fn tcp_data_split(&self, ifname: &str) -> NicResult<DataSplit> {
        self.sim.tcp_data_split(ifname)
    }
    fn set_tcp_data_split(&self, ifname: &str, on: bool) -> NicResult<()> {
        self.sim.set_tcp_data_split(ifname, on)
    }
    fn rx_ring(&self, ifname: &str) -> NicResult<RxRing> {
        self.sim.rx_ring(ifname)
    }
    fn set_rx_ring(&self, ifname: &str, size: u32) -> NicResult<()> {
        self.sim.set_rx_ring(ifname, size)
    }
}
