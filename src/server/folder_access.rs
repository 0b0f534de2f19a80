//! Who the socket folder lets reach the sockets: the mode a folder made for
//! them gets, and a warning when an existing folder keeps out clients the
//! sockets' own mode admits.

use nix::unistd::Gid;

use crate::host::shared_dir::SharedDir;

/// The mode a folder for sockets of mode `socket_mode` gets: every class that
/// may use the sockets (read or write bit) gets search and list (`r-x`); the
/// owner gets `rwx`. Write is never handed on: it would let a client delete
/// or replace the daemon's sockets. `0660` → `0750`, `0666` → `0755`, `0600` → `0700`.
pub fn dir_mode_for(socket_mode: u32) -> u32 {
    crate::types::mode::granted_to_socket_users(socket_mode, 0o700, 0o5)
}

/// Which clients the socket mode admits but the folder's own mode keeps out
/// (they need search permission on it); `None` when all can reach the sockets.
pub fn unreachable_by(
    dir_mode: u32,
    dir_gid: u32,
    socket_mode: u32,
    socket_gid: u32,
) -> Option<&'static str> {
    let others_in = dir_mode & 0o001 != 0;
    if socket_mode & 0o060 != 0 && !(others_in || (dir_gid == socket_gid && dir_mode & 0o010 != 0)) {
        return Some("the socket group");
    }
    if socket_mode & 0o006 != 0 && !others_in {
        return Some("other users");
    }
    None
}

/// Warns when an existing folder's mode stops clients the sockets are meant for.
pub(super) fn warn_if_unreachable(dir: &SharedDir, socket_mode: u32, gid: Option<Gid>) {
    let Ok(m) = nix::sys::stat::fstat(dir.fd()) else { return };
    let socket_gid = gid.map(|g| g.as_raw()).unwrap_or_else(|| nix::unistd::getegid().as_raw());
    if let Some(who) = unreachable_by(m.st_mode & 0o7777, m.st_gid, socket_mode, socket_gid) {
        tracing::warn!(
            path = %dir.path().display(),
            mode = format!("{:04o}", m.st_mode & 0o7777),
            gid = m.st_gid,
            socket_mode = format!("{socket_mode:04o}"),
            socket_gid,
            "{who} cannot reach the sockets: the folder lacks search (x) permission for them; \
             change its mode or group, or let the daemon create it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_mode_follows_the_socket_mode_without_write() {
        assert_eq!(dir_mode_for(0o660), 0o750);
        assert_eq!(dir_mode_for(0o600), 0o700);
        assert_eq!(dir_mode_for(0o666), 0o755);
        assert_eq!(dir_mode_for(0o640), 0o750);
        assert_eq!(dir_mode_for(0o602), 0o705);
    }

    #[test]
    fn reachability() {
        // Group-only sockets in a 0700 folder: the group is kept out.
        assert_eq!(unreachable_by(0o700, 5, 0o660, 5), Some("the socket group"));
        // 0750 of the right group: fine; of another group: kept out.
        assert_eq!(unreachable_by(0o750, 5, 0o660, 5), None);
        assert_eq!(unreachable_by(0o750, 6, 0o660, 5), Some("the socket group"));
        // o+x lets everyone search.
        assert_eq!(unreachable_by(0o711, 6, 0o660, 5), None);
        assert_eq!(unreachable_by(0o750, 5, 0o666, 5), Some("other users"));
        assert_eq!(unreachable_by(0o700, 0, 0o600, 0), None);
    }
}
