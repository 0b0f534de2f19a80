//! The async endpoints and the daemon's views: the socket folder and its
//! listeners, one runtime task per connection for the queue, registry and
//! pool endpoints (the rule endpoints are the rule path's, see
//! [`steering`](crate::steering)), the HTTP server and the status socket.
//!
//! It may use `steering` (to hand rule requests over and to show the rule
//! tables), `endpoint`, `identity`, `metrics` and the layers below; the
//! daemon assembles it.

pub(crate) mod conn;
mod folder_access;
pub(crate) mod handlers;
pub(crate) mod http;
pub(crate) mod socket_dir;
pub mod status;

use foldhash::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch, Notify};

use crate::endpoint::accept_backoff;
use crate::endpoint::pause::{self, Parked};
use crate::endpoint::{stopped, Endpoint};
use crate::gpu::RxPool;
use crate::metrics::Metrics;
use crate::steering::{GpuSlot, RulePath, Shared};
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
    /// What every endpoint shares (the rule path's own).
    pub shared: Arc<Shared>,
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
        state.registry.register(&state.shared.metrics);
    }
    let live = state.shared.gate.enter();
    let permit = state.shared.conn_limit.try_acquire(p.endpoint);
    let start = conn::Start { registered: p.registered, input: p.input };
    tokio::spawn(async move {
        conn::serve(stream, p.endpoint, &state, shutdown, done, start).await;
        drop((permit, live));
    });
    Ok(())
}

/// Accepts connections on `listener` until shutdown; each connection runs in
/// its own task holding a connection permit and a clone of `done`.
///
/// The loop counts at the pause gate from before each accept until the
/// connection's task takes over, so a takeover waits for it: idle, it parks
/// nothing; with a connection accepted while the budget is full (another
/// endpoint took the last permit meanwhile), it parks that connection, which
/// the successor then serves.
pub fn spawn_endpoint(
    listener: UnixListener,
    endpoint: Endpoint,
    state: Arc<ServerState>,
    mut shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) {
    tokio::spawn(async move {
        let mut backoff = accept_backoff::AcceptBackoff::new(endpoint.kind());
        let mut gate = state.shared.gate.subscribe();
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
                p = state.shared.conn_limit.acquire(endpoint) => drop(p),
            }
            let live = state.shared.gate.enter();
            let stream = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = pause::closing(&mut gate) => {
                    state.shared.gate.park_task(None);
                    pause::settled(&mut gate).await;
                    continue;
                }
                r = listener.accept() => match r {
                    Ok((s, _)) => {
                        backoff.succeeded();
                        s
                    }
                    Err(e) => {
                        drop(live);
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
            let permit = match state.shared.conn_limit.try_acquire(endpoint) {
                Some(p) => Some(p),
                None => match wait_for_permit(&stream, endpoint, &state, &mut gate, &mut shutdown).await {
                    Waited::Permit(p) => Some(p),
                    // Shutdown: served without one, to answer what it sent.
                    Waited::Stopping => None,
                    Waited::HandedOver => continue,
                },
            };
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

/// How waiting for a connection permit ended.
enum Waited {
    Permit(tokio::sync::OwnedSemaphorePermit),
    Stopping,
    /// A takeover took the connection: the successor serves it.
    HandedOver,
}

/// Waits for a permit for a connection accepted at the limit. A takeover
/// meanwhile parks the connection, with nothing read, for the successor;
/// if the takeover fails it waits on.
async fn wait_for_permit(
    stream: &tokio::net::UnixStream,
    endpoint: Endpoint,
    state: &ServerState,
    gate: &mut watch::Receiver<pause::GateState>,
    shutdown: &mut watch::Receiver<bool>,
) -> Waited {
    use std::os::fd::AsFd;
    loop {
        tokio::select! {
            _ = stopped(shutdown) => return Waited::Stopping,
            p = state.shared.conn_limit.acquire(endpoint) => return Waited::Permit(p),
            _ = pause::closing(gate) => {
                let parked = match stream.as_fd().try_clone_to_owned() {
                    Ok(fd) => Some(Parked { fd, endpoint, registered: false, input: Vec::new(), peeked: 0 }),
                    Err(e) => {
                        tracing::warn!(endpoint = endpoint.kind(), error = %e, "cannot duplicate a connection for the takeover: it stays here");
                        None
                    }
                };
                state.shared.gate.park_task(parked);
                if !pause::settled(gate).await {
                    return Waited::HandedOver;
                }
            }
        }
    }
}
