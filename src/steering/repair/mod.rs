//! Installs of IPv6 flows named with half their address bytes (the NCCL
//! plugin's, see `identity::flows`), looked up before they become jobs for
//! a NIC thread: off the rule sockets' I/O threads, on [`WORKERS`] threads of
//! their own (started with the first such install), so no flood of them
//! grows the daemon or holds a thread another tenant's requests need.
//!
//! Each install joins its tenant's queue ([`board`]): its workload (see
//! `identity::workload`) with tenant isolation on, else its client process. Workers serve the queues in turn
//! and look each install up by exact lookups; one those do not settle waits
//! on its network namespace for a dump, which then serves every install of
//! the namespace waiting with it. A tenant may have [`BACKLOG`] installs
//! waiting; one more is answered `UNAVAILABLE` at once. A tenant whose
//! dumps find nothing (a flood of flows that fit no connection) waits longer
//! before each next one; its installs wait, others' go on.
//!
//! An IPv4 request never comes here, nor does an uninstall: the NIC thread
//! repairs a garbled uninstall against its own rule table.

pub mod board;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use board::{Board, Key, Next};

use super::request::{self, RuleStart};
use super::{Handoff, Requester, RulePath};
use crate::endpoint::Reply;
use crate::identity::flows::{self, Found};
use crate::identity::{Client, TenantPolicy};
use crate::metrics::{Metrics, RuleOp};
use crate::rules::flow::RuleRequest;
use crate::types::status::StatusCode;
use crate::wire::frame;

/// Worker threads.
pub const WORKERS: usize = 2;
/// Installs one tenant may have waiting, at most.
pub const BACKLOG: usize = 1024;
/// The answer past [`BACKLOG`].
pub const BUSY: &str = "too many IPv6 flows of this client wait to be repaired; try again";

/// One install waiting.
struct Pending {
    rules: Arc<RulePath>,
    req: RuleRequest,
    who: Requester,
    conn: Arc<Handoff>,
    started: Instant,
}

struct Shared {
    board: Mutex<Board<Pending>>,
    wake: Condvar,
    closed: AtomicBool,
    metrics: Arc<Metrics>,
}

impl Shared {
    fn board(&self) -> MutexGuard<'_, Board<Pending>> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The repair workers and what waits for them.
pub struct Repairs {
    shared: Arc<Shared>,
    started: AtomicBool,
}

impl Drop for Repairs {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_all();
    }
}

/// Whose queue `who`'s installs join.
fn key_of(tenants: &TenantPolicy, who: &Client) -> Key {
    match (tenants.checks().then(|| who.workload_id()).flatten(), &who.process) {
        (Some(t), _) => Key::Tenant(t),
        (None, Some(p)) => Key::Process(p.id()),
        (None, None) => Key::Nobody,
    }
}

impl Repairs {
    pub fn new(metrics: Arc<Metrics>) -> Repairs {
        Repairs::with_backlog(metrics, backlog())
    }

    fn with_backlog(metrics: Arc<Metrics>, backlog: usize) -> Repairs {
        let shared = Shared {
            board: Mutex::new(Board::new(backlog)),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
            metrics,
        };
        Repairs { shared: Arc::new(shared), started: AtomicBool::new(false) }
    }

    /// Queues the install `req` of `who`, received on `conn` at `started`
    /// (`Handoff::begin` called): its answer reaches `conn` as from a NIC
    /// thread. Past the tenant's backlog it is answered at once.
    pub fn submit(
        &self,
        rules: &Arc<RulePath>,
        req: RuleRequest,
        who: Requester,
        conn: Arc<Handoff>,
        started: Instant,
    ) {
        let key = key_of(&rules.shared.tenants, &who.client);
        // Its namespace (0: none to be had; its lookup fails).
        let space = rules.shared.tenants.netns_of(&who.client).map_or(0, |ns| ns.inode);
        let p = Pending { rules: rules.clone(), req, who, conn, started };
        let mut board = self.shared.board();
        let refused = board.push(key, space, p).err();
        self.shared.metrics.ipv6_repairs_waiting.set(board.waiting() as i64);
        drop(board);
        if let Some(p) = refused {
            self.shared.metrics.ipv6_repair_lookups.with_label_values(&["busy"]).inc();
            let reply = frame::error(StatusCode::Unavailable, BUSY);
            p.rules.shared.metrics.rule_done(
                RuleOp::Install,
                StatusCode::Unavailable,
                p.started.elapsed().as_secs_f64(),
            );
            request::answer_handed(&p.conn, Reply::Message(reply));
            return;
        }
        self.start();
        self.shared.wake.notify_one();
    }

    fn start(&self) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        for i in 0..WORKERS {
            let shared = self.shared.clone();
            let spawned =
                std::thread::Builder::new().name(format!("ipv6-repair-{i}")).spawn(move || work(&shared));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start an IPv6 repair thread");
            }
        }
    }
}

/// The backlog: [`BACKLOG`], or in debug builds (the tests) what
/// `TCPX_RXDM_TEST_REPAIR_BACKLOG` says.
fn backlog() -> usize {
    if cfg!(debug_assertions) {
        if let Some(n) = std::env::var("TCPX_RXDM_TEST_REPAIR_BACKLOG").ok().and_then(|v| v.parse().ok()) {
            return n;
        }
    }
    BACKLOG
}

/// A worker: takes the next thing to do, does it without the lock.
fn work(shared: &Shared) {
    let mut board = shared.board();
    loop {
        let next = board.next(Instant::now());
        shared.metrics.ipv6_repairs_waiting.set(board.waiting() as i64);
        match next {
            Next::Look(key, space, p) => {
                drop(board);
                look(shared, key, space, p);
                board = shared.board();
            }
            Next::Dump(space, batch) => {
                drop(board);
                dump(shared, space, batch);
                board = shared.board();
            }
            Next::Wait(_) if shared.closed.load(Ordering::Acquire) && board.waiting() == 0 => return,
            Next::Wait(None) => board = shared.wake.wait(board).unwrap_or_else(|p| p.into_inner()),
            Next::Wait(Some(at)) => {
                let left = at.saturating_duration_since(Instant::now());
                board = shared.wake.wait_timeout(board, left).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
    }
}

/// Exact lookups of one install of namespace `space`: settled, it goes on;
/// else it waits for a dump.
fn look(shared: &Shared, key: Key, space: u64, p: Pending) {
    let found = {
        let client = &p.who.client;
        match p.rules.shared.tenants.netns_of(client) {
            Err(e) => Err(e),
            Ok(ns) => {
                let conn = &p.conn;
                let held = |inodes: &[u32]| flows::held_by_opener(conn.sock(), inodes);
                flows::look(ns, &p.req.flow, client.cgroup_id(), held)
            }
        }
    };
    match found {
        Ok(None) => {
            shared.board().park(key, space, p, Instant::now());
            shared.wake.notify_all();
            return;
        }
        Ok(Some(found)) => {
            let mut board = shared.board();
            board.found(key);
            board.looked(space);
            drop(board);
            finish(shared, p, Ok(found), "exact");
        }
        Err(e) => {
            shared.board().looked(space);
            finish(shared, p, Err(e), "failed");
        }
    }
    // A dump may have waited for this lookup.
    shared.wake.notify_all();
}

/// One dump of namespace `space` for every install in `batch`.
fn dump(shared: &Shared, space: u64, batch: Vec<(Key, Pending)>) {
    let mut pairs: Vec<(u16, u16)> =
        batch.iter().map(|(_, p)| (p.req.flow.dst.port(), p.req.flow.src.port())).collect();
    pairs.sort_unstable();
    pairs.dedup();
    let listed = match batch[0].1.rules.shared.tenants.netns_of(&batch[0].1.who.client) {
        Ok(ns) => flows::dump(ns, &pairs),
        Err(e) => Err(e),
    };
    shared.metrics.ipv6_repair_dumps.inc_by(pairs.len().div_ceil(crate::netlink::sock_diag::PAIRS) as u64);
    let mut served = Vec::with_capacity(batch.len());
    for (key, p) in batch {
        let found = match &listed {
            Ok(all) => {
                let conn = &p.conn;
                let held = |inodes: &[u32]| flows::held_by_opener(conn.sock(), inodes);
                Ok(flows::choose(flows::fitting(&p.req.flow, all), p.who.client.cgroup_id(), held))
            }
            Err(e) => Err(e.clone()),
        };
        // A failed dump is no sign of a flood.
        served.push((key, !matches!(found, Ok(Found::Missing))));
        finish(shared, p, found, "dump");
    }
    shared.board().dumped(space, &served, Instant::now());
    shared.wake.notify_all();
}

/// Counts how the lookup ended (`how`: the outcome when a connection was
/// found) and goes on with the install.
fn finish(shared: &Shared, p: Pending, found: Result<Found, String>, how: &str) {
    let outcome = match &found {
        Ok(Found::Repaired { .. }) | Ok(Found::Exact { .. }) => how,
        Ok(Found::Missing) => "missing",
        Ok(Found::Ambiguous(_)) => "ambiguous",
        Err(_) => "failed",
    };
    shared.metrics.ipv6_repair_lookups.with_label_values(&[outcome]).inc();
    let Pending { rules, req, who, conn, started } = p;
    match request::start_looked(&rules, req, who, &conn, started, found) {
        RuleStart::Answered(reply) => request::answer_handed(&conn, reply),
        RuleStart::Handed { nic, job } => rules.nics[nic].submit(&mut vec![job]),
        // Only an uninstall goes to every NIC; none comes here.
        RuleStart::General(_) => request::answer_handed(
            &conn,
            Reply::Message(frame::error(StatusCode::Internal, "an install found no NIC to go to")),
        ),
    }
}
