//! Black-box tests against hostile clients, scarce resources and careless
//! settings: the real binary on simulated NICs.

mod common;

use std::io::Read;
use std::time::Duration;

use common::netns::{veth_topology, Netns};
use common::*;
use nix::errno::Errno;
use tcpx_rxdm::wire::client::{self, status_code};
use tcpx_rxdm::wire::frame;

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

/// With the daemon's umask 077, a socket folder it creates still lets the
/// `--socket_group` in (mode 0750, that group), and nobody else.
#[test]
#[ignore = "needs root: setuid to a test user, chown to a test group"]
fn socket_group_member_reaches_sockets_in_a_folder_the_daemon_created() {
    require_root("setuid to a test user, chown to a test group");
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
    assert_eq!(connect_as(UID, GID, &sock, &query), Ok(()), "member of the socket group not served");
    assert_eq!(
        connect_as(UID, GID + 1, &sock, &query),
        Err(Errno::EACCES),
        "non-member not refused with EACCES"
    );
    drop(d);
}

/// An existing folder that keeps the socket group out is left alone, with a warning.
#[test]
fn existing_folder_that_keeps_the_group_out_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let d = Daemon::start(&[&format!("--uds_path={}", tmp.path().display())]);
    d.wait_for_log("cannot reach the sockets", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no warning; log:\n{}", d.log().join("\n")));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(tmp.path()).unwrap().mode() & 0o7777, 0o700, "left as it was");
    // A reachable folder gets no warning.
    let ok = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ok.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
    let d = Daemon::start(&[&format!("--uds_path={}", ok.path().display())]);
    assert!(!d.log().iter().any(|l| l.contains("cannot reach the sockets")), "{}", d.log().join("\n"));
}

/// Two daemons in one network namespace never manage the same NIC, whatever
/// their socket folders, and deleting the lock file does not let a second in.
#[test]
fn second_daemon_on_claimed_nics_exits_one_naming_nic_and_holder() {
    let first = Daemon::start(&["--claim_sim_nics"]);
    let other = tempfile::tempdir().unwrap();
    let run_second = |uds: &std::path::Path| {
        run_to_exit(&[
            "--gpu_nic_preset=sim",
            "--claim_sim_nics",
            &format!("--uds_path={}", uds.display()),
            "--metrics_address=",
        ])
    };
    let (code, err) = run_second(other.path());
    assert_eq!(code, 1, "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("NIC eth1") && last.contains(&format!("pid {}", first.child.id())), "{err}");
    // Refused before it touched anything: nothing primed, no sockets.
    assert!(!err.contains("NICs primed"), "{err}");
    assert!(std::fs::read_dir(other.path()).unwrap().next().is_none(), "files left in the second folder");

    // The same folder with the lock file deleted: the claim still refuses.
    std::fs::remove_file(first.sock(".rxdm.lock")).unwrap();
    let (code, err) = run_second(first.dir.path());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("NIC eth1") && err.contains("already managed"), "{err}");
    // The first daemon was not disturbed.
    let mut c = first.client("rx_rule_manager");
    let r = c.request(&client::rule_request(1, ("10.0.0.9", 1), ("192.168.1.2", 2), None, None)).unwrap();
    assert_eq!(client::raw_bytes(&r), Some(&b"Ok."[..]));
    assert_eq!(first.flows()["nics"][0]["rules"].as_array().unwrap().len(), 1);

    // Once the first is gone, the NICs are free.
    drop(first);
    let second = Daemon::start(&["--claim_sim_nics", &format!("--uds_path={}", other.path().display())]);
    drop(second);
}

/// Without --claim_sim_nics, simulated daemons run side by side (they share no hardware).
#[test]
fn simulated_nics_are_not_claimed_by_default() {
    let a = Daemon::start(&[]);
    let b = Daemon::start(&[]);
    for d in [&a, &b] {
        assert_eq!(
            status_code(&d.client("queue_ids_by_gpu").request(&client::queue_query(GPU0)).unwrap()),
            0
        );
    }
}

/// Real NICs are claimed with the ethtool backend: in a fresh network
/// namespace holding `eth1`, a claim held by this test process makes the
/// daemon exit 1 naming eth1 and this pid before priming.
#[test]
#[ignore = "needs root: network namespaces, veth"]
fn ethtool_daemon_refuses_a_claimed_nic_in_its_netns() {
    let ns = Netns::with_veth("claim");
    // The claim socket belongs to the namespace it was created in.
    let claim = ns.run(|| tcpx_rxdm::nic::NicClaim::acquire("nic", "eth1").unwrap());
    let uds = tempfile::tempdir().unwrap();
    let daemon = || {
        let out = ns
            .bin()
            .args(["--gpu_nic_preset=manual", "--nic_backend=ethtool"])
            .arg(format!("--gpu_nic_topology_proto={}", veth_topology("eth1", Some("0000:06:00.0"))))
            .args(["--gpu_backend=host", "--bind_backend=none", "--metrics_address=", "--setup_param="])
            .arg(format!("--uds_path={}", uds.path().display()))
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = daemon();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("NIC eth1") && err.contains(&format!("pid {}", std::process::id())), "{err}");
    assert!(!err.contains("rule_capacity"), "primed before claiming: {err}");
    // Released: the daemon now gets past the claim (and fails on the veth's
    // missing ntuple support, as veths do).
    drop(claim);
    let (code, err) = daemon();
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains("already managed"), "{err}");
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Raises this test process's soft fd limit to its hard limit.
fn raise_own_nofile() -> u64 {
    tcpx_rxdm::endpoint::accept_backoff::raise_nofile_limit().unwrap().1
}

/// 3000 idle TCP connections cost the daemon at most its places for
/// connections waiting for their head in fds: each new one evicts the oldest
/// waiting, closed without a reply. /healthz and /metrics answer meanwhile,
/// Unix-socket clients are served, and the ones left are dropped after the
/// header timeout.
#[test]
fn idle_http_flood_is_capped_and_does_not_starve_probes_or_unix_clients() {
    use std::io::Write;
    assert!(raise_own_nofile() >= 3200, "this test needs an fd limit of 3200");
    let d = Daemon::start(&["--max_http_connections=64"]);
    let pid = d.child.id();
    let addr = d.http();
    // What a client process costs while it lives (its pidfd watch, its
    // network namespace and the threads' lookup sockets for it, kept for the
    // tenant checks) is taken before the baseline: this test is about HTTP.
    let warm = client::rule_request(1, ("10.1.0.2", 3), ("192.168.1.2", 2), Some(GPU0), None);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&warm)), OK_FRAME);
    let mut c = d.client("queue_ids_by_gpu");
    assert_eq!(status_code(&c.request(&client::queue_query(GPU0)).unwrap()), 0);
    drop(c);
    let baseline = fd_count(pid);
    let mut flood = Vec::new();
    for i in 0..3000 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        if i % 2 == 0 {
            s.write_all(b"GET /metr").unwrap(); // half-sent
        }
        flood.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let during = fd_count(pid);
    assert!(during <= baseline + 64 + 8, "fds: baseline {baseline}, with 3000 idle connections {during}");
    // The probes and /metrics are answered during the flood: a connection
    // waiting for its head holds no request slot, and a new one finds a place.
    for _ in 0..12 {
        assert_eq!(d.http_get("/healthz"), (200, "ok\n".to_string()));
    }
    assert_eq!(d.http_get("/readyz").0, 200);
    let (code, metrics) = d.http_get("/metrics");
    assert_eq!(code, 200);
    let evicted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"tcpx_rxdm_http_turned_away_total{reason="evicted"} "#))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no evicted count in /metrics"));
    assert!(evicted >= 3000 - 64, "evicted: {evicted}");
    // A Unix-socket client is served meanwhile.
    let mut c = d.client("queue_ids_by_gpu");
    assert_eq!(status_code(&c.request(&client::queue_query(GPU0)).unwrap()), 0);
    let ok = client::rule_request(1, ("10.1.0.2", 1), ("192.168.1.2", 2), Some(GPU0), None);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&ok)), OK_FRAME);
    // Older connections were closed without a reply, without waiting for the
    // header timeout. (A half-sent request racing the close may see a reset.)
    for s in flood.iter_mut().skip(100).take(50) {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut resp = String::new();
        match s.read_to_string(&mut resp) {
            Ok(_) if resp.is_empty() => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("an old idle connection was not closed unanswered: {other:?} {resp:?}"),
        }
    }
    // After the header timeout (5 s) the newest, still waiting, are dropped too.
    std::thread::sleep(Duration::from_secs(6));
    let mut last = flood.pop().unwrap();
    last.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut rest = Vec::new();
    assert_eq!(last.read_to_end(&mut rest).unwrap_or(0), 0, "idle connection not closed: {rest:?}");
    drop(flood);
    std::thread::sleep(Duration::from_millis(300));
    assert!(fd_count(pid) <= baseline + 2, "fds not given back: {} vs {baseline}", fd_count(pid));
}

/// /debug/* is for loopback peers by default and can be turned off;
/// /metrics, /healthz and /readyz stay open.
#[test]
fn debug_endpoints_flag() {
    let d = Daemon::start(&[]);
    assert_eq!(d.http_get("/debug/config").0, 200);
    assert_eq!(d.http_get("/debug/flows").0, 200);
    let d = Daemon::start(&["--debug_endpoints=off"]);
    assert_eq!(d.http_get("/debug/flows").0, 404);
    assert_eq!(d.http_get("/debug/config").0, 404);
    for p in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(d.http_get(p).0, 200, "{p}");
    }
    for (bad, flag) in [
        ("--debug_endpoints=some", "--debug_endpoints"),
        ("--max_http_connections=0", "--max_http_connections"),
        ("--client_idle_timeout=-1", "--client_idle_timeout"),
        ("--claim_sim_nics=maybe", "--claim_sim_nics"),
    ] {
        let (code, err) = run_to_exit(&["--gpu_nic_preset=sim", "--metrics_address=", bad]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(flag), "{bad}: {err}");
    }
}

/// GET from a given local source address; returns the status.
fn get_from(src: std::net::IpAddr, to: std::net::SocketAddr, path: &str) -> u16 {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let std::net::IpAddr::V4(v4) = src else { panic!("v4 only") };
    nix::sys::socket::bind(
        std::os::fd::AsRawFd::as_raw_fd(&sock),
        &nix::sys::socket::SockaddrIn::from(std::net::SocketAddrV4::new(v4, 0)),
    )
    .unwrap();
    let std::net::SocketAddr::V4(to4) = to else { panic!("v4 only") };
    nix::sys::socket::connect(
        std::os::fd::AsRawFd::as_raw_fd(&sock),
        &nix::sys::socket::SockaddrIn::from(to4),
    )
    .unwrap();
    http_get_on(std::net::TcpStream::from(sock), path).0
}

/// /debug/* refuses a non-loopback peer (403) unless --debug_endpoints=all;
/// /metrics, /healthz, /readyz stay open to it.
#[test]
#[ignore = "needs root: network namespaces, veth"]
fn debug_endpoints_refuse_non_loopback_peers() {
    let ns = Netns::new("debug");
    ns.add_veth("veth0", "veth1", None);
    ns.ip(&["addr", "add", "10.213.0.1/24", "dev", "veth0"]);
    ns.ip(&["addr", "add", "10.213.0.2/24", "dev", "veth1"]);
    let remote: std::net::IpAddr = "10.213.0.2".parse().unwrap();
    let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    for (flag, remote_debug) in [("--debug_endpoints=local", 403), ("--debug_endpoints=all", 200)] {
        let (statuses, d) = ns.run(|| {
            let d = Daemon::start(&["--metrics_address=0.0.0.0:0", flag]);
            let port = d.http().port();
            let at = std::net::SocketAddr::new("10.213.0.1".parse().unwrap(), port);
            let lo = std::net::SocketAddr::new(local, port);
            let statuses = [
                get_from(remote, at, "/debug/flows"),
                get_from(remote, at, "/debug/config"),
                get_from(remote, at, "/metrics"),
                get_from(remote, at, "/healthz"),
                get_from(remote, at, "/readyz"),
                get_from(local, lo, "/debug/flows"),
            ];
            (statuses, d)
        });
        assert_eq!(statuses, [remote_debug, remote_debug, 200, 200, 200, 200], "{flag}");
        drop(d);
    }
}

/// Installs `n` rules toward `dst` (one connection, sequential); source ports from `base`.
fn install_many(d: &Daemon, dst: &str, base: u32, n: u32) {
    let mut c = d.client("rx_rule_manager");
    for i in 0..n {
        let sport = 1024 + (base + i) % 60000;
        let src = format!("10.{}.{}.9", (base + i) / 60000 % 250, 1 + (base + i) / 15_000_000);
        let r = c
            .request(&client::rule_request(1, (src.as_str(), sport as i32), (dst, 5000), None, None))
            .unwrap();
        assert_eq!(client::raw_bytes(&r), Some(&b"Ok."[..]), "rule {i}: {r:?}");
    }
}

/// The HTTP port takes GET only: any other method on any route is told 405
/// and changes nothing (the rule table is as it was); a request head over
/// 8 KiB is told 431.
#[test]
fn only_get_is_served_and_a_large_head_is_refused() {
    use std::io::Write;
    let d = Daemon::start(&[]);
    install_many(&d, "192.168.1.2", 0, 3);
    let before = d.flows();
    assert_eq!(before["nics"][0]["rules"].as_array().map(Vec::len), Some(3), "{before}");
    let send = |raw: &[u8]| {
        let mut s = std::net::TcpStream::connect(d.http()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        for path in ["/debug/flows", "/debug/config", "/metrics", "/healthz", "/readyz"] {
            let out = send(
                format!("{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}").as_bytes(),
            );
            assert!(out.starts_with("HTTP/1.1 405 "), "{method} {path}: {out}");
        }
    }
    assert_eq!(d.flows(), before, "a refused method changed the rule table");
    let huge = format!("GET /metrics HTTP/1.1\r\nX-Filler: {}\r\n\r\n", "a".repeat(9000));
    let out = send(huge.as_bytes());
    assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
    assert_eq!(d.http_get("/healthz").0, 200);
}

/// `/debug/flows?nic=` filters; 30 requests that never read their responses
/// neither grow the daemon's memory past 256 MiB nor stop installs.
#[test]
fn debug_flows_filters_by_nic_and_non_readers_cost_bounded_memory() {
    let d = Daemon::start(&[]);
    install_many(&d, "192.168.1.2", 0, 20_000);
    install_many(&d, "192.168.2.2", 0, 300);
    let all = d.flows();
    let nics = all["nics"].as_array().unwrap();
    assert_eq!(nics.len(), 4);
    assert_eq!(nics[0]["rules"].as_array().unwrap().len(), 20_000);
    assert_eq!(nics[0]["nic_rules"].as_array().unwrap().len(), 20_000);
    assert_eq!(nics[1]["rules"].as_array().unwrap().len(), 300);
    let (status, body) = d.http_get("/debug/flows?nic=eth2");
    assert_eq!(status, 200);
    let one: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(one["nics"].as_array().unwrap().len(), 1);
    assert_eq!(one["nics"][0]["ifname"], "eth2");
    assert_eq!(one["nics"][0], nics[1]);
    assert_eq!(d.http_get("/debug/flows?nic=eth9").0, 404);

    let pid = d.child.id();
    let before = rss_kib(pid);
    let mut stuck = Vec::new();
    for _ in 0..30 {
        use std::io::Write;
        let s = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &4096).unwrap();
        let std::net::SocketAddr::V4(a) = d.http() else { panic!() };
        nix::sys::socket::connect(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            &nix::sys::socket::SockaddrIn::from(a),
        )
        .unwrap();
        let mut s = std::net::TcpStream::from(s);
        s.write_all(b"GET /debug/flows HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        stuck.push(s);
    }
    // Installs go on while the 30 responses are stuck.
    install_many(&d, "192.168.1.2", 20_000, 500);
    std::thread::sleep(Duration::from_secs(1));
    let peak = rss_kib(pid);
    // Each full body is about 5 MiB here: 30 of them held in memory would add 150 MiB.
    assert!(
        peak < 256 * 1024 && peak < before + 64 * 1024,
        "RSS {before} KiB before, {peak} KiB with 30 unread /debug/flows"
    );
    // Queued ones gave up with 503 or wait; a fresh reader after they are gone is served in full.
    drop(stuck);
    std::thread::sleep(Duration::from_millis(200));
    let after = d.flows();
    assert_eq!(after["nics"][0]["rules"].as_array().unwrap().len(), 20_500);
    eprintln!("RSS {before} KiB before, {peak} KiB with 30 unread /debug/flows");
}

/// Out of file descriptors (soft = hard = 128): accepting backs off with a
/// few log lines, /healthz still answers, and service resumes by itself
/// once clients leave.
#[test]
fn fd_exhaustion_backs_off_keeps_healthz_and_recovers() {
    let d = Daemon::start_with_nofile(&[], 128);
    let pid = d.child.id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(limits.lines().any(|l| l.starts_with("Max open files") && l.contains(" 128 ")), "{limits}");
    let base = fd_count(pid);
    assert!(base < 100, "baseline {base} fds leaves no room for the test");
    let mut clients = Vec::new();
    for _ in 0..150 {
        clients.push(std::os::unix::net::UnixStream::connect(d.sock("queue_ids_by_gpu")).unwrap());
    }
    d.wait_for_log("out of file descriptors", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no EMFILE log; fds {}; log:\n{}", fd_count(pid), d.log().join("\n")));
    // Every fd is taken: /healthz is answered from the reserved one.
    assert!(fd_count(pid) >= 127, "fds {} of 128", fd_count(pid));
    for _ in 0..3 {
        assert_eq!(d.http_get("/healthz"), (200, "ok\n".to_string()));
    }
    std::thread::sleep(Duration::from_secs(1));
    // Backing off, not spinning: a handful of lines, not thousands.
    let lines = d.log().iter().filter(|l| l.contains("out of file descriptors")).count();
    assert!(lines <= 20, "{lines} EMFILE lines");
    drop(clients);
    let mut c = d.client("queue_ids_by_gpu");
    c.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(status_code(&c.request(&client::queue_query(GPU0)).unwrap()), 0);
    d.wait_for_log("accepting connections again", Duration::from_secs(30)).expect("recovery logged");
    assert_eq!(d.http_get("/healthz"), (200, "ok\n".to_string()));
}

/// At startup the daemon raises its soft fd limit to the hard one and logs both.
#[test]
fn soft_fd_limit_is_raised_to_the_hard_limit() {
    let d = Daemon::spawn_with_nofile(&["--metrics_address="], 256, 2048).ready();
    let logged = d.log().into_iter().find(|l| l.contains("RLIMIT_NOFILE"));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.child.id())).unwrap();
    drop(d);
    let logged = logged.expect("limit logged");
    assert!(
        logged.contains("soft_before=256") && logged.contains("soft=2048") && logged.contains("hard=2048"),
        "{logged}"
    );
    let row = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    assert_eq!(row.split_whitespace().collect::<Vec<_>>()[3..5], ["2048", "2048"], "{row}");
}

/// Rule and queue connections without a complete request for
/// --client_idle_timeout are closed: silently when nothing is pending, with
/// INVALID_ARGUMENT when part of a frame is. Active ones and the registry
/// connection stay.
#[test]
fn idle_rule_connections_are_closed_registry_is_not() {
    let d = Daemon::start(&["--client_idle_timeout=1"]);
    let idle = d.client("rx_rule_manager");
    let mut partial = d.client("queue_ids_by_gpu");
    let full = encoded(&client::queue_query(GPU0));
    partial.send_bytes(&full[..3]).unwrap();
    let mut registry = d.client("rxdm_application_registry");
    assert_eq!(client::raw_bytes(&registry.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
    let mut active = d.client("queue_ids_by_gpu");
    for _ in 0..5 {
        assert_eq!(status_code(&active.request(&client::queue_query(GPU0)).unwrap()), 0);
        std::thread::sleep(Duration::from_millis(400));
    }
    // 2 s later: the idle one is closed without a reply.
    idle.stream().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    assert_eq!(idle.stream().try_clone().unwrap().read_to_end(&mut rest).unwrap(), 0);
    assert!(rest.is_empty(), "{rest:?}");
    // The half-sent one got INVALID_ARGUMENT naming the bytes, then the close.
    partial.stream().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let r = partial.recv().unwrap();
    assert_eq!(status_code(&r), 3);
    let text = r.status.unwrap().message;
    assert!(text.contains(&format!("3 of {} bytes", full.len())), "{text}");
    assert_eq!(partial.stream().try_clone().unwrap().read_to_end(&mut rest).unwrap(), 0);
    // The registry connection, silent all along, is still registered and served.
    assert!(d.http_get("/metrics").1.lines().any(|l| l.contains("registered") && l.ends_with(" 1")));
    assert_eq!(client::raw_bytes(&registry.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
}

/// A registry or pool connection that never asks for anything is closed
/// after --client_idle_timeout like any other (it would hold a share of the
/// budget for nothing); one that registered stays, silent, for good.
#[test]
fn registry_and_pool_connections_that_never_ask_are_closed() {
    let d = Daemon::start(&["--client_idle_timeout=1"]);
    let silent_registry = d.client("rxdm_application_registry");
    let silent_pool = d.client(&format!("get_gpu_fd_{GPU0}"));
    let mut registered = d.client("rxdm_application_registry");
    assert_eq!(client::raw_bytes(&registered.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
    for c in [&silent_registry, &silent_pool] {
        c.stream().set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut rest = Vec::new();
        assert_eq!(c.stream().try_clone().unwrap().read_to_end(&mut rest).unwrap(), 0, "closed, no reply");
    }
    // Well past the limit, the registration is still served.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(client::raw_bytes(&registered.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
}

/// Idle rule/queue connections filling their share of --max_connections do
/// not keep registry and pool clients out.
#[test]
fn idle_rule_connections_do_not_starve_registry_and_pools() {
    // 8 connections: 6 shared, 2 kept for registry and pool endpoints.
    // Workloads are not told apart: one workload may not hold all six
    // (tests/workloads.rs), many may.
    let d = Daemon::start(&["--max_connections=8", "--tenant_isolation=off"]);
    let mut hogs = Vec::new();
    for _ in 0..6 {
        let mut c = d.client("queue_ids_by_gpu");
        assert_eq!(status_code(&c.request(&client::queue_query(GPU0)).unwrap()), 0);
        hogs.push(c);
    }
    let mut seventh = d.client("rx_rule_manager");
    seventh.stream().set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let ok = client::rule_request(1, ("10.1.0.2", 1), ("192.168.1.2", 2), Some(GPU0), None);
    seventh.send(&ok).unwrap();
    assert!(seventh.recv().is_err(), "a rule connection got into the reserved share");
    let mut registry = d.client("rxdm_application_registry");
    registry.stream().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(client::raw_bytes(&registry.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
    let mut pool = d.client(&format!("get_gpu_fd_{GPU0}"));
    pool.stream().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    pool.send(&client::raw_request(GPU0)).unwrap();
    assert!(matches!(pool.recv_fd_reply().unwrap(), client::FdReply::Fd(_)));
    // A rule slot frees: the waiting one is served.
    drop(hogs.pop());
    seventh.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(client::raw_bytes(&seventh.recv().unwrap()), Some(&b"Ok."[..]));
}

/// Connections whose client cannot be told (here: every tenant read is
/// held, so each identification runs out) are charged together, as one
/// workload: a workload cannot dodge its share by having its connections'
/// openers exit before they are read. Once reads go on, a client that can
/// be told is served on its own share.
#[test]
fn clients_that_cannot_be_told_share_one_share() {
    let hold_dir = tempfile::tempdir().unwrap();
    let hold = hold_dir.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let env = [("TCPX_RXDM_TEST_HOLD_TENANT_READS", hold.to_str().unwrap())];
    // 8 in all: 6 registry and pool connections for one workload.
    let d = Daemon::spawn(&["--tenant_isolation=audit", "--max_connections=8"], &env).ready();
    let conns: Vec<_> = (0..7).map(|_| d.client("rxdm_application_registry")).collect();
    let refused = || metric(&d.http_get("/metrics").1, "tcpx_rxdm_connections_over_share_total");
    wait_until_or(Duration::from_secs(30), || refused() == Some(1.0), || format!("refused: {:?}", refused()));
    // Exactly one was answered, RESOURCE_EXHAUSTED saying why, then closed.
    let mut answered = Vec::new();
    for c in &conns {
        let mut s = c.stream().try_clone().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        if !got.is_empty() {
            answered.push(frame::parse(&got).unwrap().unwrap().0);
        }
    }
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(status_code(&answered[0]), 8);
    let text = answered[0].status.clone().unwrap().message;
    assert!(text.contains("could not identify") && text.contains("hold 6 registry and pool"), "{text}");
    // Reads go on: this process is told, and served on its own workload's share.
    std::fs::remove_file(&hold).unwrap();
    let mut told = d.client("rxdm_application_registry");
    told.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(client::raw_bytes(&told.request(&client::register(true)).unwrap()), Some(&b"Ok."[..]));
}
