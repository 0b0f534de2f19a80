use super::*;
use std::os::unix::net::UnixStream;

#[test]
fn pidfd_info_has_the_kernel_layout() {
    assert_eq!(std::mem::size_of::<PidfdInfo>(), PIDFD_INFO_SIZE);
    assert_eq!(std::mem::offset_of!(PidfdInfo, cgroupid), 8);
    assert_eq!(std::mem::offset_of!(PidfdInfo, pid), 16);
    assert_eq!(std::mem::offset_of!(PidfdInfo, fsgid), 56);
    assert_eq!(PIDFD_GET_INFO, 0xC040_FF0B);
}

#[test]
fn a_pidfds_fdinfo_says_where_its_process_is() {
    let pid = |t: &str| parse_pid_line(t);
    assert_eq!(
        pid("pos:\t0\nflags:\t02000002\nPid:\t4242\nNSpid:\t4242\t7\n"),
        NonZeroU32::new(4242).map(PidNow::Visible)
    );
    assert_eq!(pid("Pid:\t0\n"), Some(PidNow::Hidden));
    assert_eq!(pid("Pid:\t-1\nNSpid:\t-1\n"), Some(PidNow::Reaped));
    assert_eq!(pid("pos:\t0\n"), None);
    let p = parse_pids("pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1\nPid:\t4242\nNSpid:\t4242\t7\n");
    assert_eq!(p, Pids { here: Some(4242), innermost: Some(7) });
    assert_eq!(parse_pids("Pid:\t-1\nNSpid:\t-1\n"), Pids { here: None, innermost: None });
    assert_eq!(parse_pids("Pid:\t0\n"), Pids { here: None, innermost: None });
}

#[test]
fn a_child_is_there_until_it_exits_and_then_until_it_is_reaped() {
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pidfd = Pidfd::open(child.id()).unwrap();
    assert_eq!(pidfd.pid_now(), Ok(PidNow::Visible(NonZeroU32::new(child.id()).unwrap())));
    assert!(!pidfd.exited() && pidfd.unreaped());
    assert!(!pidfd.wait_exit(Duration::from_millis(20)), "sleep 30 still runs");
    pidfd.signal(Signal::SIGKILL).unwrap();
    // A zombie has exited but keeps its pid until it is reaped.
    assert!(pidfd.wait_exit(Duration::from_secs(10)), "killed and gone");
    assert!(pidfd.unreaped(), "a zombie still holds its pid");
    child.wait().unwrap();
    assert!(pidfd.exited() && !pidfd.unreaped());
    assert_eq!(pidfd.pid_now(), Ok(PidNow::Reaped));
    // Reaped: its pid may be anyone's now; the pidfd still names the dead one.
    assert_eq!(pidfd.pids(), Some(Pids { here: None, innermost: None }));
    assert_eq!(pidfd.signal(Signal::SIGTERM), Err(Errno::ESRCH));
    assert_eq!(pidfd.get_fd(0).unwrap_err(), Errno::ESRCH);
}

#[test]
fn the_peer_of_a_socket_pair_is_this_process() {
    let own = Pidfd::own().unwrap();
    assert_eq!(own.pids().and_then(|p| p.here), Some(std::process::id()));
    let (a, _b) = UnixStream::pair().unwrap();
    let peer = Pidfd::of_peer(a.as_fd()).unwrap();
    assert_eq!(peer.pids().and_then(|p| p.here), Some(std::process::id()));
    // Its own descriptors, taken through the pidfd.
    let dup = own.get_fd(a.as_raw_fd()).unwrap();
    assert_eq!(
        nix::sys::stat::fstat(dup.as_fd()).unwrap().st_ino,
        nix::sys::stat::fstat(a.as_fd()).unwrap().st_ino
    );
}

#[test]
fn the_tests_proc_is_their_own_pid_namespaces() {
    // As cargo runs them: /proc mounted for the namespace they run in.
    assert!(proc_is_own_pid_namespace());
}

#[test]
fn a_pidfds_inode_names_its_process_on_pidfs() {
    if !on_pidfs() {
        return;
    }
    let (a, b) = (Pidfd::own().unwrap(), Pidfd::own().unwrap());
    assert_eq!(a.inode(), b.inode(), "one process, one inode");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let c = Pidfd::open(child.id()).unwrap();
    assert_ne!(a.inode(), c.inode());
    child.wait().unwrap();
}
