//! A NIC thread's batch in turns by tenant: the rule requests of one batch
//! (from every rule I/O thread) are run one tenant after the other, newest
//! tenant first, and when several tenants have requests queued the thread
//! runs [`NIC_TURN`] of them and then looks at the queue again (the rest go
//! back to its front, with whatever came meanwhile). So a tenant with
//! hundreds of requests queued delays another's by a few of its own, not by
//! all of them. Nothing moves across a job that is not a client's rule
//! request (a takeover's freeze, a snapshot, a reclaim): those keep their
//! place in the arrival order.

/// Requests run per look at the queue while tenants take turns.
pub(super) const NIC_TURN: usize = 16;

use super::Job;
use crate::types::fair::FairQueue;

/// The turn key of a client's rule request; `None` for other jobs.
fn turn(job: &Job) -> Option<u64> {
    match job {
        Job::InstallTo { who, .. } | Job::UninstallTo { who, .. } => Some(who.turn()),
        _ => None,
    }
}

/// Reorders `batch` so that tenants take turns (see the module's notes);
/// `lanes` is scratch space, empty before and after. Whether several
/// tenants had requests in it.
pub(super) fn take_turns(batch: &mut Vec<Job>, lanes: &mut FairQueue<u64, Job>) -> bool {
    let Some(first) = batch.iter().find_map(turn) else { return false };
    if batch.iter().all(|j| turn(j).is_none_or(|k| k == first)) {
        return false; // one tenant: arrival order is its order
    }
    let mut out = Vec::with_capacity(batch.len());
    for job in batch.drain(..) {
        match turn(&job) {
            Some(key) => lanes.push(key, job),
            None => {
                out.extend(std::iter::from_fn(|| lanes.pop().map(|(_, j)| j)));
                out.push(job);
            }
        }
    }
    out.extend(std::iter::from_fn(|| lanes.pop().map(|(_, j)| j)));
    *batch = out;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Client, ClientInfo, Tenant};
    use crate::steering::{Requester, SocketReply};
    use std::sync::Arc;

    fn install(tenant: u64, port: u16, inbox: &Arc<crate::steering::Inbox>) -> Job {
        let who = Requester::from(Client::from(ClientInfo {
            tenant: Some(Arc::new(Tenant::for_test(tenant, 0))),
            ..ClientInfo::default()
        }));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let conn = Arc::new(crate::steering::Handoff::new(a.into(), inbox.clone(), 0));
        let to =
            SocketReply { conn, op: crate::metrics::RuleOp::Install, started: std::time::Instant::now() };
        let flow = crate::types::flow::FlowSpec {
            src: format!("10.0.0.1:{port}").parse().unwrap(),
            dst: "192.168.1.2:5000".parse().unwrap(),
        };
        Job::install_to(flow, 0, None, who, to)
    }

    fn order(batch: &[Job]) -> Vec<String> {
        batch
            .iter()
            .map(|j| match j {
                Job::InstallTo { flow, who, .. } => {
                    format!("{}:{}", who.owner.tenant.unwrap(), flow.src.port())
                }
                Job::Wake => "wake".into(),
                _ => "other".into(),
            })
            .collect()
    }

    #[test]
    fn a_batch_runs_tenant_after_tenant_and_nothing_crosses_other_jobs() {
        let inbox = Arc::new(crate::steering::Inbox::new().unwrap());
        let mut lanes = FairQueue::default();
        let mut batch: Vec<Job> = (0..5).map(|p| install(1, p, &inbox)).collect();
        batch.push(install(2, 100, &inbox));
        batch.push(Job::Wake);
        batch.push(install(1, 5, &inbox));
        batch.push(install(3, 300, &inbox));
        assert!(take_turns(&mut batch, &mut lanes));
        // Before the other job: the tenant with one request goes second at the latest.
        assert_eq!(order(&batch)[..7], ["2:100", "1:0", "1:1", "1:2", "1:3", "1:4", "wake"]);
        assert_eq!(order(&batch)[7..], ["3:300", "1:5"]);
        assert!(lanes.is_empty());
        // One tenant: untouched.
        let mut one: Vec<Job> = (0..3).map(|p| install(7, p, &inbox)).collect();
        assert!(!take_turns(&mut one, &mut lanes));
        assert_eq!(order(&one), ["7:0", "7:1", "7:2"]);
    }
}
