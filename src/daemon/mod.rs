//! The lifecycle: lock the socket folder → claim the NICs → start (prime →
//! allocate → bind → serve, see `startup.rs`) → ready; then wait for a reason
//! to stop, and restore everything (`teardown.rs`).
//!
//! [`run`] takes everything from its caller: the configuration, the backends
//! it programs NICs and allocates pools through, and the future whose end
//! asks it to stop. `main` passes the real backends and the signals; tests
//! pass recording fakes and a channel.

mod backends;
pub(crate) mod datapath;
mod debug_view;
mod error;
mod events;
mod files;
pub(crate) mod http_routes;
pub(crate) mod job_end;
pub mod notify;
mod signals;
mod startup;
mod takeover;
mod teardown;
mod wait_nics;

use std::future::Future;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::config::flags::{AfterHandover, Flags, Takeover};
use crate::config::presets::{self, Source};
use crate::metrics::Metrics;
use crate::nic::NicClaim;
use crate::nic::NicEvent;
use crate::server::http;
use crate::server::socket_dir::{resolve_group, SocketDir};
use crate::types::topology::Topology;

pub use backends::{mig_check, select as select_backends, Backends};
pub use error::{DaemonError, TeardownError, EXIT_CONFIG, EXIT_FAILURE};
pub use events::StopReason;
pub use signals::{shutdown_on_signals, HUP_IGNORED};
pub use wait_nics::{load as load_config_waiting_for_nics, Loaded, POLL as NIC_POLL, PROGRESS_EVERY};

use events::next_fatal_event;
use http_routes::Routes;
use job_end::ShutdownFile;
use startup::Startup;
use teardown::Node;

/// The exact line tools grep for once the daemon is ready.
pub const READY_LINE: &str = "Buffer manager initialization completed.";

/// How long shutdown waits for open connections to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// What the daemon runs with: the flags and the topology they resolved to.
#[derive(Debug, Clone)]
pub struct Config {
    pub flags: Flags,
    pub topology: Topology,
    /// Where the topology came from.
    pub source: Source,
}

impl Config {
    /// Resolves the topology the flags describe (preset, file, or discovery).
    pub fn load(flags: Flags) -> Result<Config, DaemonError> {
        let t = Instant::now();
        let config = Config::resolve(flags)?;
        config.log_loaded(t);
        Ok(config)
    }

    /// [`Config::load`] without the log line (looked for again while waiting for NICs).
    fn resolve(flags: Flags) -> Result<Config, DaemonError> {
        let (topology, source) = presets::resolve_topology(&flags)?;
        Ok(Config { flags, topology, source })
    }

    /// The `topology loaded` line, for a resolution begun at `t`.
    fn log_loaded(&self, t: Instant) {
        let (topology, source) = (&self.topology, &self.source);
        tracing::info!(source = %source.describe(), nics = topology.nics.len(), gpus = topology.gpus().count(), elapsed_ms = ms(t), "topology loaded");
    }
}

/// Milliseconds since `t`, rounded to microseconds for readable logs.
fn ms(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

/// Runs the daemon until `shutdown` resolves (with the cause to log) or
/// another reason to stop comes, then restores the node. `Ok` is a clean
/// exit. If `shutdown` resolves while the daemon is already stopping for
/// another reason, the caller insists: the process exits with status 1 at
/// once, as on a second signal.
pub async fn run(
    config: Config,
    backends: Backends,
    shutdown: impl Future<Output = String> + Send + 'static,
) -> Result<(), DaemonError> {
    run_in(config, backends, shutdown, None).await
}

/// [`run`] in a socket folder already locked (`dir`: the daemon locked it to
/// answer `tcpx-rxdm status` while it waited for its NICs), or in
/// `--uds_path` locked now when `None`.
pub async fn run_in(
    config: Config,
    backends: Backends,
    shutdown: impl Future<Output = String> + Send + 'static,
    dir: Option<SocketDir>,
) -> Result<(), DaemonError> {
    let started = Instant::now();
    let flags = &config.flags;
    let gid = match &flags.socket_group {
        Some(g) => Some(resolve_group(g).map_err(DaemonError::SocketGroup)?),
        None => None,
    };
    notify::send(&notify::status("priming NICs, allocating pools"));

    let t = Instant::now();
    // A takeover: the running daemon's state, fds in hand (nothing served yet).
    let (taking, mut handed) = match flags.takeover {
        Takeover::Off => (None, None),
        _ => match takeover::take::fetch(&config, &backends).await? {
            Some((taking, handed)) => (Some(taking), Some(handed)),
            None => (None, None),
        },
    };
    let locked = match (handed.as_mut(), dir) {
        (None, Some(dir)) => Ok(dir),
        (Some(h), _) => {
            let lock = h.lock.take().expect("decoded with the lock");
            SocketDir::adopt(&flags.uds_path, flags.socket_mode, gid, lock, std::mem::take(&mut h.listeners))
                .map(|mut dir| {
                    // The serving daemon's files until the commit: never removed by this one.
                    dir.disarm();
                    dir
                })
        }
        (None, None) => takeover::take::lock_fresh(flags, gid),
    };
    let dir = locked.map_err(DaemonError::LockSocketDir).or_else(|e| abort(&taking, e))?;
    tracing::info!(path = %flags.uds_path.display(), elapsed_ms = ms(t), "socket folder locked");
    // Held until the process exits; claimed before anything touches a NIC.
    let claims = match handed.as_mut() {
        Some(h) => std::mem::take(&mut h.claims).into_iter().map(|(n, fd)| NicClaim::adopt(&n, fd)).collect(),
        None => crate::nic::claim::claim_managed(
            backends.nic.capabilities(),
            flags.claim_sim_nics,
            config.topology.nics.iter().map(|n| n.ifname.as_str()),
        ),
    };
    let claims = claims.map_err(DaemonError::from).or_else(|e| abort(&taking, e))?;
    let shutdown_file = flags
        .shutdown_file()
        .map(|path| ShutdownFile::watch(&path))
        .transpose()
        .map_err(DaemonError::from)
        .or_else(|e| abort(&taking, e))?;

    let metrics = Arc::new(Metrics::new());
    metrics.init_topology(&config.topology);
    let routes = Arc::new(Routes::new(metrics.clone()).with_debug_access(flags.debug_endpoints));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // HTTP stops at shutdown, and once handed over (the successor answers).
    let http_stop = watch::Sender::new(false);
    {
        let (mut rx, tx) = (shutdown_rx.clone(), http_stop.clone());
        tokio::spawn(async move {
            crate::endpoint::stopped(&mut rx).await;
            let _ = tx.send(true);
        });
    }
    // The path started from, for a successor (SIGUSR2) after the binary was replaced.
    let exe = std::env::current_exe().ok();
    let mut usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
        .map_err(DaemonError::Signals)
        .or_else(|e| abort(&taking, e))?;
    let mut http_fd = None;
    if let Some(addr) = flags.metrics_address.0 {
        let listener = match handed.as_mut().and_then(|h| h.http.take()) {
            Some(fd) => {
                let std = std::net::TcpListener::from(fd);
                std.set_nonblocking(true).and_then(|()| tokio::net::TcpListener::from_std(std))
            }
            None => tokio::net::TcpListener::bind(addr).await,
        };
        let listener = listener
            .map_err(|source| DaemonError::MetricsListen { addr, source })
            .or_else(|e| abort(&taking, e))?;
        http_fd = listener.as_fd().try_clone_to_owned().ok();
        // The bound address (port 0 picks a free one).
        let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(address = %bound, "HTTP endpoints listening");
        let limits = http::Limits::new(flags.max_http_connections as usize);
        tokio::spawn(http::serve(listener, routes.clone(), limits, http_stop.subscribe()));
    }

    let mut node = Node::new(backends.nic.clone(), dir);
    let takeovers = handed.as_ref().map_or(0, |h| h.takeovers);
    let (handed_rules, handed_pools) = handed.as_ref().map_or((0, 0), |h| (h.rule_count(), h.pools.len()));
    node.adopting = handed;
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<NicEvent>();
    let startup = Startup {
        config: &config,
        backends: &backends,
        metrics: &metrics,
        routes: &routes,
        shutdown: shutdown_rx.clone(),
        done: done_tx,
    };
    let started_ok = startup.run(&mut node).await;
    drop(startup);
    // The handover socket (owner only): where a successor asks to take over.
    let handover_listener = started_ok.and_then(|()| {
        node.dir.bind_with_mode(crate::handover::SOCKET, 0o600).map_err(DaemonError::Endpoint)
    });
    let handover_listener = match (handover_listener, &taking) {
        (Ok(l), _) => Ok(l),
        (Err(e), Some(_)) => abort(&taking, e),
        (Err(e), None) => Err(e),
    };
    if let Some(taking) = taking {
        // Adopted: answer, and once the old daemon has committed, serve
        // (what it holds armed, the sockets listened on anew, the lock file
        // naming it, the gate open) before saying so: there is no moment
        // when neither serves.
        let from = taking.from;
        let since = taking.started;
        let committed = match taking.await_commit().await {
            Ok(c) => c,
            Err(why) => {
                tracing::error!("takeover failed: {why}");
                std::process::exit(EXIT_FAILURE.into());
            }
        };
        takeover::committed(&mut node.dir, node.tuning.as_mut());
        let state = node.state.clone().expect("set by startup");
        state.gate.resume();
        committed.serving().await;
        tracing::info!(
            "took over from pid {from}: {handed_rules} rules, {} clients, {handed_pools} pools in {:.1} ms",
            state.clients.subscribe().borrow().alive,
            since.elapsed().as_secs_f64() * 1e3
        );
    }
    let (monitor, handover) = match handover_listener
        .and_then(|l| events::start_link_monitor(&backends.nic, &config.topology, &events_tx).map(|m| (m, l)))
    {
        Ok(v) => v,
        Err(e) => {
            // The error itself is logged once, by the caller, when the process exits.
            tracing::warn!("startup failed; undoing what was applied");
            notify::send(&notify::status(&format!("startup failed: {e}")));
            let _ = shutdown_tx.send(true);
            for err in node.teardown().await {
                metrics.restore_failed(err.nic(), &err.to_string());
                tracing::error!(error = %err, "rollback step failed");
            }
            return Err(e);
        }
    };
    drop(events_tx); // monitors hold their own senders
    let state = node.state.clone().expect("set by startup");
    crate::endpoint::memory::spawn_trimmer(state.conn_limit.clone(), shutdown_rx.clone());
    let health =
        datapath::Datapath::new(&config.topology, backends.nic.clone(), metrics.clone(), Default::default());
    let health = Arc::new(health);
    let _ = routes.datapath.set(health.clone());
    tokio::spawn(datapath::tick(health, shutdown_rx.clone()));

    let mut shutdown = Box::pin(shutdown);
    // A stop asked for during startup (the signal is kept): never ready.
    let mut early =
        tokio::select! { biased; cause = &mut shutdown => Some(cause), () = std::future::ready(()) => None };
    if early.is_none() {
        // Before readiness is signalled, so a workload that waits for it finds the file.
        files::write_nccl_env(&config, gid.map(|g| g.as_raw()));
        if let Ok(path) = std::env::var("HEALTH_CHECK_LOG_FILE") {
            if let Err(e) = files::write_health_line(&path) {
                tracing::warn!(path, error = %e, "could not write HEALTH_CHECK_LOG_FILE");
            }
        }
        routes.set_ready(true);
        tracing::info!(elapsed_ms = ms(started), "{READY_LINE}");
        notify::send(&format!(
            "READY=1\n{}",
            notify::status(&format!("serving on {}", flags.uds_path.display()))
        ));
    }

    let grace = Duration::from_secs(flags.wait_time_before_exit);
    let busy = Arc::new(AtomicBool::new(false));
    let mut successors = takeover::admit::accept(handover, busy.clone());
    // A takeover under way, as a task of its own: the loop stays responsive.
    let mut session: Option<takeover::give::Session> = None;
    let start_session = |successor, node: &Node| {
        let http = http_fd.as_ref().map(|f| f.as_fd());
        let giver = takeover::handout::Giver {
            config: &config,
            backends: &backends,
            node,
            claims: &claims,
            http,
            takeovers,
        };
        takeover::give::Session::start(successor, &giver)
    };
    let reason = loop {
        if let Some(cause) = early.take() {
            break StopReason::Requested(cause);
        }
        tokio::select! {
            cause = &mut shutdown => break StopReason::Requested(cause),
            _ = state.registry.last_gone.notified(), if flags.monitor_shutdown => break StopReason::LastApplicationGone,
            _ = async { shutdown_file.as_ref().expect("guarded").appeared().await }, if shutdown_file.is_some() => {
                break StopReason::ShutdownFile(shutdown_file.as_ref().expect("guarded").path().to_path_buf())
            }
            _ = job_end::all_clients_exited(state.clients.subscribe(), grace), if flags.shutdown_when_all_clients_exited => {
                break StopReason::AllClientsExited(grace)
            }
            ev = next_fatal_event(&mut events_rx, &state, backends.nic.as_ref(), &config.topology, &metrics) => break StopReason::Nic(ev),
            Some(successor) = successors.recv() => session = Some(start_session(successor, &node)),
            outcome = async { session.as_mut().expect("guarded").finished().await }, if session.is_some() => {
                session = None;
                if takeover::give::settle(outcome, &mut node.dir, &busy).is_some() {
                    routes.set_ready(false);
                    let _ = http_stop.send(true);
                    successors.stop();
                    if flags.after_handover == AfterHandover::Wait {
                        tracing::info!("handed over; waiting for SIGTERM (--after_handover=wait)");
                        let cause = (&mut shutdown).await;
                        tracing::info!(cause, "exiting; the successor serves");
                    }
                    // Nothing is undone: the successor holds it all now.
                    std::process::exit(0);
                }
            }
            _ = usr2.recv() => {
                // The successor takes the one takeover slot from its start.
                if busy.swap(true, Ordering::AcqRel) {
                    tracing::warn!("SIGUSR2: a takeover is under way; no successor started");
                } else if let Some(child) = takeover::admit::start_child(exe.as_deref()) {
                    session = Some(start_session(child, &node));
                } else {
                    busy.store(false, Ordering::Release);
                }
            }
        }
    };
    // A takeover under way ends first: this daemon serves on (the new one is
    // gone), then stops as asked; unless the new one already serves.
    if let Some(mut s) = session.take() {
        tracing::info!(reason = %reason, "stopping: ending the takeover under way");
        s.abort();
        if let Some(pid) = takeover::give::settle(s.finished().await, &mut node.dir, &busy) {
            tracing::info!(pid, "handed over to pid {pid} before stopping; exiting, the successor serves");
            std::process::exit(0);
        }
    }
    tracing::info!(reason = %reason, "shutting down");
    notify::send(&format!("STOPPING=1\n{}", notify::status(&format!("shutting down: {reason}"))));
    if !matches!(reason, StopReason::Requested(_)) {
        tokio::spawn(async move {
            let cause = shutdown.await;
            tracing::error!(cause, "asked to stop during shutdown: exiting now without finishing restore");
            std::process::exit(1);
        });
    }
    drop(monitor);
    routes.set_ready(false);
    // Removed while the folder's lock is still held, so a successor's file is never hit.
    if let Err(e) = crate::nccl::file::remove(&flags.uds_path) {
        tracing::warn!(error = %e, "could not remove {}", crate::nccl::file::FILE_NAME);
    }
    // Requests not yet started get UNAVAILABLE from here on.
    state.stopping.store(true, Ordering::Release);
    let _ = shutdown_tx.send(true);
    drop(state);
    if tokio::time::timeout(DRAIN_TIMEOUT, done_rx.recv()).await.is_err() {
        tracing::warn!(
            "connections still open after {}; continuing shutdown",
            crate::types::secs(DRAIN_TIMEOUT)
        );
    }
    let errors = node.teardown().await;
    for e in &errors {
        metrics.restore_failed(e.nic(), &e.to_string());
        tracing::error!(error = %e, "restore step failed");
    }
    if !errors.is_empty() {
        return Err(DaemonError::Restore(errors));
    }
    tracing::info!("shutdown complete");
    match reason {
        // The NIC failed under us: restored, but not a clean exit.
        StopReason::Nic(_) => Err(DaemonError::NicFailed(reason)),
        _ => Ok(()),
    }
}

/// A failure after the running daemon handed its state over: tell it (it
/// serves on) and exit at once, undoing nothing — what this process holds
/// is the other daemon's.
fn abort<T>(taking: &Option<takeover::take::Taking>, e: DaemonError) -> Result<T, DaemonError> {
    let Some(t) = taking else { return Err(e) };
    tracing::error!("takeover failed: {e}; pid {} serves on", t.from);
    t.fail(&e.to_string());
    std::process::exit(EXIT_FAILURE.into());
}
