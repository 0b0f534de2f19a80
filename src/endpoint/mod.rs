//! What every client endpoint shares, whichever threads serve it: the
//! socket names ([`Endpoint`]), the connection budget that bounds them all
//! ([`budget`]), the accept back-off when descriptors run out
//! ([`accept_backoff`]), the replies owed at shutdown, and giving memory
//! back after peaks ([`memory`]).
//!
//! Two serving paths build on it: the rule path's own I/O threads
//! (`steering`) and the runtime's tasks for every other endpoint (`server`).
//! It may use `metrics`, `wire`, `gpu` (a reply may carry a pool's fd) and
//! the layers below; it knows neither serving path.

pub mod accept_backoff;
pub mod budget;
pub mod memory;
pub mod pause;

use std::sync::Arc;

use tokio::sync::watch;

use crate::gpu::RxPool;
use crate::types::pci::PciAddr;
use crate::types::status::StatusCode;
use crate::wire::frame;
use crate::wire::proto::UnixSocketProto;

/// What a socket file serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    RuleManager,
    RuleUninstall,
    QueueIdsByGpu,
    Registry,
    GpuFd(PciAddr),
    GpuMetadata(PciAddr),
    /// `get_gpu_by_gpu_pci` (`--gpu_shmem_type file`).
    GpuIpcHandle,
}

impl Endpoint {
    pub fn socket_name(&self) -> String {
        match self {
            Endpoint::RuleManager => "rx_rule_manager".into(),
            Endpoint::RuleUninstall => "rx_rule_uninstall".into(),
            Endpoint::QueueIdsByGpu => "queue_ids_by_gpu".into(),
            Endpoint::Registry => "rxdm_application_registry".into(),
            Endpoint::GpuFd(p) => format!("get_gpu_fd_{p}"),
            Endpoint::GpuMetadata(p) => format!("get_gpu_metadata_{p}"),
            Endpoint::GpuIpcHandle => "get_gpu_by_gpu_pci".into(),
        }
    }

    /// The endpoint a socket in the folder serves, by its name.
    pub fn from_socket_name(name: &str) -> Option<Endpoint> {
        let pci = |rest: &str| rest.parse::<PciAddr>().ok();
        Some(match name {
            "rx_rule_manager" => Endpoint::RuleManager,
            "rx_rule_uninstall" => Endpoint::RuleUninstall,
            "queue_ids_by_gpu" => Endpoint::QueueIdsByGpu,
            "rxdm_application_registry" => Endpoint::Registry,
            "get_gpu_by_gpu_pci" => Endpoint::GpuIpcHandle,
            _ => {
                if let Some(p) = name.strip_prefix("get_gpu_fd_") {
                    Endpoint::GpuFd(pci(p)?)
                } else {
                    Endpoint::GpuMetadata(pci(name.strip_prefix("get_gpu_metadata_")?)?)
                }
            }
        })
    }

    /// Whether the rule path's own threads serve it.
    pub fn is_rule(&self) -> bool {
        matches!(self, Endpoint::RuleManager | Endpoint::RuleUninstall)
    }

    /// Metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Endpoint::RuleManager => "rule_manager",
            Endpoint::RuleUninstall => "rule_uninstall",
            Endpoint::QueueIdsByGpu => "queue_ids",
            Endpoint::Registry => "registry",
            Endpoint::GpuFd(_) => "gpu_fd",
            Endpoint::GpuMetadata(_) => "gpu_metadata",
            Endpoint::GpuIpcHandle => "gpu_ipc_handle",
        }
    }
}

/// What to send back to a request.
pub enum Reply {
    Message(UnixSocketProto),
    /// Send, then close the connection (malformed input).
    Close(UnixSocketProto),
    /// Send the pool's shareable fd.
    Fd(Arc<dyn RxPool>),
}

/// The reply to a request that arrives once shutdown has begun.
pub fn shutting_down() -> UnixSocketProto {
    frame::error(StatusCode::Unavailable, "the daemon is shutting down")
}

/// Resolves once `shutdown` turns true (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_read_back_as_their_endpoint() {
        let pci: PciAddr = "0000:04:00.0".parse().unwrap();
        for e in [
            Endpoint::RuleManager,
            Endpoint::RuleUninstall,
            Endpoint::QueueIdsByGpu,
            Endpoint::Registry,
            Endpoint::GpuFd(pci),
            Endpoint::GpuMetadata(pci),
            Endpoint::GpuIpcHandle,
        ] {
            assert_eq!(Endpoint::from_socket_name(&e.socket_name()), Some(e));
        }
        assert_eq!(Endpoint::from_socket_name("get_gpu_fd_nonsense"), None);
        assert_eq!(Endpoint::from_socket_name(".rxdm-handover"), None);
    }
}
