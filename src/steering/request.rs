//! What a rule request means: parse it, pick its NIC and GPU, and either
//! answer it at once (bad input, an unknown GPU) or turn it into a [`Job`]
//! for that NIC's thread. Malformed input gets INVALID_ARGUMENT and the
//! connection closes.

use std::sync::Arc;
use std::time::Instant;

use super::{GpuSlot, Handoff, Job, Requester, RulePath, SocketReply};
use crate::endpoint::Reply;
use crate::identity::flows::{self as identity_flows, Found};
use crate::identity::{Examined, TenantPolicy};
use crate::metrics::RuleOp;
use crate::rules::flow::{self, RuleRequest};
use crate::rules::RuleFailure;
use crate::types::flow::{FlowSpec, TCP_V6_FLOW};
use crate::types::pci::PciAddr;
use crate::types::status::StatusCode;

/// The metric label of installs (`rx_rule_manager`).
pub const ENDPOINT_INSTALL: &str = "rule_manager";
/// The metric label of removals (`rx_rule_uninstall`).
pub const ENDPOINT_UNINSTALL: &str = "rule_uninstall";
use crate::wire::frame;
use crate::wire::proto::{unix_socket_proto::Payload, UnixSocketProto};

fn invalid(msg: impl Into<String>) -> Reply {
    Reply::Close(frame::error(StatusCode::InvalidArgument, msg))
}

/// How a rule request went on.
pub enum RuleStart {
    /// Answered here (bad input, no such GPU, ...).
    Answered(Reply),
    /// For NIC `nic`'s thread, which writes the reply to the client itself.
    Handed { nic: usize, job: Job },
    /// Needs the general path (an uninstall that asks every NIC): [`uninstall_everywhere`].
    General(RuleRequest),
}

/// Starts a rule request on `conn`, received at `started`, so that its
/// NIC's thread writes the reply: the connection's thread is not woken for
/// it. The caller hands the job over (batched with others) and calls
/// `Handoff::begin` first.
pub fn start_rule(
    rules: &RulePath,
    msg: UnixSocketProto,
    install: bool,
    who: Requester,
    conn: &Arc<Handoff>,
    started: Instant,
) -> RuleStart {
    let op = if install { RuleOp::Install } else { RuleOp::Uninstall };
    let req = match &msg.payload {
        Some(Payload::FlowSteerRuleRequest(req)) => match flow::parse(req) {
            Ok(req) => req,
            Err(f) => {
                rules.shared.metrics.rule_done(op, f.code, started.elapsed().as_secs_f64());
                return RuleStart::Answered(Reply::Close(frame::error(f.code, f.message)));
            }
        },
        _ => {
            rules.shared.metrics.rule_done(op, StatusCode::InvalidArgument, started.elapsed().as_secs_f64());
            return RuleStart::Answered(invalid("expected a flow_steer_rule_request"));
        }
    };
    start_parsed(rules, req, install, who, conn, started, None)
}

/// [`start_rule`] for an install of a garbled IPv6 flow that
/// `steering::repair` looked up (`found`).
pub fn start_looked(
    rules: &RulePath,
    req: RuleRequest,
    who: Requester,
    conn: &Arc<Handoff>,
    started: Instant,
    found: Result<Found, String>,
) -> RuleStart {
    start_parsed(rules, req, true, who, conn, started, Some(found))
}

fn start_parsed(
    rules: &RulePath,
    mut req: RuleRequest,
    install: bool,
    who: Requester,
    conn: &Arc<Handoff>,
    started: Instant,
    found: Option<Result<Found, String>>,
) -> RuleStart {
    let op = if install { RuleOp::Install } else { RuleOp::Uninstall };
    let answered = |code: StatusCode, reply: Reply| {
        rules.shared.metrics.rule_done(op, code, started.elapsed().as_secs_f64());
        RuleStart::Answered(reply)
    };
    let mut who = who;
    let examined = match repair(rules, &mut req, &mut who, op, found) {
        Ok(e) => e,
        Err(f) => return answered(f.code, Reply::Message(frame::error(f.code, f.message))),
    };
    let (nic, gpu) = match resolve(rules, &req) {
        Ok((pci, slot)) => {
            if install {
                if let Err(f) = check_install(rules, &who, &examined, pci, slot) {
                    return answered(f.code, Reply::Message(frame::error(f.code, f.message)));
                }
            }
            (slot.nic, slot.index)
        }
        Err(_) if !install => return RuleStart::General(req),
        Err(f) => return answered(f.code, Reply::Message(frame::error(f.code, f.message))),
    };
    let to = SocketReply { conn: conn.clone(), op, started };
    let job = if install {
        Job::install_to(req.flow, gpu, req.queue, who, to)
    } else {
        Job::uninstall_to(req.flow, who, to)
    };
    RuleStart::Handed { nic, job }
}

/// An uninstall whose NIC the request does not tell ([`RuleStart::General`]),
/// answered on the runtime: every NIC is asked (the NIC threads do the NIC work).
pub async fn uninstall_everywhere(rules: &RulePath, req: RuleRequest, mut who: Requester) -> Reply {
    let started = Instant::now();
    who.garbled = identity_flows::repairable(&req.flow);
    let (code, reply) = match uninstall_rule(rules, &req, who).await {
        Ok(()) => (StatusCode::Ok, Reply::Message(frame::ok())),
        Err(f) => {
            tracing::debug!(code = f.code.name(), error = %f.message, "uninstall failed");
            (f.code, Reply::Message(frame::error(f.code, f.message)))
        }
    };
    rules.shared.metrics.rule_done(RuleOp::Uninstall, code, started.elapsed().as_secs_f64());
    reply
}

/// Writes `reply` to a connection whose request was handed off its thread.
pub fn answer_handed(conn: &Handoff, reply: Reply) {
    let msg = match reply {
        Reply::Message(m) | Reply::Close(m) => m,
        Reply::Fd(_) => frame::error(StatusCode::Internal, "no file descriptor is served here"),
    };
    let bytes = frame::encode(&msg).unwrap_or_else(|e| {
        frame::encode(&frame::error(StatusCode::Internal, format!("reply not sent: {e}")))
            .expect("a short reply fits")
    });
    conn.answer(&bytes);
}

/// The target GPU: the named one, else the first GPU of the NIC that owns `dst`.
fn resolve(rules: &RulePath, req: &RuleRequest) -> Result<(PciAddr, GpuSlot), RuleFailure> {
    if let Some(gpu) = req.gpu {
        return rules.gpu(&gpu).map(|s| (gpu, s)).ok_or_else(|| {
            RuleFailure::new(StatusCode::NotFound, format!("GPU {gpu} is not managed by this daemon"))
        });
    }
    let ip = req.flow.dst.ip();
    rules.nic_for_address(ip).and_then(|nic| rules.gpu_at(nic, 0)).ok_or_else(|| {
        RuleFailure::new(
            StatusCode::NotFound,
            format!("no gpu_pci_addr given and {ip} is not an address of a managed NIC"),
        )
    })
}

/// Looks the request's flow up where that matters ([`TenantPolicy::examine`]):
/// a garbled IPv6 flow that fits one connection of the client is steered as
/// that connection (and counted); one that fits several is refused in every
/// mode ([`ambiguous`]). `found`: the lookup of a garbled install, made by
/// `steering::repair`. An uninstall is not looked up: a garbled one is
/// marked, and its NIC thread finds the rule of the client's process it means.
fn repair(
    rules: &RulePath,
    req: &mut RuleRequest,
    who: &mut Requester,
    op: RuleOp,
    found: Option<Result<Found, String>>,
) -> Result<Examined, RuleFailure> {
    if op == RuleOp::Uninstall {
        who.garbled = identity_flows::repairable(&req.flow);
        return Ok(Examined { flow: req.flow, sent: req.flow, repaired: false, found: None });
    }
    let e = match found {
        Some(found) => TenantPolicy::examined(req.flow, found),
        None => {
            let check = !rules.shared.tenants.checks_flow_later(&req.flow);
            rules.shared.tenants.examine(&who.client, req.flow, check)
        }
    };
    if e.repaired {
        tracing::debug!(op = op.name(), sent = %req.flow, steered = %e.flow, "IPv6 flow repaired");
        rules.shared.metrics.ipv6_flows_repaired.with_label_values(&[op.name()]).inc();
        req.flow = e.flow;
        who.owner.repaired = true;
    } else if let Some(all) = e.ambiguous() {
        return Err(ambiguous(&req.flow, all, who.client.cgroup_id()));
    }
    Ok(e)
}

/// The refusal of a garbled IPv6 flow that fits several connections
/// (`fits`, each with its creator's cgroup id). It names the client's own
/// (of tenant `own`) and only counts the rest, which may be other tenants'
/// connections; the log names them all.
fn ambiguous(sent: &FlowSpec, fits: &[(FlowSpec, u64)], own: Option<u64>) -> RuleFailure {
    let show = |f: &FlowSpec| format!("{} -> {}", f.src, f.dst);
    let all: Vec<String> = fits.iter().map(|(f, _)| show(f)).collect();
    tracing::info!(sent = %sent, fits = %all.join(", "), "a garbled IPv6 flow fits several connections");
    let mine: Vec<String> = fits.iter().filter(|(_, cg)| Some(*cg) == own).map(|(f, _)| show(f)).collect();
    let which = match (mine.len(), fits.len() - mine.len()) {
        _ if own.is_none() => format!("it fits {} connections", fits.len()),
        (0, _) => format!("it fits {} connections, none of them this client's", fits.len()),
        (n, 0) => format!("{n} connections of this client fit it: {}", mine.join(", ")),
        (n, others) => format!(
            "it fits {} connections: {n} of this client's ({}) and {others} not its own",
            fits.len(),
            mine.join(", ")
        ),
    };
    RuleFailure::new(
        StatusCode::FailedPrecondition,
        format!(
            "flow {} names only the first 8 bytes of each address, and {which}; the daemon does not guess \
             (try again on a new connection)",
            show(sent)
        ),
    )
}

/// Tenant checks of an install: the GPU must be the client's, and the
/// flow (repaired, where it was) its own TCP connection.
fn check_install(
    rules: &RulePath,
    who: &Requester,
    examined: &Examined,
    pci: PciAddr,
    slot: GpuSlot,
) -> Result<(), RuleFailure> {
    let t = &rules.shared.tenants;
    if !t.checks() {
        return Ok(());
    }
    t.check_gpu(ENDPOINT_INSTALL, &who.client, slot.ordinal, &pci)
        .and_then(|_| match t.checks_flow_later(&examined.flow) {
            true => {
                t.check_flow_later(ENDPOINT_INSTALL, &who.client, examined.flow);
                Ok(())
            }
            false => t.check_flow(ENDPOINT_INSTALL, &who.client, examined),
        })
        .map_err(|d| RuleFailure::new(d.code(), d.message))
}

/// The install `msg` asks for, when it is a well-formed request for an
/// IPv6 flow that may name only half of each address: it is looked up by
/// `steering::repair` (see [`crate::identity::flows`]), off the caller's thread.
pub fn needs_repair(msg: &UnixSocketProto, install: bool) -> Option<RuleRequest> {
    match &msg.payload {
        Some(Payload::FlowSteerRuleRequest(r)) if install && names_ipv6_flow(msg) => {
            flow::parse(r).ok().filter(|r| identity_flows::repairable(&r.flow))
        }
        _ => None,
    }
}

/// Whether `msg` asks about an IPv6 flow (an uninstall of one may be
/// repaired to the client's own rule, so its client is identified in every mode).
pub fn names_ipv6_flow(msg: &UnixSocketProto) -> bool {
    matches!(&msg.payload, Some(Payload::FlowSteerRuleRequest(r))
        if r.flow_steer_ntuple.as_ref().and_then(|n| n.flow_type) == Some(TCP_V6_FLOW as i32))
}

/// Uninstall of an unknown flow is "Ok."; without a resolvable NIC, every NIC is asked.
async fn uninstall_rule(rules: &RulePath, req: &RuleRequest, who: Requester) -> Result<(), RuleFailure> {
    match resolve(rules, req) {
        Ok((_, slot)) => rules.nics[slot.nic].uninstall(req.flow, who).await.map(|_| ()),
        Err(_) => {
            for w in &rules.nics {
                w.uninstall(req.flow, who.clone()).await?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ambiguity_refusal_names_only_the_clients_own_connections() {
        let f = |l: &str, r: &str| FlowSpec { src: r.parse().unwrap(), dst: l.parse().unwrap() };
        let sent = f("[fd00::1:0:0:0:7]:5000", "[fd00::2:0:0:0:9]:40001");
        let (mine, theirs) = (f("[fd00::1]:5000", "[fd00::2]:40001"), f("[fd00::3]:5000", "[fd00::4]:40001"));
        let text = |fits: &[(FlowSpec, u64)], own| ambiguous(&sent, fits, own).message;
        let t = text(&[(mine, 1), (theirs, 2), (mine, 1)], Some(1));
        assert!(t.contains("[fd00::1]:5000") && t.contains("1 not its own"), "{t}");
        assert!(t.contains(&format!("{} -> {}", sent.src, sent.dst)), "the flow as sent: {t}");
        for (fits, own) in [
            (&[(mine, 1), (theirs, 2)][..], Some(1)),
            (&[(mine, 1), (theirs, 2)], Some(3)),
            (&[(mine, 1), (theirs, 2)], None),
        ] {
            let t = text(fits, own);
            assert!(!t.contains("fd00::3") && !t.contains("fd00::4"), "names another's connection: {t}");
            if own != Some(1) {
                assert!(!t.contains("[fd00::1]"), "{t}");
            }
        }
        let t = text(&[(mine, 1), (mine, 1)], Some(1));
        assert!(t.contains("2 connections of this client fit it"), "{t}");
        assert_eq!(ambiguous(&sent, &[(mine, 1), (theirs, 1)], Some(1)).code, StatusCode::FailedPrecondition);
    }
}
