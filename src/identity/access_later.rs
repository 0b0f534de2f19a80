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
    /// so the request does not wait for the kernel's. Each is still made and
    /// counted: with [`LATER_QUEUE`] checks waiting, the next one is made in
    /// place. The thread ends with the policy.
    pub fn defer_flow_checks(self: &Arc<Self>) {
        if self.mode != TenantIsolation::Audit || self.later.get().is_some() {
            return;
        }
        let (tx, rx) = sync_channel::<Later>(LATER_QUEUE);
        let policy: Weak<TenantPolicy> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("audit-flows".into()).spawn(move || {
            while let Ok(first) = rx.recv() {
                let Some(p) = policy.upgrade() else { break };
                let mut batch = vec![first];
                batch.extend(rx.try_iter());
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
