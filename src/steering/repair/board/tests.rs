//! Unit tests of the repair board: turns, bounds, gathering, back-off.
use super::*;

const A: Key = Key::Tenant(1);
const B: Key = Key::Tenant(2);

fn look<T>(n: Next<T>) -> (Key, T) {
    match n {
        Next::Look(k, _, t) => (k, t),
        Next::Dump(..) => panic!("a dump, not a lookup"),
        Next::Wait(_) => panic!("nothing, not a lookup"),
    }
}

fn dump<T>(n: Next<T>) -> (u64, Vec<(Key, T)>) {
    match n {
        Next::Dump(s, items) => (s, items),
        _ => panic!("not a dump"),
    }
}

fn wait<T>(n: Next<T>) -> Option<Instant> {
    match n {
        Next::Wait(at) => at,
        _ => panic!("not a wait"),
    }
}

#[test]
fn tenants_take_turns_whatever_they_queued() {
    let mut b = Board::new(100);
    let now = Instant::now();
    for i in 0..5 {
        b.push(A, 7, i).unwrap();
    }
    b.push(B, 7, 100).unwrap();
    assert_eq!(b.waiting(), 6);
    let order: Vec<(Key, i32)> = (0..6).map(|_| look(b.next(now))).collect();
    assert_eq!(order, [(A, 0), (B, 100), (A, 1), (A, 2), (A, 3), (A, 4)]);
    assert_eq!(b.waiting(), 0);
    assert_eq!(wait(b.next(now)), None, "nothing left, nothing due");
}

#[test]
fn a_tenant_holds_at_most_its_backlog_parked_ones_included() {
    let mut b = Board::new(3);
    let now = Instant::now();
    b.push(A, 7, 1).unwrap();
    b.push(A, 7, 2).unwrap();
    let (_, one) = look(b.next(now));
    b.park(A, 9, one, now);
    b.push(A, 7, 3).unwrap();
    assert_eq!(b.push(A, 7, 4), Err(4), "two queued and one parked: full");
    assert_eq!(b.push(B, 7, 5), Ok(()), "another tenant's queue is its own");
    assert_eq!(b.waiting(), 4);
}

#[test]
fn a_namespace_is_dumped_once_for_everything_parked_on_it() {
    let mut b = Board::new(100);
    let t0 = Instant::now();
    for (k, i) in [(A, 1), (B, 2), (A, 3)] {
        b.push(k, 7, i).unwrap();
    }
    for _ in 0..3 {
        let (k, i) = look(b.next(t0));
        b.park(k, 7, i, t0);
    }
    b.push(B, 8, 4).unwrap();
    let (k, i) = look(b.next(t0));
    b.park(k, 8, i, t0);
    // Nothing joined for GATHER yet: wait for stragglers.
    assert_eq!(wait(b.next(t0)), Some(t0 + GATHER));
    let t1 = t0 + GATHER;
    let mut dumps = [dump(b.next(t1)), dump(b.next(t1))];
    dumps.sort_by_key(|d| d.0);
    assert_eq!(dumps[0].0, 7);
    assert_eq!(dumps[0].1.iter().map(|x| x.1).collect::<Vec<_>>(), [1, 2, 3], "one dump for all three");
    assert_eq!(dumps[1].1.iter().map(|x| x.1).collect::<Vec<_>>(), [4]);
    // One dump at a time per namespace: what parks meanwhile waits for the next.
    b.push(A, 7, 5).unwrap();
    let (k, i) = look(b.next(t1));
    b.park(k, 7, i, t1);
    assert_eq!(wait(b.next(t1 + GATHER)), None, "namespace 7 is being dumped");
    b.dumped(7, &[(A, true), (B, true), (A, true)], t1 + GATHER);
    assert_eq!(dump(b.next(t1 + GATHER)).1.len(), 1);
    assert_eq!(b.waiting(), 0);
}

#[test]
fn a_tenant_whose_dumps_find_nothing_waits_longer_each_time_and_only_it() {
    let mut b = Board::new(100);
    let mut now = Instant::now();
    let mut a_dumped = Vec::new();
    for i in 0..12 {
        for k in [A, B] {
            b.push(k, 7, i).unwrap();
            let (k, x) = look(b.next(now));
            b.park(k, 7, x, now);
        }
        now += GATHER;
        // B's install is dumped now, whatever A's back-off.
        let (_, served) = dump(b.next(now));
        assert!(served.iter().any(|(k, _)| *k == B));
        let flags: Vec<(Key, bool)> = served.iter().map(|(k, _)| (*k, *k == B)).collect();
        b.dumped(7, &flags, now);
        if !served.iter().any(|(k, _)| *k == A) {
            // A waits out its back-off, then gets its dump.
            now = wait(b.next(now)).expect("A's back-off ends");
            let (_, served) = dump(b.next(now));
            assert_eq!(served.iter().map(|x| x.0).collect::<Vec<_>>(), [A]);
            b.dumped(7, &[(A, false)], now);
        }
        a_dumped.push(now);
    }
    let gaps: Vec<u128> = a_dumped.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 64, 128, 256, 256, 256], "doubling up to the bound");
    assert_eq!(Duration::from_millis(256), BACKOFF_MAX);
    // A connection found ends the wait.
    b.found(A);
    b.push(A, 7, 50).unwrap();
    let (k, i) = look(b.next(now));
    b.park(k, 7, i, now);
    assert_eq!(dump(b.next(now + GATHER)).1.len(), 1);
}

#[test]
fn a_dump_waits_for_the_installs_of_its_namespace_still_being_looked_up() {
    let mut b = Board::new(100);
    let t0 = Instant::now();
    b.push(A, 7, 1).unwrap();
    b.push(A, 7, 2).unwrap();
    let (k, i) = look(b.next(t0));
    b.park(k, 7, i, t0);
    let (_, second) = look(b.next(t0));
    // The second is still being looked up (a slow worker): the dump waits for it.
    assert_eq!(wait(b.next(t0 + GATHER * 3)), Some(t0 + GATHER_MAX));
    let t1 = t0 + GATHER * 3;
    b.park(A, 7, second, t1);
    assert_eq!(wait(b.next(t1)), Some(t1 + GATHER));
    assert_eq!(dump(b.next(t1 + GATHER)).1.len(), 2, "one dump for both");
    // One settled by its exact lookups does not hold the next dump up either.
    b.push(B, 7, 3).unwrap();
    b.push(B, 7, 4).unwrap();
    let (k, i) = look(b.next(t1));
    b.park(k, 7, i, t1);
    let _settled = look(b.next(t1));
    b.looked(7);
    b.dumped(7, &[(A, true), (A, true)], t1);
    assert_eq!(dump(b.next(t1 + GATHER)).1.len(), 1);
    // Nothing waits longer than GATHER_MAX for stragglers.
    b.push(A, 9, 5).unwrap();
    b.push(A, 9, 6).unwrap();
    let (k, i) = look(b.next(t1));
    b.park(k, 9, i, t1);
    let _stuck = look(b.next(t1));
    assert_eq!(dump(b.next(t1 + GATHER_MAX)).1.len(), 1);
}
