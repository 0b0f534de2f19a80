//! The async endpoints and the daemon's views: the socket folder and its
//! listeners, one runtime task per connection for the queue, registry and
//! pool endpoints (the rule endpoints are the rule path's, see
//! [`steering`](crate::steering)), the HTTP server and the status socket.
//!
//! It may use `steering` (to hand rule requests over and to show the rule
//! tables), `endpoint`, `identity`, `metrics` and the layers below; the
//! daemon assembles it.

pub(crate) mod conn;
pub(crate) mod handlers;
pub(crate) mod http;
pub(crate) mod socket_dir;
pub mod status;

use foldhash::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};

use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch, Notify};

use crate::endpoint::accept_backoff;
use crate::endpoint::budget::ConnBudget;
use crate::endpoint::pause::{self, Gate, Parked};
use crate::endpoint::{stopped, Endpoint};
use crate::gpu::RxPool;
use crate::identity::{ClientTracker, TenantPolicy};
use crate::metrics::Metrics;
use crate::steering::{GpuSlot, RulePath};
use crate::types::pci::PciAddr;

/// One managed GPU as the handlers see it.
#[derive(Debug, Clone)]
pub struct GpuEntry {
    /// Where it sits: its NIC, its index there, its place among all GPUs.
    pub slot: GpuSlot,
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
    /// The rule path: one rule thread per NIC, in topology order
    /// (`GpuEntry::nic` indexes `rules.nics`).
    pub rules: Arc<RulePath>,
    pub registry: AppRegistry,
    pub metrics: Arc<Metrics>,
    /// `--max_connections`, with a share kept for registry and pool endpoints.
    pub conn_limit: Arc<ConnBudget>,
    /// Client processes and their leases.
    pub clients: Arc<ClientTracker>,
    /// Tenant isolation: who may fetch which pool.
    pub tenants: Arc<TenantPolicy>,
    /// Set when shutdown starts: the NIC threads answer requests not yet
    /// started with UNAVAILABLE.
    pub stopping: Arc<AtomicBool>,
    /// A takeover's pause: no accepting, connections parked between requests.
    pub gate: Arc<Gate>,
}

/// Serves a connection taken over from another daemon (registered there,
/// with part of a request read) until it ends.
pub fn spawn_adopted(
    p: Parked,
    state: Arc<ServerState>,
    shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) -> Result<(), socket_dir::SocketDirError> {
    let std = std::os::unix::net::UnixStream::from(p.fd);
    let stream = std
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(std))
        .map_err(|err| socket_dir::SocketDirError::Bind { path: p.endpoint.socket_name().into(), err })?;
    if p.registered {
        state.registry.register(&state.metrics);
    }
    let live = state.gate.enter();
    let permit = state.conn_limit.try_acquire(p.endpoint);
    let start = conn::Start { registered: p.registered, input: p.input };
    tokio::spawn(async move {
        conn::serve(stream, p.endpoint, &state, shutdown, done, start).await;
        drop((permit, live));
    });
    Ok(())
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
        let mut gate = state.gate.subscribe();
        loop {
            // Paused for a takeover: clients wait in the backlog for whoever serves next.
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = pause::wait_open(&mut gate) => {}
            }
            // At the limit, stop accepting so new clients wait in the kernel backlog.
            // The permit is only probed here: an idle listener must not hold one.
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                p = state.conn_limit.acquire(endpoint) => drop(p),
            }
            let stream = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = pause::closing(&mut gate) => continue,
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
                            _ = stopped(&mut shutdown) => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                        continue;
                    }
                },
            };
            let permit = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                p = state.conn_limit.acquire(endpoint) => p,
            };
            // Counted from here, so that a pause waits for it too.
            let live = state.gate.enter();
            let state = state.clone();
            let shutdown = shutdown.clone();
            let done = done.clone();
            tokio::spawn(async move {
                conn::serve(stream, endpoint, &state, shutdown, done, conn::Start::default()).await;
                drop((permit, live));
            });
        }
    });
}
