//! What the serving daemon hands over, gathered in two parts: what stays
//! the same while it serves (the folder's lock and listeners, the NIC
//! claims, the pools, the bindings, the undo logs; duplicated when a
//! takeover is asked, so that the session runs as a task of its own), and
//! what only the pause settles (connections, leases, rule tables).

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::endpoint::pause::Parked;
use crate::handover::{FdList, State, VERSION};
use crate::nic::sim::SimNic;
use crate::nic::NicClaim;
use crate::server::ServerState;
use crate::wire::handover as wire;

use super::super::teardown::Node;
use super::super::{Backends, Config};
use super::fingerprint;

/// What a successor this daemon started may need to start, beyond its
/// takeover timeout and its wait for NICs (loading its configuration, opening
/// its GPUs' contexts).
const CHILD_START: Duration = Duration::from_secs(30);

/// What a takeover session hands over from, borrowed from the daemon.
pub(in crate::daemon) struct Giver<'a> {
    pub config: &'a Config,
    pub backends: &'a Backends,
    pub node: &'a Node,
    pub claims: &'a [NicClaim],
    pub http: Option<BorrowedFd<'a>>,
    pub takeovers: u32,
}

/// What the session needs beside the handout.
pub(super) struct Context {
    pub timeout: Duration,
    /// How long a successor this daemon started may take to say hello: it
    /// may wait for its NICs and open its GPUs first.
    pub child_wait: Duration,
    pub fingerprint: HashMap<String, String>,
    /// The simulated NICs, whose state goes with the takeover.
    pub sim: Option<std::sync::Arc<SimNic>>,
}

/// The part of the state that does not change while the daemon serves,
/// its fds duplicated.
pub(super) struct Handout {
    fds: FdList,
    lock_fd: u32,
    listeners: Vec<wire::Listener>,
    created: Vec<wire::Folder>,
    claims: Vec<wire::Claim>,
    pools: Vec<wire::Pool>,
    bindings: Vec<wire::Binding>,
    primed: Vec<wire::PrimedNic>,
    tuning: Option<wire::HostTuning>,
    takeovers: u32,
}

impl Giver<'_> {
    pub(super) fn context(&self) -> Context {
        Context {
            timeout: self.config.flags.takeover_timeout,
            child_wait: self.config.flags.takeover_timeout + self.config.flags.wait_for_nics + CHILD_START,
            fingerprint: fingerprint(self.config, self.backends),
            sim: self.backends.sim.clone(),
        }
    }

    /// Duplicates what stays the same.
    pub(super) fn handout(&self) -> io::Result<Handout> {
        let mut fds = FdList::default();
        let node = self.node;
        let (lock, listeners, made) = node.dir.handover();
        let lock_fd = fds.push(lock.ok_or_else(|| io::Error::other("the folder is not locked"))?)?;
        let mut ls = Vec::new();
        for (name, fd) in listeners {
            ls.push(wire::Listener { name: name.to_string(), fd: fds.push(fd)? });
        }
        let mut created = Vec::new();
        for c in made {
            use std::os::unix::ffi::OsStrExt;
            let (parent, name, path, own) = c.parts();
            created.push(wire::Folder {
                name: name.as_bytes().to_vec(),
                path: path.as_os_str().as_bytes().to_vec(),
                parent_fd: fds.push(parent)?,
                own_fd: fds.push(own)?,
            });
        }
        if let Some(h) = self.http {
            ls.push(wire::Listener { name: String::new(), fd: fds.push(h)? });
        }
        let mut claims = Vec::new();
        for c in self.claims {
            claims.push(wire::Claim { ifname: c.ifname.clone(), fd: fds.push(c.socket())? });
        }
        let mut pools = Vec::new();
        for (gpu, p) in &node.pools {
            pools.push(wire::Pool {
                gpu: gpu.to_string(),
                size: p.size(),
                alignment: p.alignment(),
                share_fd: p.share_fd().map(|f| fds.push(f)).transpose()?,
                dmabuf_fd: p.dmabuf_fd().map(|f| fds.push(f)).transpose()?,
            });
        }
        let mut bindings = Vec::new();
        for b in &node.bindings {
            let held = b.handover_fds().into_iter().map(|f| fds.push(f)).collect::<io::Result<Vec<_>>>()?;
            bindings.push(wire::Binding { fds: held, description: b.describe(), dmabuf_id: b.dmabuf_id() });
        }
        Ok(Handout {
            fds,
            lock_fd,
            listeners: ls,
            created,
            claims,
            pools,
            bindings,
            primed: node.primed.iter().map(|p| p.to_wire()).collect(),
            tuning: node.tuning.as_ref().map(|t| t.to_wire()),
            takeovers: self.takeovers,
        })
    }
}

impl Handout {
    /// The whole message and its fds, once the pause has settled the rest.
    pub(super) fn finish(
        self,
        state: &ServerState,
        parked: Vec<Parked>,
        tables: Vec<wire::RuleTable>,
        sim: Option<&SimNic>,
    ) -> io::Result<(State, FdList)> {
        let mut fds = self.fds;
        let mut connections = Vec::new();
        for p in parked {
            connections.push(wire::Connection {
                endpoint: p.endpoint.socket_name(),
                registered: p.registered,
                input: p.input,
                peeked: p.peeked as u32,
                fd: fds.push_owned(p.fd),
            });
        }
        let (leases, next_lease) = state.shared.clients.handover(&mut fds)?;
        let st = State {
            version: VERSION,
            pid: std::process::id(),
            fd_count: fds.len(),
            lock_fd: self.lock_fd,
            listeners: self.listeners,
            claims: self.claims,
            pools: self.pools,
            bindings: self.bindings,
            connections,
            leases,
            next_lease,
            tables,
            primed: self.primed,
            tuning: self.tuning,
            sim: sim.map(SimNic::export).unwrap_or_default(),
            takeovers: self.takeovers + 1,
            created: self.created,
        };
        Ok((st, fds))
    }
}
