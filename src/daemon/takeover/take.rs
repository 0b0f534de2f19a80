//! The new daemon's side: ask the running daemon for its state, adopt it,
//! answer, and serve once it has committed.

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use crate::config::flags::Takeover;
use crate::handover::{self, verdict, Commit, Hello, Verdict, VERSION};

use super::super::{Backends, Config, DaemonError};
use super::{fingerprint, Handed};

/// A takeover under way: the connection to the running daemon and what it handed over.
pub(in crate::daemon) struct Taking {
    conn: UnixStream,
    /// The daemon taken over from.
    pub from: u32,
    pub started: Instant,
}

fn failed(why: impl std::fmt::Display) -> DaemonError {
    DaemonError::Takeover(why.to_string())
}

/// Asks the daemon serving the folder for its state. `None`: nobody serves
/// it and `--takeover=auto` starts normally.
pub(in crate::daemon) async fn fetch(
    config: &Config,
    backends: &Backends,
) -> Result<Option<(Taking, Handed)>, DaemonError> {
    let flags = &config.flags;
    let path = flags.uds_path.join(handover::SOCKET);
    let started = Instant::now();
    // What can be done before the running daemon pauses is done first: its
    // clients then wait only for the handover itself (opening a GPU's
    // context takes about 100 ms).
    let gpus: Vec<_> = config.topology.gpus().map(|(_, g)| g.pci).collect();
    backends.alloc.prepare(&gpus).map_err(|e| failed(format!("preparing the GPUs: {e}")))?;
    let conn = match UnixStream::connect(&path) {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
            if flags.takeover == Takeover::Auto {
                tracing::info!(path = %path.display(), "no daemon to take over from; starting normally");
                return Ok(None);
            }
            return Err(failed(format!(
                "no daemon serves {} to take over from ({e})",
                flags.uds_path.display()
            )));
        }
        Err(e) => return Err(failed(format!("connecting to {}: {e}", path.display()))),
    };
    handover::check_peer(&conn).map_err(failed)?;
    handover::set_timeouts(&conn, flags.takeover_timeout).map_err(failed)?;
    let hello =
        Hello { version: VERSION, pid: std::process::id(), fingerprint: fingerprint(config, backends) };
    let mut conn2 = conn;
    let (mut conn, state, fds) = tokio::task::spawn_blocking(move || {
        let sent = handover::send(&mut conn2, "sending hello", &hello);
        // A refusal may already be waiting even if the hello could not be sent.
        let (st, fds) = match handover::recv_offer(&mut conn2) {
            Err(e) if sent.is_err() && !e.to_string().contains("refused") => return Err(sent.unwrap_err()),
            r => r?,
        };
        test_fault();
        Ok::<_, handover::HandoverError>((conn2, st, fds))
    })
    .await
    .map_err(failed)?
    .map_err(failed)?;
    if state.version != VERSION {
        let why = format!(
            "the running daemon sent version {} of the state, this one reads {VERSION}",
            state.version
        );
        let _ = handover::send(
            &mut conn,
            "verdict",
            &Verdict { answer: Some(verdict::Answer::Failed(why.clone())) },
        );
        return Err(failed(why));
    }
    tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "state received");
    match Handed::decode(state, fds) {
        Ok(handed) => Ok(Some((Taking { conn, from: handed.pid, started }, handed))),
        Err(why) => {
            let _ = handover::send(
                &mut conn,
                "verdict",
                &Verdict { answer: Some(verdict::Answer::Failed(why.clone())) },
            );
            Err(failed(why))
        }
    }
}

/// Failures the takeover tests ask for, at the worst moment: the state is
/// here, the old daemon waits for the verdict. `exit`: this process dies;
/// `stall`: it never answers.
fn test_fault() {
    match std::env::var("TCPX_RXDM_TEST_TAKEOVER_FAULT").as_deref() {
        Ok("exit") => std::process::exit(3),
        Ok("stall") => std::thread::sleep(std::time::Duration::from_secs(3600)),
        _ => {}
    }
}

impl Taking {
    /// Tells the old daemon why this one gives up (it then serves on).
    pub fn fail(&self, why: &str) {
        let v = Verdict { answer: Some(verdict::Answer::Failed(why.to_string())) };
        if let Ok(mut c) = self.conn.try_clone() {
            let _ = handover::send(&mut c, "verdict", &v);
        }
    }

    /// Answers `adopted` and waits for the old daemon's commit: `Ok` means
    /// this daemon serves from now on.
    pub async fn commit(self) -> Result<u32, String> {
        let from = self.from;
        let mut conn = self.conn;
        tokio::task::spawn_blocking(move || {
            let v = Verdict { answer: Some(verdict::Answer::Adopted(true)) };
            handover::send(&mut conn, "answering adopted", &v).map_err(|e| e.to_string())?;
            match handover::recv::<Commit>(&mut conn, "waiting for the commit") {
                Ok(_) => Ok(from),
                // Gone without a word: it died after reading our answer (we
                // serve: nobody else will), or it gave up waiting and serves on.
                Err(e) => match nix::sys::signal::kill(nix::unistd::Pid::from_raw(from as i32), None) {
                    Err(nix::errno::Errno::ESRCH) => {
                        tracing::warn!(pid = from, error = %e, "the daemon taken over from ended without committing; serving");
                        Ok(from)
                    }
                    _ => Err(format!("pid {from} did not commit ({e}); it serves on")),
                },
            }
        })
        .await
        .map_err(|e| e.to_string())?
    }
}
