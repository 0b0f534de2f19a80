//! Black-box tests against hostile clients, scarce resources and careless
//! settings: the real binary on simulated NICs.

mod common;

use std::io::Read;
use std::time::Duration;

use common::*;
use tcpx_rxdm::wire::client::{self, status_code};
use tcpx_rxdm::wire::frame;

const GPU0: &str = "0000:04:00.0";
const OK_FRAME: [u8; 7] = [0, 5, 0x0a, 3, b'O', b'k', b'.'];

fn encoded(m: &tcpx_rxdm::wire::proto::UnixSocketProto) -> Vec<u8> {
    frame::encode(m).unwrap()
}

/// Over-long fields still get INVALID_ARGUMENT (the echoed text is cut so
/// the reply fits a frame), then the connection closes.
#[test]
fn over_long_fields_get_invalid_argument() {
    let d = Daemon::start(&[]);
    let long = "9".repeat(40_000);
    let requests = [
        client::rule_request(1, (long.as_str(), 1), ("192.168.1.2", 2), Some(GPU0), None),
        client::rule_request(1, ("10.1.0.2", 1), ("192.168.1.2", 2), Some(long.as_str()), None),
    ];
    for req in &requests {
        for sock in ["rx_rule_manager", "rx_rule_uninstall"] {
            let mut c = d.client(sock);
            c.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.send(req).unwrap();
            let r = c.recv().unwrap_or_else(|e| panic!("{sock}: no reply: {e}"));
            assert_eq!(status_code(&r), 3, "{sock}");
            let text = r.status.as_ref().unwrap().message.clone();
            assert!(text.len() <= frame::MAX_ERROR_MESSAGE, "{}", text.len());
            assert!(text.contains("bytes cut"), "{text}");
            let mut rest = Vec::new();
            assert_eq!(c.stream().try_clone().unwrap().read_to_end(&mut rest).unwrap(), 0, "closed");
        }
    }
    let q = client::queue_query(&long);
    let mut c = d.client("queue_ids_by_gpu");
    assert_eq!(status_code(&c.request(&q).unwrap()), 3);
    // The daemon still serves.
    let ok = client::rule_request(1, ("10.1.0.2", 1), ("192.168.1.2", 2), Some(GPU0), None);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&ok)), OK_FRAME);
}

/// SIGHUP is an orderly shutdown: rules removed, files removed, exit 0; a
/// second SIGHUP well into a slow shutdown forces the exit (code 1).
#[test]
fn sighup_is_an_orderly_shutdown_and_a_second_one_forces() {
    use nix::sys::signal::Signal;
    let mut d = Daemon::start(&[]);
    let mut c = d.client("rx_rule_manager");
    let r = c.request(&client::rule_request(1, ("10.0.0.9", 1), ("192.168.2.2", 2), None, None)).unwrap();
    assert_eq!(client::raw_bytes(&r), Some(&b"Ok."[..]));
    d.signal(Signal::SIGHUP);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    assert_eq!(d.files(), Vec::<String>::new(), "files left behind");
    let log = d.log();
    assert!(log.iter().any(|l| l.contains("received SIGHUP")), "{}", log.join("\n"));
    assert!(log.iter().any(|l| l.contains("rules removed")));
    assert!(log.iter().any(|l| l.contains("shutdown complete")));

    // 30 rules at 100 ms per removal: a 3 s shutdown, interrupted by a second SIGHUP.
    let mut d = Daemon::start(&["--sim_delay=del_rule:100"]);
    for p in 0..30 {
        let mut c = d.client("rx_rule_manager");
        let r = c.request(&client::rule_request(1, ("10.0.0.9", p), ("192.168.1.2", 2), None, None)).unwrap();
        assert_eq!(client::raw_bytes(&r), Some(&b"Ok."[..]));
    }
    d.signal(Signal::SIGHUP);
    d.wait_for_log("shutting down", Duration::from_secs(10)).expect("shutdown started");
    std::thread::sleep(Duration::from_millis(1500));
    d.signal(Signal::SIGHUP);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(1), "{}", d.log().join("\n"));
    assert!(d.log().iter().any(|l| l.contains("exiting now without finishing restore")));
}

/// Connects to `path` as `uid`/`gid` (no supplementary groups) in a forked
/// child, sends `request` and reads a reply. Returns the child's result:
/// 0 served, 1 connect refused with EACCES, 2 other failure. The child does
/// only raw system calls (no allocation after fork).
fn exchange_as(uid: u32, gid: u32, path: &std::path::Path, request: &[u8]) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: the child only makes raw system calls on memory prepared
    // before the fork, then _exits; the parent waits for it.
    match unsafe { nix::unistd::fork() }.unwrap() {
        // SAFETY: raw system calls on buffers that outlive the child; no allocation.
        nix::unistd::ForkResult::Child => unsafe {
            let code = (|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return 2;
                }
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0 {
                    return 2;
                }
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) != 0 {
                    return if *libc::__errno_location() == libc::EACCES { 1 } else { 2 };
                }
                if libc::write(fd, request.as_ptr().cast(), request.len()) != request.len() as isize {
                    return 2;
                }
                let mut reply = [0u8; 64];
                if libc::read(fd, reply.as_mut_ptr().cast(), reply.len()) <= 2 {
                    return 2;
                }
                0
            })();
            libc::_exit(code)
        },
        nix::unistd::ForkResult::Parent { child } => match nix::sys::wait::waitpid(child, None).unwrap() {
            nix::sys::wait::WaitStatus::Exited(_, code) => code,
            other => panic!("client child: {other:?}"),
        },
    }
}

/// With the daemon's umask 077, a socket folder it creates still lets the
/// `--socket_group` in (mode 0750, that group), and nobody else.
#[test]
#[ignore = "needs root (setuid to a test user, chown to a test group)"]
fn socket_group_member_reaches_sockets_in_a_folder_the_daemon_created() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const GID: u32 = 64_123;
    const UID: u32 = 64_123;
    let tmp = tempfile::tempdir().unwrap();
    // Let anyone traverse the temporary parent; the daemon creates the rest.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let dir = tmp.path().join("job-42/tcpx");
    let d = Daemon::start(&[&format!("--uds_path={}", dir.display()), &format!("--socket_group={GID}")]);
    for folder in [tmp.path().join("job-42"), dir.clone()] {
        let m = std::fs::metadata(&folder).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o750, "{}", folder.display());
        assert_eq!(m.gid(), GID, "{}", folder.display());
    }
    let sock = dir.join("queue_ids_by_gpu");
    let query = encoded(&client::queue_query(GPU0));
    assert_eq!(exchange_as(UID, GID, &sock, &query), 0, "member of the socket group not served");
    assert_eq!(exchange_as(UID, GID + 1, &sock, &query), 1, "non-member not refused with EACCES");
    drop(d);
}

/// An existing folder that keeps the socket group out is left alone, with a warning.
#[test]
fn existing_folder_that_keeps_the_group_out_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let d = Daemon::start(&[&format!("--uds_path={}", tmp.path().display())]);
    d.wait_for_log("cannot reach the sockets", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no warning; log:\n{}", d.log().join("\n")));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(tmp.path()).unwrap().mode() & 0o7777, 0o700, "left as it was");
    // A reachable folder gets no warning.
    let ok = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ok.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
    let d = Daemon::start(&[&format!("--uds_path={}", ok.path().display())]);
    assert!(!d.log().iter().any(|l| l.contains("cannot reach the sockets")), "{}", d.log().join("\n"));
}
