//! A recording NIC for tests: every NIC trait call is logged as a
//! [`NicCall`] with its arguments, may be made to fail, and otherwise goes to
//! a [`SimNic`], so the state behind the calls stays that of a driver. Tests
//! then assert on what was asked of the NIC, in order, rather than only on
//! where it ended up.

use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;

use super::sim::SimNic;
use super::{
    DataSplit, FlowSpec, NicCapabilities, NicError, NicInfo, NicOp, NicResult, NicRule, NicSetup,
    RuleControl, RxRing,
};

/// One call of a NIC trait method, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicCall {
    Ifindex { ifname: String },
    Addresses { ifname: String },
    Channels { ifname: String },
    Stat { ifname: String, name: String },
    AddRule { ifname: String, flow: FlowSpec, queue: u32, loc: u32 },
    DelRule { ifname: String, loc: u32 },
    ListRules { ifname: String },
    RuleCapacity { ifname: String },
    SlotInUse { ifname: String, loc: u32 },
    RssTable { ifname: String },
    SetRssTable { ifname: String, table: Vec<u32> },
    SetRssEqual { ifname: String, n: u32 },
    Feature { ifname: String, name: String },
    SetFeature { ifname: String, name: String, on: bool },
    PrivFlags { ifname: String },
    SetPrivFlag { ifname: String, name: String, on: bool },
    TcpDataSplit { ifname: String },
    SetTcpDataSplit { ifname: String, on: bool },
    RxRing { ifname: String },
    SetRxRing { ifname: String, size: u32 },
}

impl NicCall {
    /// The operation a failure of this call names (as the backends name it).
    pub fn op(&self) -> NicOp {
        match self {
            NicCall::Ifindex { .. } => NicOp::Ifindex,
            NicCall::Addresses { .. } => NicOp::Addresses,
            NicCall::Channels { .. } => NicOp::Channels,
            NicCall::Stat { .. } => NicOp::Stat,
            NicCall::AddRule { .. } => NicOp::AddRule,
            NicCall::DelRule { .. } => NicOp::DelRule,
            NicCall::ListRules { .. } | NicCall::SlotInUse { .. } => NicOp::ListRules,
            NicCall::RuleCapacity { .. } => NicOp::RuleCapacity,
            NicCall::RssTable { .. } => NicOp::GetRss,
            NicCall::SetRssTable { .. } | NicCall::SetRssEqual { .. } => NicOp::SetRss,
            NicCall::Feature { .. } => NicOp::GetFeature,
            NicCall::SetFeature { .. } => NicOp::SetFeature,
            NicCall::PrivFlags { .. } => NicOp::GetPrivFlags,
            NicCall::SetPrivFlag { .. } => NicOp::SetPrivFlag,
            NicCall::TcpDataSplit { .. } => NicOp::GetTcpDataSplit,
            NicCall::SetTcpDataSplit { .. } => NicOp::SetTcpDataSplit,
            NicCall::RxRing { .. } => NicOp::GetRing,
            NicCall::SetRxRing { .. } => NicOp::SetRing,
        }
    }

    /// The interface the call is about.
    pub fn ifname(&self) -> &str {
        match self {
            NicCall::Ifindex { ifname }
            | NicCall::Addresses { ifname }
            | NicCall::Channels { ifname }
            | NicCall::Stat { ifname, .. }
            | NicCall::AddRule { ifname, .. }
            | NicCall::DelRule { ifname, .. }
            | NicCall::ListRules { ifname }
            | NicCall::RuleCapacity { ifname }
            | NicCall::SlotInUse { ifname, .. }
            | NicCall::RssTable { ifname }
            | NicCall::SetRssTable { ifname, .. }
            | NicCall::SetRssEqual { ifname, .. }
            | NicCall::Feature { ifname, .. }
            | NicCall::SetFeature { ifname, .. }
            | NicCall::PrivFlags { ifname }
            | NicCall::SetPrivFlag { ifname, .. }
            | NicCall::TcpDataSplit { ifname }
            | NicCall::SetTcpDataSplit { ifname, .. }
            | NicCall::RxRing { ifname }
            | NicCall::SetRxRing { ifname, .. } => ifname,
        }
    }

    /// Whether the call asks the NIC to change (adds, deletes, sets), as
    /// opposed to reading it.
    pub fn is_change(&self) -> bool {
        matches!(
            self,
            NicCall::AddRule { .. }
                | NicCall::DelRule { .. }
                | NicCall::SetRssTable { .. }
                | NicCall::SetRssEqual { .. }
                | NicCall::SetFeature { .. }
                | NicCall::SetPrivFlag { .. }
                | NicCall::SetTcpDataSplit { .. }
                | NicCall::SetRxRing { .. }
        )
    }
}

type CallFilter = Box<dyn Fn(&NicCall) -> bool + Send + Sync>;
type CallSink = Box<dyn Fn(&NicCall) + Send + Sync>;

/// A [`SimNic`] whose every trait call is recorded; see the module docs.
pub struct RecordingNic {
    sim: SimNic,
    calls: Mutex<Vec<NicCall>>,
    failures: Mutex<Vec<(CallFilter, Errno)>>,
    sink: Option<CallSink>,
}

impl std::fmt::Debug for RecordingNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingNic")
            .field("sim", &self.sim)
            .field("calls", &lock(&self.calls).len())
            .field("failures", &lock(&self.failures).len())
            .finish_non_exhaustive()
    }
}

/// A test's panic while one of these locks is held leaves plain data behind,
/// still fit to read.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RecordingNic {
    /// Records calls to a fresh [`SimNic`] with these interfaces.
    pub fn new<S: AsRef<str>>(ifnames: &[S]) -> Self {
        Self::over(SimNic::new(ifnames))
    }

    /// Records calls to `sim`, as already set up (driver family, faults...).
    pub fn over(sim: SimNic) -> Self {
        RecordingNic { sim, calls: Mutex::default(), failures: Mutex::default(), sink: None }
    }

    /// The simulated NIC behind the recording, to read or change its state
    /// without recording.
    pub fn sim(&self) -> &SimNic {
        &self.sim
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<NicCall> {
        lock(&self.calls).clone()
    }

    /// The calls so far that ask for a change ([`NicCall::is_change`]), in order.
    pub fn changes(&self) -> Vec<NicCall> {
        lock(&self.calls).iter().filter(|c| c.is_change()).cloned().collect()
    }

    /// Forgets the calls recorded so far (failures set up stay).
    pub fn clear(&self) {
        lock(&self.calls).clear();
    }

    /// Every later call `matches` accepts fails with `errno` (recorded, not applied).
    pub fn fail_when(&self, matches: impl Fn(&NicCall) -> bool + Send + Sync + 'static, errno: Errno) {
        lock(&self.failures).push((Box::new(matches), errno));
    }

    /// Also send each call to `sink` (so a test can merge NIC and GPU calls into one ordered log).
    pub fn with_sink(mut self, sink: impl Fn(&NicCall) + Send + Sync + 'static) -> Self {
        self.sink = Some(Box::new(sink));
        self
    }

    /// Records `call`, then fails it as set up or lets `apply` run it on the sim.
    fn call<T>(&self, call: NicCall, apply: impl FnOnce(&SimNic) -> NicResult<T>) -> NicResult<T> {
        lock(&self.calls).push(call.clone());
        if let Some(sink) = &self.sink {
            sink(&call);
        }
        let failure = lock(&self.failures).iter().find(|(matches, _)| matches(&call)).map(|(_, e)| *e);
        match failure {
            Some(errno) => Err(NicError::new(call.ifname(), call.op(), errno).with_detail("injected fault")),
            None => apply(&self.sim),
        }
    }
}

impl NicInfo for RecordingNic {
    /// The sim's name: a recording changes nothing the daemon reports.
    fn backend(&self) -> &'static str {
        self.sim.backend()
    }

    fn capabilities(&self) -> NicCapabilities {
        self.sim.capabilities()
    }

    fn ifindex(&self, ifname: &str) -> NicResult<u32> {
        self.call(NicCall::Ifindex { ifname: ifname.into() }, |s| s.ifindex(ifname))
    }

    fn addresses(&self, ifname: &str) -> NicResult<Vec<IpAddr>> {
        self.call(NicCall::Addresses { ifname: ifname.into() }, |s| s.addresses(ifname))
    }

    fn channels(&self, ifname: &str) -> NicResult<u32> {
        self.call(NicCall::Channels { ifname: ifname.into() }, |s| s.channels(ifname))
    }

    fn stat(&self, ifname: &str, name: &str) -> NicResult<Option<u64>> {
        self.call(NicCall::Stat { ifname: ifname.into(), name: name.into() }, |s| s.stat(ifname, name))
    }

    /// Passed through unrecorded: health metrics read it on their own clock,
    /// and the recorded sequence is the daemon's changes and their checks.
    fn queue_rx_bytes(&self, ifname: &str) -> NicResult<crate::nic::queue_stats::QueueBytes> {
        self.sim.queue_rx_bytes(ifname)
    }
}

impl RuleControl for RecordingNic {
    fn add_rule(&self, ifname: &str, flow: &FlowSpec, queue: u32, loc: u32) -> NicResult<()> {
        let call = NicCall::AddRule { ifname: ifname.into(), flow: *flow, queue, loc };
        self.call(call, |s| s.add_rule(ifname, flow, queue, loc))
    }

    fn del_rule(&self, ifname: &str, loc: u32) -> NicResult<()> {
        self.call(NicCall::DelRule { ifname: ifname.into(), loc }, |s| s.del_rule(ifname, loc))
    }

    fn list_rules(&self, ifname: &str) -> NicResult<Vec<NicRule>> {
        self.call(NicCall::ListRules { ifname: ifname.into() }, |s| s.list_rules(ifname))
    }

    fn rule_capacity(&self, ifname: &str) -> NicResult<u32> {
        self.call(NicCall::RuleCapacity { ifname: ifname.into() }, |s| s.rule_capacity(ifname))
    }

    fn slot_in_use(&self, ifname: &str, loc: u32) -> NicResult<bool> {
        self.call(NicCall::SlotInUse { ifname: ifname.into(), loc }, |s| s.slot_in_use(ifname, loc))
    }
}

impl NicSetup for RecordingNic {
    fn rss_table(&self, ifname: &str) -> NicResult<Vec<u32>> {
        self.call(NicCall::RssTable { ifname: ifname.into() }, |s| s.rss_table(ifname))
    }

    fn set_rss_table(&self, ifname: &str, table: &[u32]) -> NicResult<()> {
        let call = NicCall::SetRssTable { ifname: ifname.into(), table: table.to_vec() };
        self.call(call, |s| s.set_rss_table(ifname, table))
    }

    fn set_rss_equal(&self, ifname: &str, n: u32) -> NicResult<()> {
        self.call(NicCall::SetRssEqual { ifname: ifname.into(), n }, |s| s.set_rss_equal(ifname, n))
    }

    fn feature(&self, ifname: &str, name: &str) -> NicResult<bool> {
        self.call(NicCall::Feature { ifname: ifname.into(), name: name.into() }, |s| s.feature(ifname, name))
    }

    fn set_feature(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        let call = NicCall::SetFeature { ifname: ifname.into(), name: name.into(), on };
        self.call(call, |s| s.set_feature(ifname, name, on))
    }

    fn priv_flags(&self, ifname: &str) -> NicResult<Vec<(String, bool)>> {
        self.call(NicCall::PrivFlags { ifname: ifname.into() }, |s| s.priv_flags(ifname))
    }

    fn set_priv_flag(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        let call = NicCall::SetPrivFlag { ifname: ifname.into(), name: name.into(), on };
        self.call(call, |s| s.set_priv_flag(ifname, name, on))
    }

    fn tcp_data_split(&self, ifname: &str) -> NicResult<DataSplit> {
        self.call(NicCall::TcpDataSplit { ifname: ifname.into() }, |s| s.tcp_data_split(ifname))
    }

    fn set_tcp_data_split(&self, ifname: &str, on: bool) -> NicResult<()> {
        let call = NicCall::SetTcpDataSplit { ifname: ifname.into(), on };
        self.call(call, |s| s.set_tcp_data_split(ifname, on))
    }

    fn rx_ring(&self, ifname: &str) -> NicResult<RxRing> {
        self.call(NicCall::RxRing { ifname: ifname.into() }, |s| s.rx_ring(ifname))
    }

    fn set_rx_ring(&self, ifname: &str, size: u32) -> NicResult<()> {
        self.call(NicCall::SetRxRing { ifname: ifname.into(), size }, |s| s.set_rx_ring(ifname, size))
    }
}

#[cfg(test)]
mod tests;
