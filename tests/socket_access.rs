//! Who can reach the sockets in the layout the systemd unit sets up: a
//! runtime folder `root:GROUP 0750` (RuntimeDirectoryMode=0750, Group=) and
//! the daemon's `--socket_group=GROUP`. A member of the group connects but
//! cannot delete or replace a socket; a user outside it gets EACCES. Needs
//! root to switch users.

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
    // What systemd makes of RuntimeDirectory=, RuntimeDirectoryMode=0750, Group=.
    let dir = tmp.path().join("tcpx");
    std::fs::create_dir(&dir).unwrap();
    nix::unistd::chown(&dir, Some(Uid::from_raw(0)), Some(Gid::from_raw(GROUP))).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();

    let daemon = Daemon::start(&[
        &format!("--uds_path={}", dir.display()),
        "--metrics_address=",
        &format!("--socket_group={GROUP}"),
        "--nomonitor_shutdown",
    ]);
    let sock = dir.join("rx_rule_manager");
    let member = connect_as(NOBODY, GROUP, &sock, &[]);
    let outsider = connect_as(NOBODY, NOBODY, &sock, &[]);
    // A member tries to delete the daemon's socket (to bind its own in its
    // place) and to create a file in the folder.
    let as_member = |cmd: &[&str]| {
        std::process::Command::new("setpriv")
            .args([&format!("--reuid={NOBODY}"), &format!("--regid={GROUP}"), "--clear-groups", "--"])
            .args(cmd)
            .output()
            .unwrap()
    };
    let rm = as_member(&["rm", "-f", sock.to_str().unwrap()]);
    let touch = as_member(&["touch", dir.join("terminated").to_str().unwrap()]);
    let still_ours = connect_as(NOBODY, GROUP, &sock, &[]);
    let after: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    drop(daemon);
    assert_eq!(member, Ok(()), "a member of the socket group could not connect");
    assert_eq!(outsider, Err(Errno::EACCES), "a user outside the group got in");
    for (what, out) in [("delete a socket", &rm), ("create a file", &touch)] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("Permission denied"), "a member could {what}: {err}");
    }
    assert_eq!(still_ours, Ok(()));
    assert!(after.contains(&"rx_rule_manager".to_string()), "{after:?}");
}
