//! The daemon started and serving: its startup (fresh or adopting what a
//! takeover handed over), the loop that waits for a reason to stop (or a
//! successor to hand over to), and the stop that restores the node.

use std::future::Future;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::super::events::{self, next_fatal_event, StopReason};
use super::super::startup::Startup;
use super::super::takeover::{self, admit::Candidate, admit::Successors, give::Session};
use super::super::teardown::Node;
use super::super::{abort, datapath, files, job_end, ms, notify, Backends, Config, DaemonError};
use super::super::{DRAIN_TIMEOUT, EXIT_FAILURE, READY_LINE};
use super::hold::Held;
use crate::config::flags::AfterHandover;
use crate::nic::monitor::MonitorHandle;
use crate::nic::NicEvent;
use crate::server::ServerState;

/// The cause a stop was asked for with (a signal, said in words).
pub(super) type Shutdown<'a> = Pin<Box<dyn Future<Output = String> + Send + 'a>>;

/// A started daemon: the node it changed, what it serves, and what ends it.
pub(super) struct Live {
    held: Held,
    node: Node,
    state: Arc<ServerState>,
    monitor: Option<MonitorHandle>,
    /// Closed once every endpoint has finished its work.
    done: mpsc::Receiver<()>,
    events: mpsc::UnboundedReceiver<NicEvent>,
    successors: Successors,
    /// A takeover is under way (one at a time).
    busy: Arc<AtomicBool>,
    session: Option<Session>,
    /// The path started from, for a successor (SIGUSR2) after the binary was replaced.
    exe: Option<PathBuf>,
    /// How many takeovers led to this daemon.
    takeovers: u32,
}

impl Live {
    /// Starts the daemon on what `held` holds: the startup steps (each
    /// adopting what a takeover handed over instead of doing its work), a
    /// takeover's commit, the link monitor and the datapath checks. A failed
    /// startup undoes what it applied.
    pub async fn start(config: &Config, backends: &Backends, mut held: Held) -> Result<Live, DaemonError> {
        let dir = held.dir.take().expect("held until started");
        let mut node = Node::new(backends.nic.clone(), dir);
        let handed = held.handed.take();
        let takeovers = handed.as_ref().map_or(0, |h| h.takeovers);
        let (handed_rules, handed_pools) =
            handed.as_ref().map_or((0, 0), |h| (h.rule_count(), h.pools.len()));
        let (done_tx, done) = mpsc::channel::<()>(1);
        let (events_tx, events) = mpsc::unbounded_channel::<NicEvent>();
        let startup = Startup {
            config,
            backends,
            metrics: &held.metrics,
            routes: &held.routes,
            shutdown: held.stop_rx.clone(),
            done: done_tx,
        };
        let started_ok = match handed {
            Some(h) => startup.adopted(&mut node, h).await,
            None => startup.fresh(&mut node).await,
        };
        drop(startup);
        // The handover socket (owner only): where a successor asks to take over.
        let handover = started_ok.and_then(|()| {
            node.dir.bind_with_mode(crate::handover::SOCKET, 0o600).map_err(DaemonError::Endpoint)
        });
        let handover = match (handover, &held.taking) {
            (Ok(l), _) => Ok(l),
            (Err(e), Some(_)) => abort(&held.taking, e),
            (Err(e), None) => Err(e),
        };
        if let Some(taking) = held.taking.take() {
            // Adopted: answer, and once the old daemon has committed, serve
            // (what it holds armed, the sockets listened on anew, the lock file
            // naming it, the gate open) before saying so: there is no moment
            // when neither serves.
            let (from, since) = (taking.from, taking.started);
            let committed = match taking.await_commit().await {
                Ok(c) => c,
                Err(why) => {
                    tracing::error!("takeover failed: {why}");
                    std::process::exit(EXIT_FAILURE.into());
                }
            };
            takeover::committed(&mut node.dir, node.tuning.as_mut());
            let state = node.state.clone().expect("set by startup");
            state.shared.gate.resume();
            committed.serving().await;
            tracing::info!(
                "took over from pid {from}: {handed_rules} rules, {} clients, {handed_pools} pools in {:.1} ms",
                state.shared.clients.subscribe().borrow().alive,
                since.elapsed().as_secs_f64() * 1e3
            );
        }
        let started = handover.and_then(|l| {
            events::start_link_monitor(&backends.nic, &config.topology, &events_tx).map(|m| (m, l))
        });
        let (monitor, handover) = match started {
            Ok(v) => v,
            Err(e) => {
                // The error itself is logged once, by the caller, when the process exits.
                tracing::warn!("startup failed; undoing what was applied");
                notify::send(&notify::status(&format!("startup failed: {e}")));
                let _ = held.stop_tx.send(true);
                for err in node.teardown().await {
                    held.metrics.restore_failed(err.nic(), &err.to_string());
                    tracing::error!(error = %err, "rollback step failed");
                }
                return Err(e);
            }
        };
        drop(events_tx); // monitors hold their own senders
        let state = node.state.clone().expect("set by startup");
        crate::endpoint::memory::spawn_trimmer(state.shared.conn_limit.clone(), held.stop_rx.clone());
        let nic = backends.nic.clone();
        let health = Arc::new(datapath::Datapath::new(
            &config.topology,
            nic,
            held.metrics.clone(),
            Default::default(),
        ));
        let _ = held.routes.datapath.set(health.clone());
        tokio::spawn(datapath::tick(health, held.stop_rx.clone()));
        let busy = Arc::new(AtomicBool::new(false));
        let successors = takeover::admit::accept(handover, busy.clone());
        let exe = std::env::current_exe().ok();
        Ok(Live { held, node, state, monitor, done, events, successors, busy, session: None, exe, takeovers })
    }

    /// Says that it serves: `nccl.env` and the health line first (a
    /// workload that waits for readiness finds them), then `/readyz`, the
    /// ready line and the service manager.
    pub fn ready(&self, config: &Config, gid: Option<u32>, started: Instant) {
        files::write_nccl_env(config, gid);
        if let Ok(path) = std::env::var("HEALTH_CHECK_LOG_FILE") {
            if let Err(e) = files::write_health_line(&path) {
                tracing::warn!(path, error = %e, "could not write HEALTH_CHECK_LOG_FILE");
            }
        }
        self.held.routes.set_ready(true);
        tracing::info!(elapsed_ms = ms(started), "{READY_LINE}");
        let serving = notify::status(&format!("serving on {}", config.flags.uds_path.display()));
        notify::send(&format!("READY=1\n{serving}"));
    }

    /// A takeover by `successor`, as a task of its own.
    fn hand_over(&self, successor: Candidate, config: &Config, backends: &Backends) -> Session {
        let giver = takeover::handout::Giver {
            config,
            backends,
            node: &self.node,
            claims: &self.held.claims,
            http: self.held.http_fd.as_ref().map(|f| f.as_fd()),
            takeovers: self.takeovers,
        };
        Session::start(successor, &giver)
    }

    /// Serves until a reason to stop comes (`early`: one that came during
    /// startup). A takeover that succeeds ends the process here.
    pub async fn serve(
        &mut self,
        config: &Config,
        backends: &Backends,
        shutdown: &mut Shutdown<'_>,
        mut early: Option<String>,
    ) -> StopReason {
        let flags = &config.flags;
        let grace = Duration::from_secs(flags.wait_time_before_exit);
        loop {
            if let Some(cause) = early.take() {
                return StopReason::Requested(cause);
            }
            let file = self.held.shutdown_file.as_ref();
            tokio::select! {
                cause = &mut *shutdown => return StopReason::Requested(cause),
                _ = self.state.registry.last_gone.notified(), if flags.monitor_shutdown => return StopReason::LastApplicationGone,
                _ = async { file.expect("guarded").appeared().await }, if file.is_some() => {
                    return StopReason::ShutdownFile(file.expect("guarded").path().to_path_buf())
                }
                _ = job_end::all_clients_exited(self.state.shared.clients.subscribe(), grace), if flags.shutdown_when_all_clients_exited => {
                    return StopReason::AllClientsExited(grace)
                }
                ev = next_fatal_event(&mut self.events, &self.state, backends.nic.as_ref(), &config.topology, &self.held.metrics) => return StopReason::Nic(ev),
                Some(successor) = self.successors.recv() => self.session = Some(self.hand_over(successor, config, backends)),
                outcome = async { self.session.as_mut().expect("guarded").finished().await }, if self.session.is_some() => {
                    self.session = None;
                    if takeover::give::settle(outcome, &mut self.node.dir, &self.busy).is_some() {
                        self.handed_over(flags.after_handover, shutdown).await;
                    }
                }
                _ = self.held.usr2.recv() => self.start_successor(config, backends),
            }
        }
    }

    /// SIGUSR2: starts the binary now at this one's path as a successor,
    /// unless a takeover is under way.
    fn start_successor(&mut self, config: &Config, backends: &Backends) {
        // The successor takes the one takeover slot from its start.
        if self.busy.swap(true, Ordering::AcqRel) {
            tracing::warn!("SIGUSR2: a takeover is under way; no successor started");
        } else if let Some(child) = takeover::admit::start_child(self.exe.as_deref()) {
            self.session = Some(self.hand_over(child, config, backends));
        } else {
            self.busy.store(false, Ordering::Release);
        }
    }

    /// Handed over: the successor serves. Nothing is undone (the successor
    /// holds it all now); with `--after_handover=wait`, exits at the next
    /// stop asked for.
    async fn handed_over(&mut self, after: AfterHandover, shutdown: &mut Shutdown<'_>) {
        self.held.routes.set_ready(false);
        let _ = self.held.http_stop.send(true);
        self.successors.stop();
        if after == AfterHandover::Wait {
            tracing::info!("handed over; waiting for SIGTERM (--after_handover=wait)");
            let cause = (&mut *shutdown).await;
            tracing::info!(cause, "exiting; the successor serves");
        }
        std::process::exit(0);
    }

    /// Stops for `reason`: ends a takeover under way first (this daemon
    /// serves on, unless the new one already serves), then stops serving and
    /// restores the node. `shutdown` asked again meanwhile exits at once.
    pub async fn stop(
        mut self,
        config: &Config,
        reason: StopReason,
        shutdown: Shutdown<'static>,
    ) -> Result<(), DaemonError> {
        if let Some(mut s) = self.session.take() {
            tracing::info!(reason = %reason, "stopping: ending the takeover under way");
            s.abort();
            if let Some(pid) = takeover::give::settle(s.finished().await, &mut self.node.dir, &self.busy) {
                tracing::info!(
                    pid,
                    "handed over to pid {pid} before stopping; exiting, the successor serves"
                );
                std::process::exit(0);
            }
        }
        tracing::info!(reason = %reason, "shutting down");
        notify::send(&format!("STOPPING=1\n{}", notify::status(&format!("shutting down: {reason}"))));
        if !matches!(reason, StopReason::Requested(_)) {
            tokio::spawn(async move {
                let cause = shutdown.await;
                tracing::error!(
                    cause,
                    "asked to stop during shutdown: exiting now without finishing restore"
                );
                std::process::exit(1);
            });
        }
        drop(self.monitor.take());
        self.held.routes.set_ready(false);
        // Removed while the folder's lock is still held, so a successor's file is never hit.
        if let Err(e) = crate::nccl::file::remove(&config.flags.uds_path) {
            tracing::warn!(error = %e, "could not remove {}", crate::nccl::file::FILE_NAME);
        }
        // Requests not yet started get UNAVAILABLE from here on.
        self.state.shared.stopping.store(true, Ordering::Release);
        let _ = self.held.stop_tx.send(true);
        drop(self.state);
        if tokio::time::timeout(DRAIN_TIMEOUT, self.done.recv()).await.is_err() {
            tracing::warn!(
                "connections still open after {}; continuing shutdown",
                crate::types::secs(DRAIN_TIMEOUT)
            );
        }
        let errors = self.node.teardown().await;
        for e in &errors {
            self.held.metrics.restore_failed(e.nic(), &e.to_string());
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
}
