//! Who a rule connection's client is, and serving its requests.
//!
//! The client is asked for when the connection is taken in (accept, or a
//! takeover), which also gives the connection its turn key: requests are
//! served tenant by tenant (see `io_thread`). A client whose process is
//! new has its tenant read by the identity readers, off this thread: the
//! connection goes on reading, and a request that arrives before the read
//! ends waits, parsed, until the thread is woken for it (through its
//! inbox) or the wait times out. Nothing here blocks the thread.

use std::cmp::Reverse;
use std::num::NonZeroU32;
use std::task::Waker;

use super::{Conn, Cx};
use crate::config::flags::TenantIsolation;
use crate::endpoint::budget::NOBODY_WORKLOAD;
use crate::endpoint::{shutting_down, Endpoint, Reply};
use crate::identity::{self, Asked, Client, IdentifyError, PendingClient, Tenant};
use crate::metrics::RuleOp;
use crate::steering::request::{self, RuleStart};
use crate::steering::{turn_of, Requester};
use crate::types::status::StatusCode;
use crate::wire::frame;
use crate::wire::proto::UnixSocketProto;

/// Who a connection's client is, as far as its thread knows.
pub(super) enum Who {
    /// To be asked (asked again after a failure).
    Unasked,
    /// Not asked: the connection's requests need no client (removals while
    /// isolation is off), unless one names an IPv6 flow (to be repaired in
    /// the client's network namespace).
    Unneeded,
    Known(Requester),
    /// Its tenant is being read; the waker posts the connection to its
    /// thread's inbox when the read ends.
    Reading(PendingClient, Waker),
    /// Could not be told in time: the next request is answered as the mode
    /// says, and the one after asks again.
    Failed(IdentifyError),
}

/// The turn key of connections whose client is not known (yet).
pub(super) const NOBODY: u64 = crate::steering::NOBODY_TURN;

impl Conn {
    /// Asks who the client is, without waiting (a read under way parks the
    /// connection's next request), and sets its turn key.
    pub(in crate::steering::intake) fn ask_who(&mut self, cx: &mut Cx) {
        self.ask(cx, false);
    }

    /// [`Self::ask_who`]; `needed`: even where the requests need no client.
    fn ask(&mut self, cx: &mut Cx, needed: bool) {
        let clients = &cx.state.shared.clients;
        let unneeded =
            !needed && self.endpoint == Endpoint::RuleUninstall && !cx.state.shared.tenants.checks();
        if !clients.policy().track || unneeded {
            // Nobody is identified: the process at the connection's pid, as
            // the kernel recorded it, is only a key to take turns by.
            let pid = identity::credentials(self.shared.sock()).and_then(|c| c.pid);
            self.turn = (1 << 62) | u64::from(pid.map_or(0, NonZeroU32::get));
            self.who = if unneeded { Who::Unneeded } else { Who::Known(Requester::unchecked()) };
            return;
        }
        match clients.ask_queued(self.shared.sock(), &mut cx.clients, Waker::noop(), self.queued_after) {
            Asked::Now(r) => self.known(r, cx),
            Asked::Reading(p) => {
                let waker = self.shared.waker();
                // Registers the real waker; the read may have ended meanwhile.
                match clients.pending(&p, &mut cx.clients, &waker, cx.now) {
                    Some(r) => self.known(r, cx),
                    None => {
                        cx.deadlines.push(Reverse((p.deadline, self.shared.key())));
                        self.turn = NOBODY;
                        self.who = Who::Reading(p, waker);
                    }
                }
            }
        }
    }

    fn known(&mut self, r: Result<Client, IdentifyError>, cx: &Cx) {
        match r {
            Ok(c) => {
                self.charge(c.tenant.as_deref(), cx);
                self.turn = turn_of(&c);
                self.who = Who::Known(Requester::from(c));
            }
            Err(e) => {
                self.charge(None, cx);
                self.turn = NOBODY;
                self.who = Who::Failed(e);
            }
        }
    }

    /// Counts the connection against its workload's share (once, where
    /// tenants are read; a client that cannot be told with all such); over
    /// it, its first request is refused.
    fn charge(&mut self, tenant: Option<&Tenant>, cx: &Cx) {
        let shared = &cx.state.shared;
        if self.share.is_some() || self.over_share.is_some() || !shared.tenants.checks() {
            return;
        }
        let key = tenant.map_or(NOBODY_WORKLOAD, |t| t.workload.id);
        match shared.conn_limit.charge_workload(key, self.endpoint) {
            Ok(share) => self.share = Some(share),
            Err(over) => {
                shared.metrics.connections_over_share.inc();
                self.over_share = Some(over.message(tenant.map(|t| t.name()).as_deref()));
            }
        }
    }

    /// Whether a request waits for its client's tenant; once the read ended
    /// (or the wait timed out), it is served.
    pub(super) fn waiting_for_who(&mut self, cx: &mut Cx) -> bool {
        if self.stashed.is_none() {
            return false;
        }
        // At shutdown the request is answered at once (UNAVAILABLE).
        if let (Who::Reading(p, waker), false) = (&self.who, cx.stopping) {
            match cx.state.shared.clients.pending(p, &mut cx.clients, waker, cx.now) {
                None => return true,
                Some(r) => self.known(r, cx),
            }
        }
        let msg = self.stashed.take().expect("checked");
        self.serve(msg, cx);
        false
    }

    /// The client to serve a request for; `None`: the request was answered
    /// here (its client could not be told under `enforce`) or waits for its
    /// tenant (stashed).
    fn requester(
        &mut self,
        msg: UnixSocketProto,
        cx: &mut Cx,
        install: bool,
    ) -> Option<(Requester, UnixSocketProto)> {
        let ipv6 = || request::names_ipv6_flow(&msg);
        // A client is the process that opened the connection while it lives:
        // once it has exited, it is asked again (and is nobody, whoever sends).
        let opener_gone =
            || matches!(&self.who, Who::Known(r) if r.client.process.as_ref().is_some_and(|l| !l.alive()));
        if matches!(self.who, Who::Unasked) || (matches!(self.who, Who::Unneeded) && ipv6()) || opener_gone()
        {
            self.ask(cx, true);
        }
        match std::mem::replace(&mut self.who, Who::Unasked) {
            Who::Known(r) => {
                self.who = Who::Known(r.clone());
                Some((r, msg))
            }
            reading @ Who::Reading(..) => {
                self.who = reading;
                self.stashed = Some(msg);
                None
            }
            // Its tenant could not be read in time: enforce cannot decide, so
            // the request is not served; audit serves it, unidentified. The
            // next request asks again.
            Who::Failed(e) if cx.state.shared.tenants.mode == TenantIsolation::Enforce => {
                let op = if install { RuleOp::Install } else { RuleOp::Uninstall };
                cx.state.shared.metrics.rule_done(
                    op,
                    StatusCode::Unavailable,
                    cx.now.elapsed().as_secs_f64(),
                );
                self.reply(&frame::error(StatusCode::Unavailable, e.to_string()));
                None
            }
            Who::Unneeded => {
                self.who = Who::Unneeded;
                Some((Requester::unchecked(), msg))
            }
            Who::Failed(_) | Who::Unasked => Some((Requester::unchecked(), msg)),
        }
    }

    pub(super) fn serve(&mut self, msg: UnixSocketProto, cx: &mut Cx) {
        if cx.stopping {
            self.reply(&shutting_down());
            return;
        }
        let install = self.endpoint == Endpoint::RuleManager;
        let Some((who, msg)) = self.requester(msg, cx, install) else { return };
        if let Some(text) = self.over_share.take() {
            let op = if install { RuleOp::Install } else { RuleOp::Uninstall };
            let code = StatusCode::ResourceExhausted;
            cx.state.shared.metrics.rule_done(op, code, cx.now.elapsed().as_secs_f64());
            self.reply(&frame::error(code, text));
            self.closing = true;
            return;
        }
        if let Some(req) = request::needs_repair(&msg, install) {
            // A garbled IPv6 install is looked up by the repair workers, a
            // queue per tenant: not on this thread, which serves others.
            self.shared.begin();
            self.handed = true;
            cx.state.repairs.submit(&cx.state, req, who, self.shared.clone(), cx.now);
            return;
        }
        match request::start_rule(&cx.state, msg, install, who, &self.shared, cx.now) {
            RuleStart::Answered(Reply::Message(m)) => self.reply(&m),
            RuleStart::Answered(Reply::Close(m)) => {
                self.reply(&m);
                self.closing = true;
            }
            RuleStart::Answered(Reply::Fd(_)) => {
                self.reply(&frame::error(StatusCode::Internal, "no file descriptor is served here"))
            }
            RuleStart::Handed { nic, job } => {
                self.shared.begin();
                self.handed = true;
                cx.pending[nic].push(job);
            }
            RuleStart::General(req) => {
                self.shared.begin();
                self.handed = true;
                let (state, conn) = (cx.state.clone(), self.shared.clone());
                let who = match &self.who {
                    Who::Known(r) => r.clone(),
                    _ => Requester::unchecked(),
                };
                cx.runtime.spawn(async move {
                    let reply = request::uninstall_everywhere(&state, req, who).await;
                    request::answer_handed(&conn, reply);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{ClientInfo, Tenant};
    use std::sync::Arc;

    #[test]
    fn requests_take_turns_by_tenant_then_by_process() {
        let tenant = |id| Some(Arc::new(Tenant::for_test(id, 0)));
        let a = Client::from(ClientInfo { tenant: tenant(7), ..ClientInfo::default() });
        let b =
            Client::from(ClientInfo { tenant: tenant(7), pid: NonZeroU32::new(3), ..ClientInfo::default() });
        let c = Client::from(ClientInfo { tenant: tenant(8), ..ClientInfo::default() });
        assert_eq!(turn_of(&a), turn_of(&b), "one tenant, one turn, whatever the process");
        assert_ne!(turn_of(&a), turn_of(&c));
        assert_eq!(turn_of(&Client::default()), NOBODY);
        // Two cgroups of one workload (a Pod's containers): one turn.
        let mut d = Tenant::for_test(9, 0);
        d.workload = Tenant::for_test(7, 0).workload;
        let d = Client::from(ClientInfo { tenant: Some(Arc::new(d)), ..ClientInfo::default() });
        assert_eq!(turn_of(&a), turn_of(&d), "one workload, one turn, whatever the cgroup");
    }
}
