//! The Slurm prolog, epilog and task prolog (deploy/slurm/) against the real
//! daemon on sim NICs. Like slurmd, the tests give the scripts no environment
//! but `SLURM_JOB_ID` and `SLURM_JOB_GID`; the settings come from a settings
//! file (in a temp folder, named by `TCPX_SLURM_CONF`, as the real one in
//! /etc is root's). `.ci/slurm-test` runs the same scripts on a real slurmd.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::BIN;
use tcpx_rxdm::wire::client::{self, raw_bytes, Client};

/// One job's files, all under one temp folder shared by the jobs of a test (the node).
struct Job {
    id: String,
    root: PathBuf,
    extra: String,
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm").join(name)
}

/// The settings file of a test's node: `extra` lines after the common ones.
fn write_settings(root: &Path, extra: &str) -> PathBuf {
    let path = root.join("slurm.conf");
    let text = format!(
        "# written by tests/slurm.rs\nTCPX_RXDM_BIN={BIN}\nTCPX_PRESET=sim\n\
         TCPX_UDS_PATH={}/tcpx-$SLURM_JOB_ID\nTCPX_STATE_DIR=\"{}/state\"\n\
         TCPX_READY_TIMEOUT=30\nTCPX_STOP_TIMEOUT=30\n{extra}",
        root.display(),
        root.display()
    );
    std::fs::write(&path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

impl Job {
    fn new(root: &Path, id: &str, extra: &str) -> Job {
        Job { id: id.into(), root: root.into(), extra: extra.into() }
    }

    fn uds(&self) -> PathBuf {
        self.root.join(format!("tcpx-{}", self.id))
    }

    fn state(&self, ext: &str) -> PathBuf {
        self.root.join("state").join(format!("{}.{ext}", self.id))
    }

    /// The script with slurmd's kind of environment (only SLURM_*) plus `env`.
    fn command(&self, script_name: &str, env: &[(&str, &str)]) -> Command {
        let conf = write_settings(&self.root, &format!("TCPX_EXTRA_ARGS={}\n", self.extra));
        let mut c = Command::new(script(script_name));
        c.env_clear()
            .env("SLURM_JOB_ID", &self.id)
            .env("SLURM_JOB_GID", nix::unistd::getgid().to_string())
            .env("TCPX_SLURM_CONF", conf)
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        c
    }

    fn run(&self, script_name: &str) -> Output {
        self.command(script_name, &[]).output().unwrap()
    }

    fn pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.state("pid")).ok()?;
        text.split_whitespace().next()?.parse().ok()
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

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn install_rule(job: &Job, port: i32) {
    let mut c = Client::connect(job.uds().join("rx_rule_manager")).expect("rule socket ready");
    let r =
        c.request(&client::rule_request(1, ("10.0.0.9", port), ("192.168.1.2", 5000), None, None)).unwrap();
    assert_eq!(raw_bytes(&r), Some(&b"Ok."[..]), "{r:?}");
}

#[test]
fn prolog_starts_a_ready_daemon_and_epilog_stops_it_cleanly() {
    let node = tempfile::tempdir().unwrap();
    let job = Job::new(node.path(), "4101", "");
    let out = job.run("prolog.sh");
    assert!(out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("ready on"), "{}", text(&out));
    let pid = job.pid().expect("pid file");
    assert!(alive(pid));
    // $SLURM_JOB_ID in the settings file became the job's id.
    assert!(job.uds().is_dir(), "{:?} missing", job.uds());
    // Ready on return: the rule socket answers at once, no sleeping or retrying.
    install_rule(&job, 4101);
    // The job's group owns the sockets.
    use std::os::unix::fs::MetadataExt;
    let gid = std::fs::metadata(job.uds().join("rx_rule_manager")).unwrap().gid();
    assert_eq!(gid, nix::unistd::getgid().as_raw());
    // No HTTP unless the settings ask for it.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(cmdline.split(|b| *b == 0).any(|a| a == b"--metrics_address="), "HTTP is on by default");

    // A second prolog for the same job refuses to start another daemon.
    let again = job.run("prolog.sh");
    assert!(!again.status.success());
    assert!(stderr(&again).contains("already runs"), "{}", text(&again));
    assert!(alive(pid));

    let out = job.run("epilog.sh");
    assert!(out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("stopped cleanly (exit 0"), "{}", text(&out));
    assert!(!alive(pid), "daemon still running after the epilog");
    // Rules removed and files gone: the socket folder itself was removed.
    assert!(!job.uds().exists(), "socket folder left behind");
    assert_eq!(std::fs::read_dir(node.path().join("state")).unwrap().count(), 0, "state files left behind");

    // Epilog of a job that has no daemon (e.g. its prolog failed): nothing to do.
    let out = job.run("epilog.sh");
    assert!(out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("nothing to stop"), "{}", text(&out));
}

#[test]
fn a_failed_prolog_fails_fast_with_the_reason_and_leaves_only_its_log() {
    // Every RSS write fails: the daemon rolls back and exits 1 during startup.
    let node = tempfile::tempdir().unwrap();
    let job = Job::new(node.path(), "4102", "--sim_fault=set_rss:EOPNOTSUPP:1");
    let out = job.run("prolog.sh");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(!err.contains("was not ready after"), "waited for the timeout instead of failing fast: {err}");
    assert!(err.contains("exited with status 1 before it was ready"), "{err}");
    assert!(err.contains("set RSS"), "the daemon's own error is shown: {err}");
    assert!(!job.uds().exists(), "the socket folder was left behind");
    for ext in ["pid", "rc", "health"] {
        assert!(!job.state(ext).exists(), "{ext} file left behind");
    }
    assert!(std::fs::read_to_string(job.state("log")).unwrap().contains("set RSS"), "log kept");
    // Nothing for the epilog to stop.
    let out = job.run("epilog.sh");
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn two_jobs_with_the_default_settings_run_side_by_side() {
    let node = tempfile::tempdir().unwrap();
    let a = Job::new(node.path(), "4201", "");
    let b = Job::new(node.path(), "4202", "");
    for j in [&a, &b] {
        let out = j.run("prolog.sh");
        assert!(out.status.success(), "job {}: {}", j.id, text(&out));
    }
    install_rule(&a, 4201);
    install_rule(&b, 4202);
    for j in [&a, &b] {
        let out = j.run("epilog.sh");
        assert!(out.status.success(), "job {}: {}", j.id, text(&out));
    }
}

#[test]
fn a_nic_held_by_another_jobs_daemon_fails_the_prolog_naming_that_job_and_the_ways_out() {
    // Claimed sim NICs behave as real ones do: one daemon per NIC.
    let node = tempfile::tempdir().unwrap();
    let a = Job::new(node.path(), "4301", "--claim_sim_nics");
    let b = Job::new(node.path(), "4302", "--claim_sim_nics");
    let out = a.run("prolog.sh");
    assert!(out.status.success(), "{}", text(&out));
    let out = b.run("prolog.sh");
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(!err.contains("was not ready after"), "waited for the timeout instead of failing fast: {err}");
    let pid = a.pid().unwrap();
    assert!(err.contains(&format!("already managed by job 4301's daemon (pid {pid})")), "{err}");
    assert!(err.contains("--exclusive") && err.contains("systemd"), "both ways out: {err}");
    assert!(!b.uds().exists(), "the second job's folder was left behind");
    assert!(alive(pid), "the first job's daemon must be untouched");
    assert!(a.run("epilog.sh").status.success());
}

/// Runs `cmd` with stdout/stderr piped; returns its output, or None if the
/// pipes did not close within `limit` (something still holds them).
fn output_within(mut cmd: Command, limit: Duration) -> Option<(Output, Duration)> {
    let t = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let _ = so.read_to_end(&mut a);
        let _ = se.read_to_end(&mut b);
        let _ = tx.send((a, b));
    });
    let status = child.wait().unwrap();
    let (stdout, stderr) = rx.recv_timeout(limit.saturating_sub(t.elapsed())).ok()?;
    Some((Output { status, stdout, stderr }, t.elapsed()))
}

#[test]
fn a_wrapper_that_pipes_the_prologs_stderr_is_not_held_open_by_the_daemon() {
    // A site wrapper: `prolog.sh 2> >(tee -a LOG >&2)`. The process
    // substitution's pipe (fd 63) reaches the prolog; a daemon that kept it
    // would keep tee, and so slurmd, waiting.
    let node = tempfile::tempdir().unwrap();
    let job = Job::new(node.path(), "4401", "");
    let log = node.path().join("wrapper.log");
    let wrapper = format!("{} 2> >(tee -a {} >&2)", script("prolog.sh").display(), log.display());
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(&wrapper).env_clear();
    for (k, v) in job.command("prolog.sh", &[]).get_envs() {
        cmd.env(k, v.unwrap());
    }
    let (out, _) = output_within(cmd, Duration::from_secs(60)).expect("the wrapper's pipes stayed open");
    assert!(out.status.success(), "{}", text(&out));
    assert!(std::fs::read_to_string(&log).unwrap().contains("ready on"));
    // The shell that waits on the daemon kept nothing but stdin, stdout and stderr.
    let pid = job.pid().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let ppid = stat.rsplit(") ").next().unwrap().split(' ').nth(1).unwrap();
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{ppid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    fds.sort();
    assert_eq!(fds, ["0", "1", "2"], "the waiting shell's descriptors");
    // In a session of its own.
    assert_eq!(
        nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(pid))).unwrap().as_raw(),
        ppid.parse::<i32>().unwrap()
    );
    assert!(job.run("epilog.sh").status.success());
}

#[test]
fn epilog_reports_a_daemon_that_failed_while_serving() {
    // A daemon whose shutdown fails (rule removal errors) exits 1: the epilog must say so.
    let node = tempfile::tempdir().unwrap();
    let job = Job::new(node.path(), "4103", "--sim_fault=del_rule:EIO:1");
    let out = job.run("prolog.sh");
    assert!(out.status.success(), "{}", text(&out));
    install_rule(&job, 4103);
    let out = job.run("epilog.sh");
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("exited with status 1"), "{err}");
    assert!(err.contains("restore step"), "the log tail names the failure: {err}");
    assert!(!job.uds().exists(), "socket folder left behind");
    assert!(job.state("log").exists(), "the log is kept for diagnosis");
}

#[test]
fn epilog_says_the_daemon_was_killed_by_a_signal() {
    let node = tempfile::tempdir().unwrap();
    let job = Job::new(node.path(), "4501", "");
    assert!(job.run("prolog.sh").status.success());
    let pid = nix::unistd::Pid::from_raw(job.pid().unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    common::wait_until(Duration::from_secs(10), || job.state("rc").exists());
    let out = job.run("epilog.sh");
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("killed by signal 9 (SIGKILL)"), "{err}");
    assert!(err.contains("draining the node is right"), "{err}");
    assert!(!job.uds().exists(), "stale sockets left behind");
}

#[test]
fn epilog_sends_nothing_to_a_process_that_is_not_its_daemon() {
    let node = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(node.path().join("state")).unwrap();
    // The pid file names a live process that started at another time (a reused pid).
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    let job = Job::new(node.path(), "4601", "");
    std::fs::write(job.state("pid"), format!("{} 1\n", other.id())).unwrap();
    let out = job.run("epilog.sh");
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("is now another process") && err.contains("sent no signal"), "{err}");
    assert!(alive(other.id() as i32), "the epilog signalled a process that is not its daemon");
    other.kill().unwrap();
    other.wait().unwrap();

    // A dead pid and no exit status: gone, and nothing sent.
    let job = Job::new(node.path(), "4602", "");
    std::fs::write(job.state("pid"), format!("{} 1\n", other.id())).unwrap();
    let out = job.run("epilog.sh");
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("is gone") && err.contains("left no exit status"), "{err}");

    // Each recorded exit status gets its own explanation; only 0 passes.
    for (rc, want, ok) in [
        ("0", "stopped cleanly", true),
        ("1", "exited with status 1: a restore step failed", false),
        ("2", "exited with status 2: it rejected its flags", false),
        ("143", "killed by signal 15 (SIGTERM)", false),
    ] {
        let job = Job::new(node.path(), "4603", "");
        std::fs::write(job.state("pid"), "1 1\n").unwrap();
        std::fs::write(job.state("rc"), format!("{rc}\n")).unwrap();
        let out = job.run("epilog.sh");
        assert_eq!(out.status.success(), ok, "rc {rc}: {}", text(&out));
        assert!(stderr(&out).contains(want), "rc {rc}: {}", text(&out));
    }
}

#[test]
fn settings_file_environment_and_task_prolog() {
    let node = tempfile::tempdir().unwrap();
    let job = Job::new(node.path(), "4701", "$(touch INJECTED)");
    let args = |env: &[(&str, &str)]| {
        let out = job.command("prolog.sh", &[&[("TCPX_PRINT_ARGS", "1")], env].concat()).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // From the file: the binary, the preset, the folder with the job's id.
    let a = args(&[]);
    assert!(a.lines().next() == Some(BIN), "{a}");
    assert!(a.contains("--gpu_nic_preset=sim\n"), "{a}");
    assert!(a.contains(&format!("--uds_path={}\n", job.uds().display())), "{a}");
    assert!(a.contains("--metrics_address=\n"), "HTTP off by default: {a}");
    // Read as data: the command substitution is a literal word, never run.
    assert!(a.contains("$(touch\n"), "{a}");
    assert!(!node.path().join("INJECTED").exists() && !Path::new("INJECTED").exists(), "the file was run");
    // The environment overrides the file.
    let a = args(&[("TCPX_PRESET", "a3vm"), ("TCPX_HTTP", "127.0.0.1:0")]);
    assert!(a.contains("--gpu_nic_preset=a3vm\n") && a.contains("--metrics_address=127.0.0.1:0\n"), "{a}");

    // The task prolog exports the configured folder, whatever the job's environment says.
    let out = job.command("task-prolog.sh", &[("TCPX_UDS_PATH", "/tmp/the-jobs-own")]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("export NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX={}\n", job.uds().display())
    );

    // A mistyped name, or a file others may write, is refused with the reason.
    let conf = node.path().join("bad.conf");
    std::fs::write(&conf, "TCPX_PRESTE=sim\n").unwrap();
    let out = job.command("prolog.sh", &[("TCPX_SLURM_CONF", conf.to_str().unwrap())]).output().unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bad.conf:1: unknown setting TCPX_PRESTE"), "{}", text(&out));
    std::fs::write(&conf, "TCPX_PRESET=sim\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = job.command("prolog.sh", &[("TCPX_SLURM_CONF", conf.to_str().unwrap())]).output().unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("writable by group or others"), "{}", text(&out));
}

#[test]
fn the_example_settings_file_lists_every_setting_with_its_default() {
    let example = std::fs::read_to_string(script("slurm.conf.example")).unwrap();
    let common = std::fs::read_to_string(script("common.sh")).unwrap();
    // Every name common.sh accepts is in the example, once.
    let names = common.split("TCPX_SETTINGS=(").nth(1).unwrap().split(')').next().unwrap();
    for name in names.split_whitespace() {
        let n = example.lines().filter(|l| l.starts_with(&format!("#{name}="))).count();
        assert_eq!(n, 1, "{name} in slurm.conf.example");
    }
    // Uncommented, the example changes nothing: its values are the defaults.
    let node = tempfile::tempdir().unwrap();
    let uncommented: String = example
        .lines()
        .filter_map(|l| l.strip_prefix('#').filter(|l| l.starts_with("TCPX_")))
        .map(|l| format!("{l}\n"))
        .collect();
    let print = |conf: &Path| {
        let out = Command::new(script("prolog.sh"))
            .env_clear()
            .env("SLURM_JOB_ID", "12")
            .env("SLURM_JOB_GID", "1000")
            .env("TCPX_SLURM_CONF", conf)
            .env("TCPX_PRINT_ARGS", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let conf = node.path().join("slurm.conf");
    std::fs::write(&conf, uncommented).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o644)).unwrap();
    let defaults = print(&node.path().join("absent.conf"));
    assert_eq!(print(&conf), defaults);
    assert!(defaults.contains("--uds_path=/run/tcpx-12\n"), "{defaults}");
}

#[test]
fn a_prolog_that_times_out_stops_the_daemon_and_leaves_only_its_log() {
    // Priming takes 4 x 2 s of RSS writes at once; the prolog waits 1 s.
    let node = tempfile::tempdir().unwrap();
    let job = Job::new(node.path(), "4801", "--sim_delay=set_rss:2000");
    let mut cmd = job.command("prolog.sh", &[("TCPX_READY_TIMEOUT", "1")]);
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("was not ready after 1s; stopping it"), "{err}");
    assert!(err.contains("it stopped with status"), "{err}");
    assert!(!job.uds().exists(), "the socket folder was left behind");
    for ext in ["pid", "rc", "health"] {
        assert!(!job.state(ext).exists(), "{ext} file left behind");
    }
    assert!(job.state("log").exists(), "log kept");
}
