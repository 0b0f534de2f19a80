use std::sync::Arc;

use super::*;
use crate::nic::prime::prime;
use crate::nic::{
    NicControl, ALL_OPS, FEATURE_NTUPLE, PRIV_HEADER_SPLIT, PRIV_MAX_RX_BUFFER, PRIV_STRICT_HEADER_SPLIT,
};

fn set_flag(name: &str, on: bool) -> NicCall {
    NicCall::SetPrivFlag { ifname: "eth1".into(), name: name.into(), on }
}

fn set_ntuple(on: bool) -> NicCall {
    NicCall::SetFeature { ifname: "eth1".into(), name: FEATURE_NTUPLE.into(), on }
}

/// What prime and restore touch, read from the sim without recording.
fn state(sim: &SimNic) -> (bool, Vec<(String, bool)>, DataSplit, Vec<u32>) {
    (
        sim.feature("eth1", FEATURE_NTUPLE).unwrap(),
        sim.priv_flags("eth1").unwrap(),
        sim.tcp_data_split("eth1").unwrap(),
        sim.rss_table("eth1").unwrap(),
    )
}

#[test]
fn prime_then_restore_records_each_change_and_its_undo_in_reverse() {
    let nic = RecordingNic::new(&["eth1"]);
    let before = state(nic.sim());
    let mut p = prime(&nic, "eth1", 8).unwrap();
    let eth1 = || "eth1".to_string();
    assert_eq!(
        nic.calls()[..3],
        [
            NicCall::Channels { ifname: eth1() },
            NicCall::RuleCapacity { ifname: eth1() },
            NicCall::PrivFlags { ifname: eth1() }
        ],
        "reads come before any change"
    );
    assert_eq!(
        nic.changes(),
        [set_flag(PRIV_MAX_RX_BUFFER, true), set_ntuple(true), NicCall::SetRssEqual { ifname: eth1(), n: 8 }]
    );

    nic.clear();
    p.enable_header_split(&nic).unwrap();
    assert_eq!(nic.changes(), [set_flag(PRIV_HEADER_SPLIT, true), set_flag(PRIV_STRICT_HEADER_SPLIT, true)]);

    nic.clear();
    assert!(p.restore(&nic).is_empty());
    assert_eq!(
        nic.changes(),
        [
            set_flag(PRIV_STRICT_HEADER_SPLIT, false),
            set_flag(PRIV_HEADER_SPLIT, false),
            NicCall::SetRssTable { ifname: eth1(), table: before.3.clone() },
            set_ntuple(false),
            set_flag(PRIV_MAX_RX_BUFFER, false),
        ]
    );
    assert_eq!(state(nic.sim()), before);
}

#[test]
fn a_failed_prime_step_rolls_back_exactly_the_earlier_changes_in_reverse() {
    let before = state(&SimNic::new(&["eth1"]));
    let applied = [
        set_flag(PRIV_MAX_RX_BUFFER, true),
        set_ntuple(true),
        NicCall::SetRssEqual { ifname: "eth1".into(), n: 8 },
    ];
    let undo = [
        set_flag(PRIV_MAX_RX_BUFFER, false),
        set_ntuple(false),
        NicCall::SetRssTable { ifname: "eth1".into(), table: before.3.clone() },
    ];
    for (k, failing) in applied.iter().enumerate() {
        let nic = RecordingNic::new(&["eth1"]);
        let target = failing.clone();
        nic.fail_when(move |c| *c == target, Errno::EIO);
        let e = prime(&nic, "eth1", 8).unwrap_err();
        assert_eq!((e.source.op, e.source.errno), (failing.op(), Errno::EIO));
        let mut want = applied[..=k].to_vec();
        want.extend(undo[..k].iter().rev().cloned());
        assert_eq!(nic.changes(), want, "failing {failing:?}");
        assert_eq!(state(nic.sim()), before, "failing {failing:?}");
    }
}

#[test]
fn failed_calls_are_recorded_and_sunk_but_not_applied() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink_log = log.clone();
    let nic = RecordingNic::new(&["eth1"]).with_sink(move |c| sink_log.lock().unwrap().push(c.op()));
    nic.fail_when(|c| matches!(c, NicCall::SetFeature { .. }), Errno::EBUSY);
    assert_eq!(nic.channels("eth1").unwrap(), nic.sim().channels("eth1").unwrap());
    let e = nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap_err();
    assert_eq!((e.ifname.as_str(), e.op, e.errno), ("eth1", NicOp::SetFeature, Errno::EBUSY));
    assert!(!nic.sim().feature("eth1", FEATURE_NTUPLE).unwrap(), "a failed call is not applied");
    assert_eq!(*log.lock().unwrap(), [NicOp::Channels, NicOp::SetFeature]);
    assert_eq!(nic.calls(), [NicCall::Channels { ifname: "eth1".into() }, set_ntuple(true)]);
    nic.clear();
    assert!(nic.calls().is_empty());
    assert_eq!(nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap_err().errno, Errno::EBUSY, "still armed");
}

#[test]
fn it_stands_in_for_any_nic_and_says_what_the_sim_can_do() {
    let nic: Arc<dyn NicControl> = Arc::new(RecordingNic::new(&["eth1"]));
    assert_eq!(nic.capabilities(), NicCapabilities::SIMULATED);
    assert_eq!(nic.backend(), "sim");
}

/// One call of every kind, all on `eth1`.
fn one_of_each() -> Vec<NicCall> {
    let i = || "eth1".to_string();
    let flow = crate::nic::sim::test_flow(1);
    vec![
        NicCall::Ifindex { ifname: i() },
        NicCall::Addresses { ifname: i() },
        NicCall::Channels { ifname: i() },
        NicCall::Stat { ifname: i(), name: "reset_cnt".into() },
        NicCall::AddRule { ifname: i(), flow, queue: 1, loc: 2 },
        NicCall::DelRule { ifname: i(), loc: 2 },
        NicCall::ListRules { ifname: i() },
        NicCall::RuleCapacity { ifname: i() },
        NicCall::SlotInUse { ifname: i(), loc: 2 },
        NicCall::RssTable { ifname: i() },
        NicCall::SetRssTable { ifname: i(), table: vec![0, 1] },
        NicCall::SetRssEqual { ifname: i(), n: 2 },
        NicCall::Feature { ifname: i(), name: FEATURE_NTUPLE.into() },
        NicCall::SetFeature { ifname: i(), name: FEATURE_NTUPLE.into(), on: true },
        NicCall::PrivFlags { ifname: i() },
        NicCall::SetPrivFlag { ifname: i(), name: PRIV_HEADER_SPLIT.into(), on: true },
        NicCall::TcpDataSplit { ifname: i() },
        NicCall::SetTcpDataSplit { ifname: i(), on: true },
        NicCall::RxRing { ifname: i() },
        NicCall::SetRxRing { ifname: i(), size: 512 },
    ]
}

#[test]
fn changes_are_the_adds_deletes_and_sets_and_every_op_has_a_call() {
    let calls = one_of_each();
    for c in &calls {
        let name = format!("{c:?}");
        let change = ["AddRule", "DelRule", "Set"].iter().any(|p| name.starts_with(p));
        assert_eq!(c.is_change(), change, "{name}");
        assert_eq!(c.ifname(), "eth1");
    }
    for op in ALL_OPS {
        assert!(calls.iter().any(|c| c.op() == op), "no call for {op}");
    }
}
