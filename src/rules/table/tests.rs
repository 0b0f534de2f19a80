//! Tests of the rule table: slots, queue loads, the flow index, and their
//! agreement under random operation sequences.

use super::*;

fn flow(p: u16) -> FlowSpec {
    FlowSpec { src: format!("10.0.0.2:{p}").parse().unwrap(), dst: "10.0.0.1:5000".parse().unwrap() }
}

#[test]
fn flow_index_gives_memory_back_after_a_peak() {
    let mut t = NicRules::new(100_000, &[vec![8, 9]]);
    let flows: Vec<FlowSpec> = (0..60_000u32)
        .map(|i| FlowSpec {
            src: SocketAddr::new(IpAddr::from([10, 1, (i >> 8) as u8, i as u8]), 1000 + (i % 50_000) as u16),
            dst: "10.0.0.1:5000".parse().unwrap(),
        })
        .collect();
    for f in &flows {
        assert!(matches!(t.reserve(*f, 0, None, Owner::default()), Reserve::New(_)));
    }
    let peak = t.flow_capacity();
    assert!(peak >= 60_000);
    for f in &flows[10..] {
        assert!(t.release(f).is_some());
    }
    assert_eq!(t.len(), 10);
    assert!(t.flow_capacity() <= 1024, "capacity {} after the peak of {peak}", t.flow_capacity());
    t.check_consistency().unwrap();
    // What is left is still found, and the table grows again as needed.
    for f in &flows[..10] {
        assert!(t.get(f).is_some());
    }
    for f in &flows[10..5000] {
        assert!(matches!(t.reserve(*f, 0, None, Owner::default()), Reserve::New(_)));
    }
    t.check_consistency().unwrap();
}

#[test]
fn flow_keys_round_trip_and_are_compact() {
    for f in [
        flow(7),
        FlowSpec { src: "[fd00::2]:41000".parse().unwrap(), dst: "[fd00::1]:5000".parse().unwrap() },
    ] {
        assert_eq!(FlowKey::from(&f).spec(), f);
    }
    assert!(std::mem::size_of::<FlowKey>() <= 38);
}

#[test]
fn slots_are_lowest_free_first() {
    let mut s = RuleSlots::new(4);
    assert_eq!((0..4).map(|_| s.allocate().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(s.allocate(), None);
    s.free(2);
    s.free(0);
    assert_eq!(s.allocate(), Some(0));
    assert_eq!(s.allocate(), Some(2));
    s.free(3);
    s.free(2);
    assert_eq!(s.used(), 2);
    assert_eq!(s.allocate(), Some(2));
}

#[test]
fn queues_balance_and_honour_hints() {
    let mut t = NicRules::new(100, &[vec![8, 9, 10, 11]]);
    let picks: Vec<u32> = (0..6)
        .map(|i| match t.reserve(flow(i), 0, None, Owner::default()) {
            Reserve::New(e) => e.queue,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(picks, vec![8, 9, 10, 11, 8, 9]);
    let Reserve::New(e) = t.reserve(flow(100), 0, Some(11), Owner::default()) else { panic!() };
    assert_eq!(e.queue, 11);
    // A queue of another GPU is not honoured: least loaded instead (10).
    let Reserve::New(e) = t.reserve(flow(101), 0, Some(3), Owner::default()) else { panic!() };
    assert_eq!(e.queue, 10);
    assert!(matches!(t.reserve(flow(0), 0, None, Owner::default()), Reserve::Existing(e) if e.queue == 8));
    t.check_consistency().unwrap();
}

#[test]
fn exhaustion_and_release() {
    let mut t = NicRules::new(2, &[vec![8]]);
    assert!(matches!(t.reserve(flow(1), 0, None, Owner::default()), Reserve::New(_)));
    assert!(matches!(t.reserve(flow(2), 0, None, Owner::default()), Reserve::New(_)));
    assert_eq!(t.reserve(flow(3), 0, None, Owner::default()), Reserve::Exhausted);
    assert_eq!(t.release(&flow(1)).unwrap().loc, 0);
    assert_eq!(t.release(&flow(1)), None);
    assert!(matches!(t.reserve(flow(3), 0, None, Owner::default()), Reserve::New(e) if e.loc == 0));
    t.check_consistency().unwrap();
}

#[test]
fn foreign_slots_stay_out_of_use() {
    let mut t = NicRules::new(4, &[vec![8, 9]]);
    let Reserve::New(e) = t.reserve(flow(1), 0, None, Owner::default()) else { panic!() };
    assert_eq!(t.mark_foreign(&flow(1)), Some(e.loc));
    assert!(t.is_empty());
    assert_eq!(t.gpu(0).load(e.queue), Some(0));
    // The next reservation skips the foreign slot 0.
    assert!(matches!(t.reserve(flow(1), 0, None, Owner::default()), Reserve::New(e) if e.loc == 1));
    assert_eq!(t.foreign_slots().iter().copied().collect::<Vec<_>>(), vec![0]);
    t.check_consistency().unwrap();
    for p in 2..5 {
        let _ = t.reserve(flow(p), 0, None, Owner::default());
    }
    // 4 slots: one foreign, three flows.
    assert_eq!(t.len(), 3);
    assert_eq!(t.reserve(flow(9), 0, None, Owner::default()), Reserve::Exhausted);
    t.check_consistency().unwrap();
}

#[test]
fn pending_deletes_and_owners() {
    let lease =
        |n| Owner { pid: NonZeroU32::new(100 + n), lease: NonZeroU32::new(n), tenant: None, repaired: false };
    let mut t = NicRules::new(8, &[vec![8]]);
    for p in 0..4u16 {
        let _ = t.reserve(flow(p), 0, None, lease(1 + u32::from(p % 2)));
    }
    let mut mine = t.owned_by(NonZeroU32::new(1).unwrap());
    mine.sort();
    assert_eq!(mine, vec![flow(0), flow(2)]);
    t.set_pending(&flow(2), true);
    assert!(t.get(&flow(2)).unwrap().pending_delete);
    assert_eq!(t.pending().collect::<Vec<_>>(), vec![flow(2)]);
    t.check_consistency().unwrap();
    t.set_owner(&flow(2), lease(3));
    assert_eq!(t.get(&flow(2)).unwrap().owner, lease(3));
    // Releasing a pending flow clears its pending mark.
    t.release(&flow(2));
    assert_eq!(t.pending_len(), 0);
    t.check_consistency().unwrap();
}
