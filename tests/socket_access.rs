//! Who can reach the sockets in the layout the systemd unit sets up: a
//! runtime folder `root:GROUP 0770` (RuntimeDirectoryMode=0770, Group=) and
//! the daemon's `--socket_group=GROUP`. A member of the group connects; a
//! user outside it gets EACCES. Needs root to switch users.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::BIN;
use nix::errno::Errno;
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, setgid, setgroups, setuid, ForkResult, Gid, Uid};

/// Debian's `daemon` group.
const GROUP: u32 = 1;
const NOBODY: u32 = 65534;

/// Connects to `path` as `uid`/`gid` (with `gid` as the only group) in a child
/// process; returns the errno of the connect (`None` when it succeeded).
fn connect_as(path: &Path, uid: u32, gid: u32) -> Option<Errno> {
    // Everything the child needs is prepared here: after fork it makes only system calls.
    let addr = UnixAddr::new(path).unwrap();
    let groups = [Gid::from_raw(gid)];
    // SAFETY: the child runs no allocator, lock or Rust runtime code: only
    // setgroups/setgid/setuid/socket/connect system calls and _exit.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let code = (|| -> Result<(), Errno> {
                setgroups(&groups)?;
                setgid(Gid::from_raw(gid))?;
                setuid(Uid::from_raw(uid))?;
                let s = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
                connect(std::os::fd::AsRawFd::as_raw_fd(&s), &addr)
            })()
            .map_or_else(|e| e as i32, |()| 0);
            // SAFETY: _exit skips destructors and atexit handlers, as a forked child must.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
            WaitStatus::Exited(_, 0) => None,
            WaitStatus::Exited(_, e) => Some(Errno::from_raw(e)),
            other => panic!("child: {other:?}"),
        },
    }
}

#[test]
#[ignore = "needs root (switches user and group)"]
fn runtime_folder_group_members_connect_others_get_eacces() {
    assert!(nix::unistd::geteuid().is_root(), "run as root with --include-ignored");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // What systemd makes of RuntimeDirectory=, RuntimeDirectoryMode=0770, Group=.
    let dir = tmp.path().join("tcpx");
    std::fs::create_dir(&dir).unwrap();
    nix::unistd::chown(&dir, Some(Uid::from_raw(0)), Some(Gid::from_raw(GROUP))).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();

    let mut daemon = std::process::Command::new(BIN)
        .args([
            "--gpu_nic_preset=sim",
            &format!("--uds_path={}", dir.display()),
            "--metrics_address=",
            &format!("--socket_group={GROUP}"),
            "--nomonitor_shutdown",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sock = dir.join("rx_rule_manager");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let member = connect_as(&sock, NOBODY, GROUP);
    let outsider = connect_as(&sock, NOBODY, NOBODY);
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(member, None, "a member of the socket group could not connect");
    assert_eq!(outsider, Some(Errno::EACCES), "a user outside the group got in");
}
