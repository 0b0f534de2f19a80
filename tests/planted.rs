//! What a client can plant in the socket folder (it is the workload's: an
//! `emptyDir`, a host path): symbolic links, hard links and FIFOs at every
//! name the daemon uses, the lock file, `nccl.env` and its temporary names
//! (the pid is easy to guess), a socket's name, the shutdown file, the health
//! file. The real daemon starts over them, as root and as another user; no
//! file outside the folder changes (content, mode, owner), nothing new
//! appears outside, and the daemon either serves or refuses naming the entry.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::sysfs::{a3_highgpu_8g, FakeSysfs};
use common::{require_root, BIN};
use tcpx_rxdm::daemon::READY_LINE;

/// A test user and group of no one's.
const UID: u32 = 64_124;
const GID: u32 = 64_124;

/// Files outside the socket folder that planted entries point at.
struct Outside {
    dir: tempfile::TempDir,
}

/// Each entry of the outside folder: (content, mode, uid, gid).
type Snapshot = BTreeMap<PathBuf, (String, u32, u32, u32)>;

impl Outside {
    /// Targets named after what points at them, owned by `owner` (who the daemon runs as).
    fn new(owner: Option<(u32, u32)>) -> Outside {
        let dir = tempfile::tempdir().unwrap();
        for name in ["lock", "env", "env_tmp", "socket", "terminated", "health", "hard_lock", "hard_env"] {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("precious {name}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
            if let Some((u, g)) = owner {
                std::os::unix::fs::chown(&p, Some(u), Some(g)).unwrap();
            }
        }
        Outside { dir }
    }

    fn target(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn snapshot(&self) -> Snapshot {
        std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let content = if m.is_file() {
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned()
                } else {
                    String::new()
                };
                (p, (content, m.mode() & 0o7777, m.uid(), m.gid()))
            })
            .collect()
    }
}

/// The daemon on `uds`, its stderr collected.
struct Run {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Run {
    fn start(uds: &Path, sysfs: &FakeSysfs, extra: &[&str], user: Option<(u32, u32)>) -> Run {
        let mut cmd = Command::new(BIN);
        cmd.args(["--gpu_nic_preset=sim", "--metrics_address="])
            .arg(format!("--uds_path={}", uds.display()))
            .arg(format!("--sysfs_root={}", sysfs.root().display()))
            .args(extra)
            .env("RUST_LOG", "info")
            .env("HEALTH_CHECK_LOG_FILE", uds.join("health.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((u, g)) = user {
            // std drops the supplementary groups when root sets a uid.
            cmd.uid(u).gid(g);
        }
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stderr, sink) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Run { child, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Ready (`Ok`) or exited (`Err(code)`), within 20 s.
    fn outcome(&mut self) -> Result<(), i32> {
        let t = Instant::now();
        loop {
            if self.log.lock().unwrap().iter().any(|l| l.contains(READY_LINE)) {
                return Ok(());
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return Err(st.code().unwrap_or(-1));
            }
            assert!(t.elapsed() < Duration::from_secs(20), "neither ready nor exited; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(&mut self) -> i32 {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM)
            .unwrap();
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return st.code().unwrap_or(-1);
            }
            assert!(t.elapsed() < Duration::from_secs(20), "did not stop; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node whose NCCL settings can be derived, so that the daemon writes nccl.env.
fn node() -> FakeSysfs {
    let fs = a3_highgpu_8g();
    fs.gce_cpus(2, 52).numa_node("eth0", 0);
    for (nic, n) in [("eth1", 0), ("eth2", 0), ("eth3", 1), ("eth4", 1)] {
        fs.numa_node(nic, n);
    }
    // Readable by the test user too.
    std::fs::set_permissions(fs.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    fs
}

/// A socket folder for a daemon run as `user` (theirs) or as this process.
fn socket_folder(user: Option<(u32, u32)>) -> tempfile::TempDir {
    let uds = tempfile::tempdir().unwrap();
    if let Some((u, g)) = user {
        std::os::unix::fs::chown(uds.path(), Some(u), Some(g)).unwrap();
    }
    uds
}

/// The pids the next process will likely get: from this process's latest child on.
fn likely_pids() -> std::ops::Range<u32> {
    let probe = Command::new("true").spawn().unwrap();
    let pid = probe.id();
    let _ = { probe }.wait();
    pid..pid + 2000
}

fn kind(p: &Path) -> &'static str {
    match std::fs::symlink_metadata(p) {
        Err(_) => "nothing",
        Ok(m) if m.file_type().is_symlink() => "link",
        Ok(m) if m.is_file() => "file",
        Ok(m) if m.is_dir() => "folder",
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => "socket",
        Ok(_) => "other",
    }
}

/// Symbolic links at every name the daemon writes: the daemon serves, and
/// replaces each link with its own file; nothing outside changes, during the
/// run or after a clean stop.
fn links_everywhere(user: Option<(u32, u32)>, extra: &[&str]) {
    let out = Outside::new(user);
    let uds = socket_folder(user);
    let d = uds.path();
    symlink(out.target("lock"), d.join(".rxdm.lock")).unwrap();
    symlink(out.target("env"), d.join("nccl.env")).unwrap();
    for pid in likely_pids() {
        symlink(out.target("env_tmp"), d.join(format!(".nccl.env.{pid}"))).unwrap();
    }
    symlink(out.target("socket"), d.join("rx_rule_manager")).unwrap();
    symlink(out.target("terminated"), d.join("terminated")).unwrap();
    symlink(out.target("health"), d.join("health.log")).unwrap();
    let before = out.snapshot();
    let sysfs = node();
    let mut run = Run::start(d, &sysfs, extra, user);
    let outcome = run.outcome();
    assert_eq!(out.snapshot(), before, "a file outside the folder changed; log:\n{}", run.log());
    assert_eq!(outcome, Ok(()), "log:\n{}", run.log());
    assert_eq!(kind(&d.join(".rxdm.lock")), "file");
    assert_eq!(kind(&d.join("nccl.env")), "file");
    assert!(std::fs::read_to_string(d.join("nccl.env")).unwrap().contains("export NCCL_"));
    assert_eq!(kind(&d.join("rx_rule_manager")), "socket");
    assert_eq!(kind(&d.join("terminated")), "nothing", "the stale link is removed");
    let stray: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".nccl.env."))
        .collect();
    assert!(stray.is_empty(), "planted temporary names left: {stray:?}");
    // The health file is a link: not written through, and said so.
    assert_eq!(kind(&d.join("health.log")), "link");
    let log = run.log();
    assert!(
        log.contains("could not write HEALTH_CHECK_LOG_FILE") && log.contains("it is a symbolic link"),
        "{log}"
    );
    assert!(log.contains("removed it") && log.contains(".rxdm.lock"), "{log}");
    assert_eq!(run.stop(), 0, "log:\n{}", run.log());
    assert_eq!(out.snapshot(), before, "a file outside the folder changed at exit");
    // What the daemon made is gone; the client's health link stays.
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["health.log"], "log:\n{}", run.log());
}

/// Hard links and FIFOs: a lock file or nccl.env that is a second name of
/// an outside file is replaced, never written; a FIFO at the health file's
/// name is not opened (the daemon does not hang on it).
fn hard_links_and_fifos(user: Option<(u32, u32)>) {
    let out = Outside::new(user);
    let uds = socket_folder(user);
    let d = uds.path();
    std::fs::hard_link(out.target("hard_lock"), d.join(".rxdm.lock")).unwrap();
    std::fs::hard_link(out.target("hard_env"), d.join("nccl.env")).unwrap();
    for name in ["health.log", "terminated"] {
        nix::unistd::mkfifo(&d.join(name), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    }
    let before = out.snapshot();
    let sysfs = node();
    let mut run = Run::start(d, &sysfs, &[], user);
    let outcome = run.outcome();
    assert_eq!(out.snapshot(), before, "a file outside the folder changed; log:\n{}", run.log());
    assert_eq!(outcome, Ok(()), "log:\n{}", run.log());
    for name in [".rxdm.lock", "nccl.env"] {
        assert_eq!(std::fs::metadata(d.join(name)).unwrap().nlink(), 1, "{name} is still a hard link");
    }
    assert!(run.log().contains("a FIFO"), "{}", run.log());
    assert_eq!(run.stop(), 0, "log:\n{}", run.log());
    assert_eq!(out.snapshot(), before);
}

/// Entries that cannot be removed without losing something are refused, by
/// name, before anything else is done: a FIFO where a socket goes, a folder
/// at the lock file's name.
fn refusals(user: Option<(u32, u32)>) {
    let out = Outside::new(user);
    for (name, says) in [("queue_ids_by_gpu", "is a FIFO, not a socket"), (".rxdm.lock", "it is a folder")] {
        let uds = socket_folder(user);
        let d = uds.path();
        if name == ".rxdm.lock" {
            std::fs::create_dir(d.join(name)).unwrap();
        } else {
            nix::unistd::mkfifo(&d.join(name), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        }
        let before = out.snapshot();
        let sysfs = node();
        let mut run = Run::start(d, &sysfs, &[], user);
        assert_eq!(run.outcome(), Err(1), "log:\n{}", run.log());
        let log = run.log();
        let last = log.lines().last().unwrap_or_default();
        assert!(last.contains(&d.join(name).display().to_string()) && last.contains(says), "{log}");
        assert_eq!(out.snapshot(), before);
        // What it made is gone; the planted entry stays.
        let left: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, [name], "log:\n{log}");
    }
}

/// The socket folder's path through a link someone planted in a folder
/// anyone may write (as `/tmp` is): refused, and nothing is created where it points.
fn a_planted_folder_link(user: Option<(u32, u32)>) {
    let out = Outside::new(user);
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let uds = shared.path().join("tcpx");
    symlink(out.dir.path(), &uds).unwrap();
    let before = out.snapshot();
    let sysfs = node();
    let mut run = Run::start(&uds, &sysfs, &[], user);
    assert_eq!(run.outcome(), Err(1), "log:\n{}", run.log());
    let log = run.log();
    assert!(log.contains("symbolic link in a folder others may write"), "{log}");
    assert_eq!(out.snapshot(), before, "created or changed files where the link points");
}

/// Each entry of a folder and what it is.
fn listing(d: &Path) -> Vec<(String, &'static str)> {
    let mut v: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), kind(&e.path()))
        })
        .collect();
    v.sort();
    v
}

/// `doctor` and `status` only read: over a folder with a FIFO at the lock
/// file's name (an open for reading would block) and links elsewhere, they
/// finish, and neither the folder nor anything outside changes.
#[test]
fn doctor_and_status_neither_hang_nor_write_on_planted_entries() {
    let out = Outside::new(None);
    let uds = socket_folder(None);
    let d = uds.path();
    nix::unistd::mkfifo(&d.join(".rxdm.lock"), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    symlink(out.target("env"), d.join("nccl.env")).unwrap();
    symlink(out.target("socket"), d.join("rxdm_status")).unwrap();
    let (before, folder) = (out.snapshot(), listing(d));
    let uds_arg = format!("--uds_path={}", d.display());
    for args in [vec!["doctor", "--gpu_nic_preset=sim", &uds_arg], vec!["status", &uds_arg]] {
        let mut child = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("`{}` hangs on the planted folder", args[0]);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(listing(d), folder, "`{}` changed the folder", args[0]);
        assert_eq!(out.snapshot(), before, "`{}` changed a file outside", args[0]);
    }
}

#[test]
fn links_planted_at_every_name_are_never_followed() {
    links_everywhere(None, &[]);
}

#[test]
fn hard_links_and_fifos_planted_in_the_folder_are_never_written() {
    hard_links_and_fifos(None);
}

#[test]
fn entries_that_cannot_be_replaced_are_refused_by_name() {
    refusals(None);
}

#[test]
fn a_socket_folder_through_a_planted_link_is_refused() {
    a_planted_folder_link(None);
}

/// As root with a socket group: the chown and chmod paths run too.
#[test]
#[ignore = "needs root: the daemon as root, chown to a test group"]
fn as_root_with_a_socket_group_nothing_outside_changes() {
    require_root("the daemon as root, chown to a test group");
    links_everywhere(None, &[&format!("--socket_group={GID}")]);
    hard_links_and_fifos(None);
}

/// As an unprivileged user whose own files are the targets (so that a
/// followed link would succeed): nothing outside changes either.
#[test]
#[ignore = "needs root: setuid to a test user, chown its folders"]
fn as_another_user_nothing_outside_changes() {
    require_root("setuid to a test user, chown its folders");
    let user = Some((UID, GID));
    links_everywhere(user, &[]);
    hard_links_and_fifos(user);
    refusals(user);
    a_planted_folder_link(user);
}
