//! Audit mode's flow checks after the reply: an IPv4 install's check does
//! not change the answer in audit mode, so it runs on a thread of its own,
//! in batches whose lookups go to the kernel together.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, Weak};

use super::{flows, Examined, TenantPolicy};
use crate::config::flags::TenantIsolation;
use crate::identity::Client;
use crate::types::flow::FlowSpec;

/// Flow checks waiting for the audit thread, at most.
pub const LATER_QUEUE: usize = 4096;

/// How long the audit thread lets checks gather after a batch.
const LATER_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// The audit thread's queue. Every install's flow is checked while the
/// thread keeps up; what it counts does not depend on the order or timing
/// of a tenant's requests. Only when [`LATER_QUEUE`] checks already wait
/// is one left out (counted as skipped): one of the sending workload's own
/// (all its cgroups' together), chosen at random among its waiting ones and
/// the new one (or, when it has none waiting, of the workload with the
/// most), so that a workload can neither push another's checks out nor
/// pick which of its own are left: its forged flows are as likely to be
/// checked as the rest.
pub(super) struct AuditQueue {
    jobs: Mutex<Jobs>,
    ready: Condvar,
    /// xorshift state, seeded at random per daemon.
    rng: Mutex<u64>,
}

/// The checks waiting, and whether the audit thread sleeps until there is
/// one (only then is it woken: a wake-up is a system call, and installs
/// come far faster than the thread's batches).
#[derive(Default)]
struct Jobs {
    queue: VecDeque<Later>,
    idle: bool,
}

impl AuditQueue {
    fn new() -> AuditQueue {
        use std::hash::{BuildHasher, Hasher};
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish() | 1;
        AuditQueue { jobs: Mutex::default(), ready: Condvar::new(), rng: Mutex::new(seed) }
    }

    fn random_below(&self, n: usize) -> usize {
        let mut x = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        (*x % n as u64) as usize
    }

    /// Queues `job`; `false` when a check was left out to make room.
    fn push(&self, job: Later) -> bool {
        let mut guard = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if guard.queue.len() < LATER_QUEUE {
            guard.queue.push_back(job);
            if std::mem::take(&mut guard.idle) {
                self.ready.notify_one();
            }
            return true;
        }
        let jobs = &mut guard.queue;
        let key = tenant_key(&job);
        let mut own: Vec<usize> = (0..jobs.len()).filter(|&i| tenant_key(&jobs[i]) == key).collect();
        if own.is_empty() {
            // The queue is others': one of the tenant's with the most waiting goes.
            let mut counts: HashMap<Option<u64>, usize> = HashMap::new();
            jobs.iter().for_each(|j| *counts.entry(tenant_key(j)).or_default() += 1);
            let most = counts.into_iter().max_by_key(|(_, n)| *n).map(|(k, _)| k);
            own = (0..jobs.len()).filter(|&i| Some(tenant_key(&jobs[i])) == most).collect();
            let victim = own[self.random_below(own.len())];
            jobs[victim] = job;
            return false;
        }
        // One of the tenant's waiting checks and the new one, at random.
        let pick = self.random_below(own.len() + 1);
        if let Some(&victim) = own.get(pick) {
            jobs[victim] = job;
        }
        false
    }

    /// Every check waiting, once there is one.
    fn take_all(&self) -> Vec<Later> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        while jobs.queue.is_empty() {
            jobs.idle = true;
            jobs = self.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
        }
        jobs.queue.drain(..).collect()
    }
}

/// Whose check `job` is: its tenant's workload, or the unidentified.
fn tenant_key(job: &Later) -> Option<u64> {
    job.client.workload_id()
}

/// The audit thread: batches of checks until the policy is gone.
fn audit_loop(jobs: &AuditQueue, policy: &Weak<TenantPolicy>) {
    loop {
        let batch = jobs.take_all();
        let Some(p) = policy.upgrade() else { break };
        p.check_flows(&batch);
        drop(p);
        // Checks that come meanwhile wait a little, to go in one batch.
        std::thread::sleep(LATER_PAUSE);
    }
}

/// A flow check for the audit thread.
pub(super) struct Later {
    endpoint: &'static str,
    client: Client,
    flow: FlowSpec,
}

impl TenantPolicy {
    /// In audit mode, runs the flow checks of IPv4 installs on a thread of
    /// their own, after the reply: their answer does not change the reply,
    /// so the request does not wait for the kernel's. With [`LATER_QUEUE`]
    /// checks waiting, one of the sending workload's is counted as skipped
    /// (the audit queue). The thread ends with the policy.
    pub fn defer_flow_checks(self: &Arc<Self>) {
        if self.mode != TenantIsolation::Audit || self.later.get().is_some() {
            return;
        }
        let queue = Arc::new(AuditQueue::new());
        let policy: Weak<TenantPolicy> = Arc::downgrade(self);
        let jobs = queue.clone();
        let spawned = std::thread::Builder::new().name("audit-flows".into()).spawn(move || {
            // Below the rule path: on a busy machine checks wait (and, past
            // the queue's bound, some are left out at random), requests do not.
            crate::identity::lower_priority("audit thread");
            audit_loop(&jobs, &policy);
        });
        if spawned.is_ok() {
            let _ = self.later.set(queue);
        }
    }

    /// The flow checks of `batch`: the lookups of each network namespace
    /// made together ([`flows::locate_many`]).
    fn check_flows(&self, batch: &[Later]) {
        let mut by_ns: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, j) in batch.iter().enumerate() {
            match (&j.client.tenant, j.client.netns()) {
                (Some(_), Some(ns)) => by_ns.entry(ns.inode).or_default().push(i),
                // Unidentified, or no namespace: the check says why, no lookup.
                _ => {
                    let e = Examined { flow: j.flow, sent: j.flow, repaired: false, found: None };
                    let found = j
                        .client
                        .tenant
                        .as_ref()
                        .map(|_| Err("its network namespace could not be opened".into()));
                    let _ = self.check_flow(j.endpoint, &j.client, &Examined { found, ..e });
                }
            }
        }
        for idx in by_ns.values() {
            let ns = batch[idx[0]].client.netns().expect("grouped by namespace");
            let flows: Vec<FlowSpec> = idx.iter().map(|&i| batch[i].flow).collect();
            for (&i, found) in idx.iter().zip(flows::locate_many(ns, &flows)) {
                let j = &batch[i];
                let e = Examined { flow: j.flow, sent: j.flow, repaired: false, found: Some(found) };
                let _ = self.check_flow(j.endpoint, &j.client, &e);
            }
        }
    }

    /// Whether an install's flow check may wait until after the reply:
    /// audit mode, an IPv4 flow (an IPv6 one is looked up at once, to be
    /// repaired), checks deferred.
    pub fn checks_flow_later(&self, flow: &FlowSpec) -> bool {
        self.later.get().is_some() && !flows::repairable(flow)
    }

    /// Checks `flow` for `who` after the reply (see [`Self::defer_flow_checks`]).
    pub fn check_flow_later(&self, endpoint: &'static str, who: &Client, flow: FlowSpec) {
        let job = Later { endpoint, client: who.clone(), flow };
        match self.later.get() {
            Some(q) => {
                if !q.push(job) {
                    if let Some(m) = &self.metrics {
                        m.audit_flow_checks_skipped.inc();
                    }
                }
            }
            None => {
                let e = self.examine(&job.client, job.flow, true);
                let _ = self.check_flow(endpoint, &job.client, &e);
            }
        }
    }
}

#[cfg(test)]
mod queue_tests {
    use super::*;

    fn job(cgroup: Option<u64>) -> Later {
        job_in(cgroup, cgroup)
    }

    /// A check of a client in `cgroup`, of workload `workload`.
    fn job_in(cgroup: Option<u64>, workload: Option<u64>) -> Later {
        use crate::identity::{tenant::Tenant, workload::Workload};
        let client = match (cgroup, workload) {
            (Some(id), Some(w)) => Client::from(crate::identity::ClientInfo {
                tenant: Some(Arc::new(Tenant::from_parts(id, None, Workload::cgroup(w, None), 0, None))),
                ..Default::default()
            }),
            _ => Client::from(crate::identity::ClientInfo::default()),
        };
        Later {
            endpoint: "rx_rule_manager",
            client,
            flow: FlowSpec { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() },
        }
    }

    fn count(q: &AuditQueue, cgroup: u64) -> usize {
        q.jobs.lock().unwrap().queue.iter().filter(|j| tenant_key(j) == Some(cgroup)).count()
    }

    #[test]
    fn every_check_waits_its_turn_until_the_queue_is_full() {
        let q = AuditQueue::new();
        assert!((0..LATER_QUEUE).all(|_| q.push(job(Some(7)))));
        assert_eq!(q.take_all().len(), LATER_QUEUE);
    }

    #[test]
    fn a_full_queue_leaves_out_the_flooders_checks_never_anothers() {
        let q = AuditQueue::new();
        q.push(job(Some(8)));
        for _ in 0..LATER_QUEUE - 1 {
            q.push(job(Some(7)));
        }
        // Tenant 7 floods on: each time one of its own is left out.
        for _ in 0..500 {
            assert!(!q.push(job(Some(7))));
            assert_eq!(count(&q, 8), 1, "another tenant's check was pushed out");
        }
        // Tenant 8, with a check waiting, takes its own chances: 7's stay.
        assert!(!q.push(job(Some(8))));
        assert_eq!(count(&q, 7), LATER_QUEUE - 1);
        // Tenant 9, with none waiting, takes the place of one of the flooder's.
        assert!(!q.push(job(Some(9))));
        assert_eq!((count(&q, 7), count(&q, 9)), (LATER_QUEUE - 2, 1));
    }

    #[test]
    fn a_workloads_cgroups_take_their_chances_as_one() {
        // Workload 80 has a check waiting from its cgroup 8; workload 70
        // fills the rest of the queue. A check from 80's other cgroup takes
        // its chances among 80's own: it cannot push 70's out as a newcomer.
        let q = AuditQueue::new();
        q.push(job_in(Some(8), Some(80)));
        for _ in 0..LATER_QUEUE - 1 {
            q.push(job_in(Some(7), Some(70)));
        }
        for _ in 0..100 {
            assert!(!q.push(job_in(Some(9), Some(80))));
            assert_eq!((count(&q, 70), count(&q, 80)), (LATER_QUEUE - 1, 1));
        }
    }

    #[test]
    fn which_of_a_tenants_checks_are_left_out_is_not_its_order() {
        // A tenant fills the queue with its own flows, then sends a late one:
        // the late one stays about as often as any waiting one, not never.
        let (mut late_kept, rounds) = (0, 100);
        for _ in 0..rounds {
            let q = AuditQueue::new();
            for _ in 0..LATER_QUEUE {
                q.push(job(Some(7)));
            }
            let mut late = job(Some(7));
            late.endpoint = "late";
            q.push(late);
            late_kept += usize::from(q.jobs.lock().unwrap().queue.iter().any(|j| j.endpoint == "late"));
        }
        // Kept with chance 4096/4097 each round: all but very rarely one.
        assert!(late_kept >= rounds - 3, "the late check kept {late_kept} of {rounds} times");
    }
}
