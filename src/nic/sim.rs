//! The simulated NIC: a real [`NicControl`] backend with its own
//! state, limits and failure modes, used by the embedded default run and by
//! the behaviour tests. Not a mock: it enforces what a driver enforces.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;

use super::*;

pub const SIM_CHANNELS: u32 = 16;
pub const SIM_RULE_CAPACITY: u32 = 100_000;
pub const SIM_RSS_TABLE_SIZE: usize = 128;
pub const SIM_RX_RING: RxRing = RxRing { current: 1024, max: 4096 };
const SIM_PRIV_FLAGS: [&str; 3] = [PRIV_HEADER_SPLIT, PRIV_STRICT_HEADER_SPLIT, PRIV_MAX_RX_BUFFER];

/// A fault to inject: operation `op` fails with `errno`, either with
/// probability `prob` on each call or exactly on the `nth` call (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub op: NicOp,
    pub errno: Errno,
    pub trigger: Trigger,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    Probability(f64),
    Nth(u64),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid value {0:?}: {1}")]
pub struct FaultParseError(pub String, pub &'static str);

impl FromStr for Fault {
    type Err = FaultParseError;

    /// `OP:ERRNO:PROB`, e.g. `add_rule:EBUSY:0.5`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| FaultParseError(s.to_string(), why);
        let mut parts = s.split(':');
        let (Some(op), Some(errno), Some(prob), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err("expected OP:ERRNO:PROB"));
        };
        let op =
            match op {
                "add_rule" => NicOp::AddRule,
                "del_rule" => NicOp::DelRule,
                "set_feature" => NicOp::SetFeature,
                "set_priv_flag" => NicOp::SetPrivFlag,
                "set_rss" => NicOp::SetRss,
                "list_rules" => NicOp::ListRules,
                _ => return Err(err(
                    "OP must be one of add_rule, del_rule, set_feature, set_priv_flag, set_rss, list_rules",
                )),
            };
        let errno = errno_from_name(errno).ok_or_else(|| err("ERRNO must be an errno name such as EBUSY"))?;
        let prob: f64 = prob.parse().map_err(|_| err("PROB must be a number in [0,1]"))?;
        if !(0.0..=1.0).contains(&prob) {
            return Err(err("PROB must be a number in [0,1]"));
        }
        Ok(Fault { op, errno, trigger: Trigger::Probability(prob) })
    }
}

/// A delay for every call of one operation: `--sim_delay=OP:DELAY[:IFNAME]`,
/// on every simulated NIC or only on `IFNAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDelay {
    pub op: NicOp,
    pub by: Duration,
    pub ifname: Option<String>,
}

impl FromStr for SimDelay {
    type Err = FaultParseError;

    /// `OP:DELAY[:IFNAME]`, e.g. `del_rule:50` or `add_rule:200us:eth1`; OP is any
    /// NIC operation name. DELAY is a whole number of milliseconds, or a whole
    /// number with a unit: `50ms`, `200us`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| FaultParseError(s.to_string(), why);
        let mut parts = s.splitn(3, ':');
        let (Some(op), Some(delay)) = (parts.next(), parts.next()) else {
            return Err(err("expected OP:DELAY[:IFNAME]"));
        };
        let ifname = match parts.next() {
            Some("") => return Err(err("IFNAME after the second ':' is empty")),
            other => other.map(str::to_string),
        };
        let op = NicOp::from_name(op)
            .ok_or_else(|| err("OP must be a NIC operation such as add_rule or del_rule"))?;
        let (digits, unit): (&str, fn(u64) -> Duration) = if let Some(d) = delay.strip_suffix("us") {
            (d, Duration::from_micros)
        } else if let Some(d) = delay.strip_suffix("ms") {
            (d, Duration::from_millis)
        } else {
            (delay, Duration::from_millis)
        };
        let bad = "DELAY must be a whole number of milliseconds, or a whole number ending in ms or us (e.g. 20, 20ms, 200us)";
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(bad));
        }
        let n: u64 = digits.parse().map_err(|_| err(bad))?;
        Ok(SimDelay { op, by: unit(n), ifname })
    }
}

/// Parses an errno name (`EBUSY`) into its value.
pub fn errno_from_name(name: &str) -> Option<Errno> {
    // The errno values Linux uses on every architecture we build for.
    const NAMES: &[(&str, Errno)] = &[
        ("EPERM", Errno::EPERM),
        ("ENOENT", Errno::ENOENT),
        ("EIO", Errno::EIO),
        ("E2BIG", Errno::E2BIG),
        ("EAGAIN", Errno::EAGAIN),
        ("ENOMEM", Errno::ENOMEM),
        ("EACCES", Errno::EACCES),
        ("EBUSY", Errno::EBUSY),
        ("EEXIST", Errno::EEXIST),
        ("ENODEV", Errno::ENODEV),
        ("EINVAL", Errno::EINVAL),
        ("ENOSPC", Errno::ENOSPC),
        ("ERANGE", Errno::ERANGE),
        ("ENOTSUP", Errno::EOPNOTSUPP),
        ("EOPNOTSUPP", Errno::EOPNOTSUPP),
        ("ETIMEDOUT", Errno::ETIMEDOUT),
        ("ENETDOWN", Errno::ENETDOWN),
        ("ENXIO", Errno::ENXIO),
        ("EFAULT", Errno::EFAULT),
    ];
    NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, e)| *e)
}

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
}

/// Driver families the simulator can model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimDriver {
    GvePrivFlags,
    UpstreamRings,
    RingSizeOnly,
}

#[derive(Debug, Clone, Copy)]
struct SimRule {
    queue: u32,
    flow: FlowSpec,
}

#[derive(Debug, Default)]
struct FaultState {
    faults: Vec<Fault>,
    /// Per operation, and per NIC (`None`: every NIC).
    delays: HashMap<(NicOp, Option<String>), Duration>,
    rng: u64,
}

impl FaultState {
    fn next_f64(&mut self) -> f64 {
        // xorshift64*: plenty for fault sampling, no dependency.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
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
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
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
                };
                (name, Mutex::new(state))
            })
            .collect();
        SimNic {
            nics,
            faults: Mutex::new(FaultState { rng: seed, ..Default::default() }),
            armed: AtomicBool::new(false),
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    // ---- test API -------------------------------------------------------

    /// Adds a fault (from `--sim_fault` or a test).
    pub fn inject(&self, fault: Fault) {
        self.faults.lock().expect("sim fault lock").faults.push(fault);
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Fails the `nth` (1-based, counted from now) call of `op` with `errno`.
    pub fn fail_nth(&self, op: NicOp, nth: u64, errno: Errno) {
        let mut f = self.faults.lock().expect("sim fault lock");
        let done = self.calls(op);
        f.faults.push(Fault { op, errno, trigger: Trigger::Nth(done + nth) });
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Delays every call of `op`, on every NIC.
    pub fn delay(&self, op: NicOp, by: Duration) {
        self.faults.lock().expect("sim fault lock").delays.insert((op, None), by);
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Delays every call of `op` on `ifname` only.
    pub fn delay_on(&self, ifname: &str, op: NicOp, by: Duration) {
        self.faults.lock().expect("sim fault lock").delays.insert((op, Some(ifname.to_string())), by);
        self.armed.store(true, Ordering::SeqCst);
    }

    pub fn clear_faults(&self) {
        let mut f = self.faults.lock().expect("sim fault lock");
        f.faults.clear();
        f.delays.clear();
        self.armed.store(false, Ordering::SeqCst);
    }

    /// How many times `op` was called on any NIC.
    pub fn calls(&self, op: NicOp) -> u64 {
        self.calls[op as usize].load(Ordering::SeqCst)
    }

    pub fn set_capacity(&self, ifname: &str, capacity: u32) {
        if let Some(n) = self.nics.get(ifname) {
            n.lock().expect("sim nic lock").capacity = capacity;
        }
    }

    pub fn set_addresses(&self, ifname: &str, addrs: Vec<IpAddr>) {
        if let Some(n) = self.nics.get(ifname) {
            n.lock().expect("sim nic lock").addresses = addrs;
        }
    }

    /// Makes `ifname` behave like another driver family: the
    /// default is gve with private flags.
    pub fn model_driver(&self, ifname: &str, family: SimDriver) {
        if let Some(n) = self.nics.get(ifname) {
            let mut s = n.lock().expect("sim nic lock");
            match family {
                SimDriver::GvePrivFlags => {
                    s.priv_flags = SIM_PRIV_FLAGS.iter().map(|f| (f.to_string(), false)).collect();
                    s.data_split = DataSplit::Disabled;
                }
                SimDriver::UpstreamRings => {
                    s.priv_flags.clear();
                    s.data_split = DataSplit::Disabled;
                }
                SimDriver::RingSizeOnly => {
                    s.priv_flags.clear();
                    s.data_split = DataSplit::Unknown;
                }
            }
        }
    }

    /// Puts a rule into slot `loc` behind the daemon's back, as another tool
    /// (`ethtool -N`) or a previous owner of the NIC would.
    pub fn add_foreign_rule(&self, ifname: &str, loc: u32, flow: FlowSpec, queue: u32) {
        if let Some(n) = self.nics.get(ifname) {
            let mut s = n.lock().expect("sim nic lock");
            let slot = loc as usize;
            if s.rules.len() <= slot {
                s.rules.resize(slot + 1, None);
            }
            s.rules[slot] = Some(SimRule { queue, flow });
        }
    }

    pub fn bump_stat(&self, ifname: &str, name: &str) {
        if let Some(n) = self.nics.get(ifname) {
            *n.lock().expect("sim nic lock").stats.entry(name.to_string()).or_default() += 1;
        }
    }

    // ---- internals ------------------------------------------------------

    /// Counts the call, applies delays, and returns an injected failure if one fires.
    fn enter(&self, ifname: &str, op: NicOp) -> NicResult<()> {
        let n = self.calls[op as usize].fetch_add(1, Ordering::SeqCst) + 1;
        if !self.armed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (delay, fail) = {
            let mut f = self.faults.lock().expect("sim fault lock");
            let delay =
                f.delays.get(&(op, Some(ifname.to_string()))).or_else(|| f.delays.get(&(op, None))).copied();
            let mut fail = None;
            for i in 0..f.faults.len() {
                if f.faults[i].op != op {
                    continue;
                }
                let fires = match f.faults[i].trigger {
                    Trigger::Nth(k) => k == n,
                    Trigger::Probability(p) => p >= 1.0 || (p > 0.0 && f.next_f64() < p),
                };
                if fires {
                    fail = Some(f.faults[i].errno);
                    if matches!(f.faults[i].trigger, Trigger::Nth(_)) {
                        f.faults.remove(i);
                    }
                    break;
                }
            }
            (delay, fail)
        };
        if let Some(d) = delay {
            std::thread::sleep(d);
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

impl NicControl for SimNic {
    fn backend(&self) -> &'static str {
        "sim"
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

    fn stat(&self, ifname: &str, name: &str) -> NicResult<Option<u64>> {
        self.with(ifname, NicOp::Stat, |s| Ok(s.stats.get(name).copied()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(sp: u16) -> FlowSpec {
        FlowSpec { src: format!("10.1.0.2:{sp}").parse().unwrap(), dst: "192.168.1.2:5000".parse().unwrap() }
    }

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
    fn faults_fire_by_nth_and_probability() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        nic.fail_nth(NicOp::AddRule, 2, Errno::ENOSPC);
        nic.add_rule("eth1", &flow(1), 8, 0).unwrap();
        let e = nic.add_rule("eth1", &flow(2), 8, 1).unwrap_err();
        assert_eq!((e.op, e.errno), (NicOp::AddRule, Errno::ENOSPC));
        nic.add_rule("eth1", &flow(2), 8, 1).unwrap();
        nic.inject("del_rule:EBUSY:1".parse().unwrap());
        assert_eq!(nic.del_rule("eth1", 0).unwrap_err().errno, Errno::EBUSY);
        nic.clear_faults();
        nic.inject("del_rule:EBUSY:0".parse().unwrap());
        nic.del_rule("eth1", 0).unwrap();
    }

    #[test]
    fn call_counters_cover_every_op() {
        for (i, op) in ALL_OPS.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op}");
        }
        let nic = SimNic::new(&["eth1"]);
        nic.channels("eth1").unwrap();
        nic.channels("eth1").unwrap();
        assert_eq!(nic.calls(NicOp::Channels), 2);
        assert_eq!(nic.calls(NicOp::AddRule), 0);
    }

    #[test]
    fn delay_flag_parsing() {
        let d: SimDelay = "del_rule:50".parse().unwrap();
        assert_eq!(d, SimDelay { op: NicOp::DelRule, by: Duration::from_millis(50), ifname: None });
        let d: SimDelay = "add_rule:1000:eth2".parse().unwrap();
        assert_eq!(
            d,
            SimDelay { op: NicOp::AddRule, by: Duration::from_secs(1), ifname: Some("eth2".into()) }
        );
        let d: SimDelay = "add_rule:200us:eth2".parse().unwrap();
        assert_eq!((d.by, d.ifname.as_deref()), (Duration::from_micros(200), Some("eth2")));
        let cases = [
            ("add_rule:20", Duration::from_millis(20)),
            ("add_rule:20ms", Duration::from_millis(20)),
            ("add_rule:200us", Duration::from_micros(200)),
            ("add_rule:0us", Duration::ZERO),
            ("add_rule:1500us", Duration::from_micros(1500)),
        ];
        for (s, want) in cases {
            assert_eq!(
                s.parse::<SimDelay>().unwrap(),
                SimDelay { op: NicOp::AddRule, by: want, ifname: None },
                "{s}"
            );
        }
        for bad in [
            "del_rule",
            "frob:5",
            "del_rule:-1",
            "del_rule:1.5",
            "del_rule:+5",
            "del_rule:",
            "del_rule:ms",
            "del_rule:us",
            "del_rule:20ns",
            "del_rule:20s",
            "del_rule:20 us",
            "del_rule:20usms",
            "del_rule:99999999999999999999us",
            "del_rule:5:",
        ] {
            let e = bad.parse::<SimDelay>().unwrap_err();
            assert_eq!(e.0, bad, "the error names the value");
        }
        let e = "add_rule:5ns".parse::<SimDelay>().unwrap_err();
        assert!(e.to_string().contains("200us"), "{e}");
    }

    #[test]
    fn delays_slow_only_the_named_op() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        nic.delay(NicOp::AddRule, Duration::from_millis(30));
        let t = std::time::Instant::now();
        nic.add_rule("eth1", &flow(1), 8, 0).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(30));
        let t = std::time::Instant::now();
        nic.list_rules("eth1").unwrap();
        assert!(t.elapsed() < Duration::from_millis(30));
        nic.clear_faults();
        let t = std::time::Instant::now();
        nic.add_rule("eth1", &flow(2), 8, 1).unwrap();
        assert!(t.elapsed() < Duration::from_millis(30));
    }

    #[test]
    fn a_delay_on_one_nic_leaves_the_others_alone() {
        let nic = SimNic::new(&["eth1", "eth2"]);
        for n in ["eth1", "eth2"] {
            nic.set_feature(n, FEATURE_NTUPLE, true).unwrap();
        }
        nic.delay_on("eth1", NicOp::AddRule, Duration::from_millis(30));
        let t = std::time::Instant::now();
        nic.add_rule("eth2", &flow(1), 8, 0).unwrap();
        assert!(t.elapsed() < Duration::from_millis(30));
        let t = std::time::Instant::now();
        nic.add_rule("eth1", &flow(1), 8, 0).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(30));
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
    fn capacity_bounds_rule_slots() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        nic.set_capacity("eth1", 2);
        assert_eq!(nic.rule_capacity("eth1").unwrap(), 2);
        nic.add_rule("eth1", &flow(1), 8, 1).unwrap();
        assert_eq!(nic.add_rule("eth1", &flow(2), 8, 2).unwrap_err().errno, Errno::EINVAL);
    }

    #[test]
    fn fault_flag_parsing() {
        let f: Fault = "set_rss:EAGAIN:0.25".parse().unwrap();
        assert_eq!(f, Fault { op: NicOp::SetRss, errno: Errno::EAGAIN, trigger: Trigger::Probability(0.25) });
        for bad in [
            "add_rule:EBUSY",
            "frob:EBUSY:1",
            "add_rule:ENOPE:1",
            "add_rule:EBUSY:2",
            "add_rule:EBUSY:x",
            "a:b:c:d",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad}");
        }
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
