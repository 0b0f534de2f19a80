//! The processes of the hostile section (`hostile.rs`), each this benchmark
//! started again with `--hostile-role`: a tenant of its own needs a process
//! of its own (its cgroup, its network namespace).
//!
//! - `flood`: joins a cgroup and a network namespace, then `--hostile-n`
//!   threads each send garbled IPv6 installs whose prefixes fit no
//!   connection, one connection per request, as fast as they are answered,
//!   until its stdin closes; prints the requests sent.
//! - `hold`: in a network namespace, opens `--hostile-n` sockets (loopback
//!   connections, two sockets each) and holds them until its stdin closes.
//! - `lone`: in a network namespace whose `lo` has two addresses of one /64,
//!   `--hostile-n` times: a new IPv6 connection and the NCCL plugin's
//!   garbled install and uninstall for it; prints the installs' p50 and p99.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_rxdm::wire::client::{rule_request, status_code};
use tcpx_rxdm::wire::frame;

use crate::stats::{percentile, us};

/// The two addresses of the lone client's `lo`.
pub const LONE_A: &str = "fd00:1::1";
pub const LONE_B: &str = "fd00:1::2";

/// Enters network namespace `name` (under `/run/netns`) on the calling
/// thread: the main thread, so that the process is in it.
fn enter(name: &str) {
    let ns = File::open(format!("/run/netns/{name}")).unwrap_or_else(|e| panic!("netns {name}: {e}"));
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
}

/// A small xorshift: garbage that differs per request, like the plugin's.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// `ip` (IPv6) with its last 8 bytes replaced by `junk`.
fn garbled(ip: Ipv6Addr, junk: u64) -> String {
    let mut b = ip.octets();
    b[8..].copy_from_slice(&junk.to_be_bytes());
    Ipv6Addr::from(b).to_string()
}

/// One request on a new connection; its reply's status (0: Ok).
fn ask(sock: &Path, req: &[u8]) -> Result<i32, String> {
    let mut s = UnixStream::connect(sock).map_err(|e| e.to_string())?;
    s.write_all(req).map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed without a reply".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Ok(Some((msg, _))) = frame::parse(&buf) {
            return Ok(status_code(&msg));
        }
    }
}

/// Runs `role` and exits.
pub fn run(role: &str, sock: &Path, netns: &str, cgroup: Option<&Path>, n: usize, gpu: &str) -> ! {
    if let Some(cg) = cgroup {
        std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string()).expect("join the cgroup");
    }
    enter(netns);
    match role {
        "flood" => flood(sock, n, gpu),
        "hold" => hold(n),
        "lone" => lone(sock, n, gpu),
        other => panic!("no role {other}"),
    }
    std::process::exit(0)
}

fn wait_for_stdin_close() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn flood(sock: &Path, threads: usize, gpu: &str) {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            let (stop, sent, sock, gpu) = (stop.clone(), sent.clone(), sock.to_path_buf(), gpu.to_string());
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1) << 20;
                    let (src, dst) = ("fd00:dead::".parse().unwrap(), "fd00:beef::".parse().unwrap());
                    while !stop.load(Ordering::Relaxed) {
                        let r = next(&mut x);
                        let (sport, dport) = (1024 + (r % 60_000) as i32, 1024 + ((r >> 20) % 60_000) as i32);
                        let req = rule_request(
                            5,
                            (&garbled(src, next(&mut x)), sport),
                            (&garbled(dst, next(&mut x)), dport),
                            Some(&gpu),
                            None,
                        );
                        let bytes = frame::encode(&req).expect("a rule request fits a frame");
                        if ask(&sock, &bytes).is_err() {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .expect("a flood thread")
        })
        .collect();
    println!("flooding");
    std::io::stdout().flush().unwrap();
    wait_for_stdin_close();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    println!("sent {}", sent.load(Ordering::Relaxed));
}

/// Raises `RLIMIT_NOFILE` to what `sockets` need (within the hard limit).
fn raise_nofile(sockets: usize) {
    let want = (sockets + 1000) as libc::rlim_t;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit for getrlimit to write.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let lim = libc::rlimit { rlim_cur: want.max(lim.rlim_cur), rlim_max: want.max(lim.rlim_max) };
    // SAFETY: `lim` is a valid rlimit for setrlimit to read.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        panic!("RLIMIT_NOFILE {want}: {}", std::io::Error::last_os_error());
    }
}

fn hold(sockets: usize) {
    raise_nofile(sockets);
    let mut held = Vec::with_capacity(sockets);
    // Spread over listeners, so that no address pair runs out of ports.
    let listeners: Vec<TcpListener> =
        (0..8).map(|_| TcpListener::bind("127.0.0.1:0").expect("listen")).collect();
    for (i, l) in (0..sockets / 2).zip(listeners.iter().cycle()) {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        let (s, _) = l.accept().expect("accept");
        held.push((c, s));
    }
    println!("held {}", held.len() * 2);
    std::io::stdout().flush().unwrap();
    wait_for_stdin_close();
}

fn lone(sock: &Path, n: usize, gpu: &str) {
    // The stand-in of the GPU it asks for, held as CUDA holds its device node.
    let _gpu = std::fs::OpenOptions::new().read(true).write(true).open("/dev/nvidia0");
    let (a, b): (Ipv6Addr, Ipv6Addr) = (LONE_A.parse().unwrap(), LONE_B.parse().unwrap());
    let listener = TcpListener::bind((a, 0)).expect("listen on the lone client's address");
    let dir = sock.parent().expect("the socket folder");
    let (install, uninstall) = (dir.join("rx_rule_manager"), dir.join("rx_rule_uninstall"));
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut lat = Vec::with_capacity(n);
    let mut errors = 0;
    let warm = 20;
    for i in 0..warm + n {
        let c = socket_from(b, listener.local_addr().unwrap());
        let (s, peer) = listener.accept().expect("accept");
        let local = s.local_addr().unwrap();
        let req = |x: &mut u64| {
            let src = garbled(ipv6(peer), next(x));
            let dst = garbled(ipv6(local), next(x));
            let r = rule_request(
                5,
                (&src, i32::from(peer.port())),
                (&dst, i32::from(local.port())),
                Some(gpu),
                None,
            );
            frame::encode(&r).expect("a rule request fits a frame")
        };
        let t = Instant::now();
        let ok = ask(&install, &req(&mut x)) == Ok(0);
        let took = t.elapsed();
        let removed = ask(&uninstall, &req(&mut x)) == Ok(0);
        if i >= warm {
            match ok && removed {
                true => lat.push(took),
                false => errors += 1,
            }
        }
        drop((c, s));
    }
    lat.sort_unstable();
    let p = |q| percentile(&lat, q).map(us).unwrap_or(0.0);
    println!("lone {:.1} {:.1} {errors}", p(0.5), p(0.99));
}

fn ipv6(a: SocketAddr) -> Ipv6Addr {
    match a.ip() {
        std::net::IpAddr::V6(v6) => v6,
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
    }
}

/// A connection to `to` from address `from` (any port).
fn socket_from(from: Ipv6Addr, to: SocketAddr) -> TcpStream {
    let s = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet6,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("a socket");
    let bind = nix::sys::socket::SockaddrIn6::from(std::net::SocketAddrV6::new(from, 0, 0, 0));
    nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&s), &bind).expect("bind the second address");
    let stream = TcpStream::from(s);
    let to6 = match to {
        SocketAddr::V6(v6) => nix::sys::socket::SockaddrIn6::from(v6),
        SocketAddr::V4(_) => panic!("an IPv6 listener"),
    };
    nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &to6).expect("connect");
    stream
}
