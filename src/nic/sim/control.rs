//! What tests and the `--sim_*` flags do to a simulated NIC from outside:
//! arm faults and delays, count calls, reshape a NIC (rule capacity,
//! addresses, driver family), and change it behind the daemon's back
//! (foreign rules, driver stats).

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::errno::Errno;

use super::faults::{Fault, Stall, Trigger};
use super::{SimNic, SimRule, SimState, SIM_PRIV_FLAGS};
use crate::nic::{DataSplit, FlowSpec, NicOp};

/// Driver families the simulator can model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimDriver {
    GvePrivFlags,
    UpstreamRings,
    RingSizeOnly,
}

impl SimNic {
    /// `bytes` arrive on receive queue `queue` of `ifname` (its per-queue
    /// counter grows, as a driver's would). Unknown NICs and queues are ignored.
    pub fn receive(&self, ifname: &str, queue: u32, bytes: u64) {
        if let Some(nic) = self.nics.get(ifname) {
            let mut st = nic.lock().expect("sim nic lock");
            if let Some(c) = st.rx_bytes.get_mut(queue as usize) {
                *c += bytes;
            }
        }
    }

    /// Adds a fault (from `--sim_fault` or a test).
    pub fn inject(&self, fault: Fault) {
        self.faults.lock().expect("sim fault lock").faults.push(fault);
        self.armed.store(true, Ordering::Release);
    }

    /// Fails the `nth` (1-based, counted from now) call of `op` with `errno`.
    pub fn fail_nth(&self, op: NicOp, nth: u64, errno: Errno) {
        let mut f = self.faults.lock().expect("sim fault lock");
        let done = self.calls(op);
        f.faults.push(Fault { op, errno, trigger: Trigger::Nth(done + nth) });
        self.armed.store(true, Ordering::Release);
    }

    /// Delays every call of `op`, on every NIC.
    pub fn delay(&self, op: NicOp, by: Duration) {
        self.stall(None, op, Stall::For(by));
    }

    /// Delays every call of `op` on `ifname` only.
    pub fn delay_on(&self, ifname: &str, op: NicOp, by: Duration) {
        self.stall(Some(ifname), op, Stall::For(by));
    }

    /// Makes every call of `op` (on `ifname`, or on every NIC) wait as `stall` says.
    pub fn stall(&self, ifname: Option<&str>, op: NicOp, stall: Stall) {
        self.faults.lock().expect("sim fault lock").delays.insert((op, ifname.map(str::to_string)), stall);
        self.armed.store(true, Ordering::Release);
    }

    pub fn clear_faults(&self) {
        let mut f = self.faults.lock().expect("sim fault lock");
        f.faults.clear();
        f.delays.clear();
        self.armed.store(false, Ordering::Release);
    }

    /// How many times `op` was called on any NIC.
    pub fn calls(&self, op: NicOp) -> u64 {
        self.calls[op as usize].load(Ordering::SeqCst)
    }

    pub fn set_capacity(&self, ifname: &str, capacity: u32) {
        self.modify(ifname, |s| s.capacity = capacity);
    }

    pub fn set_addresses(&self, ifname: &str, addrs: Vec<IpAddr>) {
        self.modify(ifname, |s| s.addresses = addrs);
    }

    /// Makes `ifname` behave like another driver family: the
    /// default is gve with private flags.
    pub fn model_driver(&self, ifname: &str, family: SimDriver) {
        self.modify(ifname, |s| match family {
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
        });
    }

    /// Puts a rule into slot `loc` behind the daemon's back, as another tool
    /// (`ethtool -N`) or a previous owner of the NIC would.
    pub fn add_foreign_rule(&self, ifname: &str, loc: u32, flow: FlowSpec, queue: u32) {
        self.modify(ifname, |s| {
            let slot = loc as usize;
            if s.rules.len() <= slot {
                s.rules.resize(slot + 1, None);
            }
            s.rules[slot] = Some(SimRule { queue, flow });
        });
    }

    pub fn bump_stat(&self, ifname: &str, name: &str) {
        self.modify(ifname, |s| *s.stats.entry(name.to_string()).or_default() += 1);
    }

    /// Changes `ifname`'s state without counting a call; unknown names are ignored.
    fn modify(&self, ifname: &str, f: impl FnOnce(&mut SimState)) {
        if let Some(n) = self.nics.get(ifname) {
            f(&mut n.lock().expect("sim nic lock"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;
    use crate::nic::sim::test_flow as flow;
    use crate::nic::{NicInfo, NicSetup, RuleControl, ALL_OPS, FEATURE_NTUPLE};

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

    /// Runs `call` on a thread of its own; its result arrives on the receiver.
    fn in_thread<T: Send + 'static>(
        nic: &Arc<SimNic>,
        call: impl FnOnce(&SimNic) -> T + Send + 'static,
    ) -> std::sync::mpsc::Receiver<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        let nic = nic.clone();
        std::thread::spawn(move || tx.send(call(&nic)));
        rx
    }

    /// Bounds only a hang: everything asserted is order.
    const HANG: Duration = Duration::from_secs(60);

    #[test]
    fn a_held_op_holds_only_calls_of_that_op() {
        let nic = Arc::new(SimNic::new(&["eth1"]));
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let go = tmp.path().join("go");
        nic.stall(None, NicOp::AddRule, Stall::Until(go.clone()));
        let held = in_thread(&nic, |n| n.add_rule("eth1", &flow(1), 8, 0));
        // Another op is answered while the add is held.
        assert!(in_thread(&nic, |n| n.list_rules("eth1")).recv_timeout(HANG).unwrap().is_ok());
        assert!(held.try_recv().is_err(), "the held add returned before it was let go");
        std::fs::write(&go, b"").unwrap();
        held.recv_timeout(HANG).unwrap().unwrap();
        // Cleared, nothing holds a call, though the file is gone again.
        nic.clear_faults();
        std::fs::remove_file(&go).unwrap();
        in_thread(&nic, |n| n.add_rule("eth1", &flow(2), 8, 1)).recv_timeout(HANG).unwrap().unwrap();
        // A fixed delay holds a call at least that long.
        nic.delay(NicOp::AddRule, Duration::from_millis(30));
        let t = Instant::now();
        nic.add_rule("eth1", &flow(3), 8, 2).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_hold_on_one_nic_leaves_the_others_alone() {
        let nic = Arc::new(SimNic::new(&["eth1", "eth2"]));
        for n in ["eth1", "eth2"] {
            nic.set_feature(n, FEATURE_NTUPLE, true).unwrap();
        }
        let tmp = tempfile::tempdir().unwrap();
        let go = tmp.path().join("go");
        nic.stall(Some("eth1"), NicOp::AddRule, Stall::Until(go.clone()));
        let held = in_thread(&nic, |n| n.add_rule("eth1", &flow(1), 8, 0));
        in_thread(&nic, |n| n.add_rule("eth2", &flow(1), 8, 0)).recv_timeout(HANG).unwrap().unwrap();
        assert!(held.try_recv().is_err(), "eth1's add returned before it was let go");
        std::fs::write(&go, b"").unwrap();
        held.recv_timeout(HANG).unwrap().unwrap();
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
}
