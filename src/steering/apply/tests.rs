//! The rule thread: inline runs, freezing, slow NICs.
use super::*;
use crate::nic::sim::SimNic;
use crate::nic::{NicOp, NicSetup, RuleControl, FEATURE_NTUPLE};

fn flow(i: u32) -> FlowSpec {
    FlowSpec {
        src: format!("10.1.{}.{}:{}", i / 250, i % 250, 1000 + i % 50_000).parse().unwrap(),
        dst: "192.168.1.2:5000".parse().unwrap(),
    }
}

fn setup() -> (Arc<SimNic>, NicRuleThread) {
    let nic = Arc::new(SimNic::new(&["eth1"]));
    nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
    let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
    let t = NicRuleThread::new(
        "eth1",
        1000,
        vec![(gpu, vec![8, 9])],
        nic.clone(),
        &crate::steering::Shared::for_tests(),
        None,
    )
    .unwrap();
    (nic, t)
}

/// An install job and the receiver of its answer.
fn install_job(i: u32) -> (Job, oneshot::Receiver<Result<Installed, RuleFailure>>) {
    let (reply, rx) = oneshot::channel();
    (Job::Install { flow: flow(i), gpu: 0, hint: None, who: Requester::unchecked(), reply }, rx)
}

/// Installs through the NIC thread until the NIC is trusted (a preempted
/// operation on a busy machine may restart the streak); returns how many.
async fn warm_up(t: &NicRuleThread, first: u32) -> u32 {
    let mut n = 0;
    while !t.core.fast.load(Ordering::Relaxed) {
        assert!(n < 20 * FAST_STREAK, "never trusted after {n} quick installs");
        t.install(flow(first + n), 0, None, Requester::unchecked()).await.unwrap();
        n += 1;
    }
    n
}

/// Offers one install to `run_here`, a few times (the NIC thread answers
/// its last caller just before it lets go of the NIC); `Some(answer)`
/// when it ran on this thread.
fn offer(t: &NicRuleThread, i: u32) -> Option<Result<Installed, RuleFailure>> {
    let (job, mut rx) = install_job(i);
    let mut batch = vec![job];
    for _ in 0..50 {
        if t.run_here(&mut batch) {
            assert!(batch.is_empty());
            return Some(rx.try_recv().expect("answered before run_here returned"));
        }
        assert_eq!(batch.len(), 1, "a refused batch is left as it was");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    None
}

#[tokio::test]
async fn lone_requests_run_here_only_after_a_streak_of_quick_operations() {
    let (_nic, t) = setup();
    assert!(offer(&t, 0).is_none(), "a NIC not yet seen answering is not trusted");
    for i in 0..FAST_STREAK - 1 {
        t.install(flow(100 + i), 0, None, Requester::unchecked()).await.unwrap();
    }
    assert!(offer(&t, 0).is_none(), "not before a whole streak");
    let n = FAST_STREAK - 1 + warm_up(&t, 10_000).await;
    match offer(&t, 1) {
        Some(Ok(Installed::New(e))) => assert!(e.queue == 8 || e.queue == 9),
        other => panic!("expected an install run here, got {other:?}"),
    }
    // The bookkeeping is the NIC thread's own: it sees the inline install.
    let copy = t.booked_copy().await;
    assert_eq!(copy.rules.len(), n as usize + 1);
}

#[tokio::test]
async fn a_frozen_thread_writes_its_table_and_runs_nothing_until_released() {
    let (nic, t) = setup();
    for i in 0..5 {
        t.install(flow(i), 0, None, Requester::unchecked()).await.unwrap();
    }
    let (table, hold) = t.freeze().expect("thread alive");
    let table = table.await.unwrap();
    assert_eq!(table.rules.len(), 5 * crate::wire::handover::RECORD);
    assert_eq!(table.capacity, 1000);
    let later = tokio::spawn({
        let t = std::sync::Arc::new(t);
        async move { (t.install(flow(99), 0, None, Requester::unchecked()).await, t) }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(!later.is_finished(), "frozen: the install waits");
    assert_eq!(nic.list_rules("eth1").unwrap().len(), 5, "nothing reached the NIC");
    drop(hold);
    let (r, t) = tokio::time::timeout(Duration::from_secs(5), later).await.unwrap().unwrap();
    assert!(r.is_ok());
    // A thread started over the table books exactly what it held.
    let adopted = NicRules::from_wire(&table, 1000, &[vec![8, 9]]).unwrap();
    let gpu: PciAddr = "0000:04:00.0".parse().unwrap();
    let shared = crate::steering::Shared::for_tests();
    let metrics = shared.metrics.clone();
    let t2 = NicRuleThread::new("eth1", 1000, vec![(gpu, vec![8, 9])], nic.clone(), &shared, Some(adopted))
        .unwrap();
    assert_eq!(t2.booked_copy().await.rules.len(), 5);
    assert_eq!(metrics.rules_installed.with_label_values(&["eth1"]).get(), 5);
    assert!(matches!(t2.install(flow(3), 0, None, Requester::unchecked()).await, Ok(Installed::Existing(_))));
    drop(t);
}

#[tokio::test]
async fn one_slow_operation_sends_requests_back_to_the_nic_thread() {
    let (nic, t) = setup();
    warm_up(&t, 0).await;
    nic.delay_on("eth1", NicOp::AddRule, FAST_OP * 3);
    // Still trusted: this one runs here, and is measured slow.
    assert!(offer(&t, 1001).is_some());
    assert!(offer(&t, 1002).is_none(), "a slow NIC's requests go to its thread");
    nic.clear_faults();
    // Trust comes back only after a new streak.
    for i in 0..FAST_STREAK - 1 {
        t.install(flow(2000 + i), 0, None, Requester::unchecked()).await.unwrap();
    }
    assert!(offer(&t, 1003).is_none());
    warm_up(&t, 3000).await;
    assert!(offer(&t, 1004).is_some());
}

#[tokio::test]
async fn a_busy_nic_or_queued_work_keeps_requests_on_its_thread() {
    let (nic, t) = setup();
    warm_up(&t, 0).await;
    // While the thread runs a (slow) operation, nothing runs beside it,
    // and what is queued behind it keeps its turn.
    nic.delay_on("eth1", NicOp::AddRule, std::time::Duration::from_millis(500));
    let (slow, slow_rx) = install_job(500);
    let (queued, queued_rx) = install_job(501);
    t.submit(&mut vec![slow, queued]);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(offer(&t, 502).is_none(), "the NIC is busy");
    assert!(slow_rx.await.unwrap().is_ok());
    assert!(queued_rx.await.unwrap().is_ok());
}
