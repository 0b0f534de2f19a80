//! One run of the daemon, in phases: [`hold`] what it needs before it
//! starts (the socket folder, fresh or handed over, the NIC claims, the
//! HTTP port), start it ([`serve::Live::start`]: the startup steps, a
//! takeover's commit), say it is ready, serve until a reason to stop, and
//! restore the node.

mod hold;
mod serve;

use std::future::Future;
use std::time::Instant;

use super::{notify, Backends, Config, DaemonError};
use crate::server::socket_dir::{resolve_group, SocketDir};
use hold::Held;
use serve::Live;

/// [`super::run`] in a socket folder already locked (`dir`: the daemon
/// locked it to answer `tcpx-rxdm status` while it waited for its NICs), or
/// in `--uds_path` locked now when `None`.
pub async fn run_in(
    config: Config,
    backends: Backends,
    shutdown: impl Future<Output = String> + Send + 'static,
    dir: Option<SocketDir>,
) -> Result<(), DaemonError> {
    let started = Instant::now();
    let gid = match &config.flags.socket_group {
        Some(g) => Some(resolve_group(g).map_err(DaemonError::SocketGroup)?),
        None => None,
    };
    notify::send(&notify::status("priming NICs, allocating pools"));
    let held = Held::take(&config, &backends, dir, gid).await?;
    let mut live = Live::start(&config, &backends, held).await?;
    let mut shutdown: serve::Shutdown<'static> = Box::pin(shutdown);
    // A stop asked for during startup (the signal is kept): never ready.
    let early =
        tokio::select! { biased; cause = &mut shutdown => Some(cause), () = std::future::ready(()) => None };
    if early.is_none() {
        live.ready(&config, gid.map(|g| g.as_raw()), started);
    }
    let reason = live.serve(&config, &backends, &mut shutdown, early).await;
    live.stop(&config, reason, shutdown).await
}
