//! Why the daemon did not start or did not stop cleanly. Each variant names
//! the step that failed and keeps the error it failed with; the exit code of
//! each is decided here and nowhere else.

use std::net::SocketAddr;

use crate::config::presets::ConfigError;
use crate::gpu::mig::MigError;
use crate::gpu::PlacementError;
use crate::gpu::{BindError, GpuError};
use crate::host::tuning::TuningError;
use crate::nic::claim::ClaimError;
use crate::nic::ethtool::EthtoolError;
use crate::nic::monitor::MonitorError;
use crate::nic::prime::PrimeError;
use crate::nic::NicError;
use crate::server::socket_dir::SocketDirError;
use crate::types::pci::PciAddr;
use crate::types::topology::TopologyError;

use super::events::StopReason;
use super::job_end::JobEndError;

/// Exit status for bad flags or a bad topology (as with a usage error).
pub const EXIT_CONFIG: u8 = 2;
/// Exit status for everything else that went wrong.
pub const EXIT_FAILURE: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("installing signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// The topology could not be loaded (flags, preset, textproto, discovery).
    #[error("{0}")]
    Topology(#[from] ConfigError),
    /// A flag asks for something the chosen backends cannot do.
    #[error("{0}")]
    Flags(#[from] FlagError),
    #[error("{0}")]
    SocketGroup(#[source] SocketDirError),
    #[error("--gpu_backend={flag}: {source}")]
    Cuda {
        flag: &'static str,
        #[source]
        source: GpuError,
    },
    #[error("--gpu_backend={flag}: GPUs {} of the topology are not visible to CUDA (visible: {})", crate::types::list(.missing), crate::types::list(.visible))]
    GpusNotVisible { flag: &'static str, missing: Vec<PciAddr>, visible: Vec<PciAddr> },
    /// A GPU of the topology is partitioned (MIG): the CUDA backend needs whole GPUs.
    #[error("{0}")]
    Mig(#[from] MigError),
    #[error("placing CUDA GPUs on the sim NICs: {0}")]
    PlaceGpus(#[source] PlacementError),
    #[error("placing CUDA GPUs on the sim NICs: {0}")]
    PlacedTopology(#[source] TopologyError),
    #[error("ethtool NIC backend: {0}")]
    EthtoolBackend(#[source] EthtoolError),
    #[error("{0}")]
    LockSocketDir(#[source] SocketDirError),
    /// `--takeover`: nothing to take over from, or the running daemon refused.
    #[error("takeover failed: {0}")]
    Takeover(#[from] super::takeover::TakeoverError),
    #[error("{0}")]
    ClaimNic(#[from] ClaimError),
    #[error("{0}")]
    ShutdownFile(#[from] JobEndError),
    #[error("--metrics_address {addr}: {source}{}", port_hint(addr, source))]
    MetricsListen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("priming NIC {0}")]
    Prime(#[source] PrimeError),
    /// The topology names queues the NIC does not have.
    #[error("{0}")]
    Channels(#[source] TopologyError),
    #[error("{0}")]
    Allocate(#[source] GpuError),
    #[error("{0}")]
    Bind(#[source] BindError),
    #[error("starting the rule thread of {ifname}: {source}")]
    NicRuleThread {
        ifname: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Endpoint(#[source] SocketDirError),
    #[error("starting the rule endpoints' I/O threads: {source}")]
    RuleIo {
        #[source]
        source: std::io::Error,
    },
    #[error("header split on {0}")]
    HeaderSplit(#[source] PrimeError),
    #[error("link monitor: {0}")]
    LinkMonitor(#[source] MonitorError),
    /// Shutdown finished but some restore steps failed (each was logged).
    #[error("{} restore step(s) failed", .0.len())]
    Restore(Vec<TeardownError>),
    /// A NIC was still missing when `--wait_for_nics` ran out.
    #[error("{source} (still missing after waiting {}, --wait_for_nics)", crate::types::secs(*.waited))]
    NicsNotUp {
        waited: std::time::Duration,
        #[source]
        source: Box<DaemonError>,
    },
    /// A NIC failed under the running daemon; it was restored and stopped.
    #[error("stopped because {0}")]
    NicFailed(StopReason),
}

/// Flags that cannot work together, or with this node.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// `class_net`: a fabricated `--sysfs_root`'s, which counts too;
    /// `elsewhere`: those of them the host's sysfs lists (another network
    /// namespace's), and where.
    #[error(
        "--nic_backend={backend}: {} not found {}{}",
        crate::types::plural_list("interface", ifnames),
        nic_places(class_net.as_deref()),
        nic_elsewhere(elsewhere.as_ref())
    )]
    NicNotFound {
        backend: &'static str,
        ifnames: Vec<String>,
        class_net: Option<std::path::PathBuf>,
        elsewhere: Option<(Vec<String>, std::path::PathBuf)>,
    },
    #[error(
        "--gpu_shmem_type=file needs CUDA pools, but the pool backend is {backend} (--gpu_backend=cuda)"
    )]
    ShmemFileNeedsCuda { backend: &'static str },
    #[error("--sim_fault and --sim_delay need --nic_backend=sim")]
    SimFlagsNeedSim,
    #[error("--sim_delay: {0} is not a NIC of the topology")]
    SimDelayUnknownNic(String),
}

/// Where a NIC was looked for: a fabricated `--sysfs_root`'s `class/net`
/// and the daemon's own network namespace.
pub(super) fn nic_places(class_net: Option<&std::path::Path>) -> String {
    match class_net {
        Some(c) => format!("under {} or in this network namespace", c.display()),
        None => "in this network namespace".into(),
    }
}

fn nic_elsewhere(elsewhere: Option<&(Vec<String>, std::path::PathBuf)>) -> String {
    match elsewhere {
        Some((names, class_net)) => format!(
            "; {} listed under {}, the host's network namespace: run the daemon in the network \
             namespace that holds the NICs (the Pod's, where they are attached to it, or the host's)",
            crate::types::list(names),
            class_net.display()
        ),
        None => " (use --gpu_nic_preset=sim for simulated NICs)".into(),
    }
}

impl DaemonError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            DaemonError::Topology(_)
            | DaemonError::Flags(_)
            | DaemonError::SocketGroup(_)
            | DaemonError::Channels(_)
            | DaemonError::Mig(_)
            | DaemonError::ShutdownFile(JobEndError::NoFolder { .. }) => EXIT_CONFIG,
            DaemonError::NicsNotUp { source, .. } => source.exit_code(),
            _ => EXIT_FAILURE,
        }
    }
}

/// A step of shutdown or rollback that failed; the others still ran.
#[derive(Debug, thiserror::Error)]
pub enum TeardownError {
    #[error("removing rules: {0}")]
    RemoveRule(#[source] NicError),
    #[error("restoring {0}")]
    RestoreNic(#[source] PrimeError),
    #[error("undoing host tuning: {0}")]
    HostTuning(#[source] TuningError),
}

impl TeardownError {
    /// The NIC the step was about, or `host` for host tuning (a metric label).
    pub fn nic(&self) -> &str {
        match self {
            TeardownError::RemoveRule(e) => &e.ifname,
            TeardownError::RestoreNic(e) => &e.ifname,
            TeardownError::HostTuning(_) => "host",
        }
    }
}

/// A port below 1024 needs `CAP_NET_BIND_SERVICE` (where the network
/// namespace keeps the kernel's default `ip_unprivileged_port_start`).
fn port_hint(addr: &SocketAddr, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) if addr.port() < 1024 => crate::caps::refusal(n, crate::caps::Cap::NetBindService)
            .map(|w| format!(" (port {} is below 1024: {w})", addr.port()))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::NicOp;
    use nix::errno::Errno;

    #[test]
    fn configuration_errors_exit_2_and_the_rest_1() {
        assert_eq!(DaemonError::Flags(FlagError::SimFlagsNeedSim).exit_code(), 2);
        assert_eq!(DaemonError::Topology(ConfigError::ManualWithoutTopology).exit_code(), 2);
        let gpu = "0000:04:00.0".parse().unwrap();
        let mig = crate::gpu::mig::Finding { gpu, minor: 0, instances: vec!["gi1".into()], nvml: None };
        assert_eq!(DaemonError::Mig(MigError::Partitioned(vec![mig])).exit_code(), 2);
        let nic = NicError::new("eth1", NicOp::SetFeature, Errno::EPERM);
        let prime = PrimeError { ifname: "eth1".into(), step: "ntuple on", source: nic.clone() };
        assert_eq!(DaemonError::Prime(prime).exit_code(), 1);
        assert_eq!(DaemonError::Restore(vec![TeardownError::RemoveRule(nic)]).exit_code(), 1);
    }

    #[test]
    fn errors_keep_their_source() {
        use std::error::Error;
        let nic = NicError::new("eth2", NicOp::SetPrivFlag, Errno::EIO);
        let e =
            DaemonError::HeaderSplit(PrimeError { ifname: "eth2".into(), step: "header split", source: nic });
        let prime = e.source().expect("keeps the prime error");
        let nic = prime.source().expect("which keeps the NIC error");
        assert_eq!(nic.downcast_ref::<NicError>().map(|n| n.errno), Some(Errno::EIO));
        assert!(e.to_string().starts_with("header split on eth2"), "{e}");
    }

    #[test]
    fn teardown_errors_name_their_nic() {
        let nic = NicError::new("eth3", NicOp::DelRule, Errno::EBUSY);
        assert_eq!(TeardownError::RemoveRule(nic.clone()).nic(), "eth3");
        let p = PrimeError { ifname: "eth4".into(), step: "restore", source: nic };
        assert_eq!(TeardownError::RestoreNic(p).nic(), "eth4");
    }
}
