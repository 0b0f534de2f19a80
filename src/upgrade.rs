//! `tcpx-rxdm upgrade`: asks the daemon serving a socket folder to hand its
//! place to the binary now installed at the path it was started from
//! (SIGUSR2), and waits until that successor serves.
//!
//! The daemon is the process that answers on the folder's status socket,
//! held by a pidfd taken from the connection (each daemon listens on its
//! sockets anew when it takes over, so the kernel names the one serving);
//! it must be the pid the lock file names. A pid number alone is never
//! trusted: it is the daemon's own view (its pid namespace) and may be
//! reused. Before signalling, the daemon must show that it can take part:
//! it catches SIGUSR2 (for a version without takeover the signal's default
//! action would kill it without restoring anything) and its handover socket
//! is there (it serves). Done means: another process answers on the status
//! socket, ready. The old daemon's failures leave it serving; the reason is
//! in its log, not here.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::handover::Process;
use crate::server::socket_dir::LOCK_FILE;
use crate::types::exit::Exit;

/// How often the folder and processes are looked at.
const POLL: Duration = Duration::from_millis(20);

/// What `upgrade` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub uds_path: PathBuf,
    pub timeout: Duration,
}

/// How long one look at the status socket waits for its answer (a daemon
/// in the middle of a takeover answers once it has settled).
const ASK_WAIT: Duration = Duration::from_secs(2);
/// How long after the old daemon is gone a successor may take to answer.
const GONE_WAIT: Duration = Duration::from_secs(5);

/// Whether `pid` catches `sig` (its handler is installed).
fn catches(pid: u32, sig: nix::sys::signal::Signal) -> Result<bool, String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("pid {pid}: {e}"))?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .ok_or_else(|| format!("pid {pid}: no SigCgt line in /proc/{pid}/status"))?;
    Ok(mask & (1 << (sig as u32 - 1)) != 0)
}

/// The pid the lock file names, if it names one. The folder is shared with
/// workloads: only a plain file of its own is read there (a link or a FIFO
/// planted at the lock's name is neither followed nor opened).
fn lock_pid(uds: &Path) -> Result<Option<u32>, std::io::Error> {
    use std::io::Read;
    let folder = crate::host::shared_dir::SharedDir::open(uds)?;
    let mut text = String::new();
    folder.open_plain(LOCK_FILE, nix::fcntl::OFlag::O_RDONLY)?.read_to_string(&mut text)?;
    Ok(text.trim().parse().ok())
}

/// Children of `pid` started as successors (their last argument is
/// `--takeover`, or `--takeover=auto` as a daemon starts them now).
fn successors(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
            let last = cmdline.split(|b| *b == 0).rfind(|a| !a.is_empty());
            if last.is_some_and(|a| a == b"--takeover" || a.starts_with(b"--takeover=")) {
                out.push(c);
            }
        }
    }
    out
}

/// A daemon that serves a folder, held by its process (a pidfd): signalled
/// and watched through it, never through a pid number.
#[derive(Debug)]
struct Daemon {
    /// Its pid as it knows itself (what its lock file and its status say).
    pid: u32,
    process: Process,
    ready: bool,
    /// What it waits for, while it is starting (`--wait_for_nics`).
    starting: Option<String>,
}

impl Daemon {
    fn is(&self, other: &Daemon) -> bool {
        self.process.is(&other.process) || (self.pid == other.pid && !other.process.exited())
    }
}

/// The daemon answering on the status socket: the process its listener
/// names (each daemon listens on it anew when it takes over), checked to be
/// the one that answered.
fn answering(uds: &Path, wait: Duration) -> Result<Daemon, String> {
    let s = crate::server::status::connect(uds)?;
    let process = Process::of_peer(s.as_fd()).map_err(|e| {
        format!("cannot hold the process behind {}: {e}", uds.join(crate::server::status::SOCKET).display())
    })?;
    let v = crate::server::status::ask_on(s, "status", wait)?;
    let pid = v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).ok_or("its status names no pid")?;
    if process.own_pid() != Some(pid) {
        return Err(format!(
            "pid {pid} answered on the status socket, whose listener names another process: \
             a takeover may be under way; try again"
        ));
    }
    let starting = v["starting"]["waiting_for"].as_str().map(str::to_string);
    Ok(Daemon { pid, process, ready: v["ready"].as_bool() == Some(true), starting })
}

/// The daemon serving `uds`, checked able to take part in an upgrade.
fn serving_daemon(uds: &Path) -> Result<Daemon, String> {
    let lock = uds.join(LOCK_FILE);
    let named = match lock_pid(uds) {
        Ok(Some(p)) => p,
        Ok(None) => return Err(format!("{} names no pid: is a daemon starting?", lock.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("no daemon serves {} ({} is missing)", uds.display(), lock.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let hint = crate::server::status::run_as_hint(uds, "upgrade");
            return Err(format!("{}: permission denied: {hint}", lock.display()));
        }
        Err(e) => return Err(format!("{}: {e}", lock.display())),
    };
    let d = answering(uds, ASK_WAIT)
        .map_err(|e| format!("pid {named}, named in {}, does not answer: {e}", lock.display()))?;
    if d.pid != named {
        return Err(format!(
            "{} names pid {named}, but pid {} answers: a takeover may be under way; try again",
            lock.display(),
            d.pid
        ));
    }
    let pid = d.pid;
    if let Some(what) = &d.starting {
        return Err(format!(
            "pid {pid} is still starting (waiting for {what}): there is nothing to hand over yet; nothing sent"
        ));
    }
    let Some(here) = d.process.pid_here() else {
        return Err(format!(
            "pid {pid} runs in a pid namespace this command cannot see into: run it where the daemon runs"
        ));
    };
    if !catches(here, nix::sys::signal::Signal::SIGUSR2)? {
        return Err(format!(
            "pid {pid} does not handle SIGUSR2 (a version without takeover?): the signal would kill it \
             without restoring the NICs; nothing sent (restart it instead)"
        ));
    }
    let handover = uds.join(crate::handover::SOCKET);
    if !std::fs::symlink_metadata(&handover)
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    {
        return Err(format!(
            "pid {pid} has no {}: not serving yet (or too old for takeover); nothing sent",
            handover.display()
        ));
    }
    Ok(d)
}

/// Signals the daemon serving `opts.uds_path` and waits for its successor;
/// `(old, new)` once the new one serves.
pub fn upgrade(opts: &Options) -> Result<(u32, u32), String> {
    let uds = &opts.uds_path;
    let old = serving_daemon(uds)?;
    let see_log = "the reason is in the daemon's log (journalctl -u tcpx-rxdm, kubectl logs, or its stderr)";
    let pid = old.pid;
    old.process.signal(nix::sys::signal::Signal::SIGUSR2).map_err(|e| match e {
        nix::errno::Errno::EPERM => {
            format!("not allowed to signal pid {pid}: {}", crate::server::status::run_as_hint(uds, "upgrade"))
        }
        nix::errno::Errno::ESRCH => format!("pid {pid} exited before it was asked; nothing sent"),
        e => format!("signalling pid {pid}: {e}"),
    })?;
    let deadline = Instant::now() + opts.timeout;
    let mut seen: Vec<(u32, Process)> = Vec::new();
    let mut gone_at = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Done: another process answers on the status socket, ready.
        if let Ok(now) = answering(uds, left.clamp(POLL, ASK_WAIT)) {
            if now.ready && !now.is(&old) {
                return Ok((pid, now.pid));
            }
        }
        if old.process.exited() {
            let since = *gone_at.get_or_insert_with(Instant::now);
            if since.elapsed() >= GONE_WAIT || Instant::now() >= deadline {
                return Err(format!(
                    "pid {pid} is gone and no daemon took over {}; {see_log}",
                    uds.display()
                ));
            }
        } else {
            // A successor that ended while the old daemon still serves failed.
            for c in old.process.pid_here().map(successors).unwrap_or_default() {
                if !seen.iter().any(|(p, _)| *p == c) {
                    if let Ok(p) = Process::of_pid(c) {
                        seen.push((c, p));
                    }
                }
            }
            if let Some((gone, _)) = seen.iter().find(|(_, p)| p.exited()) {
                return Err(format!(
                    "the successor (pid {gone}) ended without taking over; pid {pid} still serves {}; {see_log}",
                    uds.display()
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "pid {pid} still serves {} after {}: no successor took over; {see_log}",
                    uds.display(),
                    crate::types::secs(opts.timeout)
                ));
            }
        }
        std::thread::sleep(POLL);
    }
}

/// `tcpx-rxdm upgrade`: done once the successor serves.
pub fn main(opts: &Options) -> Exit {
    match upgrade(opts) {
        Ok((old, new)) => {
            // Done whether or not anyone reads it (`upgrade | head` must not panic).
            let _ = writeln!(std::io::stdout(), "upgraded: pid {old} -> pid {new}");
            Exit::Done
        }
        Err(e) => {
            eprintln!("tcpx-rxdm upgrade: {e}");
            Exit::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_handlers_are_read_from_proc() {
        let me = std::process::id();
        // The test harness installs no SIGUSR2 handler; SIGUSR2 here would kill us.
        assert!(!catches(me, nix::sys::signal::Signal::SIGUSR2).unwrap());
        assert!(catches(u32::MAX - 1, nix::sys::signal::Signal::SIGUSR2).is_err());
    }

    /// A status socket in `dir` that answers one request with `reply`, from this process.
    fn answer_once(dir: &Path, reply: String) -> std::thread::JoinHandle<()> {
        let l = std::os::unix::net::UnixListener::bind(dir.join(crate::server::status::SOCKET)).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut line = [0u8; 64];
            let _ = std::io::Read::read(&mut s, &mut line);
            s.write_all(reply.as_bytes()).unwrap();
        })
    }

    #[test]
    fn a_folder_without_a_serving_daemon_is_refused_before_any_signal() {
        let tmp = tempfile::tempdir().unwrap();
        let e = serving_daemon(tmp.path()).unwrap_err();
        assert!(e.contains("no daemon serves") && e.contains(LOCK_FILE), "{e}");
        std::fs::write(tmp.path().join(LOCK_FILE), "").unwrap();
        assert!(serving_daemon(tmp.path()).unwrap_err().contains("names no pid"));
        // A pid named, but nobody answers on the status socket.
        std::fs::write(tmp.path().join(LOCK_FILE), format!("{}", u32::MAX - 1)).unwrap();
        let e = serving_daemon(tmp.path()).unwrap_err();
        assert!(e.contains("does not answer") && e.contains("no daemon answers"), "{e}");
        // The lock names another pid than the process that answers: not signalled.
        let me = std::process::id();
        let t = answer_once(tmp.path(), format!("{{\"pid\": {me}, \"ready\": true}}"));
        let e = serving_daemon(tmp.path()).unwrap_err();
        t.join().unwrap();
        assert!(e.contains(&format!("names pid {}, but pid {me} answers", u32::MAX - 1)), "{e}");
        // A process that answers for another pid than its own: not signalled.
        std::fs::remove_file(tmp.path().join(crate::server::status::SOCKET)).unwrap();
        std::fs::write(tmp.path().join(LOCK_FILE), "1").unwrap();
        let t = answer_once(tmp.path(), "{\"pid\": 1, \"ready\": true}".to_string());
        let e = serving_daemon(tmp.path()).unwrap_err();
        t.join().unwrap();
        assert!(e.contains("whose listener names another process"), "{e}");
        // A live process that answers as itself but does not handle SIGUSR2 (this test) is never signalled.
        std::fs::remove_file(tmp.path().join(crate::server::status::SOCKET)).unwrap();
        std::fs::write(tmp.path().join(LOCK_FILE), me.to_string()).unwrap();
        let t = answer_once(tmp.path(), format!("{{\"pid\": {me}, \"ready\": true}}"));
        let e = serving_daemon(tmp.path()).unwrap_err();
        t.join().unwrap();
        assert!(e.contains("does not handle SIGUSR2") && e.contains("nothing sent"), "{e}");
    }
}
