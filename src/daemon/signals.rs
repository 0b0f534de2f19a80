//! The shutdown future `main` gives the daemon: the first SIGTERM, SIGINT or
//! SIGHUP (a closed terminal, some supervisors) asks for an orderly
//! shutdown; a second one during shutdown forces the exit.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, Signal, SignalKind};

/// A second signal sooner than this after the first is a duplicate, not a
/// demand to force the exit: wrappers such as timeout, runuser or sudo
/// forward a signal their process group also got.
const FORCE_GRACE: Duration = Duration::from_secs(1);

/// Installs the handlers now (signals that arrive during startup are kept)
/// and returns a future that resolves, with its cause, at the first signal.
/// From then on a further signal, after `FORCE_GRACE` (1 s), exits the process
/// with status 1 without finishing the restore.
pub fn shutdown_on_signals() -> std::io::Result<impl Future<Output = String>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        let name = next(&mut term, &mut int, &mut hup).await;
        let first = Instant::now();
        tokio::spawn(async move {
            loop {
                next(&mut term, &mut int, &mut hup).await;
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

async fn next(term: &mut Signal, int: &mut Signal, hup: &mut Signal) -> &'static str {
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = hup.recv() => "SIGHUP",
    }
}
