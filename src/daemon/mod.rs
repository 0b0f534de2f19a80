//! Lifecycle: config → lock → prime → allocate → bind → serve →
//! ready; then wait for a reason to stop, and restore everything.

pub mod backends;
pub mod http_routes;
pub mod job_end;
pub mod notify;

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

use crate::config::flags::Flags;
use crate::config::flags::SetupParam;
use crate::config::presets::{self, Source};
use crate::gpu::{Binding, RxPool};
use crate::host::tuning::{HostTuning, TuningPlan};
use crate::metrics::Metrics;
use crate::nic::monitor::{spawn_link_monitor, MonitorHandle};
use crate::nic::prime::{self, PrimedNic};
use crate::nic::{NicControl, NicEvent};
use crate::server::http;
use crate::server::leases::{ClientTracker, LeasePolicy};
use crate::server::rule_workers::RuleWorker;
use crate::server::socket_dir::{resolve_group, SocketDir};
use crate::server::{self, AppRegistry, Endpoint, GpuEntry, ServerState};
use crate::types::pci::PciAddr;
use crate::types::topology::Topology;
use backends::Backends;
use http_routes::Routes;
use job_end::{JobEndError, ShutdownFile};

/// The exact line tools grep for once the daemon is ready.
pub const READY_LINE: &str = "Buffer manager initialization completed.";

/// A second signal sooner than this after the first is a duplicate, not a demand to force the exit.
const FORCE_GRACE: Duration = Duration::from_secs(1);

/// How long shutdown waits for open connections to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long shutdown keeps retrying rule deletes the NIC refuses.
const RULE_REMOVAL_GIVE_UP: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Bad flags or topology: exit 2.
    #[error("{0}")]
    Config(String),
    /// Anything else: exit 1.
    #[error("{0}")]
    Runtime(String),
}

impl DaemonError {
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Config(_) => 2,
            DaemonError::Runtime(_) => 1,
        }
    }
}

/// Why the daemon is stopping.
#[derive(Debug)]
enum StopReason {
    Signal(&'static str),
    LastApplicationGone,
    ShutdownFile(PathBuf),
    AllClientsExited(Duration),
    Nic(NicEvent),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Signal(s) => write!(f, "received {s}"),
            StopReason::LastApplicationGone => f.write_str("the last registered application disconnected"),
            StopReason::ShutdownFile(p) => write!(f, "the shutdown file {} appeared", p.display()),
            StopReason::AllClientsExited(d) => {
                write!(f, "no client process has been alive for {}s", d.as_secs())
            }
            StopReason::Nic(NicEvent::LinkDown(n)) => write!(f, "link of {n} went down"),
            StopReason::Nic(NicEvent::Removed(n)) => write!(f, "{n} was removed"),
            StopReason::Nic(NicEvent::Reset { ifname, before, after }) => {
                write!(f, "{ifname} was reset (reset_cnt {before} -> {after})")
            }
            StopReason::Nic(NicEvent::AddressesChanged) => f.write_str("addresses changed"),
        }
    }
}

/// What startup has changed so far, so that failure and shutdown undo the same things.
struct Node {
    nic: Arc<dyn NicControl>,
    primed: Vec<PrimedNic>,
    bindings: Vec<Box<dyn Binding>>,
    pools: Vec<(PciAddr, Arc<dyn RxPool>)>,
    state: Option<Arc<ServerState>>,
    dir: SocketDir,
    /// Host tuning applied at startup (ethtool backend only).
    tuning: Option<HostTuning>,
}

impl Node {
    /// Removes rules, unbinds, frees pools, restores NICs, removes files.
    /// Attempts every step; returns the failures. Idempotent.
    async fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Some(state) = self.state.take() {
            state.stopping.store(true, Ordering::Release);
            // Every NIC at once: each retries refused deletes on its own thread.
            let give_up_at = Instant::now() + RULE_REMOVAL_GIVE_UP;
            let t = Instant::now();
            let started: Vec<_> = state.workers.iter().map(|w| w.remove_all(give_up_at)).collect();
            for (w, removal) in state.workers.iter().zip(started) {
                let errs = removal.await;
                tracing::info!(ifname = %w.ifname, elapsed_ms = ms(t), refused = errs.len(), "rules removed");
                errors.extend(errs.into_iter().map(|e| format!("removing rules: {e}")));
            }
        }
        self.bindings.clear();
        self.pools.clear();
        for p in self.primed.iter_mut().rev() {
            let errs = p.restore(self.nic.as_ref());
            if errs.is_empty() {
                tracing::info!(ifname = %p.ifname, "NIC restored");
            }
            errors.extend(errs.into_iter().map(|e| format!("restoring {e}")));
        }
        self.primed.clear();
        if let Some(mut tuning) = self.tuning.take() {
            match tuning.restore() {
                Ok(()) => tracing::info!("host tuning undone"),
                Err(errs) => errors.extend(errs.into_iter().map(|e| format!("undoing host tuning: {e}"))),
            }
        }
        self.dir.cleanup();
        errors
    }
}

/// The NIC a teardown error names (`restoring eth1: …`), or `host`.
fn restore_nic(err: &str) -> &str {
    err.strip_prefix("restoring ").and_then(|r| r.split(':').next()).unwrap_or("host")
}

/// Milliseconds since `t`, rounded to microseconds for readable logs.
fn ms(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

/// Runs the daemon to completion. `Ok` means a clean exit (0).
pub async fn run(flags: Flags) -> Result<(), DaemonError> {
    let started = Instant::now();
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| DaemonError::Runtime(e.to_string()))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| DaemonError::Runtime(e.to_string()))?;
    // SIGHUP (a closed terminal, some supervisors): the same orderly shutdown.
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| DaemonError::Runtime(e.to_string()))?;

    let t = Instant::now();
    let (mut topo, source) =
        presets::resolve_topology(&flags).map_err(|e| DaemonError::Config(e.to_string()))?;
    tracing::info!(source = %source.describe(), nics = topo.nics.len(), gpus = topo.gpus().count(), elapsed_ms = ms(t), "topology loaded");

    let gid = match &flags.socket_group {
        Some(g) => Some(resolve_group(g).map_err(|e| DaemonError::Config(e.to_string()))?),
        None => None,
    };
    let backends = backends::select(&flags, &mut topo, &source)?;
    notify::send(&notify::status("priming NICs, allocating pools"));
    let topo = Arc::new(topo);

    let t = Instant::now();
    let dir = SocketDir::lock(&flags.uds_path, flags.socket_mode, gid)
        .map_err(|e| DaemonError::Runtime(e.to_string()))?;
    tracing::info!(path = %flags.uds_path.display(), elapsed_ms = ms(t), "socket folder locked");
    // Held until the process exits; claimed before anything touches a NIC.
    let _claims = crate::nic::claim::claim_managed(
        backends.nic.capabilities(),
        flags.claim_sim_nics,
        topo.nics.iter().map(|n| n.ifname.as_str()),
    )
    .map_err(|e| DaemonError::Runtime(e.to_string()))?;
    let shutdown_file = match flags.shutdown_file() {
        Some(path) => Some(ShutdownFile::watch(&path).map_err(|e| match e {
            JobEndError::NoFolder { .. } => DaemonError::Config(e.to_string()),
            _ => DaemonError::Runtime(e.to_string()),
        })?),
        None => None,
    };

    let metrics = Arc::new(Metrics::new());
    metrics.init_topology(&topo);
    let routes = Arc::new(Routes::new(metrics.clone()).with_debug_access(flags.debug_endpoints));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    if let Some(addr) = flags.metrics_address.0 {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| DaemonError::Runtime(format!("--metrics_address {addr}: {e}")))?;
        // The bound address (port 0 picks a free one).
        let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(address = %bound, "HTTP endpoints listening");
        let limits = http::Limits::new(flags.max_http_connections as usize);
        tokio::spawn(http::serve(listener, routes.clone(), limits, shutdown_rx.clone()));
    }

    let mut node = Node {
        nic: backends.nic.clone(),
        primed: Vec::new(),
        bindings: Vec::new(),
        pools: Vec::new(),
        state: None,
        dir,
        tuning: None,
    };
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<NicEvent>();
    let startup =
        start(&flags, &topo, &source, &backends, &mut node, &metrics, &routes, shutdown_rx.clone(), done_tx)
            .await
            .and_then(|()| start_link_monitor(&backends, &topo, &events_tx));
    let monitor = match startup {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "startup failed; undoing what was applied");
            notify::send(&notify::status(&format!("startup failed: {e}")));
            let _ = shutdown_tx.send(true);
            for err in node.teardown().await {
                metrics.restore_failed(restore_nic(&err), &err);
                tracing::error!(error = %err, "rollback step failed");
            }
            return Err(e);
        }
    };
    drop(events_tx); // monitors hold their own senders
    let state = node.state.clone().expect("set by start");
    server::memory::spawn_trimmer(state.clone(), shutdown_rx.clone());

    if let Ok(path) = std::env::var("HEALTH_CHECK_LOG_FILE") {
        if let Err(e) = write_health_line(&path) {
            tracing::warn!(path, error = %e, "could not write HEALTH_CHECK_LOG_FILE");
        }
    }
    routes.set_ready(true);
    tracing::info!(elapsed_ms = ms(started), "{READY_LINE}");
    notify::send(&format!(
        "READY=1\n{}",
        notify::status(&format!("serving on {}", flags.uds_path.display()))
    ));

    let grace = Duration::from_secs(flags.wait_time_before_exit);
    let reason = tokio::select! {
        _ = sigterm.recv() => StopReason::Signal("SIGTERM"),
        _ = sigint.recv() => StopReason::Signal("SIGINT"),
        _ = sighup.recv() => StopReason::Signal("SIGHUP"),
        _ = state.registry.last_gone.notified(), if flags.monitor_shutdown => StopReason::LastApplicationGone,
        _ = async { shutdown_file.as_ref().expect("guarded").appeared().await }, if shutdown_file.is_some() => {
            StopReason::ShutdownFile(shutdown_file.as_ref().expect("guarded").path().to_path_buf())
        }
        _ = job_end::all_clients_exited(state.clients.subscribe(), grace), if flags.shutdown_when_all_clients_exited => {
            StopReason::AllClientsExited(grace)
        }
        ev = next_fatal_event(&mut events_rx, &state, backends.nic.as_ref(), &topo, &metrics) => StopReason::Nic(ev),
    };
    tracing::info!(reason = %reason, "shutting down");
    notify::send(&format!("STOPPING=1\n{}", notify::status(&format!("shutting down: {reason}"))));
    drop(monitor);
    routes.set_ready(false);
    // A second signal during shutdown forces the exit. A repeat within
    // FORCE_GRACE is the same request delivered twice (wrappers such as
    // timeout, runuser or sudo forward a signal their process group also got).
    let shutdown_started = Instant::now();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = sigterm.recv() => {},
                _ = sigint.recv() => {},
                _ = sighup.recv() => {},
            }
            if shutdown_started.elapsed() >= FORCE_GRACE {
                break;
            }
            tracing::debug!("repeated signal right after the first: ignored");
        }
        tracing::error!("second signal during shutdown: exiting now without finishing restore");
        std::process::exit(1);
    });
    // Requests not yet started get UNAVAILABLE from here on.
    state.stopping.store(true, Ordering::Release);
    let _ = shutdown_tx.send(true);
    drop(state);
    if tokio::time::timeout(DRAIN_TIMEOUT, done_rx.recv()).await.is_err() {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; continuing shutdown");
    }
    let errors = node.teardown().await;
    for e in &errors {
        metrics.restore_failed(restore_nic(e), e);
        tracing::error!(error = %e, "restore step failed");
    }
    if !errors.is_empty() {
        return Err(DaemonError::Runtime(format!("{} restore step(s) failed", errors.len())));
    }
    tracing::info!("shutdown complete");
    match reason {
        // The NIC failed under us: restored, but not a clean exit.
        StopReason::Nic(_) => Err(DaemonError::Runtime(format!("stopped because {reason}"))),
        _ => Ok(()),
    }
}

/// Removes the rules of client processes that exited, through each NIC's worker.
fn spawn_reaper(state: Weak<ServerState>, mut exits: mpsc::UnboundedReceiver<std::num::NonZeroU32>) {
    tokio::spawn(async move {
        while let Some(lease) = exits.recv().await {
            let Some(state) = state.upgrade() else { return };
            for w in &state.workers {
                w.reclaim(lease);
            }
        }
    });
}

/// Starts the link monitor for real NICs. It starts after priming, so that
/// the drivers' own resets while being primed do not read as link failures.
fn start_link_monitor(
    b: &Backends,
    topo: &Topology,
    events: &mpsc::UnboundedSender<NicEvent>,
) -> Result<Option<MonitorHandle>, DaemonError> {
    if !b.nic.capabilities().link_events {
        return Ok(None);
    }
    let ifnames = topo.nics.iter().map(|n| n.ifname.clone()).collect();
    spawn_link_monitor(ifnames, b.nic.clone(), events.clone())
        .map(Some)
        .map_err(|e| DaemonError::Runtime(format!("link monitor: {e}")))
}

/// Host tuning, best effort: failures are logged, what was
/// applied is undone at shutdown.
fn apply_host_tuning(flags: &Flags) -> Option<HostTuning> {
    let SetupParam::Tune(params) = flags.setup_param else {
        return None;
    };
    let plan = match &flags.tuning_script_path {
        Some(dir) => TuningPlan::Script { dir: dir.clone(), args: params.script_args() },
        None => TuningPlan::Native { procfs_root: flags.procfs_root(), sysfs_root: flags.sysfs_root() },
    };
    let (tuning, errors) = HostTuning::apply(&params, &plan);
    for e in errors {
        tracing::warn!(error = %e, "host tuning step failed");
    }
    Some(tuning)
}

fn write_health_line(path: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{READY_LINE}")
}

/// Waits for a NIC event that ends the daemon; address changes only refresh the map.
async fn next_fatal_event(
    events: &mut mpsc::UnboundedReceiver<NicEvent>,
    state: &ServerState,
    nic: &dyn NicControl,
    topo: &Topology,
    metrics: &Metrics,
) -> NicEvent {
    loop {
        let Some(ev) = events.recv().await else {
            // No monitor: never fires.
            std::future::pending::<()>().await;
            unreachable!()
        };
        let (ifname, kind) = match &ev {
            NicEvent::LinkDown(n) => (n.as_str(), "link_down"),
            NicEvent::Removed(n) => (n.as_str(), "removed"),
            NicEvent::Reset { ifname, .. } => (ifname.as_str(), "reset"),
            NicEvent::AddressesChanged => ("", "addresses_changed"),
        };
        metrics.link_events.with_label_values(&[ifname, kind]).inc();
        if ev == NicEvent::AddressesChanged {
            state.set_addresses(address_map(nic, topo));
            continue;
        }
        return ev;
    }
}

/// Local address → NIC index, from the NIC backend.
fn address_map(nic: &dyn NicControl, topo: &Topology) -> HashMap<IpAddr, usize> {
    let mut map = HashMap::new();
    for (i, n) in topo.nics.iter().enumerate() {
        match nic.addresses(&n.ifname) {
            Ok(addrs) => map.extend(addrs.into_iter().map(|a| (a.to_canonical(), i))),
            Err(e) => tracing::warn!(ifname = %n.ifname, error = %e, "could not read addresses"),
        }
    }
    map
}

#[allow(clippy::too_many_arguments)]
async fn start(
    flags: &Flags,
    topo: &Arc<Topology>,
    source: &Source,
    b: &Backends,
    node: &mut Node,
    metrics: &Arc<Metrics>,
    routes: &Arc<Routes>,
    shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) -> Result<(), DaemonError> {
    let rt = |e: String| DaemonError::Runtime(e);

    // Prime every NIC, in parallel; keep what succeeded so it can be undone.
    let t = Instant::now();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = topo
            .nics
            .iter()
            .map(|n| s.spawn(|| prime::prime(b.nic.as_ref(), &n.ifname, topo.rss_set_size)))
            .collect();
        handles.into_iter().map(|h| h.join().expect("prime thread")).collect()
    });
    let mut first_err = None;
    for r in results {
        match r {
            Ok(p) => node.primed.push(p),
            Err(e) => {
                metrics.nic_op_failed(&e.source);
                first_err = first_err.or(Some(e))
            }
        }
    }
    if let Some(e) = first_err {
        return Err(rt(format!("priming NIC {e}")));
    }
    for p in &node.primed {
        topo.validate_channels(&p.ifname, p.channels).map_err(|e| DaemonError::Config(e.to_string()))?;
    }
    tracing::info!(nics = node.primed.len(), backend = b.nic.backend(), elapsed_ms = ms(t), "NICs primed");

    // One pool per GPU, in parallel.
    let t = Instant::now();
    let gpus: Vec<PciAddr> = topo.gpus().map(|(_, g)| g.pci).collect();
    let requests: Vec<(PciAddr, u64)> = gpus.iter().map(|&g| (g, topo.rx_pool_size)).collect();
    let pools = crate::gpu::allocate_all(b.alloc.as_ref(), &requests, flags.gpu_shmem_type);
    for (gpu, r) in gpus.iter().zip(pools) {
        let pool: Arc<dyn RxPool> = Arc::from(r.map_err(|e| rt(e.to_string()))?);
        metrics.pool_bytes.with_label_values(&[&gpu.to_string()]).set(pool.size() as i64);
        node.pools.push((*gpu, pool));
    }
    tracing::info!(
        gpus = node.pools.len(),
        backend = b.alloc.backend(),
        elapsed_ms = ms(t),
        "pools allocated"
    );

    let t = Instant::now();
    for (nic, gpu) in topo.gpus() {
        let pool = &node.pools.iter().find(|(p, _)| *p == gpu.pci).expect("allocated above").1;
        let binding = b
            .binder
            .bind(pool.as_ref(), gpu.pci, &nic.ifname, nic.pci, &gpu.queues)
            .map_err(|e| rt(e.to_string()))?;
        node.bindings.push(binding);
    }
    tracing::info!(
        bindings = node.bindings.len(),
        backend = b.binder.backend(),
        elapsed_ms = ms(t),
        "pools bound"
    );

    // Shared state; the rule engines see no request until the rule endpoints open.
    let mut gpu_entries = HashMap::new();
    let mut workers = Vec::new();
    let stopping = Arc::new(AtomicBool::new(false));
    for (ni, (n, p)) in topo.nics.iter().zip(&node.primed).enumerate() {
        for (gi, g) in n.gpus.iter().enumerate() {
            let pool = node.pools.iter().find(|(pci, _)| *pci == g.pci).map(|(_, p)| p.clone());
            gpu_entries.insert(g.pci, GpuEntry { nic: ni, index: gi, queues: g.queues.clone(), pool });
        }
        let capacity = topo.max_rx_rules.min(p.rule_capacity);
        if capacity < topo.max_rx_rules {
            tracing::warn!(ifname = %n.ifname, capacity, max_rx_rules = topo.max_rx_rules, "NIC has fewer rule slots than max_rx_rules");
        }
        let gq = n.gpus.iter().map(|g| (g.pci, g.queues.clone())).collect();
        let w = RuleWorker::new(&n.ifname, capacity, gq, b.nic.clone(), metrics.clone(), stopping.clone())
            .map_err(|e| rt(format!("starting the rule worker of {}: {e}", n.ifname)))?;
        workers.push(w);
    }
    let policy =
        LeasePolicy { track: flags.leases || flags.shutdown_when_all_clients_exited, reclaim: flags.leases };
    let (clients, exits) = ClientTracker::new(policy, metrics.clone());
    let state = Arc::new(ServerState {
        topology: topo.clone(),
        gpus: gpu_entries,
        workers,
        addresses: Default::default(),
        registry: AppRegistry::default(),
        metrics: metrics.clone(),
        conn_limit: Arc::new(server::budget::ConnBudget::new(
            flags.max_connections as usize,
            (flags.client_idle_timeout > 0).then(|| Duration::from_secs(flags.client_idle_timeout)),
        )),
        clients,
        stopping,
    });
    spawn_reaper(Arc::downgrade(&state), exits);
    state.set_addresses(address_map(b.nic.as_ref(), topo));
    node.state = Some(state.clone());
    // `tcpx-rxdm status` answers (not ready) from here on.
    let l = node.dir.bind(crate::server::status::SOCKET).map_err(|e| rt(e.to_string()))?;
    crate::server::status::spawn(l, state.clone(), shutdown.clone());

    let t = Instant::now();
    let mut open = |ep: Endpoint| -> Result<(), DaemonError> {
        let l = node.dir.bind(&ep.socket_name()).map_err(|e| rt(e.to_string()))?;
        server::spawn_endpoint(l, ep, state.clone(), shutdown.clone(), done.clone());
        Ok(())
    };
    for (_, g) in topo.gpus() {
        open(Endpoint::GpuFd(g.pci))?;
        open(Endpoint::GpuMetadata(g.pci))?;
    }
    if flags.gpu_shmem_type == crate::gpu::ShmemType::File {
        open(Endpoint::GpuIpcHandle)?;
    }
    tracing::info!(elapsed_ms = ms(t), "pool endpoints started");

    let t = Instant::now();
    for p in &mut node.primed {
        p.enable_header_split(b.nic.as_ref()).map_err(|e| {
            metrics.nic_op_failed(&e.source);
            rt(format!("header split on {e}"))
        })?;
    }
    tracing::info!(elapsed_ms = ms(t), "header split enabled");

    if b.nic.capabilities().host_tuning {
        let t = Instant::now();
        node.tuning = apply_host_tuning(flags);
        tracing::info!(elapsed_ms = ms(t), "host tuning applied");
    }

    let t = Instant::now();
    let mut open = |ep: Endpoint| -> Result<(), DaemonError> {
        let l = node.dir.bind(&ep.socket_name()).map_err(|e| rt(e.to_string()))?;
        server::spawn_endpoint(l, ep, state.clone(), shutdown.clone(), done.clone());
        Ok(())
    };
    open(Endpoint::RuleManager)?;
    open(Endpoint::RuleUninstall)?;
    open(Endpoint::QueueIdsByGpu)?;
    open(Endpoint::Registry)?;
    for p in &node.primed {
        metrics.set_nic_info(&p.ifname, p.header_split.name(), b.binder.backend());
    }
    tracing::info!(elapsed_ms = ms(t), "rule endpoints started");

    let _ = routes.state.set(state.clone());
    let _ = routes.config_json.set(config_json(flags, topo, source, b, node));
    Ok(())
}

fn config_json(flags: &Flags, topo: &Topology, source: &Source, b: &Backends, node: &Node) -> String {
    let nics: Vec<_> = node
        .primed
        .iter()
        .map(|p| {
            serde_json::json!({
                "ifname": p.ifname,
                "header_split": p.header_split,
                "channels": p.channels,
                "rule_capacity": p.rule_capacity,
                "rule_slots": topo.max_rx_rules.min(p.rule_capacity),
            })
        })
        .collect();
    let pools: Vec<_> = node
        .pools
        .iter()
        .map(|(g, p)| {
            serde_json::json!({ "gpu": g.to_string(), "size": p.size(), "alignment": p.alignment(), "pool": p.describe() })
        })
        .collect();
    let bindings: Vec<_> = node
        .bindings
        .iter()
        .map(|b| serde_json::json!({ "binding": b.describe(), "dmabuf_id": b.dmabuf_id() }))
        .collect();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "source": source.describe(),
        "uds_path": flags.uds_path.display().to_string(),
        "backends": { "nic": b.nic.backend(), "gpu": b.alloc.backend(), "bind": b.binder.backend() },
        "topology": topo,
        "nics": nics,
        "pools": pools,
        "bindings": bindings,
        "monitor_shutdown": flags.monitor_shutdown,
        "max_connections": flags.max_connections,
    })
    .to_string()
}
