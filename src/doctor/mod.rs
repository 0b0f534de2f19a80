//! `tcpx-rxdm doctor`: read-only checks that answer "will GPUDirect-TCPX work
//! on this node, and if not, why". Each check is one line: a mark, what was
//! found, and what to do about it.
//!
//! Nothing here changes the node. NIC state is read through the same
//! [`NicControl`](crate::nic::NicControl) backends the daemon uses, but only
//! through their read calls (features, private flags, rings, channels, rule
//! count and list, RSS, stats; the driver family probe reads only). GPU
//! checks allocate one small test buffer per GPU and free it at once; MIG
//! modes are only read (procfs, NVML). The
//! socket-folder lock is tested with a non-blocking shared lock on a
//! separately opened descriptor, released at once.

mod datapath;
mod gpu;
mod header_split;
mod host;
mod kernel;
mod mig;
mod nccl;
mod netns;
mod nic;
mod node;
mod privileges;
mod report;

use std::path::Path;

use nix::errno::Errno;

use crate::config::flags::{Flags, GpuBackendKind, NicBackendKind};
use crate::config::presets::{self, Source};
use crate::config::views::SysfsViews;
use crate::gpu::BinderKind;
use crate::host::netns::{Netns, Place};
use crate::types::exit::Exit;
use crate::types::topology::Topology;
use gpu::check_gpus;
use host::check_host;
use kernel::check_kernel;
use nic::check_nics;
use report::{Report, Status};

/// What the checks share.
struct Ctx<'a> {
    flags: &'a Flags,
    topo: Option<Topology>,
    source: Option<Source>,
    sim_nic: bool,
    /// Pid of the daemon holding the socket-folder lock, if one runs.
    daemon: Option<String>,
    /// The lock as this user sees it (held, free, or not to be told).
    lock: Lock,
    /// Whether pools must be bound to NIC queues (real NICs, a binder chosen).
    binding_needed: bool,
    /// The CUDA-visible GPUs that the sim preset is placed on (`--gpu_backend=cuda`).
    placed_gpus: Option<Vec<crate::types::pci::PciAddr>>,
    /// Where sysfs is read: `--sysfs_root` and doctor's own `/sys`.
    views: SysfsViews,
    /// The network namespace doctor runs in (a daemon with these flags
    /// here would run in it too).
    netns: Netns,
}

impl Ctx<'_> {
    /// The pid of a running daemon whose NICs are the ones checked here (a
    /// daemon on simulated NICs keeps their state in its own process).
    fn daemon_on_these_nics(&self) -> Option<&str> {
        self.daemon.as_deref().filter(|_| !self.sim_nic)
    }

    /// Whether this user cannot tell if a daemon runs (the lock could not be
    /// read): then no line may say that none does.
    fn daemon_unknown(&self) -> bool {
        matches!(self.lock, Lock::Unknown(_))
    }
}

/// Runs every check.
fn run(flags: &Flags) -> Report {
    let mut r = Report { preset: flags.gpu_nic_preset.clone(), ..Default::default() };
    let resolved = presets::resolve_topology(flags);
    let source = match &resolved {
        Ok((_, s)) => Some(s.clone()),
        Err(_) => presets::select_source(flags).ok().map(|(s, _)| s),
    };
    let sim_nic = match flags.nic_backend {
        NicBackendKind::Sim => true,
        NicBackendKind::Auto => source == Some(Source::Preset("sim")),
        NicBackendKind::Ethtool => false,
    };
    r.nic_backend = if sim_nic { "sim".into() } else { "ethtool".into() };
    r.gpu_backend = match flags.gpu_backend {
        GpuBackendKind::Host => "host".into(),
        GpuBackendKind::Auto if sim_nic => "host".into(),
        _ => "cuda".into(),
    };
    let lock = lock_holder(&flags.uds_path);
    let daemon = match &lock {
        Lock::Held(pid) => Some(pid.clone()),
        _ => None,
    };
    let binding_needed = !sim_nic && flags.bind_backend != BinderKind::None;
    let views = SysfsViews::new(flags);
    let netns = match &resolved {
        _ if sim_nic => Netns::new(Place::Unknown, "simulated NICs"),
        Ok((topo, _)) => views.netns(&topo.nics.iter().map(|n| n.ifname.as_str()).collect::<Vec<_>>()),
        Err(_) => views.netns(&[]),
    };
    let mut ctx = Ctx {
        flags,
        topo: None,
        source,
        sim_nic,
        daemon,
        lock,
        binding_needed,
        placed_gpus: None,
        views,
        netns,
    };

    match resolved {
        Ok((topo, source)) => {
            let gpus = topo.gpus().count();
            r.add(
                "topology",
                "source",
                Status::Pass,
                format!(
                    "{}: {} NIC{}, {gpus} GPU{}, RSS queues 0..{}, {} rule slots per NIC",
                    source.describe(),
                    topo.nics.len(),
                    plural(topo.nics.len()),
                    plural(gpus),
                    topo.rss_set_size,
                    topo.max_rx_rules
                ),
                None,
            );
            ctx.topo = Some(topo);
        }
        Err(e) => r.add("topology", "source", Status::Fail, e.to_string(), Some(topology_fix(flags))),
    }
    node::check_topology(&mut r, &ctx);
    netns::check_netns(&mut r, &ctx);
    check_nics(&mut r, &ctx);
    check_kernel(&mut r, &ctx);
    check_gpus(&mut r, &mut ctx);
    mig::check_mig(&mut r, &ctx);
    check_host(&mut r, &ctx);
    privileges::check_privileges(&mut r, &ctx);
    nccl::check_nccl(&mut r, &ctx);
    datapath::check_datapath(&mut r, &ctx);
    r
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn topology_fix(flags: &Flags) -> String {
    match flags.gpu_nic_preset.as_str() {
        "auto" => format!(
            "discovery found no NIC with GPUs behind its PCIe switch: check the NICs have addresses, \
             try --num_hops (now {}), or name the layout with --gpu_nic_preset=a3vm",
            flags.num_hops
        ),
        "manual" => "fix the topology textproto named in the message".into(),
        _ => "check the preset name or file".into(),
    }
}

/// `1, 2, 3, 5` as `1-3, 5`.
pub(crate) fn ranges(q: &[u32]) -> String {
    let mut v = q.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j { v[i].to_string() } else { format!("{}-{}", v[i], v[j]) });
        i = j + 1;
    }
    out.join(", ")
}

/// Whether a daemon holds the socket folder's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lock {
    /// Held, by the pid the lock file names (`pid N`, or `unknown pid`).
    Held(String),
    /// No daemon: the lock is free, or there is no lock file or folder.
    Free(&'static str),
    /// This user cannot tell: why.
    Unknown(String),
}

/// The socket folder's lock, tested with a non-blocking shared lock on our
/// own descriptor (released at once). Never creates the file, and opens it
/// only if it is a plain file of its own (a client may have planted a link
/// or a FIFO at its name).
fn lock_holder(uds: &Path) -> Lock {
    use crate::host::shared_dir::{OpenError, SharedDir};
    use std::io::ErrorKind;
    let lock_file = crate::server::socket_dir::LOCK_FILE;
    let folder = match SharedDir::open(uds) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Lock::Free("there is no socket folder"),
        Err(e) => {
            return Lock::Unknown(format!("{} cannot be opened by {}: {}", uds.display(), me(), e.kind()))
        }
    };
    let file = match folder.open_plain(lock_file, nix::fcntl::OFlag::O_RDONLY) {
        Ok(f) => f,
        Err(OpenError::Io(e)) if e.kind() == ErrorKind::NotFound => {
            return Lock::Free("there is no lock file")
        }
        Err(e) => {
            let path = uds.join(lock_file);
            let why = match &e {
                OpenError::Io(io) => io.kind().to_string(),
                other => other.to_string(),
            };
            return Lock::Unknown(format!("{} cannot be read by {}: {why}", path.display(), me()));
        }
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
        Ok(l) => {
            drop(l.unlock());
            Lock::Free("the lock is free")
        }
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = std::io::Read::read_to_string(&mut file, &mut pid);
            let pid = pid.trim();
            Lock::Held(if pid.is_empty() { "unknown pid".into() } else { format!("pid {pid}") })
        }
        Err((_, e)) => Lock::Unknown(format!("locking {} failed ({e})", uds.join(lock_file).display())),
    }
}

fn me() -> String {
    format!("this user, {}", crate::host::users::me())
}

/// `tcpx-rxdm doctor [--json] FLAGS…`: prints the report; failed when a check failed.
pub fn main(flags: &Flags, json: bool) -> Exit {
    let report = run(flags);
    if json {
        println!("{}", serde_json::to_string_pretty(&report.json()).expect("JSON of plain data"));
    } else {
        print!("{}", report.text());
    }
    Exit::of(report.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_ranges_are_compact() {
        assert_eq!(ranges(&[8, 9, 10, 11, 13, 15, 14]), "8-11, 13-15");
        assert_eq!(ranges(&[3]), "3");
        assert_eq!(ranges(&[]), "");
    }
}
