//! The HTTP server's parsing, and its bounds over real sockets.

use super::*;

#[test]
fn debug_access_by_peer() {
    let lo: SocketAddr = "127.0.0.1:5".parse().unwrap();
    let lo6: SocketAddr = "[::1]:5".parse().unwrap();
    let mapped: SocketAddr = "[::ffff:127.0.0.2]:5".parse().unwrap();
    let remote: SocketAddr = "10.0.0.3:5".parse().unwrap();
    for p in [lo, lo6, mapped] {
        assert!(DebugAccess::Local.allows(p), "{p}");
    }
    assert!(!DebugAccess::Local.allows(remote));
    assert!(DebugAccess::All.allows(remote));
    assert!(!DebugAccess::Off.allows(lo));
}

#[test]
fn query_params() {
    let peer = "127.0.0.1:1".parse().unwrap();
    let r = Request::new("/debug/flows?a=1&nic=eth2&b&nic=eth3", peer);
    assert_eq!(r.path, "/debug/flows");
    assert_eq!(r.param("nic").as_deref(), Some("eth2"));
    assert_eq!(r.param("b").as_deref(), Some(""));
    assert_eq!(r.param("c"), None);
    // Escapes decode, in names and values; a broken one stays as sent.
    let r = Request::new("/debug/flows?n%69c=eth%2D1%zz%4", peer);
    assert_eq!(r.param("nic").as_deref(), Some("eth-1%zz%4"));
    assert_eq!(Request::new("/debug/flows?nic=%FF", peer).param("nic").as_deref(), Some("\u{FFFD}"));
    assert_eq!(Request::new("/metrics", peer).query, "");
}

#[test]
fn the_request_line_gives_method_and_target() {
    assert_eq!(request_line(b"GET /a?b HTTP/1.1\r\nHost: x\r\n\r\n"), ("GET".into(), "/a?b".into()));
    assert_eq!(request_line(b"POST /x\r\n\r\n"), ("POST".into(), "/x".into()));
    assert_eq!(request_line(b"\r\n\r\n"), (String::new(), String::new()));
}

#[test]
fn the_reasons_are_the_metric_labels() {
    let all = [TurnedAway::Evicted, TurnedAway::Busy];
    assert_eq!(all.map(TurnedAway::name), crate::metrics::HTTP_TURNED_AWAY);
}

/// Routes for the tests: the probes and `/metrics` answer at once, `/slow`
/// holds its request slot until the test releases it.
struct TestRoutes {
    release: Semaphore,
    slow_started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    turned: std::sync::Mutex<Vec<TurnedAway>>,
}

impl Handler for TestRoutes {
    async fn get(&self, req: &Request) -> Response {
        match req.path.as_str() {
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => Response::text(200, "ready\n"),
            "/metrics" => Response::text(200, "up 1\n"),
            // A body without end, produced as fast as it is taken.
            "/endless" => {
                let _ = self.slow_started.lock().unwrap().send(());
                let (tx, rx) = mpsc::channel(2);
                tokio::spawn(async move { while tx.send(vec![b'x'; 64 << 10]).await.is_ok() {} });
                Response::json_stream(rx)
            }
            "/slow" => {
                let _ = self.slow_started.lock().unwrap().send(());
                let _ = self.release.acquire().await.map(|p| p.forget());
                Response::text(200, "slow\n")
            }
            _ => Response::text(404, "not found\n"),
        }
    }

    fn turned_away(&self, why: TurnedAway) {
        self.turned.lock().unwrap().push(why);
    }
}

/// `serve` on a loopback port of its own runtime; stops when dropped.
struct Server {
    addr: SocketAddr,
    routes: Arc<TestRoutes>,
    slow_started: std::sync::mpsc::Receiver<()>,
    /// Held so that the server does not stop before the test ends.
    _stop: watch::Sender<bool>,
    _runtime: tokio::runtime::Runtime,
}

/// Hang guard for every blocking read and wait of these tests.
const GUARD: Duration = Duration::from_secs(10);

impl Server {
    fn start(limits: Limits) -> Server {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let std = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std.set_nonblocking(true).unwrap();
        let addr = std.local_addr().unwrap();
        let (tx, slow_started) = std::sync::mpsc::channel();
        let routes = Arc::new(TestRoutes {
            release: Semaphore::new(0),
            slow_started: std::sync::Mutex::new(tx),
            turned: Default::default(),
        });
        let listener = {
            let _in = runtime.enter();
            TcpListener::from_std(std).unwrap()
        };
        let (stop, stopped) = watch::channel(false);
        runtime.spawn(serve(listener, routes.clone(), limits, stopped));
        Server { addr, routes, slow_started, _stop: stop, _runtime: runtime }
    }

    fn idle(&self, n: usize) -> Vec<std::net::TcpStream> {
        (0..n).map(|_| std::net::TcpStream::connect(self.addr).unwrap()).collect()
    }

    fn turned(&self, why: TurnedAway) -> usize {
        self.routes.turned.lock().unwrap().iter().filter(|&&w| w == why).count()
    }
}

/// Sends `request` on `s` and reads to the end: the status, or 0 when the
/// connection was closed without a reply.
fn exchange(mut s: std::net::TcpStream, request: &[u8]) -> u16 {
    use std::io::{Read, Write};
    s.set_read_timeout(Some(GUARD)).unwrap();
    s.write_all(request).unwrap();
    let mut resp = Vec::new();
    match s.read_to_end(&mut resp) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return 0,
        Err(e) => panic!("no reply within {GUARD:?}: {e}"),
    }
    let resp = String::from_utf8_lossy(&resp);
    resp.get(9..12).map_or(0, |code| code.parse().unwrap())
}

fn get_on(s: std::net::TcpStream, path: &str) -> u16 {
    exchange(s, format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
}

fn get(addr: SocketAddr, path: &str) -> u16 {
    get_on(std::net::TcpStream::connect(addr).unwrap(), path)
}

/// Whether the server closed `s` without sending a byte.
fn closed_unanswered(s: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(GUARD)).unwrap();
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Ok(_) => false,
        Err(e) => panic!("still open after {GUARD:?}: {e}"),
    }
}

/// Long enough that no connection of these tests is dropped for idling:
/// what makes room is eviction.
fn no_timeout(limits: Limits) -> Limits {
    Limits { header_timeout: Duration::from_secs(600), ..limits }
}

#[test]
fn probes_are_answered_while_idle_connections_outnumber_the_places() {
    let srv = Server::start(no_timeout(Limits::new(64)));
    let mut idle = srv.idle(80);
    let healthz: Vec<u16> = (0..12).map(|_| get(srv.addr, "/healthz")).collect();
    assert_eq!(healthz, [200; 12]);
    let readyz: Vec<u16> = (0..12).map(|_| get(srv.addr, "/readyz")).collect();
    assert_eq!(readyz, [200; 12]);
    // Connections waiting for their head hold no request slot.
    assert_eq!(get(srv.addr, "/metrics"), 200);
    // The 16 oldest made room for the rest; later ones only as probes came
    // while every place was held (at least the first probe).
    for (i, s) in idle.iter_mut().take(16).enumerate() {
        assert!(closed_unanswered(s), "idle connection {i} kept");
    }
    assert!(srv.turned(TurnedAway::Evicted) >= 17, "evicted: {}", srv.turned(TurnedAway::Evicted));
    // The newest idle connection still waits, and is served when it asks.
    assert_eq!(get_on(idle.pop().unwrap(), "/healthz"), 200);
}

#[test]
fn the_oldest_connection_waiting_for_its_head_is_evicted() {
    let srv = Server::start(no_timeout(Limits { max_waiting: 4, ..Limits::new(4) }));
    let mut first = srv.idle(4);
    let mut newer = srv.idle(1);
    assert!(closed_unanswered(&mut first[0]));
    newer.extend(srv.idle(1));
    assert!(closed_unanswered(&mut first[1]));
    assert_eq!(srv.turned(TurnedAway::Evicted), 2);
    // The others kept their places: each is answered.
    for s in first.drain(2..).chain(newer) {
        assert_eq!(get_on(s, "/healthz"), 200);
    }
}

#[test]
fn other_paths_need_a_free_slot_and_are_told_503_at_once_without_one() {
    let srv = Server::start(no_timeout(Limits { max_waiting: 8, ..Limits::new(2) }));
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let addr = srv.addr;
            std::thread::spawn(move || get(addr, "/slow"))
        })
        .collect();
    for _ in 0..2 {
        srv.slow_started.recv_timeout(GUARD).expect("a /slow request in its slot");
    }
    assert_eq!(get(srv.addr, "/metrics"), 503);
    assert_eq!(srv.turned(TurnedAway::Busy), 1);
    // No slot is needed for a probe, nor to be told what is wrong.
    assert_eq!(get(srv.addr, "/healthz"), 200);
    assert_eq!(get(srv.addr, "/readyz"), 200);
    let post = std::net::TcpStream::connect(srv.addr).unwrap();
    assert_eq!(exchange(post, b"POST /metrics HTTP/1.1\r\n\r\n"), 405);
    let large = std::net::TcpStream::connect(srv.addr).unwrap();
    assert_eq!(exchange(large, format!("GET /{}", "a".repeat(MAX_REQUEST + 3)).as_bytes()), 431);
    srv.routes.release.add_permits(2);
    for s in slow {
        assert_eq!(s.join().unwrap(), 200);
    }
    // A slot is given back just after its reply ends: wait for one.
    let deadline = std::time::Instant::now() + GUARD;
    while get(srv.addr, "/metrics") != 200 {
        assert!(std::time::Instant::now() < deadline, "no slot given back");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_connection_that_sends_no_head_is_still_dropped_at_the_header_timeout() {
    let limits = Limits { header_timeout: Duration::from_millis(200), ..Limits::new(4) };
    let srv = Server::start(limits);
    let mut idle = srv.idle(1);
    assert!(closed_unanswered(&mut idle[0]));
    assert_eq!(srv.turned(TurnedAway::Evicted), 0);
}

#[test]
fn a_peer_that_stops_reading_is_cut_off_and_its_slot_given_back() {
    // One request slot, and a short write limit in place of the 10 s.
    let limits = Limits { write_timeout: Duration::from_millis(200), ..no_timeout(Limits::new(1)) };
    let srv = Server::start(limits);
    // Asks for a body without end and never reads it: the socket buffers
    // fill, and the server's next write waits on the peer.
    let mut stalled = std::net::TcpStream::connect(srv.addr).unwrap();
    std::io::Write::write_all(&mut stalled, b"GET /endless HTTP/1.1\r\n\r\n").unwrap();
    srv.slow_started.recv_timeout(GUARD).expect("/endless in its slot");
    // Only a cut-off gives the one slot back: /metrics is 503 until then.
    let deadline = std::time::Instant::now() + GUARD;
    let mut busy = 0;
    while get(srv.addr, "/metrics") != 200 {
        busy += 1;
        assert!(std::time::Instant::now() < deadline, "the stalled reader kept its slot");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(busy > 0, "the slot was free while the body was being sent");
    assert_eq!(srv.turned(TurnedAway::Busy), busy);
    // What it was sent ends there: the connection is closed.
    stalled.set_read_timeout(Some(GUARD)).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    loop {
        match std::io::Read::read(&mut stalled, &mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("still open after {GUARD:?}: {e}"),
        }
    }
}
