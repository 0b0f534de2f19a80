//! The Slurm prolog and epilog (deploy/slurm/) against the real daemon on sim
//! NICs: the prolog returns once the daemon serves, a client installs a rule,
//! the epilog stops the daemon and checks its exit status. Temp folders for
//! everything; HTTP on a port the kernel picks (readiness comes from the
//! health file, not the port).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::BIN;
use tcpx_rxdm::wire::client::{self, raw_bytes, Client};

struct Job {
    id: String,
    tmp: tempfile::TempDir,
    extra: String,
}

impl Job {
    fn new(id: &str, extra: &str) -> Job {
        Job { id: id.into(), tmp: tempfile::tempdir().unwrap(), extra: extra.into() }
    }

    fn uds(&self) -> PathBuf {
        self.tmp.path().join(format!("tcpx-{}", self.id))
    }

    fn state(&self) -> PathBuf {
        self.tmp.path().join("state")
    }

    fn run(&self, script: &str) -> Output {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm").join(script);
        let gid = nix::unistd::getgid().to_string();
        Command::new(path)
            .env("SLURM_JOB_ID", &self.id)
            .env("SLURM_JOB_GID", gid)
            .env("TCPX_RXDM_BIN", BIN)
            .env("TCPX_UDS_PATH", self.uds())
            .env("TCPX_STATE_DIR", self.state())
            .env("TCPX_HTTP", "127.0.0.1:0")
            .env("TCPX_PRESET", "sim")
            .env("TCPX_READY_TIMEOUT", "30")
            .env("TCPX_STOP_TIMEOUT", "30")
            .env("TCPX_EXTRA_ARGS", &self.extra)
            .output()
            .unwrap()
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.state().join(format!("{}.pid", self.id))).ok()?.trim().parse().ok()
    }
}

impl Drop for Job {
    /// A failed assertion must not leave a detached daemon behind.
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*self.uds().to_string_lossy()));
            if ours {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn prolog_starts_a_ready_daemon_and_epilog_stops_it_cleanly() {
    let job = Job::new("4101", "");
    let t = Instant::now();
    let out = job.run("prolog.sh");
    assert!(out.status.success(), "{}", text(&out));
    assert!(t.elapsed() < Duration::from_secs(20), "prolog took {:?}", t.elapsed());
    let pid = job.pid().expect("pid file");
    assert!(alive(pid));
    // Ready on return: the rule socket answers at once, no sleeping or retrying.
    let mut c = Client::connect(job.uds().join("rx_rule_manager")).expect("rule socket ready");
    let r =
        c.request(&client::rule_request(1, ("10.0.0.9", 4101), ("192.168.1.2", 5000), None, None)).unwrap();
    assert_eq!(raw_bytes(&r), Some(&b"Ok."[..]), "{r:?}");
    drop(c);
    // The job's group owns the sockets.
    use std::os::unix::fs::MetadataExt;
    let gid = std::fs::metadata(job.uds().join("rx_rule_manager")).unwrap().gid();
    assert_eq!(gid, nix::unistd::getgid().as_raw());

    // A second prolog for the same job refuses to start another daemon.
    let again = job.run("prolog.sh");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already runs"), "{}", text(&again));
    assert!(alive(pid));

    let out = job.run("epilog.sh");
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stopped cleanly"), "{}", text(&out));
    assert!(!alive(pid), "daemon still running after the epilog");
    // Rules removed and files gone: the socket folder itself was removed.
    assert!(!job.uds().exists(), "socket folder left behind");
    assert_eq!(std::fs::read_dir(job.state()).unwrap().count(), 0, "state files left behind");

    // Epilog of a job that has no daemon (e.g. its prolog failed): nothing to do.
    let out = job.run("epilog.sh");
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn prolog_fails_fast_with_the_reason_when_the_daemon_cannot_start() {
    // Every RSS write fails: the daemon rolls back and exits 1 during startup.
    let job = Job::new("4102", "--sim_fault=set_rss:EOPNOTSUPP:1");
    let t = Instant::now();
    let out = job.run("prolog.sh");
    assert!(!out.status.success());
    assert!(t.elapsed() < Duration::from_secs(20), "waited for the timeout instead of failing fast");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exited with status 1 before it was ready"), "{err}");
    assert!(err.contains("set RSS"), "the daemon's own error is shown: {err}");
    // Nothing for the epilog to stop.
    let out = job.run("epilog.sh");
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn epilog_reports_a_daemon_that_failed_while_serving() {
    // A daemon whose shutdown fails (rule removal errors) exits 1: the epilog must say so.
    let job = Job::new("4103", "--sim_fault=del_rule:EIO:1");
    let out = job.run("prolog.sh");
    assert!(out.status.success(), "{}", text(&out));
    let mut c = Client::connect(job.uds().join("rx_rule_manager")).unwrap();
    let r =
        c.request(&client::rule_request(1, ("10.0.0.9", 4103), ("192.168.1.2", 5000), None, None)).unwrap();
    assert_eq!(raw_bytes(&r), Some(&b"Ok."[..]));
    drop(c);
    let out = job.run("epilog.sh");
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exited with status 1"), "{err}");
    assert!(err.contains("restore step"), "the log tail names the failure: {err}");
}
