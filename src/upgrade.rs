//! `tcpx-rxdm upgrade`: asks the daemon serving a socket folder to hand its
//! place to the binary now installed at the path it was started from
//! (SIGUSR2), and waits until that successor serves.
//!
//! The daemon's pid is read from the folder's lock file. Before signalling,
//! the daemon must show that it can take part: it catches SIGUSR2 (for a
//! version without takeover the signal's default action would kill it
//! without restoring anything) and its handover socket is there (it serves).
//! Done means: another live process is named in the lock file and either
//! the old one is gone, or (`--after_handover=wait`) the status socket
//! answers from the new one. The old daemon's failures leave it serving;
//! the reason is in its log, not here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::server::socket_dir::LOCK_FILE;

/// How often the folder and processes are looked at.
const POLL: Duration = Duration::from_millis(20);

/// What `upgrade` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub uds_path: PathBuf,
    pub timeout: Duration,
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which may hold spaces and parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

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

/// The pid the lock file names, if it names one.
fn lock_pid(uds: &Path) -> Result<Option<u32>, std::io::Error> {
    Ok(std::fs::read_to_string(uds.join(LOCK_FILE))?.trim().parse().ok())
}

/// Children of `pid` started as successors (their last argument is `--takeover`).
fn successors(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
            if cmdline.split(|b| *b == 0).rfind(|a| !a.is_empty()) == Some(b"--takeover") {
                out.push(c);
            }
        }
    }
    out
}

/// Whether the status socket answers from `pid`, ready.
fn serves(uds: &Path, pid: u32) -> bool {
    crate::server::status::ask(uds, "status")
        .is_ok_and(|v| v["pid"].as_u64() == Some(pid.into()) && v["ready"].as_bool() == Some(true))
}

/// The daemon serving `uds`, checked able to take part in an upgrade.
fn serving_daemon(uds: &Path) -> Result<u32, String> {
    let lock = uds.join(LOCK_FILE);
    let pid = match lock_pid(uds) {
        Ok(Some(p)) => p,
        Ok(None) => return Err(format!("{} names no pid: is a daemon starting?", lock.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("no daemon serves {} ({} is missing)", uds.display(), lock.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(format!("{}: permission denied: run as the daemon's user (root)", lock.display()))
        }
        Err(e) => return Err(format!("{}: {e}", lock.display())),
    };
    if !alive(pid) {
        return Err(format!(
            "pid {pid}, named in {}, is not running: no daemon serves {}",
            lock.display(),
            uds.display()
        ));
    }
    if !catches(pid, nix::sys::signal::Signal::SIGUSR2)? {
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
    Ok(pid)
}

/// Signals the daemon serving `opts.uds_path` and waits for its successor;
/// `(old, new)` once the new one serves.
pub fn upgrade(opts: &Options) -> Result<(u32, u32), String> {
    let uds = &opts.uds_path;
    let old = serving_daemon(uds)?;
    let see_log = "the reason is in the daemon's log (journalctl -u tcpx-rxdm, kubectl logs, or its stderr)";
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), nix::sys::signal::Signal::SIGUSR2)
        .map_err(|e| match e {
            nix::errno::Errno::EPERM => {
                format!("not allowed to signal pid {old}: run as the daemon's user (root)")
            }
            e => format!("signalling pid {old}: {e}"),
        })?;
    let deadline = Instant::now() + opts.timeout;
    let mut seen: Vec<u32> = Vec::new();
    loop {
        let named = lock_pid(uds).ok().flatten();
        let old_alive = alive(old);
        if let Some(new) = named.filter(|&p| p != old && alive(p)) {
            if !old_alive || serves(uds, new) {
                return Ok((old, new));
            }
        }
        if !old_alive {
            return Err(format!("pid {old} is gone and no daemon took over {}; {see_log}", uds.display()));
        }
        // A successor that ended while the old daemon still holds the folder failed.
        for c in successors(old).into_iter().chain(named.filter(|&p| p != old)) {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
        if let Some(gone) = seen.iter().find(|&&c| !alive(c)) {
            return Err(format!(
                "the successor (pid {gone}) ended without taking over; pid {old} still serves {}; {see_log}",
                uds.display()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "pid {old} still serves {} after {:?}: no successor took over; {see_log}",
                uds.display(),
                opts.timeout
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// `tcpx-rxdm upgrade`: the exit code.
pub fn main(opts: &Options) -> u8 {
    match upgrade(opts) {
        Ok((old, new)) => {
            // Done whether or not anyone reads it (`upgrade | head` must not panic).
            let _ = writeln!(std::io::stdout(), "upgraded: pid {old} -> pid {new}");
            0
        }
        Err(e) => {
            eprintln!("tcpx-rxdm upgrade: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_and_their_signal_handlers_are_read_from_proc() {
        let me = std::process::id();
        assert!(alive(me));
        // Pids are below 2^22 on Linux.
        assert!(!alive(u32::MAX - 1));
        // The test harness installs no SIGUSR2 handler; SIGUSR2 here would kill us.
        assert!(!catches(me, nix::sys::signal::Signal::SIGUSR2).unwrap());
        assert!(catches(u32::MAX - 1, nix::sys::signal::Signal::SIGUSR2).is_err());
        // A zombie is not alive: a child that exited and was not yet reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let t = Instant::now();
        while alive(pid) {
            assert!(t.elapsed() < Duration::from_secs(10), "the child did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "reaped too early");
        child.wait().unwrap();
    }

    #[test]
    fn a_folder_without_a_serving_daemon_is_refused_before_any_signal() {
        let tmp = tempfile::tempdir().unwrap();
        let e = serving_daemon(tmp.path()).unwrap_err();
        assert!(e.contains("no daemon serves") && e.contains(LOCK_FILE), "{e}");
        std::fs::write(tmp.path().join(LOCK_FILE), "").unwrap();
        assert!(serving_daemon(tmp.path()).unwrap_err().contains("names no pid"));
        std::fs::write(tmp.path().join(LOCK_FILE), format!("{}", u32::MAX - 1)).unwrap();
        assert!(serving_daemon(tmp.path()).unwrap_err().contains("is not running"));
        // A live process that does not handle SIGUSR2 (this test) is never signalled.
        std::fs::write(tmp.path().join(LOCK_FILE), std::process::id().to_string()).unwrap();
        let e = serving_daemon(tmp.path()).unwrap_err();
        assert!(e.contains("does not handle SIGUSR2") && e.contains("nothing sent"), "{e}");
    }
}
