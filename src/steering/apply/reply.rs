//! What a NIC thread hands back: the reply written to the client's socket,
//! and a booked rule in its `/debug/flows` form.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Instant;

use super::{BookedRule, SocketReply};
use crate::metrics::{Metrics, RuleOp};
use crate::nic::FlowSpec;
use crate::rules::table::RuleEntry;
use crate::rules::RuleFailure;
use crate::types::status::StatusCode;

/// Writes a rule request's reply to the client's socket and counts it
/// (its latency ends at `now`) in the shared series.
pub(super) fn answer(to: SocketReply, r: Result<(), RuleFailure>, metrics: Option<&Metrics>, now: Instant) {
    let (op, code, secs) = answer_only(to, r, now);
    if let Some(m) = metrics {
        m.rule_done(op, code, secs);
    }
}

/// Writes a rule request's reply to the client's socket; what to count of it:
/// its operation, its code and its latency up to `now`, in seconds.
pub(super) fn answer_only(
    to: SocketReply,
    r: Result<(), RuleFailure>,
    now: Instant,
) -> (RuleOp, StatusCode, f64) {
    use crate::wire::frame;
    let encoded;
    let (code, bytes) = match r {
        Ok(()) => (StatusCode::Ok, frame::OK_FRAME),
        Err(f) => {
            tracing::debug!(op = to.op.name(), code = f.code.name(), error = %f.message, "rule request failed");
            encoded = frame::encode(&frame::error(f.code, f.message)).unwrap_or_else(|e| {
                frame::encode(&frame::error(StatusCode::Internal, format!("reply not sent: {e}")))
                    .expect("a short reply fits")
            });
            (f.code, &encoded[..])
        }
    };
    // The client first, the bookkeeping after.
    to.conn.answer(bytes);
    (to.op, code, now.saturating_duration_since(to.started).as_secs_f64())
}

pub(super) fn booked_rule(gpu_names: &[String], f: &FlowSpec, e: &RuleEntry) -> BookedRule {
    BookedRule {
        loc: e.loc,
        queue: e.queue,
        gpu: gpu_names[e.gpu].clone(),
        flow_type: if f.is_v6() { "tcp6" } else { "tcp4" },
        src: fmt_addr(f.src),
        dst: fmt_addr(f.dst),
        pid: e.owner.pid.map(NonZeroU32::get),
        lease: e.owner.lease.is_some(),
        tenant: e.owner.tenant,
        pending_delete: e.pending_delete,
        repaired: e.owner.repaired,
    }
}

/// `10.0.0.1:5000` / `[fd00::2]:41000` — SocketAddr's own Display form.
fn fmt_addr(a: SocketAddr) -> String {
    a.to_string()
}
