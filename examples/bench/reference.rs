//! The reference daemon's per-rule cost model: it programs each rule with
//! `system("ethtool -N …")`, i.e. one `sh -c` process that runs the ethtool CLI.
//! Timed here on a veth in a private network namespace that is created for the
//! run and deleted after it.

use std::fs::File;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};

use crate::stats::percentile;

pub struct Cost {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
    /// CPU (user + system) of the child processes per rule, in µs.
    pub cpu_us: f64,
    /// What the runs ended with: exit codes and the first line of stderr, each distinct one.
    pub outcomes: String,
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// CPU seconds (user + system) of the waited-for children of this process.
fn children_cpu_s() -> f64 {
    // SAFETY: an all-zero rusage is a valid value; getrusage only writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the duration of the call.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Times `n` rule inserts the reference's way. `Err` says why it was skipped.
pub fn measure(n: usize) -> Result<Cost, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("skipped: needs root (to create a network namespace)".into());
    }
    for tool in ["ip", "ethtool", "sh"] {
        if !on_path(tool) {
            return Err(format!("skipped: no `{tool}` binary on PATH (apt-get install ethtool iproute2)"));
        }
    }
    let ns = Netns(format!("rxdm-bench-{}", std::process::id()));
    ip(&["netns", "add", &ns.0])?;
    ip(&["-n", &ns.0, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p"])?;
    ip(&["-n", &ns.0, "link", "set", "eth1", "up"])?;
    let name = ns.0.clone();
    // Children inherit the namespace of the thread that forks them, so the
    // processes run in the namespace without `ip netns exec` in between.
    std::thread::spawn(move || -> Result<Cost, String> {
        let fd = File::open(format!("/run/netns/{name}")).map_err(|e| format!("netns {name}: {e}"))?;
        setns(&fd, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))?;
        let mut lat = Vec::with_capacity(n);
        let mut codes = std::collections::BTreeSet::new();
        let cpu0 = children_cpu_s();
        for i in 0..n {
            let cmd = format!(
                "ethtool -N eth1 flow-type tcp4 src-ip 10.1.{}.{} dst-ip 192.168.1.2 \
                 src-port {} dst-port 5000 action 8 loc {i}",
                (i >> 8) & 0xff,
                i & 0xff,
                40000 + i % 20000
            );
            let t = Instant::now();
            let out = Command::new("sh").arg("-c").arg(&cmd).output().map_err(|e| format!("sh: {e}"))?;
            lat.push(t.elapsed());
            let code = out.status.code().map(|c| c.to_string()).unwrap_or_else(|| "signal".into());
            let stderr = String::from_utf8_lossy(&out.stderr);
            codes.insert(format!("exit {code}, \"{}\"", stderr.lines().next().unwrap_or("").trim()));
        }
        let cpu = children_cpu_s() - cpu0;
        let mean = lat.iter().sum::<Duration>() / n as u32;
        lat.sort();
        Ok(Cost {
            n,
            p50: percentile(&lat, 0.5).unwrap_or_default(),
            p99: percentile(&lat, 0.99).unwrap_or_default(),
            mean,
            cpu_us: cpu / n as f64 * 1e6,
            outcomes: codes.into_iter().collect::<Vec<_>>().join("; "),
        })
    })
    .join()
    .map_err(|_| "reference thread panicked".to_string())?
}
