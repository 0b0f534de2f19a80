//! The lifecycle: lock the socket folder → claim the NICs → start (prime →
//! allocate → bind → serve, see `startup/`) → ready; then wait for a reason
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
mod run;
mod signals;
mod startup;
mod takeover;
mod teardown;
mod wait_nics;

use std::future::Future;
use std::time::{Duration, Instant};

use crate::config::flags::Flags;
use crate::config::presets::{self, Source};
use crate::types::topology::Topology;

pub use backends::{mig_check, select as select_backends, Backends};
pub use error::{DaemonError, TeardownError, EXIT_CONFIG, EXIT_FAILURE};
pub use events::StopReason;
pub use run::run_in;
pub use signals::{shutdown_on_signals, HUP_IGNORED};
pub use wait_nics::{load as load_config_waiting_for_nics, Loaded, POLL as NIC_POLL, PROGRESS_EVERY};

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

/// A failure after the running daemon handed its state over: tell it (it
/// serves on) and exit at once, undoing nothing — what this process holds
/// is the other daemon's.
fn abort<T>(taking: &Option<takeover::take::Taking>, e: DaemonError) -> Result<T, DaemonError> {
    let Some(t) = taking else { return Err(e) };
    tracing::error!("takeover failed: {e}; pid {} serves on", t.from);
    t.fail(&e.to_string());
    std::process::exit(EXIT_FAILURE.into());
}
