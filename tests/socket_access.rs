//! Who can reach the sockets in the layout the systemd unit sets up: a
//! runtime folder `root:GROUP 0770` (RuntimeDirectoryMode=0770, Group=) and
//! the daemon's `--socket_group=GROUP`. A member of the group connects; a
//! user outside it gets EACCES. Needs root to switch users.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{connect_as, require_root, Daemon};
use nix::errno::Errno;
use nix::unistd::{Gid, Uid};

/// Debian's `daemon` group.
const GROUP: u32 = 1;
const NOBODY: u32 = 65534;

#[test]
#[ignore = "needs root: switches user and group"]
fn runtime_folder_group_members_connect_others_get_eacces() {
    require_root("switches user and group");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // What systemd makes of RuntimeDirectory=, RuntimeDirectoryMode=0770, Group=.
    let dir = tmp.path().join("tcpx");
    std::fs::create_dir(&dir).unwrap();
    nix::unistd::chown(&dir, Some(Uid::from_raw(0)), Some(Gid::from_raw(GROUP))).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();

    let daemon = Daemon::start(&[
        &format!("--uds_path={}", dir.display()),
        "--metrics_address=",
        &format!("--socket_group={GROUP}"),
        "--nomonitor_shutdown",
    ]);
    let sock = dir.join("rx_rule_manager");
    let member = connect_as(NOBODY, GROUP, &sock, &[]);
    let outsider = connect_as(NOBODY, NOBODY, &sock, &[]);
    drop(daemon);
    assert_eq!(member, Ok(()), "a member of the socket group could not connect");
    assert_eq!(outsider, Err(Errno::EACCES), "a user outside the group got in");
}
