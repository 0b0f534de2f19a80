//! Finding a client process's tenant: its cgroup (v2), the GPUs whose
//! device nodes it holds open for reading and writing, and its network
//! namespace.
//!
//! Everything is read through the process's pidfd, or through its
//! `/proc/<pid>` folder opened as a descriptor and then checked to be the
//! pidfd's process (it has not exited: it still holds the pid). Such a
//! descriptor keeps naming that process, never a later holder of the pid.
//! A process that has exited by the end of the read is not identified at
//! all: what was read may not be its.
//!
//! - The cgroup id comes from `PIDFD_GET_INFO` (Linux 6.13); else from the
//!   folder's `cgroup` (the `0::` line) and the inode of that folder under
//!   the cgroup2 mount, which is the same id.
//! - The GPUs: the device nodes among its open files (see `identity::held`).
//!   A simulated GPU's stand-in file is looked up under the folder's `root`;
//!   where the pid is not visible, inside its mount namespace (from
//!   `PIDFD_GET_MNT_NAMESPACE`, Linux 6.11) on a short-lived thread.
//! - The network namespace: `PIDFD_GET_NET_NAMESPACE` (Linux 6.11), or the
//!   folder's `ns/net`. Kept open: flow checks look sockets up in it.
//!
//! All of this is read once per client process, when it is first seen.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::flows_space::FlowSpace;
use super::held::{self, FileId, OpenFile};
pub use super::held::{device_minor, GpuDevices};
use super::peer;
use crate::netlink::sock_diag::SockDiag;

/// `PIDFD_GET_MNT_NAMESPACE`: `_IO(0xFF, 3)`.
const PIDFD_GET_MNT_NAMESPACE: libc::c_ulong = 0xFF03;
/// `PIDFD_GET_NET_NAMESPACE`: `_IO(0xFF, 4)`.
const PIDFD_GET_NET_NAMESPACE: libc::c_ulong = 0xFF04;

/// A network namespace, kept open.
#[derive(Debug)]
pub struct NetNs {
    /// Its nsfs inode: names the namespace.
    pub inode: u64,
    pub fd: OwnedFd,
    /// `sock_diag` sockets opened in it for flow checks, idle: a check takes
    /// one (or opens one) and puts it back. Each pins the namespace, so they
    /// close when the client process's lease ends ([`NetNs::release`]).
    diag: Mutex<Vec<SockDiag>>,
    released: AtomicBool,
    /// What is known of the namespace's addresses (shared with every other
    /// process in it), taken on first use.
    space: OnceLock<Arc<FlowSpace>>,
}

/// Idle `sock_diag` sockets kept per client process, at most.
const DIAG_IDLE: usize = 4;

impl NetNs {
    pub fn new(inode: u64, fd: OwnedFd) -> NetNs {
        NetNs { inode, fd, diag: Mutex::default(), released: AtomicBool::new(false), space: OnceLock::new() }
    }

    /// What is known of this namespace's addresses, for IPv6 repairs.
    pub(crate) fn space(&self) -> &FlowSpace {
        self.space.get_or_init(|| FlowSpace::of(self.inode))
    }

    /// An idle `sock_diag` socket of this namespace, if there is one.
    pub fn take_diag(&self) -> Option<SockDiag> {
        self.diag.lock().expect("sock_diag cache lock").pop()
    }

    /// Gives back a socket from [`Self::take_diag`] (or a new one) for the
    /// next check; after [`Self::release`] it is closed instead.
    pub fn put_diag(&self, diag: SockDiag) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        let mut idle = self.diag.lock().expect("sock_diag cache lock");
        if idle.len() < DIAG_IDLE {
            idle.push(diag);
        }
    }

    /// The process whose namespace this is has exited: its sockets close now
    /// (those in use close when given back), so that they pin nothing.
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        let idle = std::mem::take(&mut *self.diag.lock().expect("sock_diag cache lock"));
        drop(idle);
    }

    /// Idle sockets kept now.
    pub fn idle_diag(&self) -> usize {
        self.diag.lock().expect("sock_diag cache lock").len()
    }
}

/// What a client process is, as far as isolation goes.
#[derive(Debug)]
pub struct Tenant {
    /// The id of its cgroup v2 (the folder's inode number).
    pub cgroup_id: u64,
    /// The cgroup's path, where it could be read (for logs and `status`).
    pub cgroup: Option<String>,
    /// The GPUs (topology order) whose device node it holds open, as a bit set.
    gpus: u64,
    /// Its network namespace, where it could be opened.
    pub net: Option<NetNs>,
    /// It held descriptors numbered at or above the scan's limit when its
    /// open files were read, which were not looked at (`None`: not known).
    pub beyond_scan: Option<bool>,
}

impl Tenant {
    /// Whether it holds the device node of the GPU at topology place `gpu` open.
    pub fn holds_gpu(&self, gpu: usize) -> bool {
        gpu < 64 && self.gpus & (1 << gpu) != 0
    }

    /// The GPUs it holds, as a bit set (topology order).
    pub fn gpu_bits(&self) -> u64 {
        self.gpus
    }

    /// A tenant as a takeover hands it on.
    pub fn from_parts(cgroup_id: u64, cgroup: Option<String>, gpus: u64, net: Option<NetNs>) -> Tenant {
        Tenant { cgroup_id, cgroup, gpus, net, beyond_scan: None }
    }

    /// How logs and `status` name it.
    pub fn name(&self) -> String {
        self.cgroup.clone().unwrap_or_else(|| format!("cgroup id {}", self.cgroup_id))
    }

    #[cfg(test)]
    pub(crate) fn for_test(cgroup_id: u64, gpus: u64) -> Tenant {
        Tenant {
            cgroup_id,
            cgroup: Some(format!("/test/{cgroup_id}")),
            gpus,
            net: None,
            beyond_scan: Some(false),
        }
    }
}

/// Why a client process's tenant could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// It exited before the read ended: nothing read may be taken as its.
    Exited,
    /// Its cgroup cannot be told (its `/proc` folder cannot be read, or its
    /// pid is not visible and the kernel gives no cgroup id for its pidfd).
    Unknown,
}

/// Finds the tenant of the process behind `pidfd`. `pid`: its pid in the
/// daemon's namespace as its pidfd gave it (`None`: not visible), never a
/// number from anywhere else.
pub fn identify(
    pidfd: BorrowedFd<'_>,
    pid: Option<u32>,
    devices: &GpuDevices,
    cgroup2: Option<&Path>,
) -> Result<Tenant, Unread> {
    let t = match pid {
        Some(p) => identify_visible(pidfd, p, devices, cgroup2)?,
        None => identify_hidden(pidfd, devices)?,
    };
    match peer::exited(pidfd) {
        true => Err(Unread::Exited),
        false => Ok(t),
    }
}

/// `/proc/<pid>` of the process behind `pidfd`, which has pid `pid`: the
/// folder is opened, then the process is checked not to have exited, so
/// the pid named it when the folder was opened, and the folder names it
/// from then on.
pub fn proc_dir(pidfd: BorrowedFd<'_>, pid: u32) -> Result<OwnedFd, Unread> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let dir = nix::fcntl::open(format!("/proc/{pid}").as_str(), flags, Mode::empty());
    match (dir, peer::exited(pidfd)) {
        (_, true) => Err(Unread::Exited),
        (Ok(dir), false) => Ok(dir),
        (Err(e), false) => {
            tracing::debug!(pid, error = %e, "cannot open a client's /proc folder");
            Err(Unread::Unknown)
        }
    }
}

fn identify_visible(
    pidfd: BorrowedFd<'_>,
    pid: u32,
    devices: &GpuDevices,
    cgroup2: Option<&Path>,
) -> Result<Tenant, Unread> {
    let dir = proc_dir(pidfd, pid)?;
    let cgroup = read_in(dir.as_fd(), "cgroup")
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("0::")).map(|s| s.trim().to_string()));
    let cgroup_id = match peer::pidfd_cgroup_id(pidfd) {
        Ok(id) => id,
        Err(_) => {
            let (root, path) = (cgroup2.ok_or(Unread::Unknown)?, cgroup.as_deref().ok_or(Unread::Unknown)?);
            std::fs::metadata(root.join(path.trim_start_matches('/'))).map_err(|_| Unread::Unknown)?.ino()
        }
    };
    let (gpus, beyond_scan) = gpus_of_visible(pidfd, dir.as_fd(), devices);
    let net = open_net(pidfd, Some(dir.as_fd()));
    Ok(Tenant { cgroup_id, cgroup, gpus, net, beyond_scan })
}

fn identify_hidden(pidfd: BorrowedFd<'_>, devices: &GpuDevices) -> Result<Tenant, Unread> {
    let cgroup_id = peer::pidfd_cgroup_id(pidfd).map_err(|_| Unread::Unknown)?;
    let (gpus, beyond_scan) = gpus_of_hidden(pidfd, devices);
    let net = open_net(pidfd, None);
    Ok(Tenant { cgroup_id, cgroup: None, gpus, net, beyond_scan })
}

/// The text of file `name` in folder `dir`.
fn read_in(dir: BorrowedFd<'_>, name: &str) -> Option<String> {
    let fd = nix::fcntl::openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text).ok()?;
    Some(text)
}

/// The network namespace of the process behind `pidfd`:
/// `PIDFD_GET_NET_NAMESPACE` (Linux 6.11), else `ns/net` in its `/proc`
/// folder `proc_dir` (from [`proc_dir`]). The caller checks afterwards that
/// the process has not exited.
pub fn open_net(pidfd: BorrowedFd<'_>, proc_dir: Option<BorrowedFd<'_>>) -> Option<NetNs> {
    let fd = pidfd_ns(pidfd, PIDFD_GET_NET_NAMESPACE).ok().or_else(|| {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        nix::fcntl::openat(proc_dir?, "ns/net", flags, Mode::empty()).ok()
    })?;
    let inode = nix::sys::stat::fstat(fd.as_fd()).ok()?.st_ino;
    Some(NetNs::new(inode, fd))
}

/// A namespace of the process behind `pidfd` (`PIDFD_GET_*_NAMESPACE`).
fn pidfd_ns(pidfd: BorrowedFd<'_>, cmd: libc::c_ulong) -> Result<OwnedFd, Errno> {
    // SAFETY: the namespace ioctls take no argument and return a new fd.
    let fd = unsafe { libc::ioctl(pidfd.as_raw_fd(), cmd as _, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel just installed `fd` in our table and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The GPUs that the process behind `pidfd` holds open, read through its
/// `/proc` folder `dir`, and whether it held descriptors past the scan's limit.
fn gpus_of_visible(pidfd: BorrowedFd<'_>, dir: BorrowedFd<'_>, devices: &GpuDevices) -> (u64, Option<bool>) {
    // `/proc/<pid>/fd` is its owner's (0500): a daemon of another user
    // without CAP_DAC_READ_SEARCH (the systemd unit keeps only CAP_SYS_PTRACE)
    // cannot list it, but may duplicate the descriptors through the pidfd.
    let limit = held::SCAN_LIMIT;
    let open = match held::open_files_in(dir, limit, devices).or_else(|e| {
        if e == Errno::EACCES {
            held::open_files_of_pidfd(pidfd, limit, devices)
        } else {
            Err(e)
        }
    }) {
        Ok(open) => open,
        Err(e) => {
            unreadable(e);
            return (0, None);
        }
    };
    let (beyond, open) = (open.beyond_limit, open.files);
    let stand_ins = match has_regular(&open) {
        true => nix::fcntl::openat(
            dir,
            "root",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(|root| held::stand_ins_under(root.as_fd(), devices))
        .unwrap_or_default(),
        false => Vec::new(),
    };
    (held::held_gpus(&open, devices, &stand_ins), beyond)
}

/// A client's open files could not be read, so it holds no GPU here. A
/// refusal (`EACCES`, `EPERM`: a process of another user, or one with
/// capabilities the daemon lacks) is a missing `CAP_SYS_PTRACE`, which the
/// log says once; the rest at debug level.
fn unreadable(e: Errno) {
    static SAID: AtomicBool = AtomicBool::new(false);
    match crate::caps::refusal(e as i32, crate::caps::Cap::SysPtrace) {
        Some(why) if !SAID.swap(true, Ordering::Relaxed) => tracing::warn!(
            error = %e,
            "cannot read a client's open files, so no GPU counts as its own: reading another process's \
             descriptors {why} (said once)"
        ),
        _ => tracing::debug!(error = %e, "cannot read a client's open files"),
    }
}

/// Whether `open` lists a regular file (which may stand in for a simulated GPU).
fn has_regular(open: &[OpenFile]) -> bool {
    open.iter().any(|f| matches!(f, OpenFile::Regular { .. }))
}

/// The GPUs that the process behind `pidfd`, whose pid is not visible here,
/// holds open: its descriptors through the pidfd, a simulated GPU's stand-in
/// inside its mount namespace.
fn gpus_of_hidden(pidfd: BorrowedFd<'_>, devices: &GpuDevices) -> (u64, Option<bool>) {
    let open = match held::open_files_of_pidfd(pidfd, held::SCAN_LIMIT, devices) {
        Ok(open) => open,
        Err(e) => {
            unreadable(e);
            return (0, None);
        }
    };
    let (beyond, open) = (open.beyond_limit, open.files);
    let stand_ins = match has_regular(&open) {
        true => pidfd_ns(pidfd, PIDFD_GET_MNT_NAMESPACE)
            .map(|ns| stand_ins_in_mount_ns(ns.as_fd(), devices))
            .unwrap_or_default(),
        false => Vec::new(),
    };
    (held::held_gpus(&open, devices, &stand_ins), beyond)
}

/// The simulated GPUs' stand-ins in mount namespace `ns`, looked up from a
/// thread that enters it (its own filesystem context first, so nothing else moves).
fn stand_ins_in_mount_ns(ns: BorrowedFd<'_>, devices: &GpuDevices) -> Vec<Option<FileId>> {
    let raw = ns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: `raw` stays open for the scope (borrowed by the caller).
            let ns = unsafe { BorrowedFd::borrow_raw(raw) };
            let entered = nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)
                .and_then(|_| nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNS));
            match entered.map_err(std::io::Error::from).and_then(|()| std::fs::File::open("/")) {
                Ok(root) => held::stand_ins_under(root.as_fd(), devices),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot enter a client's mount namespace");
                    Vec::new()
                }
            }
        })
        .join()
        .unwrap_or_default()
    })
}

/// The cgroup2 mount point in `mounts` (the text of `/proc/self/mounts`).
pub fn cgroup2_mount(mounts: &str) -> Option<std::path::PathBuf> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| std::path::PathBuf::from(f[1]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_information_names_the_minor() {
        let text = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nDevice Minor: \t 3\nBus Location: \t 0000:04:00.0\n";
        assert_eq!(device_minor(text), Some(3));
        assert_eq!(device_minor("Model: x\n"), None);
        let dir = tempfile::tempdir().unwrap();
        let gpu = dir.path().join("driver/nvidia/gpus/0000:0a:00.0");
        std::fs::create_dir_all(&gpu).unwrap();
        std::fs::write(gpu.join("information"), "Device Minor: 5\n").unwrap();
        let d = GpuDevices::from_driver(dir.path(), &["0000:04:00.0".into(), "0000:0a:00.0".into()], false);
        assert_eq!(d.minors, [0, 5], "listed: its minor; not listed: its place");
    }

    #[test]
    fn cgroup2_mount_is_found_in_a_hybrid_layout() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(cgroup2_mount(mounts), Some("/sys/fs/cgroup/unified".into()));
        assert_eq!(cgroup2_mount("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn this_process_is_its_own_tenant() {
        let own = crate::identity::pidfd_open(std::process::id()).unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let root = cgroup2_mount(&mounts);
        let devices = GpuDevices { minors: vec![0, 1], simulated: true };
        let t =
            identify(own.as_fd(), Some(std::process::id()), &devices, root.as_deref()).expect("identified");
        if let Ok(id) = peer::pidfd_cgroup_id(own.as_fd()) {
            assert_eq!(t.cgroup_id, id);
        }
        if let (Some(root), Some(path)) = (root, &t.cgroup) {
            let ino = std::fs::metadata(root.join(path.trim_start_matches('/'))).unwrap().ino();
            assert_eq!(t.cgroup_id, ino, "PIDFD_GET_INFO and the cgroup folder agree");
        }
        assert!(t.net.is_some());
    }

    #[test]
    fn a_process_that_has_exited_is_nobody_even_before_it_is_reaped() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = crate::identity::pidfd_open(child.id()).unwrap();
        while !peer::exited(pidfd.as_fd()) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let devices = GpuDevices { minors: vec![0], simulated: true };
        // A zombie: its pid is its own still, and nothing it held is left.
        assert_eq!(identify(pidfd.as_fd(), Some(child.id()), &devices, None).err(), Some(Unread::Exited));
        assert_eq!(proc_dir(pidfd.as_fd(), child.id()).err(), Some(Unread::Exited));
        child.wait().unwrap();
        assert_eq!(identify(pidfd.as_fd(), Some(child.id()), &devices, None).err(), Some(Unread::Exited));
    }
}
