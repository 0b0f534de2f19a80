//! Takeover benchmark: how long a takeover keeps clients waiting, with 0,
//! 10 000 and 100 000 rules booked, on simulated NICs with host pools.
//! Prints numbers; asserts nothing (the takeover itself is tested in
//! `tests/takeover.rs`).
//!
//! ```text
//! cargo build --release && cargo run --release --example takeover_bench -- \
//!     [--bin target/release/tcpx-rxdm] [--rules 0,10000,100000] [--runs 3] [--clients 4]
//! ```
//!
//! Per rule count and run: daemon A is started and given the rules; `clients`
//! threads then install and remove rules in a loop (a new connection per
//! request, as the NCCL plugin does) while daemon B takes over with
//! `--takeover`. Reported: the time A's clients were paused (A's log: pause
//! to commit), B's own count (connect to commit), spawn of B to B ready,
//! and the longest any client request took during the run, next to the
//! longest before the takeover began (the machine's own noise).
//!
//! To see where the time goes: `TAKEOVER_BENCH_LOGS=1` prints both daemons'
//! takeover lines after each run (`TAKEOVER_BENCH_ALL=1`: every line),
//! `TAKEOVER_BENCH_RUST_LOG=debug` sets the daemons' log level.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use tcpx_rxdm::daemon::READY_LINE;
use tcpx_rxdm::wire::{client, frame};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "target/release/tcpx-rxdm")]
    bin: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "0,10000,100000")]
    rules: Vec<usize>,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 4)]
    clients: usize,
}

struct Daemon {
    child: Child,
    log: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Daemon {
    fn spawn(bin: &Path, folder: &Path, takeover: bool) -> Daemon {
        let mut cmd = Command::new(bin);
        cmd.arg("--gpu_nic_preset=sim")
            .arg(format!("--uds_path={}", folder.display()))
            .arg("--metrics_address=")
            .arg("--client_idle_timeout=0")
            .env("RUST_LOG", std::env::var("TAKEOVER_BENCH_RUST_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if takeover {
            cmd.arg("--takeover");
        }
        let mut child = cmd.spawn().expect("daemon binary");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push((Instant::now(), l));
            }
        });
        Daemon { child, log }
    }

    fn wait_log(&self, needle: &str, limit: Duration) -> (Instant, String) {
        let until = Instant::now() + limit;
        loop {
            if let Some(l) = self.log.lock().unwrap().iter().find(|(_, l)| l.contains(needle)) {
                return l.clone();
            }
            assert!(Instant::now() < until, "no {needle:?} in the log");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn frame_for(i: usize, nic: usize) -> Vec<u8> {
    let src = format!("10.{}.{}.{}", 1 + (i >> 16) % 250, (i >> 8) & 0xff, i & 0xff);
    let dst = format!("192.168.{}.2", 1 + nic);
    frame::encode(&client::rule_request(1, (&src, 40000 + (i % 20000) as i32), (&dst, 5000), None, None))
        .unwrap()
}

/// One request on a new connection; its time, or why it failed.
fn ask(sock: &Path, req: &[u8]) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = UnixStream::connect(sock).map_err(|e| format!("connect: {e}"))?;
    s.write_all(req).map_err(|e| format!("send: {e}"))?;
    let mut got = vec![0u8; 2];
    s.read_exact(&mut got).map_err(|e| format!("read: {e}"))?;
    let n = u16::from_be_bytes([got[0], got[1]]) as usize;
    got.resize(2 + n, 0);
    s.read_exact(&mut got[2..]).map_err(|e| format!("read: {e}"))?;
    if got != frame::OK_FRAME {
        return Err(format!("reply {got:?}"));
    }
    Ok(t.elapsed())
}

/// Installs `n` rules over the four sim NICs from 8 threads.
fn fill(folder: &Path, n: usize) {
    let sock = folder.join("rx_rule_manager");
    std::thread::scope(|s| {
        for t in 0..8 {
            let sock = &sock;
            s.spawn(move || {
                for i in (t..n).step_by(8) {
                    ask(sock, &frame_for(i, i % 4)).expect("install");
                }
            });
        }
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A number after `key=` in a log line.
fn field(line: &str, key: &str) -> f64 {
    line.split(key)
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn main() {
    let args = Args::parse();
    println!("| rules | run | paused (old's log) | connect to commit (new's log) | spawn to ready | longest client wait | longest before | requests, failed |");
    println!("|---|---|---|---|---|---|---|---|");
    for &rules in &args.rules {
        for run in 0..args.runs {
            let tmp = tempfile::tempdir().unwrap();
            let folder = tmp.path().join("uds");
            let a = Daemon::spawn(&args.bin, &folder, false);
            a.wait_log(READY_LINE, Duration::from_secs(30));
            fill(&folder, rules);
            let (stop, before) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(true)));
            let load: Vec<_> = (0..args.clients)
                .map(|c| {
                    let (stop, before, folder) = (stop.clone(), before.clone(), folder.clone());
                    std::thread::spawn(move || {
                        let (mut worst, mut worst_before, mut n, mut failed) =
                            (Duration::ZERO, Duration::ZERO, 0, 0);
                        let mut i = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let req = frame_for(1_000_000 + c * 100_000 + i % 1000, c % 4);
                            let pre = before.load(Ordering::Relaxed);
                            for path in ["rx_rule_manager", "rx_rule_uninstall"] {
                                match ask(&folder.join(path), &req) {
                                    Ok(d) if pre => worst_before = worst_before.max(d),
                                    Ok(d) => worst = worst.max(d),
                                    Err(e) => {
                                        eprintln!("client {c}: {e}");
                                        failed += 1;
                                    }
                                }
                                n += 1;
                            }
                            i += 1;
                        }
                        (worst, worst_before, n, failed)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(300));
            before.store(false, Ordering::Relaxed);
            let t = Instant::now();
            let b = Daemon::spawn(&args.bin, &folder, true);
            let (ready_at, _) = b.wait_log(READY_LINE, Duration::from_secs(60));
            let (_, took) = b.wait_log("took over from pid", Duration::from_secs(5));
            let (_, handed) = a.wait_log("handed over to pid", Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::Relaxed);
            let (mut worst, mut worst_before, mut n, mut failed) = (Duration::ZERO, Duration::ZERO, 0, 0);
            for h in load {
                let (w, wb, k, f) = h.join().unwrap();
                worst = worst.max(w);
                worst_before = worst_before.max(wb);
                n += k;
                failed += f;
            }
            if std::env::var_os("TAKEOVER_BENCH_LOGS").is_some() {
                for (_, l) in b.log.lock().unwrap().iter().chain(a.log.lock().unwrap().iter()) {
                    if l.contains("took over")
                        || l.contains("handed over")
                        || l.contains("state received")
                        || l.contains("elapsed_ms")
                    {
                        eprintln!("{l}");
                    }
                }
            }
            let commit_ms = took
                .split(" in ")
                .last()
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN);
            println!(
                "| {rules} | {run} | {:.1} ms | {commit_ms:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {n}, {failed} |",
                field(&handed, "elapsed_ms="),
                ms(ready_at - t),
                ms(worst),
                ms(worst_before),
            );
            drop(b);
            drop(a);
        }
    }
}
