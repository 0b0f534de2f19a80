//! Audit mode's flow checks after the reply: an IPv4 install's check does
//! not change the answer in audit mode, so it runs on a thread of its own,
//! in batches whose lookups go to the kernel together.

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, TrySendError};
use std::sync::{Arc, Weak};

use super::{flows, Examined, TenantPolicy};
use crate::config::flags::TenantIsolation;
use crate::identity::Client;
use crate::types::flow::FlowSpec;

/// Flow checks waiting for the audit thread, at most.
pub const LATER_QUEUE: usize = 4096;
/// Flow checks the audit thread makes per tenant and second, at most.
pub const AUDIT_CHECKS_PER_SECOND: u32 = 1000;

/// Each tenant's flow checks in the current second: a tenant that installs
/// faster than [`AUDIT_CHECKS_PER_SECOND`] has the rest of its second's
/// installs left unchecked (counted), so that its burst costs the daemon a
/// bounded number of kernel lookups, whatever its rate. Audit mode only
/// reports: a tenant whose flows are not its own shows in its first
/// thousand checks a second as surely as in all of them.
#[derive(Default)]
pub(super) struct AuditShare {
    by_tenant: HashMap<u64, (std::time::Instant, u32)>,
}

impl AuditShare {
    /// Whether tenant `cgroup` may have one more flow checked at `now`.
    pub(super) fn admit(&mut self, cgroup: u64, now: std::time::Instant) -> bool {
        if self.by_tenant.len() > 4 * LATER_QUEUE {
            self.by_tenant
                .retain(|_, (since, _)| now.duration_since(*since) < std::time::Duration::from_secs(1));
        }
        let (since, used) = self.by_tenant.entry(cgroup).or_insert((now, 0));
        if now.duration_since(*since) >= std::time::Duration::from_secs(1) {
            (*since, *used) = (now, 0);
        }
        if *used >= AUDIT_CHECKS_PER_SECOND {
            return false;
        }
        *used += 1;
        true
    }
}
/// How long the audit thread lets checks gather after a batch.
const LATER_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

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
    /// checks waiting, the next one is made in place; past a tenant's
    /// share of a second (`AuditShare`) a check is counted as skipped.
    /// The thread ends with the policy.
    pub fn defer_flow_checks(self: &Arc<Self>) {
        if self.mode != TenantIsolation::Audit || self.later.get().is_some() {
            return;
        }
        let (tx, rx) = sync_channel::<Later>(LATER_QUEUE);
        let policy: Weak<TenantPolicy> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("audit-flows".into()).spawn(move || {
            let mut share = AuditShare::default();
            while let Ok(first) = rx.recv() {
                let Some(p) = policy.upgrade() else { break };
                let mut batch = vec![first];
                batch.extend(rx.try_iter());
                let now = std::time::Instant::now();
                let before = batch.len();
                batch.retain(|j| j.client.tenant.as_ref().is_none_or(|t| share.admit(t.cgroup_id, now)));
                if let (Some(m), skipped @ 1..) = (&p.metrics, before - batch.len()) {
                    m.audit_flow_checks_skipped.inc_by(skipped as u64);
                }
                p.check_flows(&batch);
                drop(p);
                // Checks that come meanwhile wait a little: a sender that
                // finds the thread asleep here does not have to wake it.
                std::thread::sleep(LATER_PAUSE);
            }
        });
        if spawned.is_ok() {
            let _ = self.later.set(tx);
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
        let job = match self.later.get() {
            Some(tx) => match tx.try_send(job) {
                Ok(()) => return,
                Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => job,
            },
            None => job,
        };
        let e = self.examine(&job.client, job.flow, true);
        let _ = self.check_flow(endpoint, &job.client, &e);
    }
}

#[cfg(test)]
mod share_tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn each_tenant_has_its_own_share_of_checks_a_second() {
        let mut s = AuditShare::default();
        let t0 = Instant::now();
        let admitted = (0..AUDIT_CHECKS_PER_SECOND + 5).filter(|_| s.admit(7, t0)).count();
        assert_eq!(admitted, AUDIT_CHECKS_PER_SECOND as usize, "the rest of the second is left out");
        assert!(s.admit(8, t0), "another tenant's share is untouched");
        assert!(!s.admit(7, t0 + Duration::from_millis(999)));
        assert!(s.admit(7, t0 + Duration::from_secs(1)), "a new second, a new share");
    }
}
