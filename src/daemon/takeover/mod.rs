//! Takeover: a new daemon takes the running one's place without touching
//! the NICs or the pools and without a failed request (an upgrade).
//!
//! A successor comes in two ways ([`admit`]): started by the old daemon
//! itself on SIGUSR2, over a channel made for it, or through the handover
//! socket after proving it could take the old daemon's descriptors anyway.
//! The old daemon ([`give`]) pauses every serving path (listeners stay open,
//! clients wait in the backlog), lets the requests already read finish,
//! freezes the NIC threads and sends its whole state with its fds. The new
//! daemon ([`take`]) adopts it without priming, allocating or binding, and
//! answers `adopted`; the old one commits; the new one arms what it holds,
//! opens its gate and only then answers `serving`, and only that answer
//! lets the old one exit 0. Anything wrong before that answer and the old
//! daemon makes sure the new one is gone and serves on as if nothing
//! happened. Until the commit the new daemon holds the old one's state
//! disarmed: nothing it drops, and no panic ([`guard`]), undoes any of it.
//! The transport is `handover`; the protocol is in docs/ARCHITECTURE.md.

pub(super) mod admit;
mod error;
mod fault;
pub(super) mod give;
mod guard;
pub(super) mod handout;
mod paused;
pub(super) mod take;

pub use error::TakeoverError;

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use crate::endpoint::pause::Parked;
use crate::endpoint::Endpoint;
use crate::gpu::{AdoptedBinding, HandedPool};
use crate::handover::{FdSet, State};
use crate::host::shared_dir::Created;
use crate::host::tuning::HostTuning;
use crate::nic::prime::PrimedNic;
use crate::server::socket_dir::SocketDir;
use crate::types::pci::PciAddr;
use crate::wire::handover as wire;

use super::{Backends, Config};

/// What two daemons must agree on before one takes over from the other.
pub(super) fn fingerprint(config: &Config, backends: &Backends) -> HashMap<String, String> {
    let f = &config.flags;
    [
        ("topology", format!("{:?}", config.topology)),
        ("uds_path", f.uds_path.display().to_string()),
        ("nic_backend", backends.nic.backend().to_string()),
        ("pool_backend", backends.alloc.backend().to_string()),
        ("bind_backend", backends.binder.backend().to_string()),
        ("gpu_shmem_type", f.gpu_shmem_type.name().to_string()),
        ("tenant_isolation", f.tenant_isolation.name().to_string()),
    ]
    .into_iter()
    // How workloads are told, where not by the layouts: a daemon telling
    // them otherwise could not say which workload a rule handed over is. The
    // layouts leave the key out, so that a daemon from before workloads (its
    // tenants cgroups, each inside one workload) is taken over from.
    .chain(
        (f.workload_cgroup_depth != 0)
            .then(|| ("workload_cgroup_depth", f.workload_cgroup_depth.to_string())),
    )
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The setting behind a fingerprint key, as a refusal names it to the peer
/// (never with this daemon's value).
pub(super) fn setting(key: &str) -> &str {
    match key {
        "topology" => "topology (--gpu_nic_preset, --gpu_nic_topology, or what discovery found)",
        "uds_path" => "--uds_path",
        "nic_backend" => "--nic_backend",
        "pool_backend" => "--gpu_backend",
        "bind_backend" => "--bind_backend",
        "gpu_shmem_type" => "--gpu_shmem_type",
        "tenant_isolation" => "--tenant_isolation",
        "workload_cgroup_depth" => "--workload_cgroup_depth",
        other => other,
    }
}

/// The new daemon, once committed: what it holds is its own to undo from
/// now on (the socket files, the host tuning), and the folder's lock and
/// listeners name it. Panics unwind again only once the old daemon has been
/// told ([`take::Committed::serving`]): until then it may still serve on,
/// so nothing here may undo its state on the way out.
pub(super) fn committed(dir: &mut SocketDir, tuning: Option<&mut HostTuning>) {
    dir.arm();
    if let Err(e) = dir.record_holder() {
        tracing::warn!(error = %e, "could not name this daemon in the socket folder's lock file");
    }
    if let Some(t) = tuning {
        t.arm();
    }
}

/// The state a daemon took over, fds in hand, each piece taken by the
/// startup step that adopts it.
pub(super) struct Handed {
    /// The daemon it came from.
    pub pid: u32,
    pub lock: Option<OwnedFd>,
    /// Folder listeners by socket name.
    pub listeners: HashMap<String, OwnedFd>,
    /// The folders the first daemon made for the socket folder.
    pub created: Vec<Created>,
    pub http: Option<OwnedFd>,
    pub claims: Vec<(String, OwnedFd)>,
    pub pools: Vec<HandedPool>,
    pub bindings: Vec<AdoptedBinding>,
    pub conns: Vec<Parked>,
    pub leases: Vec<wire::Lease>,
    pub next_lease: u32,
    pub tables: Vec<wire::RuleTable>,
    pub primed: Vec<PrimedNic>,
    pub tuning: Option<HostTuning>,
    pub sim: Vec<wire::SimNic>,
    /// The fds not yet taken (the leases' are taken when they are adopted).
    pub fds: FdSet,
    pub takeovers: u32,
}

impl Handed {
    /// Reads the message; an error names what does not fit.
    pub fn decode(st: State, fds: Vec<OwnedFd>) -> Result<Handed, String> {
        let mut fds = FdSet::new(fds);
        let mut listeners = HashMap::new();
        let mut http = None;
        for l in &st.listeners {
            let fd = fds.take(l.fd, "listener")?;
            match l.name.as_str() {
                "" => http = Some(fd),
                n => drop(listeners.insert(n.to_string(), fd)),
            }
        }
        let claims = st
            .claims
            .iter()
            .map(|c| Ok((c.ifname.clone(), fds.take(c.fd, "NIC claim")?)))
            .collect::<Result<Vec<_>, String>>()?;
        let mut pools = Vec::new();
        for p in &st.pools {
            let gpu: PciAddr = p.gpu.parse().map_err(|e| format!("pool GPU \"{}\": {e}", p.gpu))?;
            pools.push(HandedPool {
                gpu,
                size: p.size,
                alignment: p.alignment,
                share_fd: fds.take_opt(p.share_fd, "pool fd")?,
                dmabuf_fd: fds.take_opt(p.dmabuf_fd, "pool dma-buf")?,
            });
        }
        let mut bindings = Vec::new();
        for b in &st.bindings {
            let held = b.fds.iter().map(|&i| fds.take(i, "binding")).collect::<Result<Vec<_>, _>>()?;
            bindings.push(AdoptedBinding {
                fds: held,
                description: b.description.clone(),
                dmabuf_id: b.dmabuf_id,
            });
        }
        let mut conns = Vec::new();
        for c in &st.connections {
            let endpoint = Endpoint::from_socket_name(&c.endpoint)
                .ok_or_else(|| format!("a connection of unknown endpoint \"{}\"", c.endpoint))?;
            conns.push(Parked {
                fd: fds.take(c.fd, "connection")?,
                endpoint,
                registered: c.registered,
                input: c.input.clone(),
                peeked: c.peeked as usize,
            });
        }
        let primed = st.primed.into_iter().map(PrimedNic::from_wire).collect::<Result<Vec<_>, _>>()?;
        let lock = fds.take(st.lock_fd, "folder lock")?;
        let mut created = Vec::new();
        for f in &st.created {
            use std::os::unix::ffi::OsStrExt;
            let (parent, own) = (fds.take(f.parent_fd, "made folder")?, fds.take(f.own_fd, "made folder")?);
            let name = std::ffi::OsStr::from_bytes(&f.name).to_os_string();
            let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&f.path));
            created
                .push(Created::from_parts(parent, name, path, own).map_err(|e| format!("made folder: {e}"))?);
        }
        // Last, and disarmed: dropping it restores nothing.
        let tuning = st.tuning.map(HostTuning::from_wire).transpose()?;
        Ok(Handed {
            pid: st.pid,
            lock: Some(lock),
            listeners,
            created,
            http,
            claims,
            pools,
            bindings,
            conns,
            leases: st.leases,
            next_lease: st.next_lease,
            tables: st.tables,
            primed,
            tuning,
            sim: st.sim,
            fds,
            takeovers: st.takeovers,
        })
    }

    /// Rules across the NICs.
    pub fn rule_count(&self) -> usize {
        self.tables.iter().map(|t| t.rules.len() / crate::wire::handover::RECORD).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tuning undo log whose restore would write `before` back to `path`.
    fn tuning_log(path: &std::path::Path, before: &str) -> Option<wire::HostTuning> {
        use std::os::unix::ffi::OsStrExt;
        let file = wire::TunedFile { path: path.as_os_str().as_bytes().to_vec(), before: before.into() };
        Some(wire::HostTuning { files: vec![file], ..Default::default() })
    }

    #[test]
    fn a_state_that_does_not_decode_undoes_nothing_of_the_serving_daemons() {
        let tmp = tempfile::tempdir().unwrap();
        let knob = tmp.path().join("tcp_mtu_probing");
        std::fs::write(&knob, "0").unwrap();
        // The lock's fd is missing: decoding fails after the undo log was read.
        let st = State { tuning: tuning_log(&knob, "1"), lock_fd: 7, ..State::default() };
        let err = Handed::decode(st, Vec::new()).err().expect("no lock fd");
        assert!(err.contains("folder lock"), "{err}");
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "0", "the serving daemon's tuning was undone");
        // Decoded whole and dropped (a takeover that fails later): the same.
        let lock = tempfile::tempfile().unwrap();
        let st = State { tuning: tuning_log(&knob, "1"), lock_fd: 0, ..State::default() };
        let handed = Handed::decode(st, vec![lock.into()]).unwrap();
        assert!(handed.tuning.is_some());
        drop(handed);
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "0");
    }
}
