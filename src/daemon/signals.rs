//! The shutdown future `main` gives the daemon: the first SIGTERM, SIGINT or
//! SIGHUP (a closed terminal, some supervisors) asks for an orderly
//! shutdown; a second one during shutdown forces the exit. A node-wide daemon
//! (`--node_wide`) logs and ignores SIGHUP: nothing restarts a service that
//! exited 0, so a stray hangup would leave the node without a daemon.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, Signal, SignalKind};

/// A second signal sooner than this after the first is a duplicate, not a
/// demand to force the exit: wrappers such as timeout, runuser or sudo
/// forward a signal their process group also got.
const FORCE_GRACE: Duration = Duration::from_secs(1);

/// The line logged for each ignored SIGHUP.
pub const HUP_IGNORED: &str = "SIGHUP ignored: a node-wide daemon (--node_wide) stops on SIGTERM only";

/// Installs the handlers now (signals that arrive during startup are kept)
/// and returns a future that resolves, with its cause, at the first signal.
/// From then on a further signal, after `FORCE_GRACE` (1 s), exits the process
/// with status 1 without finishing the restore. With `ignore_hup`, SIGHUP is
/// caught (so its default action, termination, never applies) and only logged.
pub fn shutdown_on_signals(ignore_hup: bool) -> std::io::Result<impl Future<Output = String>> {
    let mut sigs = Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
        hup: signal(SignalKind::hangup())?,
        ignore_hup,
    };
    Ok(async move {
        let name = sigs.next().await;
        let first = Instant::now();
        tokio::spawn(async move {
            loop {
                sigs.next().await;
                if first.elapsed() >= FORCE_GRACE {
                    break;
                }
                tracing::debug!("repeated signal right after the first: ignored");
            }
            tracing::error!("second signal during shutdown: exiting now without finishing restore");
            std::process::exit(1);
        });
        format!("received {name}")
    })
}

struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    ignore_hup: bool,
}

impl Signals {
    /// The next signal that counts.
    async fn next(&mut self) -> &'static str {
        loop {
            tokio::select! {
                _ = self.term.recv() => return "SIGTERM",
                _ = self.int.recv() => return "SIGINT",
                _ = self.hup.recv() => {
                    if !self.ignore_hup {
                        return "SIGHUP";
                    }
                    tracing::warn!("{HUP_IGNORED}");
                }
            }
        }
    }
}
