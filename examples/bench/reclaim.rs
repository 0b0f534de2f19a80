//! How soon a killed client's rules are removed (leases): a client process
//! (this benchmark started again, `--lease-client`) installs [`RULES`] rules on
//! eth2 and says `ready`; it is killed with SIGKILL, and
//! `tcpx_rxdm_lease_rules_reclaimed_total` is read from `/metrics` until it has
//! grown by [`RULES`]. `tests/leases.rs` asserts that the rules go, not how
//! soon; the time is taken here.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tcpx_rxdm::wire::client::{self, Client};

use crate::stall::{Daemon, P50P99};

/// Rules each client installs before it is killed.
pub const RULES: usize = 8;
/// The sim preset's first GPU behind eth2.
const GPU_ETH2: &str = "0000:0a:00.0";

/// Internal (`bench --lease-client DIR --lease-port N`): installs [`RULES`]
/// rules on eth2 from ports N.., keeps the connections, prints `ready`, and
/// waits to be killed.
pub fn client_main(dir: &Path, first_port: i32) -> ! {
    let mut held = Vec::new();
    for i in 0..RULES as i32 {
        let req = client::rule_request(
            1,
            ("10.3.0.2", first_port + i),
            ("192.168.2.2", 5000),
            Some(GPU_ETH2),
            None,
        );
        let mut c = Client::connect(dir.join("rx_rule_manager")).unwrap_or_else(|e| {
            eprintln!("bench lease client: {e}");
            std::process::exit(1)
        });
        match c.request(&req) {
            Ok(r) if client::raw_bytes(&r) == Some(&b"Ok."[..]) => held.push(c),
            other => {
                eprintln!("bench lease client: install answered {other:?}");
                std::process::exit(1)
            }
        }
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// `tcpx_rxdm_lease_rules_reclaimed_total` as `/metrics` shows it now.
fn reclaimed(http: SocketAddr) -> Result<f64, String> {
    let mut s = TcpStream::connect(http).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| format!("read: {e}"))?;
    body.lines()
        .find_map(|l| l.strip_prefix("tcpx_rxdm_lease_rules_reclaimed_total "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no tcpx_rxdm_lease_rules_reclaimed_total in /metrics".into())
}

/// One client started, killed, and its rules waited for: the time from the
/// kill to the counter showing them all removed.
fn once(d: &impl Daemon, first_port: i32) -> Result<Duration, String> {
    let dir = d.sock("");
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("--lease-client")
        .arg(&dir)
        .arg(format!("--lease-port={first_port}"))
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("lease client: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        let _ = child.kill();
        return Err(format!("lease client did not get ready ({:?})", line.trim()));
    }
    let http = d.http();
    let before = reclaimed(http)?;
    let t = Instant::now();
    child.kill().map_err(|e| e.to_string())?;
    let _ = child.wait();
    while reclaimed(http)? < before + RULES as f64 {
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("a killed client's {RULES} rules were not all removed within 30 s"));
        }
    }
    Ok(t.elapsed())
}

/// `samples` clients, one after another.
pub fn measure(d: &impl Daemon, samples: usize) -> Result<P50P99, String> {
    let times = (0..samples).map(|i| once(d, 40_000 + (i * RULES) as i32)).collect::<Result<Vec<_>, _>>()?;
    Ok(P50P99::of(times))
}
