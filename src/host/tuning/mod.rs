//! Host tuning, natively: TCP route metrics on every main-table
//! unicast route (rtnetlink replace), a few TCP sysctls through the procfs
//! root, and cubic's `hystart_detect` through the sysfs root. Every value
//! changed is saved and put back by [`HostTuning::restore`], which is
//! idempotent and attempts every step. Alternatively (`--tuning_script_path`)
//! the user's `setup.sh` / `teardown.sh` run instead.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use neli::consts::socket::NlFamily;
use nix::errno::Errno;
use tracing::{debug, info, warn};

use crate::netlink::rtnl::{self, Route, RTAX_INITCWND, RTAX_QUICKACK, RTAX_RTO_MIN};
use crate::netlink::{NlConn, NlError};

mod handover;
mod knobs;
pub use knobs::{knob_states, sysctl_dir, KnobState, Scope};
use knobs::{knobs, normalize, Knob, Target, Tree};

/// The three numbers of `--setup_param "--verbose A B C"`; 0 leaves a metric alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuningParams {
    pub initcwnd: u32,
    pub rto_min_ms: u32,
    pub quickack: u32,
}

impl TuningParams {
    /// The route metrics to set (`RTAX_*`, value), zeros left out.
    pub fn route_metrics(&self) -> Vec<(u16, u32)> {
        [(RTAX_INITCWND, self.initcwnd), (RTAX_RTO_MIN, self.rto_min_ms), (RTAX_QUICKACK, self.quickack)]
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .collect()
    }

    /// Arguments for `setup.sh`, as the reference passes `--setup_param`.
    pub fn script_args(&self) -> Vec<String> {
        vec![
            "--verbose".into(),
            self.initcwnd.to_string(),
            self.rto_min_ms.to_string(),
            self.quickack.to_string(),
        ]
    }
}

/// How to tune.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TuningPlan {
    /// `procfs_root` is `/proc` or a mount of the host's `/proc/sys` (such as
    /// `/hostprocsysfs`); both layouts are recognised.
    Native { procfs_root: PathBuf, sysfs_root: PathBuf },
    /// In a network namespace other than the host's (a Pod's). The `net/`
    /// sysctls under `procfs_root` are this namespace's wherever they are
    /// opened (through the host's `/proc/sys` mounted at `/hostprocsysfs`
    /// too), and so are the routes: both are the Pod's to tune. A host-wide
    /// knob is changed only through the host's own tree, where one is given
    /// (`host_procfs`: `procfs_root` is the host's `/proc` or `/proc/sys`;
    /// `host_sysfs`: `sysfs_root` is the host's sysfs). A knob this
    /// namespace lacks or refuses is left alone ([`TuningError::LeftAlone`]).
    Pod { procfs_root: PathBuf, sysfs_root: PathBuf, host_procfs: bool, host_sysfs: bool },
    /// Run `<dir>/setup.sh <args…>` now and `<dir>/teardown.sh` at restore.
    Script { dir: PathBuf, args: Vec<String> },
}

#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("writing \"{}\" to {path}: {source}{}", .value.escape_debug(), write_hint(path, .source))]
    Write { path: PathBuf, value: String, source: io::Error },
    #[error("route netlink: {0}")]
    Netlink(#[source] NlError),
    #[error("route {route}: {source}{}", route_hint(.source))]
    Route { route: String, source: NlError },
    #[error("{}: {source}", script.display())]
    ScriptStart { script: PathBuf, source: io::Error },
    #[error("{}: {detail}", script.display())]
    Script { script: PathBuf, detail: String },
    /// A knob left as it is, on purpose (`TuningPlan::Pod`).
    #[error("{path} left alone: {why}")]
    LeftAlone { path: PathBuf, why: String },
}

impl TuningError {
    /// A knob left as it is by choice, not a failure: a write refused
    /// because the file's mount is read-only (the host's `/sys` in the
    /// Kubernetes manifests), or one a Pod's namespace lacks or refuses.
    pub fn left_alone(&self) -> bool {
        match self {
            TuningError::Write { source, .. } => source.raw_os_error() == Some(libc::EROFS),
            TuningError::LeftAlone { .. } => true,
            _ => false,
        }
    }

    /// In a Pod's network namespace: a knob it refuses, left alone.
    fn in_pod(self) -> TuningError {
        match self {
            TuningError::Write { path, source, .. }
                if matches!(source.raw_os_error(), Some(libc::EROFS | libc::EACCES | libc::EPERM)) =>
            {
                let why = format!("refused here ({source}){}", write_hint(&path, &source));
                TuningError::LeftAlone { path, why }
            }
            other => other,
        }
    }
}

/// Why a write was refused: these files are root's, so root may write them
/// without any capability, but only through a writable mount; a `net/`
/// sysctl also lets a process with `CAP_NET_ADMIN` in its namespace write it.
fn write_hint(path: &Path, e: &io::Error) -> String {
    let net = path.components().any(|c| c.as_os_str() == "net");
    match e.raw_os_error() {
        Some(libc::EROFS) => {
            " (a read-only mount: mount it writable for the daemon to set it, or set it on the node)".into()
        }
        Some(libc::EACCES | libc::EPERM) if net => {
            " (a network sysctl: root (uid 0) or CAP_NET_ADMIN may write it)".into()
        }
        Some(libc::EACCES | libc::EPERM) => {
            " (the file is root's: run the daemon as root (uid 0); no capability is needed)".into()
        }
        _ => String::new(),
    }
}

/// Why a route change was refused: rtnetlink changes need `CAP_NET_ADMIN`.
fn route_hint(e: &NlError) -> String {
    match e.errno() {
        Errno::EPERM => format!(" ({})", crate::caps::lacking(crate::caps::Cap::NetAdmin)),
        _ => String::new(),
    }
}

/// Applied tuning and what it takes to undo it. Restore in the network
/// namespace `apply` ran in: `/proc/sys/net` and rtnetlink follow the calling
/// thread's namespace. A takeover hands it on (`handover.rs`).
#[derive(Debug, Default)]
pub struct HostTuning {
    /// Files changed, with their previous contents, in the order written.
    files: Vec<(PathBuf, String)>,
    /// Routes changed, as they were before.
    routes: Vec<Route>,
    /// `teardown.sh` still to run.
    teardown: Option<PathBuf>,
    /// Whether dropping it restores (see [`HostTuning::arm`]); never handed on.
    armed: bool,
}

impl HostTuning {
    /// Dropping it restores from now on (the takeover committed).
    pub fn arm(&mut self) {
        self.armed = true;
    }
}

fn write_file(path: &Path, value: &str) -> Result<(), TuningError> {
    // Never create: a missing file means the knob does not exist here.
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| TuningError::Write { path: path.to_path_buf(), value: value.to_string(), source })
}

impl HostTuning {
    /// Applies `plan`. Every step is attempted; the failures come back beside
    /// the handle (the caller logs them: tuning is best effort), and whatever
    /// did change is undone by [`HostTuning::restore`].
    pub fn apply(params: &TuningParams, plan: &TuningPlan) -> (HostTuning, Vec<TuningError>) {
        let mut t = HostTuning::default();
        t.arm();
        let mut errors = Vec::new();
        match plan {
            TuningPlan::Script { dir, args } => {
                t.teardown = Some(dir.join("teardown.sh"));
                if let Err(e) = run_script(&dir.join("setup.sh"), args) {
                    errors.push(e);
                }
            }
            TuningPlan::Native { procfs_root, sysfs_root } => {
                for Knob { path, target, .. } in knobs(procfs_root, sysfs_root) {
                    match t.set_file(&path, target) {
                        Err(TuningError::LeftAlone { path, .. }) => {
                            warn!(path = %path.display(), "tuning knob not present; skipped")
                        }
                        Err(e) => errors.push(e),
                        Ok(()) => {}
                    }
                }
                errors.extend(t.tune_routes(&params.route_metrics()));
            }
            TuningPlan::Pod { procfs_root, sysfs_root, host_procfs, host_sysfs } => {
                for k in knobs(procfs_root, sysfs_root) {
                    let host_tree = match k.tree {
                        Tree::ProcSys => *host_procfs,
                        Tree::Sysfs => *host_sysfs,
                    };
                    if k.scope == Scope::Host && !host_tree {
                        let why = "host-wide, and the host's own tree is not given here: the node's to set";
                        errors.push(TuningError::LeftAlone { path: k.path, why: why.into() });
                        continue;
                    }
                    if let Err(e) = t.set_file(&k.path, k.target) {
                        errors.push(e.in_pod());
                    }
                }
                errors.extend(t.tune_routes(&params.route_metrics()));
            }
        }
        (t, errors)
    }

    fn set_file(&mut self, path: &Path, target: Target) -> Result<(), TuningError> {
        let current = match std::fs::read_to_string(path) {
            Ok(s) => normalize(&s),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Never created: a missing file means the knob does not exist here.
                let why = "not present here (in a network namespace other than the host's: host-wide on \
                           this kernel, the node's to set)";
                return Err(TuningError::LeftAlone { path: path.to_path_buf(), why: why.into() });
            }
            Err(source) => return Err(TuningError::Read { path: path.to_path_buf(), source }),
        };
        let value = match target {
            Target::Exact(v) if current == v => return Ok(()),
            Target::Exact(v) => v.to_string(),
            Target::AtLeast(min) if current.parse::<u64>().is_ok_and(|c| c >= min) => return Ok(()),
            Target::AtLeast(min) => min.to_string(),
        };
        write_file(path, &value)?;
        info!(path = %path.display(), from = %current, to = %value, "host tuning");
        self.files.push((path.to_path_buf(), current));
        Ok(())
    }

    fn tune_routes(&mut self, metrics: &[(u16, u32)]) -> Vec<TuningError> {
        fn metric_name(t: u16) -> &'static str {
            match t {
                RTAX_INITCWND => "initcwnd",
                RTAX_RTO_MIN => "rto_min",
                RTAX_QUICKACK => "quickack",
                _ => "metric",
            }
        }
        if metrics.is_empty() {
            return Vec::new();
        }
        let mut conn = match NlConn::open(NlFamily::Route) {
            Ok(c) => c,
            Err(e) => return vec![TuningError::Netlink(e)],
        };
        let mut errors = Vec::new();
        for v6 in [false, true] {
            let routes = match conn.transact(&rtnl::getroute_dump(v6)) {
                Ok(r) => r,
                Err(e) => {
                    errors.push(TuningError::Netlink(e));
                    continue;
                }
            };
            for payload in routes {
                let route = match rtnl::parse_route(&payload) {
                    Ok(r) if r.is_tunable() => r,
                    Ok(_) => continue,
                    Err(e) => {
                        errors.push(TuningError::Netlink(e));
                        continue;
                    }
                };
                if metrics.iter().all(|(t, v)| route.metric(*t) == Some(*v)) {
                    continue;
                }
                match conn.transact(&route.with_metrics(metrics).replace_request()) {
                    Ok(_) => {
                        let set = crate::types::list(
                            metrics.iter().map(|(t, v)| format!("{}={v}", metric_name(*t))),
                        );
                        info!(route = %route.describe(), metrics = %set, "route metrics tuned");
                        self.routes.push(route);
                    }
                    Err(source) => errors.push(TuningError::Route { route: route.describe(), source }),
                }
            }
        }
        errors
    }

    /// True when there is nothing left to undo.
    pub fn is_restored(&self) -> bool {
        self.files.is_empty() && self.routes.is_empty() && self.teardown.is_none()
    }

    /// Puts back every value changed (routes first, then files in reverse
    /// order) or runs `teardown.sh`. Every step is attempted; a second call
    /// does nothing. Routes deleted meanwhile are skipped.
    pub fn restore(&mut self) -> Result<(), Vec<TuningError>> {
        let mut errors = Vec::new();
        if let Some(script) = self.teardown.take() {
            if let Err(e) = run_script(&script, &[]) {
                errors.push(e);
            }
        }
        let routes = std::mem::take(&mut self.routes);
        if !routes.is_empty() {
            match NlConn::open(NlFamily::Route) {
                Ok(mut conn) => {
                    for route in routes {
                        match conn.transact(&route.replace_request()) {
                            Ok(_) => debug!(route = %route.describe(), "route metrics restored"),
                            Err(e) if matches!(e.errno(), Errno::ENOENT | Errno::ESRCH) => {
                                debug!(route = %route.describe(), "tuned route is gone; nothing to restore")
                            }
                            Err(source) => {
                                errors.push(TuningError::Route { route: route.describe(), source })
                            }
                        }
                    }
                }
                Err(e) => errors.push(TuningError::Netlink(e)),
            }
        }
        for (path, value) in std::mem::take(&mut self.files).into_iter().rev() {
            if let Err(e) = write_file(&path, &value) {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

impl Drop for HostTuning {
    /// A safety net: the daemon restores explicitly and logs the outcome.
    /// A log taken over and not yet armed is left alone.
    fn drop(&mut self) {
        if self.armed && !self.is_restored() {
            if let Err(errors) = self.restore() {
                for e in errors {
                    warn!(error = %e, "host tuning restore failed");
                }
            }
        }
    }
}

fn run_script(script: &Path, args: &[String]) -> Result<(), TuningError> {
    let out = Command::new(script)
        .args(args)
        .output()
        .map_err(|source| TuningError::ScriptStart { script: script.to_path_buf(), source })?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    info!(script = %script.display(), stdout = %text(&out.stdout), stderr = %text(&out.stderr), "tuning script ran");
    if out.status.success() {
        Ok(())
    } else {
        Err(TuningError::Script {
            script: script.to_path_buf(),
            detail: format!("{}; stderr: {}", out.status, text(&out.stderr)),
        })
    }
}

#[cfg(test)]
mod tests;
