//! What the daemon holds before it starts anything: the socket folder
//! (locked fresh, or handed over by the daemon it takes over from), its NIC
//! claims, the job-end file's watch, the HTTP port, and the channels its
//! parts share. Fresh start and takeover both end here with one [`Held`].

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use nix::unistd::Gid;
use tokio::signal::unix::Signal;
use tokio::sync::watch;

use super::super::http_routes::Routes;
use super::super::job_end::ShutdownFile;
use super::super::takeover::{self, take::Taking, Handed};
use super::super::{abort, ms, Backends, Config, DaemonError};
use crate::metrics::Metrics;
use crate::nic::NicClaim;
use crate::server::http;
use crate::server::socket_dir::SocketDir;

/// The socket folder, the claims and the shared parts, before startup.
pub(super) struct Held {
    /// A takeover under way: the daemon taken over from, told of a failure.
    pub taking: Option<Taking>,
    /// What it handed over, adopted by the startup steps.
    pub handed: Option<Handed>,
    /// The locked socket folder, until startup takes it.
    pub dir: Option<SocketDir>,
    /// Held until the process exits.
    pub claims: Vec<NicClaim>,
    pub shutdown_file: Option<ShutdownFile>,
    pub metrics: Arc<Metrics>,
    pub routes: Arc<Routes>,
    /// Turns true when the daemon stops: every endpoint ends its work.
    pub stop_tx: watch::Sender<bool>,
    pub stop_rx: watch::Receiver<bool>,
    /// Turns true when HTTP stops: at shutdown, and once handed over.
    pub http_stop: watch::Sender<bool>,
    /// The HTTP listener, for a successor.
    pub http_fd: Option<OwnedFd>,
    /// SIGUSR2 (start a successor), caught from before startup on.
    pub usr2: Signal,
}

impl Held {
    /// Takes over the running daemon's state where `--takeover` asks for it
    /// (and one serves), locks the folder (`dir`: locked already while
    /// waiting for NICs), claims the NICs, and listens on the HTTP port.
    pub async fn take(
        config: &Config,
        backends: &Backends,
        dir: Option<SocketDir>,
        gid: Option<Gid>,
    ) -> Result<Held, DaemonError> {
        let flags = &config.flags;
        let t = Instant::now();
        let (taking, mut handed) = match flags.takeover {
            crate::config::flags::Takeover::Off => (None, None),
            _ => match takeover::take::fetch(config, backends).await? {
                Some((taking, handed)) => (Some(taking), Some(handed)),
                None => (None, None),
            },
        };
        let locked = match (handed.as_mut(), dir) {
            (None, Some(dir)) => Ok(dir),
            (Some(h), _) => {
                let lock = h.lock.take().expect("decoded with the lock");
                let (listeners, created) = (std::mem::take(&mut h.listeners), std::mem::take(&mut h.created));
                SocketDir::adopt(&flags.uds_path, flags.socket_mode, gid, lock, listeners, created).map(
                    |mut dir| {
                        // The serving daemon's files until the commit: never removed by this one.
                        dir.disarm();
                        dir
                    },
                )
            }
            (None, None) => takeover::take::lock_fresh(flags, gid),
        };
        let dir = locked.map_err(DaemonError::LockSocketDir).or_else(|e| abort(&taking, e))?;
        tracing::info!(path = %flags.uds_path.display(), elapsed_ms = ms(t), "socket folder locked");
        // Claimed before anything touches a NIC.
        let claims = match handed.as_mut() {
            Some(h) => {
                std::mem::take(&mut h.claims).into_iter().map(|(n, fd)| NicClaim::adopt(&n, fd)).collect()
            }
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
        let (stop_tx, stop_rx) = watch::channel(false);
        let http_stop = watch::Sender::new(false);
        {
            let (mut rx, tx) = (stop_rx.clone(), http_stop.clone());
            tokio::spawn(async move {
                crate::endpoint::stopped(&mut rx).await;
                let _ = tx.send(true);
            });
        }
        let usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
            .map_err(DaemonError::Signals)
            .or_else(|e| abort(&taking, e))?;
        let mut held = Held {
            taking,
            handed,
            dir: Some(dir),
            claims,
            shutdown_file,
            metrics,
            routes,
            stop_tx,
            stop_rx,
            http_stop,
            http_fd: None,
            usr2,
        };
        held.listen_http(config).await?;
        Ok(held)
    }

    /// Serves HTTP where `--metrics_address` asks: on the listener handed
    /// over, or on one bound now.
    async fn listen_http(&mut self, config: &Config) -> Result<(), DaemonError> {
        let flags = &config.flags;
        let Some(addr) = flags.metrics_address.0 else { return Ok(()) };
        let listener = match self.handed.as_mut().and_then(|h| h.http.take()) {
            Some(fd) => {
                let std = std::net::TcpListener::from(fd);
                std.set_nonblocking(true).and_then(|()| tokio::net::TcpListener::from_std(std))
            }
            None => tokio::net::TcpListener::bind(addr).await,
        };
        let listener = listener
            .map_err(|source| DaemonError::MetricsListen { addr, source })
            .or_else(|e| abort(&self.taking, e))?;
        self.http_fd = listener.as_fd().try_clone_to_owned().ok();
        // The bound address (port 0 picks a free one).
        let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(address = %bound, "HTTP endpoints listening");
        let limits = http::Limits::new(flags.max_http_connections as usize);
        tokio::spawn(http::serve(listener, self.routes.clone(), limits, self.http_stop.subscribe()));
        Ok(())
    }
}
