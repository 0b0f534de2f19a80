//! The host checks: the socket folder, a running daemon, host tuning and route
//! metrics, and the open-file limit.

use nix::errno::Errno;

use std::path::Path;

use super::{Ctx, Lock, Report, Status};
use crate::config::flags::SetupParam;

pub(super) fn check_host(r: &mut Report, ctx: &Ctx) {
    let s = "host";
    let flags = ctx.flags;
    let uds = &flags.uds_path;
    check_socket_folder(r, ctx);
    match &ctx.lock {
        Lock::Held(pid) => r.add(
            s,
            "daemon",
            Status::Pass,
            format!(
                "a daemon holds the lock ({pid}); `tcpx-rxdm status --uds_path={}` asks it",
                uds.display()
            ),
            None,
        ),
        Lock::Free(why) => {
            r.add(s, "daemon", Status::Pass, format!("none running on this socket folder ({why})"), None)
        }
        Lock::Unknown(why) => r.add(
            s,
            "daemon",
            Status::Warn,
            format!("cannot tell whether a daemon runs on {}: {why}", uds.display()),
            Some(match crate::server::status::daemon_user(uds).map(|(uid, _)| uid) {
                Some(0) | None => "run doctor as root (or as the daemon's user) to see it".to_string(),
                Some(uid) => format!(
                    "run doctor as the daemon's user, {}, or as root, to see it",
                    crate::host::users::describe(uid)
                ),
            }),
        ),
    }

    let tuning_applies =
        !ctx.sim_nic && flags.tuning_script_path.is_none() && flags.setup_param != SetupParam::Off;
    if let (false, Some(dir)) = (ctx.sim_nic, &flags.tuning_script_path) {
        check_tuning_scripts(r, dir);
    } else if !tuning_applies {
        let why = if ctx.sim_nic {
            "simulated NICs: the daemon does no host tuning"
        } else if flags.tuning_script_path.is_some() {
            "--tuning_script_path: the scripts tune"
        } else {
            "--setup_param empty: no host tuning"
        };
        r.add(s, "tuning", Status::Skip, why, None);
    } else {
        let all = crate::host::tuning::knob_states(&flags.procfs_root(), &flags.sysfs_root());
        // In a Pod's namespace, host-wide knobs are the node's: said apart, never a warning.
        let pod = ctx.netns.is_other();
        let (knobs, hosts): (Vec<_>, Vec<_>) =
            all.into_iter().partition(|k| !pod || k.scope == crate::host::tuning::Scope::Namespace);
        let at = knobs.iter().filter(|k| k.ok).count();
        let differ: Vec<String> = knobs
            .iter()
            .filter(|k| !k.ok)
            .map(|k| {
                let name = k.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                match &k.current {
                    Some(c) => {
                        format!("{name} \"{}\" (daemon sets \"{}\")", c.escape_debug(), k.want.escape_debug())
                    }
                    None => format!("{name} absent (skipped)"),
                }
            })
            .collect();
        let status = if ctx.daemon.is_some() && knobs.iter().any(|k| !k.ok && k.current.is_some()) {
            Status::Warn
        } else {
            Status::Pass
        };
        let mut found = format!("{at}/{} knobs already at the daemon's values", knobs.len());
        if !differ.is_empty() {
            found.push_str(": ");
            found.push_str(&differ.join("; "));
        }
        if ctx.daemon.is_none() && !differ.is_empty() {
            found.push_str(" (set at start, restored at exit)");
        }
        if pod {
            found.push_str("; these are this network namespace's");
            let theirs: Vec<String> = hosts
                .iter()
                .map(|k| {
                    let name =
                        k.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    let now = k
                        .current
                        .as_deref()
                        .map(|c| format!(" \"{}\"", c.escape_debug()))
                        .unwrap_or_default();
                    format!("{name}{now}")
                })
                .collect();
            if !theirs.is_empty() {
                found.push_str(&format!("; host-wide, the node's to set: {}", theirs.join(", ")));
            }
        }
        r.add(s, "tuning", status, found, None);
        if let SetupParam::Tune(params) = flags.setup_param {
            let crate::host::tuning::TuningParams { initcwnd, rto_min_ms, quickack } = params;
            match route_states(&params) {
                Ok((total, tuned)) => r.add(
                    s,
                    "route metrics",
                    Status::Pass,
                    format!(
                        "{tuned} of {total} main-table routes already carry initcwnd {initcwnd}, rto_min {rto_min_ms} ms, quickack {quickack} (0 = left alone){}",
                        if ctx.daemon.is_none() && tuned < total { "; the daemon sets them at start" } else { "" }
                    ),
                    None,
                ),
                Err(e) => r.add(s, "route metrics", Status::Warn, format!("cannot dump routes: {e}"), None),
            }
        }
    }

    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid out-pointer for one rlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let got = if rc == 0 { Ok((lim.rlim_cur, lim.rlim_max)) } else { Err(Errno::last()) };
    match got {
        // The daemon raises its soft limit to the hard one at start: the hard one is what it gets.
        Ok((soft, hard)) => {
            let need = u64::from(flags.max_connections) + 256;
            let found = format!("RLIMIT_NOFILE soft {soft}, hard {hard}; the daemon raises the soft limit to the hard one at start");
            if hard < need {
                r.add(
                    s,
                    "open files",
                    Status::Warn,
                    format!("{found}, and {hard} is below --max_connections {} + 256 for its own files", flags.max_connections),
                    Some(format!(
                        "raise the hard limit to {need} or more (LimitNOFILE= in the systemd unit, the container \
                         runtime's ulimits, `ulimit -Hn` as root), or lower --max_connections"
                    )),
                );
            } else {
                r.add(s, "open files", Status::Pass, found, None);
            }
        }
        Err(e) => r.add(s, "open files", Status::Warn, format!("getrlimit: {e}"), None),
    }
}

/// `--tuning_script_path`: the daemon runs `setup.sh` at start and
/// `teardown.sh` at exit; a missing one is logged and the node runs untuned.
fn check_tuning_scripts(r: &mut Report, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let missing: Vec<String> = ["setup.sh", "teardown.sh"]
        .iter()
        .filter(|f| {
            !std::fs::metadata(dir.join(f)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|f| dir.join(f).display().to_string())
        .collect();
    if missing.is_empty() {
        r.add(
            "host",
            "tuning",
            Status::Pass,
            format!("--tuning_script_path: {} runs the scripts", dir.display()),
            None,
        );
    } else {
        r.add(
            "host",
            "tuning",
            Status::Warn,
            format!("--tuning_script_path: no executable {}; the daemon logs the failure and leaves the host untuned", missing.join(" or ")),
            Some("install the scripts there, or drop --tuning_script_path for the built-in tuning".into()),
        );
    }
}

/// The socket folder: there and usable by this user, or creatable by it (a
/// daemon with these flags would create it, or exit 1 "Permission denied").
fn check_socket_folder(r: &mut Report, ctx: &Ctx) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (s, uds) = ("host", &ctx.flags.uds_path);
    let me = crate::host::users::me();
    let can = |p: &Path, how| nix::unistd::access(p, how).is_ok();
    let (w, x) = (nix::unistd::AccessFlags::W_OK, nix::unistd::AccessFlags::X_OK);
    match std::fs::metadata(uds) {
        Ok(m) if m.is_dir() => {
            let usable = can(uds, w | x);
            let found = format!(
                "{} exists, mode {:04o}, owner {}, group {}{}",
                uds.display(),
                m.permissions().mode() & 0o7777,
                crate::host::users::describe(m.uid()),
                m.gid(),
                if usable { String::new() } else { format!("; {me} cannot write in it") }
            );
            let status = if usable || ctx.daemon.is_some() { Status::Pass } else { Status::Fail };
            let fix = (status == Status::Fail).then(|| {
                format!(
                    "run as a user that can write {} (the daemon's user: root in the tcpx-daemon container and \
                     the systemd unit), or choose another --uds_path",
                    uds.display()
                )
            });
            r.add(s, "socket folder", status, found, fix);
        }
        Ok(_) => r.add(
            s,
            "socket folder",
            Status::Fail,
            format!("{} exists and is not a folder", uds.display()),
            Some("point --uds_path at a folder (the NCCL plugin's UNIX_CLIENT_PREFIX)".into()),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The daemon creates the missing folders from the nearest one that exists.
            let parent = uds.ancestors().skip(1).find(|p| p.exists()).unwrap_or(Path::new("/"));
            if parent.is_dir() && can(parent, w | x) {
                let found =
                    format!("{} absent: the daemon creates it (in {})", uds.display(), parent.display());
                r.add(s, "socket folder", Status::Pass, found, None);
            } else {
                r.add(
                    s,
                    "socket folder",
                    Status::Fail,
                    format!(
                        "{} absent, and {me} cannot create it: it may not write in {} \
                         (the daemon with these flags would exit 1: Permission denied)",
                        uds.display(),
                        parent.display()
                    ),
                    Some(format!(
                        "run as root (as the systemd unit and the tcpx-daemon container do), create {} for \
                         this user, or choose a --uds_path it can create (e.g. --uds_path=/tmp/tcpx)",
                        uds.display()
                    )),
                );
            }
        }
        Err(e) => r.add(
            s,
            "socket folder",
            Status::Fail,
            format!("{}: {e} ({me})", uds.display()),
            Some("run as the daemon's user (or root), or choose another --uds_path".into()),
        ),
    }
}

/// Main-table unicast routes (IPv4 and IPv6), and how many already carry
/// every route metric native tuning sets. Reads only.
fn route_states(params: &crate::host::tuning::TuningParams) -> Result<(usize, usize), String> {
    use crate::netlink::rtnl;
    let want = params.route_metrics();
    let mut conn =
        crate::netlink::NlConn::open(neli::consts::socket::NlFamily::Route).map_err(|e| e.to_string())?;
    let (mut total, mut tuned) = (0, 0);
    for v6 in [false, true] {
        for payload in conn.transact(&rtnl::getroute_dump(v6)).map_err(|e| e.to_string())? {
            let route = rtnl::parse_route(&payload).map_err(|e| e.to_string())?;
            if !route.is_tunable() {
                continue;
            }
            total += 1;
            if want.iter().all(|(t, v)| route.metric(*t) == Some(*v)) {
                tuned += 1;
            }
        }
    }
    Ok((total, tuned))
}
