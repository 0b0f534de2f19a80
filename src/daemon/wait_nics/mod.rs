//! NICs that come up late at boot (`--wait_for_nics`). A driver may register
//! its interfaces seconds after the service manager starts the daemon; instead
//! of failing at once (exit 2, which a unit does not retry), the daemon looks
//! again every [`POLL`] until the NICs are there or the bound has passed.
//!
//! What "there" means depends on where the topology comes from: a preset or
//! file names its NICs, which must exist under `<sysfs>/class/net`;
//! discovery (`auto`) must find at least one NIC with a GPU, and `a6` the
//! NICs it names.
//!
//! While it waits the daemon says so: one log line naming what is missing,
//! then one at most every [`PROGRESS_EVERY`]; and it locks the socket folder
//! and answers `tcpx-rxdm status` with what it waits for (not with
//! `--takeover`, whose folder the serving daemon holds, nor with
//! `--takeover=auto` when a daemon serves the folder). Nothing else is touched
//! yet: the caller may drop the future at any time (a signal), which removes
//! the files it made.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::watch;

use crate::config::flags::{Flags, Takeover};
use crate::config::presets::ConfigError;
use crate::server::socket_dir::{resolve_group, SocketDir, SocketDirError};
use crate::server::status;
use crate::types::topology::TopologyError;

use super::backends::missing_nic;
use super::error::FlagError;
use super::{notify, Config, DaemonError};

/// How often the NICs are looked for while waiting.
pub const POLL: Duration = Duration::from_millis(250);
/// While waiting, at most one progress line per this long.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The configuration, and the socket folder when it was locked while waiting.
pub struct Loaded {
    pub config: Config,
    pub dir: Option<SocketDir>,
}

/// [`Config::load`], waiting up to `--wait_for_nics` for missing NICs. Other
/// errors return at once; a NIC still missing at the end returns its error,
/// wrapped in [`DaemonError::NicsNotUp`] when there was a wait.
pub async fn load(flags: Flags) -> Result<Loaded, DaemonError> {
    let started = Instant::now();
    let bound = flags.wait_for_nics;
    let mut logged = false;
    let mut waiting: Option<Waiting> = None;
    loop {
        let t = Instant::now();
        let missing = match Config::resolve(flags.clone()) {
            Ok(config) => {
                if !std::mem::replace(&mut logged, true) {
                    config.log_loaded(t);
                }
                match missing_nic(&config.flags, &config.topology, &config.source) {
                    None => {
                        let dir = match waiting.take() {
                            Some(w) => {
                                tracing::info!(waited = %crate::types::secs(started.elapsed()), "the NICs are up");
                                w.finish().await
                            }
                            None => None,
                        };
                        return Ok(Loaded { config, dir });
                    }
                    Some(e) => DaemonError::Flags(e),
                }
            }
            Err(e) if is_missing_nic(&e, &flags) => e,
            Err(e) => return Err(e),
        };
        let elapsed = started.elapsed();
        if elapsed >= bound {
            if bound.is_zero() {
                return Err(missing);
            }
            return Err(DaemonError::NicsNotUp { waited: bound, source: Box::new(missing) });
        }
        match waiting.as_mut() {
            None => waiting = Some(Waiting::start(&flags, &missing)?),
            Some(w) => w.update(&missing, elapsed),
        }
        tokio::time::sleep(POLL.min(bound - elapsed)).await;
    }
}

/// Whether `e` says a NIC is not there (yet), as opposed to a bad configuration.
fn is_missing_nic(e: &DaemonError, flags: &Flags) -> bool {
    let discovery = matches!(flags.gpu_nic_preset.as_str(), "auto" | "a6");
    match e {
        DaemonError::Topology(ConfigError::A6NicMissing { .. }) => true,
        // Discovery that finds no NIC with a GPU yet: the driver may not have
        // registered them; with a wait this is what is waited for.
        DaemonError::Topology(ConfigError::NothingDiscovered { .. }) => discovery,
        DaemonError::Topology(ConfigError::Invalid { err: TopologyError::Empty, .. }) => discovery,
        _ => false,
    }
}

/// What the daemon waits for, in words, and the NICs it names.
fn waiting_for(missing: &DaemonError) -> (String, Vec<String>) {
    match missing {
        DaemonError::Flags(FlagError::NicNotFound { ifnames, class_net, .. }) => (
            format!(
                "{} to appear {}",
                crate::types::plural_list("interface", ifnames),
                super::error::nic_places(class_net.as_deref())
            ),
            ifnames.clone(),
        ),
        DaemonError::Topology(
            ConfigError::NothingDiscovered { .. } | ConfigError::Invalid { err: TopologyError::Empty, .. },
        ) => ("discovery to find a NIC with GPUs behind its PCIe switch".into(), Vec::new()),
        other => (other.to_string(), Vec::new()),
    }
}

/// A wait under way: the socket folder locked, and `status` answered.
struct Waiting {
    started: Instant,
    bound: Duration,
    last_line: Instant,
    said: String,
    dir: Option<SocketDir>,
    status: Option<StatusWhileWaiting>,
}

/// The status socket's server while waiting, and a copy of its listener.
struct StatusWhileWaiting {
    reply: watch::Sender<Value>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    listener: OwnedFd,
}

impl Waiting {
    /// Locks the folder and answers `status`, then says what is missing (log, service manager).
    fn start(flags: &Flags, missing: &DaemonError) -> Result<Waiting, DaemonError> {
        let (what, _) = waiting_for(missing);
        let mut w = Waiting {
            started: Instant::now(),
            bound: flags.wait_for_nics,
            last_line: Instant::now(),
            said: what,
            dir: None,
            status: None,
        };
        w.lock_and_answer(flags, missing)?;
        // Said once `status` answers, so that whoever reads this can ask.
        let bound = crate::types::secs(flags.wait_for_nics);
        tracing::warn!(waiting_for = %w.said, wait_for_nics = %bound, "NICs not there yet; waiting for them");
        notify::send(&notify::status(&format!("waiting up to {bound} for {}", w.said)));
        Ok(w)
    }

    /// Locks the folder and answers `status` from it, where it is this daemon's to take.
    fn lock_and_answer(&mut self, flags: &Flags, missing: &DaemonError) -> Result<(), DaemonError> {
        // With --takeover the folder is the serving daemon's; with auto, when
        // one serves it (its lock is held), it answers `status` meanwhile.
        if flags.takeover != Takeover::On {
            let gid = flags.socket_group.as_deref().map(resolve_group).transpose();
            let gid = gid.map_err(DaemonError::SocketGroup)?;
            let mut dir = match SocketDir::lock(&flags.uds_path, flags.socket_mode, gid) {
                Ok(dir) => dir,
                Err(SocketDirError::Locked { .. }) if flags.takeover == Takeover::Auto => return Ok(()),
                Err(e) => return Err(DaemonError::LockSocketDir(e)),
            };
            let l = dir
                .bind_with_mode(status::SOCKET, flags.status_socket_mode)
                .map_err(DaemonError::Endpoint)?;
            let listener = l.as_fd().try_clone_to_owned().map_err(|err| {
                let path = flags.uds_path.join(status::SOCKET);
                DaemonError::Endpoint(SocketDirError::Bind { path, err })
            })?;
            let (reply, rx) = watch::channel(self.reply(missing));
            let (stop, stopped) = watch::channel(false);
            let task = status::spawn_starting(l, rx, stopped);
            self.dir = Some(dir);
            self.status = Some(StatusWhileWaiting { reply, stop, task, listener });
        }
        Ok(())
    }

    /// The `status` reply while waiting.
    fn reply(&self, missing: &DaemonError) -> Value {
        let (what, nics) = waiting_for(missing);
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "ready": false,
            "starting": {
                "waiting_for": what,
                "missing_nics": nics,
                "waited_seconds": self.started.elapsed().as_secs(),
                "wait_for_nics_seconds": self.bound.as_secs(),
            },
        })
    }

    /// A new look: the status reply, and a progress line when one is due.
    fn update(&mut self, missing: &DaemonError, elapsed: Duration) {
        if let Some(s) = &self.status {
            s.reply.send_replace(self.reply(missing));
        }
        if self.last_line.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last_line = Instant::now();
        let (what, _) = waiting_for(missing);
        let (waited, bound) = (crate::types::secs(elapsed), crate::types::secs(self.bound));
        tracing::info!(waiting_for = %what, waited = %waited, wait_for_nics = %bound, "still waiting for the NICs");
        if what != self.said {
            notify::send(&notify::status(&format!("waiting up to {bound} for {what}")));
            self.said = what;
        }
    }

    /// Stops answering for a waiting daemon; the folder, its status listener
    /// set aside for the daemon's own status server.
    async fn finish(mut self) -> Option<SocketDir> {
        let mut dir = self.dir.take()?;
        if let Some(s) = self.status.take() {
            s.stop.send_replace(true);
            // It answers what it has taken (given a second), then ends.
            let _ = s.task.await;
            dir.set_aside(status::SOCKET, s.listener);
        }
        Some(dir)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        // Dropped unfinished (a signal, an error): no answers from here on.
        if let Some(s) = &self.status {
            s.task.abort();
        }
    }
}

#[cfg(test)]
mod tests;
