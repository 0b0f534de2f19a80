//! The daemon's process as the takeover tests see it: started on a folder
//! with leases kept, alive or not, and which pid the lock file and the status
//! socket name.

use std::path::Path;

use super::{run_bin, Daemon};

/// A daemon on `folder` that keeps leases (what a takeover hands over), with
/// `extra` flags and `env`.
pub fn leased_daemon(folder: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
    let mut args = vec![format!("--uds_path={}", folder.display()), "--leases".to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::spawn(&args, env)
}

/// Whether `pid` runs (a zombie does not: a successor's parent may be gone).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.split_whitespace().next() != Some("Z")))
        .unwrap_or(false)
}

/// The pid the folder's lock file names, if it is there.
pub fn lock_pid(folder: &Path) -> Option<u32> {
    std::fs::read_to_string(folder.join(".rxdm.lock")).ok()?.trim().parse().ok()
}

/// The pid the status socket's daemon reports, if it answers ready.
pub fn status_pid(folder: &Path) -> Option<u32> {
    let (code, out, _) = run_bin(&["status", "--json", &format!("--uds_path={}", folder.display())]);
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    (code == 0).then(|| v["pid"].as_u64().map(|p| p as u32)).flatten()
}
