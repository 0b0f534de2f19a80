//! The simulated NIC: a real [`NicControl`](super::NicControl) backend with its own
//! state, limits and failure modes, used by the embedded default run and by
//! the behaviour tests. Not a mock: it enforces what a driver enforces.
//!
//! This file holds the NICs' state and the backend; `control` is what tests
//! and the `--sim_*` flags do to it from outside, `faults` the faults and
//! delays it can be armed with.

mod control;
mod errno;
mod faults;
mod handover;
mod rng;

use foldhash::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use nix::errno::Errno;

pub use self::control::SimDriver;
pub use self::errno::errno_from_name;
use self::faults::FaultState;
pub use self::faults::{held_marker, Fault, FaultParseError, SimDelay, Stall, Trigger};
use super::queue_stats::QueueBytes;
use super::{
    DataSplit, FlowSpec, NicCapabilities, NicError, NicInfo, NicOp, NicResult, NicRule, NicSetup,
    RuleControl, RxRing, ALL_OPS, FEATURE_NTUPLE, PRIV_HEADER_SPLIT, PRIV_MAX_RX_BUFFER,
    PRIV_STRICT_HEADER_SPLIT, STAT_RESET_CNT,
};

pub const SIM_CHANNELS: u32 = 16;
pub const SIM_RULE_CAPACITY: u32 = 100_000;
pub const SIM_RSS_TABLE_SIZE: usize = 128;
pub const SIM_RX_RING: RxRing = RxRing { current: 1024, max: 4096 };
const SIM_PRIV_FLAGS: [&str; 3] = [PRIV_HEADER_SPLIT, PRIV_STRICT_HEADER_SPLIT, PRIV_MAX_RX_BUFFER];

#[derive(Debug, Clone)]
struct SimState {
    index: u32,
    addresses: Vec<IpAddr>,
    channels: u32,
    capacity: u32,
    /// Rule table indexed by slot, like a NIC's own filter table.
    rules: Vec<Option<SimRule>>,
    features: HashMap<String, bool>,
    priv_flags: Vec<(String, bool)>,
    data_split: DataSplit,
    rx_ring: RxRing,
    rss: Vec<u32>,
    stats: HashMap<String, u64>,
    /// Bytes received per queue, as tests drive them ([`SimNic::receive`]).
    rx_bytes: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct SimRule {
    queue: u32,
    flow: FlowSpec,
}

/// A set of simulated NICs, keyed by interface name.
#[derive(Debug)]
pub struct SimNic {
    nics: HashMap<String, Mutex<SimState>>,
    faults: Mutex<FaultState>,
    /// Whether any fault or delay is configured: the common path skips the lock.
    armed: AtomicBool,
    /// Calls per operation (indexed by `NicOp as usize`).
    calls: [AtomicU64; ALL_OPS.len()],
}

/// Addresses of simulated `ethN`: `192.168.N.2` and `fd00:0:0:N::2`; names
/// without a number use their position (1-based) as N.
pub fn sim_addresses(ifname: &str, position: usize) -> Vec<IpAddr> {
    let n = ifname.strip_prefix("eth").and_then(|d| d.parse::<u8>().ok()).unwrap_or((position + 1) as u8);
    vec![
        IpAddr::V4(Ipv4Addr::new(192, 168, n, 2)),
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, n as u16, 0, 0, 0, 2)),
    ]
}

impl SimNic {
    pub fn new<S: AsRef<str>>(ifnames: &[S]) -> Self {
        let nics = ifnames
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let name = name.as_ref().to_string();
                let state = SimState {
                    index: 100 + i as u32,
                    addresses: sim_addresses(&name, i),
                    channels: SIM_CHANNELS,
                    capacity: SIM_RULE_CAPACITY,
                    rules: Vec::new(),
                    features: [(FEATURE_NTUPLE.to_string(), false)].into_iter().collect(),
                    priv_flags: SIM_PRIV_FLAGS.iter().map(|f| (f.to_string(), false)).collect(),
                    data_split: DataSplit::Disabled,
                    rx_ring: SIM_RX_RING,
                    rss: (0..SIM_RSS_TABLE_SIZE as u32).map(|i| i % SIM_CHANNELS).collect(),
                    stats: [(STAT_RESET_CNT.to_string(), 0)].into_iter().collect(),
                    rx_bytes: vec![0; SIM_CHANNELS as usize],
                };
                (name, Mutex::new(state))
            })
            .collect();
        SimNic {
            nics,
            faults: Mutex::new(FaultState::new()),
            armed: AtomicBool::new(false),
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Counts the call, applies delays, and returns an injected failure if one fires.
    fn enter(&self, ifname: &str, op: NicOp) -> NicResult<()> {
        let n = self.calls[op as usize].fetch_add(1, Ordering::Relaxed) + 1;
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let (delay, fail) = self.faults.lock().expect("sim fault lock").on_call(ifname, op, n);
        if let Some(stall) = delay {
            stall.wait();
        }
        match fail {
            Some(errno) => Err(NicError::new(ifname, op, errno).with_detail("injected fault")),
            None => Ok(()),
        }
    }

    fn with<T>(
        &self,
        ifname: &str,
        op: NicOp,
        f: impl FnOnce(&mut SimState) -> Result<T, Errno>,
    ) -> NicResult<T> {
        let nic = self.nics.get(ifname).ok_or_else(|| NicError::new(ifname, op, Errno::ENODEV))?;
        self.enter(ifname, op)?;
        let mut st = nic.lock().expect("sim nic lock");
        f(&mut st).map_err(|e| NicError::new(ifname, op, e))
    }
}

impl NicInfo for SimNic {
    fn backend(&self) -> &'static str {
        "sim"
    }

    fn capabilities(&self) -> NicCapabilities {
        NicCapabilities::SIMULATED
    }

    fn ifindex(&self, ifname: &str) -> NicResult<u32> {
        self.with(ifname, NicOp::Ifindex, |s| Ok(s.index))
    }

    fn addresses(&self, ifname: &str) -> NicResult<Vec<IpAddr>> {
        self.with(ifname, NicOp::Addresses, |s| Ok(s.addresses.clone()))
    }

    fn channels(&self, ifname: &str) -> NicResult<u32> {
        self.with(ifname, NicOp::Channels, |s| Ok(s.channels))
    }

    fn stat(&self, ifname: &str, name: &str) -> NicResult<Option<u64>> {
        self.with(ifname, NicOp::Stat, |s| Ok(s.stats.get(name).copied()))
    }

    fn queue_rx_bytes(&self, ifname: &str) -> NicResult<QueueBytes> {
        self.with(ifname, NicOp::Stat, |s| {
            Ok((0..s.channels).map(|q| (q, s.rx_bytes.get(q as usize).copied().unwrap_or(0))).collect())
        })
    }
}

impl RuleControl for SimNic {
    fn add_rule(&self, ifname: &str, flow: &FlowSpec, queue: u32, loc: u32) -> NicResult<()> {
        self.with(ifname, NicOp::AddRule, |s| {
            if !s.features.get(FEATURE_NTUPLE).copied().unwrap_or(false) {
                return Err(Errno::EOPNOTSUPP);
            }
            if queue >= s.channels || loc >= s.capacity || flow.src.is_ipv6() != flow.dst.is_ipv6() {
                return Err(Errno::EINVAL);
            }
            let slot = loc as usize;
            if s.rules.len() <= slot {
                s.rules.resize(slot + 1, None);
            }
            if s.rules[slot].is_some() {
                return Err(Errno::EBUSY);
            }
            s.rules[slot] = Some(SimRule { queue, flow: *flow });
            Ok(())
        })
    }

    fn del_rule(&self, ifname: &str, loc: u32) -> NicResult<()> {
        self.with(ifname, NicOp::DelRule, |s| {
            s.rules.get_mut(loc as usize).and_then(Option::take).ok_or(Errno::ENOENT)?;
            // Like a driver's table, ours does not keep the memory of a peak.
            while s.rules.last().is_some_and(Option::is_none) {
                s.rules.pop();
            }
            if s.rules.capacity() > 1024 && s.rules.len() < s.rules.capacity() / 4 {
                s.rules.shrink_to(s.rules.len() * 2);
            }
            Ok(())
        })
    }

    fn list_rules(&self, ifname: &str) -> NicResult<Vec<NicRule>> {
        self.with(ifname, NicOp::ListRules, |s| {
            Ok(s.rules
                .iter()
                .enumerate()
                .filter_map(|(loc, r)| {
                    r.map(|r| NicRule { loc: loc as u32, queue: r.queue, src: r.flow.src, dst: r.flow.dst })
                })
                .collect())
        })
    }

    fn rule_capacity(&self, ifname: &str) -> NicResult<u32> {
        self.with(ifname, NicOp::RuleCapacity, |s| Ok(s.capacity))
    }

    fn slot_in_use(&self, ifname: &str, loc: u32) -> NicResult<bool> {
        self.with(ifname, NicOp::ListRules, |s| Ok(matches!(s.rules.get(loc as usize), Some(Some(_)))))
    }
}

impl NicSetup for SimNic {
    fn rss_table(&self, ifname: &str) -> NicResult<Vec<u32>> {
        self.with(ifname, NicOp::GetRss, |s| Ok(s.rss.clone()))
    }

    fn set_rss_table(&self, ifname: &str, table: &[u32]) -> NicResult<()> {
        self.with(ifname, NicOp::SetRss, |s| {
            if table.len() != s.rss.len() || table.iter().any(|&q| q >= s.channels) {
                return Err(Errno::EINVAL);
            }
            s.rss = table.to_vec();
            Ok(())
        })
    }

    fn feature(&self, ifname: &str, name: &str) -> NicResult<bool> {
        self.with(ifname, NicOp::GetFeature, |s| s.features.get(name).copied().ok_or(Errno::EOPNOTSUPP))
    }

    fn set_feature(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        self.with(ifname, NicOp::SetFeature, |s| {
            let cur = s.features.get_mut(name).ok_or(Errno::EOPNOTSUPP)?;
            // Drivers drop their flow rules when ntuple filtering is turned off.
            let flush = name == FEATURE_NTUPLE && *cur && !on;
            *cur = on;
            if flush {
                s.rules = Vec::new();
            }
            Ok(())
        })
    }

    fn priv_flags(&self, ifname: &str) -> NicResult<Vec<(String, bool)>> {
        self.with(ifname, NicOp::GetPrivFlags, |s| Ok(s.priv_flags.clone()))
    }

    fn set_priv_flag(&self, ifname: &str, name: &str, on: bool) -> NicResult<()> {
        self.with(ifname, NicOp::SetPrivFlag, |s| {
            let flag = s.priv_flags.iter_mut().find(|(n, _)| n == name).ok_or(Errno::EOPNOTSUPP)?;
            flag.1 = on;
            Ok(())
        })
    }

    fn tcp_data_split(&self, ifname: &str) -> NicResult<DataSplit> {
        self.with(ifname, NicOp::GetTcpDataSplit, |s| Ok(s.data_split))
    }

    fn set_tcp_data_split(&self, ifname: &str, on: bool) -> NicResult<()> {
        self.with(ifname, NicOp::SetTcpDataSplit, |s| {
            if s.data_split == DataSplit::Unknown {
                return Err(Errno::EOPNOTSUPP);
            }
            s.data_split = if on { DataSplit::Enabled } else { DataSplit::Disabled };
            Ok(())
        })
    }

    fn rx_ring(&self, ifname: &str) -> NicResult<RxRing> {
        self.with(ifname, NicOp::GetRing, |s| Ok(s.rx_ring))
    }

    fn set_rx_ring(&self, ifname: &str, size: u32) -> NicResult<()> {
        self.with(ifname, NicOp::SetRing, |s| {
            if size == 0 || size > s.rx_ring.max {
                return Err(Errno::EINVAL);
            }
            s.rx_ring.current = size;
            Ok(())
        })
    }
}

/// A TCP flow from a peer port to `192.168.1.2:5000`, the address of the simulated `eth1`.
#[cfg(test)]
pub(crate) fn test_flow(src_port: u16) -> FlowSpec {
    FlowSpec {
        src: format!("10.1.0.2:{src_port}").parse().unwrap(),
        dst: "192.168.1.2:5000".parse().unwrap(),
    }
}

#[cfg(test)]
mod tests {
    use super::test_flow as flow;
    use super::*;

    #[test]
    fn rules_need_ntuple_and_valid_queue_and_free_slot() {
        let nic = SimNic::new(&["eth1"]);
        assert_eq!(nic.add_rule("eth1", &flow(1), 8, 0).unwrap_err().errno, Errno::EOPNOTSUPP);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        nic.add_rule("eth1", &flow(1), 8, 0).unwrap();
        assert_eq!(nic.add_rule("eth1", &flow(2), 8, 0).unwrap_err().errno, Errno::EBUSY);
        assert_eq!(nic.add_rule("eth1", &flow(2), 16, 1).unwrap_err().errno, Errno::EINVAL);
        assert_eq!(nic.list_rules("eth1").unwrap().len(), 1);
        assert_eq!(nic.del_rule("eth1", 5).unwrap_err().errno, Errno::ENOENT);
        // ntuple off flushes the table, as real drivers do.
        nic.set_feature("eth1", FEATURE_NTUPLE, false).unwrap();
        assert!(nic.list_rules("eth1").unwrap().is_empty());
    }

    #[test]
    fn rule_table_memory_follows_the_rules() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        for loc in 0..50_000 {
            nic.add_rule("eth1", &flow((loc % 60_000) as u16), 8, loc).unwrap();
        }
        for loc in (10..50_000).rev() {
            nic.del_rule("eth1", loc).unwrap();
        }
        let st = nic.nics["eth1"].lock().unwrap();
        assert_eq!(st.rules.len(), 10);
        assert!(st.rules.capacity() <= 2048, "capacity {} kept after the peak", st.rules.capacity());
    }

    #[test]
    fn rx_ring_is_settable_up_to_its_max() {
        let nic = SimNic::new(&["eth1"]);
        assert_eq!(nic.rx_ring("eth1").unwrap(), SIM_RX_RING);
        nic.set_rx_ring("eth1", 512).unwrap();
        assert_eq!(nic.rx_ring("eth1").unwrap().current, 512);
        assert_eq!(nic.set_rx_ring("eth1", SIM_RX_RING.max + 1).unwrap_err().errno, Errno::EINVAL);
        assert_eq!(nic.set_rx_ring("eth1", 0).unwrap_err().errno, Errno::EINVAL);
    }

    #[test]
    fn rss_equal_spreads_over_first_queues() {
        let nic = SimNic::new(&["eth2"]);
        nic.set_rss_equal("eth2", 8).unwrap();
        let t = nic.rss_table("eth2").unwrap();
        assert_eq!(t.len(), SIM_RSS_TABLE_SIZE);
        assert!(t.iter().all(|&q| q < 8));
        let want: Vec<IpAddr> = vec!["192.168.2.2".parse().unwrap(), "fd00:0:0:2::2".parse().unwrap()];
        assert_eq!(nic.addresses("eth2").unwrap(), want);
    }
}
