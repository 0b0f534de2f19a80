//! The client-facing endpoints: one `UnixListener` per socket file and a
//! connection budget (`ConnBudget`) bounding them all. The rule endpoints are
//! served by I/O threads of their own ([`rule_io`]); the others by one
//! runtime task per connection.

pub mod accept_backoff;
pub(crate) mod budget;
pub(crate) mod conn;
pub(crate) mod flows_stream;
pub(crate) mod handlers;
pub(crate) mod http;
pub(crate) mod leases;
pub mod memory;
mod peer;
pub mod rule_io;
pub mod rule_threads;
pub(crate) mod socket_dir;
pub mod status;

use foldhash::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock, Weak};

use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch, Notify};

use crate::gpu::RxPool;
use crate::metrics::Metrics;
use crate::types::pci::PciAddr;
use leases::ClientTracker;
use rule_threads::NicRuleThread;

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

/// One managed GPU as the handlers see it.
#[derive(Debug, Clone)]
pub struct GpuEntry {
    pub nic: usize,
    /// Index of the GPU within its NIC.
    pub index: usize,
    pub queues: Vec<u32>,
    /// The daemon's teardown owns the pool: it is freed right after its
    /// binding ends, even while a task still holds this state.
    pub pool: Option<Weak<dyn RxPool>>,
}

/// Registered applications.
#[derive(Debug, Default)]
pub struct AppRegistry {
    count: Mutex<usize>,
    /// Signalled when the count drops from ≥1 to 0.
    pub last_gone: Notify,
}

impl AppRegistry {
    pub fn register(&self, metrics: &Metrics) {
        let mut c = self.count.lock().expect("registry lock");
        *c += 1;
        metrics.registered_apps.set(*c as i64);
    }

    pub fn unregister(&self, metrics: &Metrics) {
        let mut c = self.count.lock().expect("registry lock");
        *c = c.saturating_sub(1);
        metrics.registered_apps.set(*c as i64);
        if *c == 0 {
            self.last_gone.notify_one();
        }
    }

    pub fn count(&self) -> usize {
        *self.count.lock().expect("registry lock")
    }
}

/// Everything the handlers share.
pub struct ServerState {
    pub gpus: HashMap<PciAddr, GpuEntry>,
    /// One per NIC, in topology order (`GpuEntry::nic` indexes it).
    pub rule_threads: Vec<NicRuleThread>,
    /// Local address → NIC index, for requests without a GPU.
    pub addresses: RwLock<HashMap<IpAddr, usize>>,
    pub registry: AppRegistry,
    pub metrics: Arc<Metrics>,
    /// `--max_connections`, with a share kept for registry and pool endpoints.
    pub conn_limit: Arc<budget::ConnBudget>,
    /// Client processes and their leases.
    pub clients: Arc<ClientTracker>,
    /// Set when shutdown starts: the NIC threads answer requests not yet
    /// started with UNAVAILABLE.
    pub stopping: Arc<AtomicBool>,
}

impl ServerState {
    pub fn nic_for_address(&self, ip: IpAddr) -> Option<usize> {
        self.addresses.read().expect("address map lock").get(&ip.to_canonical()).copied()
    }

    pub fn set_addresses(&self, map: impl IntoIterator<Item = (IpAddr, usize)>) {
        *self.addresses.write().expect("address map lock") = map.into_iter().collect();
    }
}

/// Resolves once `shutdown` turns true (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// Accepts connections on `listener` until shutdown; each connection runs in
/// its own task holding a connection permit and a clone of `done`.
pub fn spawn_endpoint(
    listener: UnixListener,
    endpoint: Endpoint,
    state: Arc<ServerState>,
    mut shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) {
    tokio::spawn(async move {
        let mut backoff = accept_backoff::AcceptBackoff::new(endpoint.kind());
        loop {
            // At the limit, stop accepting so new clients wait in the kernel backlog.
            // The permit is only probed here: an idle listener must not hold one.
            tokio::select! {
                _ = crate::server::stopped(&mut shutdown) => return,
                p = state.conn_limit.acquire(endpoint) => drop(p),
            }
            let stream = tokio::select! {
                _ = crate::server::stopped(&mut shutdown) => return,
                r = listener.accept() => match r {
                    Ok((s, _)) => {
                        backoff.succeeded();
                        s
                    }
                    Err(e) => {
                        // EMFILE and friends: back off (growing pause, one log line
                        // per few seconds); clients wait in the backlog meanwhile.
                        let pause = backoff.failed(&e);
                        tokio::select! {
                            _ = crate::server::stopped(&mut shutdown) => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                        continue;
                    }
                },
            };
            let permit = tokio::select! {
                _ = crate::server::stopped(&mut shutdown) => return,
                p = state.conn_limit.acquire(endpoint) => p,
            };
            let state = state.clone();
            let shutdown = shutdown.clone();
            let done = done.clone();
            tokio::spawn(async move {
                conn::serve(stream, endpoint, &state, shutdown, done).await;
                drop(permit);
            });
        }
    });
}
