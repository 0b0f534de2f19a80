//! Unit tests of the lease tracker.
use super::*;
use crate::pidfd::{on_pidfs, probe_peer_pidfd};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn tracker(track: bool, reclaim: bool) -> (Arc<ClientTracker>, mpsc::UnboundedReceiver<NonZeroU32>) {
    ClientTracker::new(
        LeasePolicy { track, reclaim },
        Arc::new(Metrics::new()),
        Arc::new(TenantPolicy::off()),
    )
}

#[tokio::test]
async fn one_watch_per_process_across_connections() {
    let (t, _rx) = tracker(true, true);
    let pairs: Vec<_> = (0..5).map(|_| UnixStream::pair().unwrap()).collect();
    let leases: Vec<_> = pairs.iter().map(|(a, _)| t.identify(a.as_fd()).unwrap().expect("lease")).collect();
    assert!(leases.iter().all(|l| l.id == leases[0].id), "same process, same lease");
    assert_eq!(leases[0].pid.map(|p| p.get()), Some(std::process::id()));
    assert_eq!(t.watches_started(), 1);
    assert_eq!(t.pidfds_opened(), 1, "later connections of a visible pid take the fast path");
    assert_eq!(*t.subscribe().borrow(), ClientCount { seen_any: true, alive: 1 });
    assert_eq!(t.metrics.leases.clients.get(), 1);
    let c = t.who(pairs[0].0.as_fd()).unwrap();
    assert_eq!(c.lease.as_ref().map(|l| l.id()), Some(leases[0].id));
    assert!(c.lease.as_ref().is_some_and(|l| l.alive()));
}

#[tokio::test]
async fn exit_of_the_peer_process_releases_its_lease() {
    let (t, mut exits) = tracker(true, true);
    // The peer must be another process: a child that connects, then exits.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut client = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import socket,time; s=socket.socket(socket.AF_UNIX); s.connect({:?}); time.sleep(0.3)",
            path.display().to_string()
        ))
        .spawn()
        .unwrap();
    let (conn, _) = listener.accept().unwrap();
    let lease = t.identify(conn.as_fd()).unwrap().expect("lease for the child");
    assert_eq!(lease.pid.map(|p| p.get()), Some(client.id()));
    assert!(lease.alive());
    client.wait().unwrap();
    let id = tokio::time::timeout(Duration::from_secs(5), exits.recv()).await.unwrap().unwrap();
    assert_eq!(id, lease.id);
    assert!(!lease.alive());
    assert_eq!(*t.subscribe().borrow(), ClientCount { seen_any: true, alive: 0 });
}

#[tokio::test]
async fn tracking_off_identifies_nobody() {
    let (t, _rx) = tracker(false, false);
    let (a, _b) = UnixStream::pair().unwrap();
    assert!(t.identify(a.as_fd()).unwrap().is_none());
    assert_eq!(*t.subscribe().borrow(), ClientCount::default());
}

#[tokio::test]
async fn tracking_without_reclaim_gives_no_lease_to_rules() {
    let (t, _rx) = tracker(true, false);
    let (a, _b) = UnixStream::pair().unwrap();
    let c = t.who(a.as_fd()).unwrap();
    assert!(c.pid.is_some());
    assert!(c.lease.is_none());
    assert_eq!(t.subscribe().borrow().alive, 1);
}

/// `(major, minor)` of the running kernel.
fn kernel_version() -> (u32, u32) {
    let release = nix::sys::utsname::uname().unwrap().release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether this kernel has `SO_PEERPIDFD`.
fn kernel_has_peer_pidfd() -> bool {
    probe_peer_pidfd().is_ok()
}

#[test]
fn peer_pidfd_is_there_exactly_from_linux_6_5() {
    assert_eq!(kernel_has_peer_pidfd(), kernel_version() >= (6, 5), "kernel {:?}", kernel_version());
    if kernel_has_peer_pidfd() {
        let (a, _b) = UnixStream::pair().unwrap();
        let fd = Pidfd::of_socket_peer(a.as_fd()).unwrap();
        let fdinfo =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd())).unwrap();
        assert!(fdinfo.contains(&format!("Pid:\t{}", std::process::id())), "{fdinfo}");
    }
}

fn checking_tracker(
    timeout: Duration,
    read_delay: Duration,
) -> (Arc<ClientTracker>, Arc<TenantPolicy>, mpsc::UnboundedReceiver<NonZeroU32>) {
    use crate::config::flags::TenantIsolation;
    use crate::identity::tenant::GpuDevices;
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let policy = Arc::new(TenantPolicy::new(
        TenantIsolation::Enforce,
        0,
        GpuDevices { minors: vec![0], simulated: true },
        tenant::cgroup2_mount(&mounts),
        None,
    ));
    let (mut t, rx) = ClientTracker::new(
        LeasePolicy { track: true, reclaim: true },
        Arc::new(Metrics::new()),
        policy.clone(),
    );
    let own = Arc::get_mut(&mut t).expect("not shared yet");
    own.timeout = timeout;
    own.read_delay = read_delay;
    (t, policy, rx)
}

/// One worker: were the read on it, the ticker would stop. The read takes
/// 5 s, far longer than the 300 ms the callers wait: what is asserted is
/// order (they return while it is still under way), not time.
#[tokio::test(flavor = "current_thread")]
async fn a_slow_tenant_read_holds_no_worker_and_ends_in_an_error() {
    let (t, _, _rx) = checking_tracker(Duration::from_millis(300), Duration::from_secs(5));
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (a, _b) = UnixStream::pair().unwrap();
    let (c, _d) = UnixStream::pair().unwrap();
    // Two connections of one process at once: one read, both wait for it.
    let (ra, rc) = tokio::join!(t.who_async(a.as_fd()), t.who_async(c.as_fd()));
    assert_eq!((ra.unwrap_err(), rc.unwrap_err()), (IdentifyError::TimedOut, IdentifyError::TimedOut));
    assert!(!t.table.lock().unwrap().reading.is_empty(), "they waited for the read to end");
    assert!(ticks.load(Ordering::Relaxed) >= 1, "the worker served other tasks meanwhile");
    assert!(IdentifyError::TimedOut.to_string().contains("try again"));
    // Asking again joins the read still under way; once it is done, the lease is there.
    let again = t.who_async(a.as_fd()).await;
    assert_eq!(again.unwrap_err(), IdentifyError::TimedOut);
    assert_eq!(t.metrics.leases.tenant_reads_slow.get(), 1, "one read ran long, counted once");
    let deadline = std::time::Instant::now() + Duration::from_secs(60); // bounds a hang only
    let client = loop {
        match t.who_async(a.as_fd()).await {
            Ok(client) => break client,
            Err(e) => assert!(std::time::Instant::now() < deadline, "never read: {e}"),
        }
    };
    assert!(client.tenant.is_some() && client.lease.is_some());
    assert_eq!(t.reads.load(Ordering::Relaxed), 1, "one read for the process");
    assert!(t.table.lock().unwrap().reading.is_empty(), "nothing left behind");
    ticker.abort();
}

/// A child that connects to `path`, holds a loopback TCP connection and
/// prints its accepted socket's ends, then waits for its stdin to close.
fn flow_holder(path: &std::path::Path) -> std::process::Child {
    let script = format!(
        "import socket,sys\n\
         u=socket.socket(socket.AF_UNIX); u.connect({path:?})\n\
         l=socket.socket(); l.bind(('127.0.0.1',0)); l.listen(1)\n\
         c=socket.create_connection(l.getsockname()); s,p=l.accept()\n\
         print('%d %d' % (s.getsockname()[1], p[1]), flush=True)\n\
         sys.stdin.read()",
        path = path.display().to_string()
    );
    python(&script)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_check_sockets_of_a_process_close_when_its_lease_ends() {
    use std::io::BufRead;
    let (t, policy, mut exits) = checking_tracker(Duration::from_secs(5), Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut child = flow_holder(&path);
    let (conn, _) = listener.accept().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let ports: Vec<u16> = line.split_whitespace().map(|p| p.parse().unwrap()).collect();
    let client = t.who_async(conn.as_fd()).await.unwrap();
    let net = client.tenant.as_ref().and_then(|tn| tn.net.as_ref()).expect("its network namespace");
    assert_eq!(net.idle_diag(), 0, "no socket before the first flow check");
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], ports[0]));
    let remote = std::net::SocketAddr::from(([127, 0, 0, 1], ports[1]));
    let flow = crate::types::flow::FlowSpec { src: remote, dst: local };
    let check = || {
        let e = policy.examine(&client, flow, true);
        policy.check_flow("rule_manager", &client, &e)
    };
    for _ in 0..3 {
        assert_eq!(check(), Ok(()));
    }
    assert_eq!(net.idle_diag(), 1, "one socket, used three times");
    drop(child.stdin.take());
    child.wait().unwrap();
    tokio::time::timeout(Duration::from_secs(5), exits.recv()).await.unwrap().unwrap();
    assert_eq!(net.idle_diag(), 0, "closed when the process's lease ended");
    // A check still under way then opens one for itself and closes it after.
    let _ = check();
    assert_eq!(net.idle_diag(), 0);
}

#[test]
fn pidfds_live_on_pidfs_exactly_from_linux_6_9() {
    assert_eq!(on_pidfs(), kernel_version() >= (6, 9), "kernel {:?}", kernel_version());
}

/// A child that connects to `path`, then, as `then` says, stays (`stay`),
/// exits at once (`exit`), or hands its end to the kernel in flight over
/// another connection and closes its own (`pass`); then it waits for its
/// stdin to close.
fn opener(path: &std::path::Path, then: &str) -> std::process::Child {
    let script = format!(
        "import socket,sys,os\n\
         s=socket.socket(socket.AF_UNIX); s.connect({path:?})\n\
         if {then:?} == 'exit': os._exit(0)\n\
         if {then:?} == 'pass':\n\
         \x20   b=socket.socket(socket.AF_UNIX); b.connect({path:?}); socket.send_fds(b, [b'x'], [s.fileno()]); s.close()\n\
         print('ready', flush=True)\n\
         sys.stdin.read()",
        path = path.display().to_string()
    );
    python(&script)
}

fn wait_ready(child: &mut std::process::Child) {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
}

#[tokio::test]
async fn a_connection_whose_opener_exited_is_nobodys() {
    for before_6_5 in [false, true] {
        let (t, _rx) = tracker(true, true);
        t.no_peer_pidfd.store(before_6_5, Ordering::Relaxed);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut child = opener(&path, "exit");
        let (conn, _) = listener.accept().unwrap();
        child.wait().unwrap(); // exited and reaped
        assert!(t.identify(conn.as_fd()).unwrap().is_none(), "before 6.5: {before_6_5}");
        let c = t.who(conn.as_fd()).unwrap();
        assert!(c.opener_exited && c.pid.is_none() && c.lease.is_none() && c.process.is_none());
        assert_eq!(t.watches_started(), 0);
    }
}

#[tokio::test]
async fn before_linux_6_5_the_process_at_the_pid_must_hold_the_connection() {
    let (t, _rx) = tracker(true, true);
    t.no_peer_pidfd.store(true, Ordering::Relaxed);
    // This process holds both ends of a pair: it is the client, once.
    let (a, _b) = UnixStream::pair().unwrap();
    let lease = t.identify(a.as_fd()).unwrap().expect("this process holds the connection");
    assert_eq!(lease.pid.map(|p| p.get()), Some(std::process::id()));
    let (c, _d) = UnixStream::pair().unwrap();
    assert_eq!(t.identify(c.as_fd()).unwrap().map(|l| l.id), Some(lease.id), "same process, same lease");
    // A live opener that gave its end away holds nothing: nobody is the client.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut child = opener(&path, "pass");
    let (conn, _) = listener.accept().unwrap();
    let (_carrier, _) = listener.accept().unwrap();
    wait_ready(&mut child);
    assert!(t.who(conn.as_fd()).unwrap().opener_exited, "the process at the pid does not hold it");
    // With SO_PEERPIDFD the opener is its client while it lives, wherever its end went.
    if kernel_has_peer_pidfd() {
        t.no_peer_pidfd.store(false, Ordering::Relaxed);
        let l = t.identify(conn.as_fd()).unwrap().expect("the opener, alive");
        assert_eq!(l.pid.map(|p| p.get()), Some(child.id()));
    }
    drop(child.stdin.take());
    child.wait().unwrap();
}

#[test]
fn a_lease_found_by_pid_is_the_process_only_while_neither_is_reaped() {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pidfd = Pidfd::open(child.id()).unwrap();
    let id = NonZeroU32::new(1).unwrap();
    let lease =
        Lease::new(id, NonZeroU32::new(child.id()), ProcKey::Pid(child.id()), None, pidfd.try_clone().ok());
    let again = Pidfd::open(child.id()).unwrap();
    assert!(same_process(&lease, &again));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!same_process(&lease, &again), "reaped: its pid may name anybody");
    let unique = Lease::new(id, None, ProcKey::Unique(1), None, pidfd.try_clone().ok());
    assert!(!same_process(&unique, &pidfd));
    // A lease by pid is its process's on every connection; a unique one is one connection's.
    assert!(lease.names_process());
    assert!(!unique.names_process());
}

/// A process known by a thread is that thread's answer for a connection of
/// its pid only when the connection was queued after the process was first
/// known (and only while the process runs, as the kernel says at that
/// moment); otherwise the opener's pidfd decides.
#[tokio::test]
async fn a_known_pid_answers_only_for_connections_queued_after_it_was_known() {
    let (t, _rx) = tracker(true, true);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut child = opener(&path, "stay");
    wait_ready(&mut child);
    let before = Instant::now();
    let (conn, _) = listener.accept().unwrap();
    let mut cache = ClientCache::default();
    let pid = child.id();
    let first = match t.ask(conn.as_fd(), &mut cache, std::task::Waker::noop()) {
        Asked::Now(Ok(c)) => c,
        _ => panic!("the child is known at once (isolation off)"),
    };
    assert_eq!(first.pid.map(|p| p.get()), Some(pid));
    assert!(cache.by_pid_since(pid, before).is_none(), "queued before the process was known: not by pid");
    let later = cache.by_pid_since(pid, Instant::now()).expect("queued after: the known process");
    assert_eq!(later.lease.as_ref().map(|l| l.id()), first.lease.as_ref().map(|l| l.id()));
    assert!(cache.by_pid_since(std::process::id(), Instant::now()).is_none(), "another pid is not known");
    // Exited: the kernel says so at once, whatever the exit watcher has seen yet.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(cache.by_pid_since(pid, Instant::now()).is_none());
    assert!(!cache.by_pid.contains_key(&pid), "forgotten once its process has exited");
}

/// `python3 -c script` with its stdin and stdout piped to the test.
fn python(script: &str) -> std::process::Child {
    Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}
