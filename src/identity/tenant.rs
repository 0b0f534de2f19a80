//! Finding a client process's tenant: its cgroup (v2), the GPUs whose
//! device nodes it holds open, and its network namespace.
//!
//! - The cgroup id comes from `PIDFD_GET_INFO` (Linux 6.13), which works
//!   even when the process lives in a pid namespace the daemon cannot see;
//!   else from `/proc/<pid>/cgroup` (the `0::` line) and the inode of that
//!   folder under the cgroup2 mount, which is the same id.
//! - The GPUs: the device nodes among its open files (see `identity::held`).
//!   A simulated GPU's stand-in file is looked up under `/proc/<pid>/root`;
//!   where the pid is not visible, inside its mount namespace (from
//!   `PIDFD_GET_MNT_NAMESPACE`, Linux 6.11) on a short-lived thread.
//! - The network namespace: `/proc/<pid>/ns/net`, or
//!   `PIDFD_GET_NET_NAMESPACE`. Kept open: flow checks look sockets up in it.
//!
//! All of this is read once per client process, when it is first seen.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use nix::errno::Errno;

use super::held::{self, FileId, OpenFile};
pub use super::held::{device_minor, GpuDevices};
use crate::netlink::sock_diag::SockDiag;

/// `PIDFD_GET_MNT_NAMESPACE`: `_IO(0xFF, 3)`.
const PIDFD_GET_MNT_NAMESPACE: libc::c_ulong = 0xFF03;
/// `PIDFD_GET_NET_NAMESPACE`: `_IO(0xFF, 4)`.
const PIDFD_GET_NET_NAMESPACE: libc::c_ulong = 0xFF04;
/// `PIDFD_GET_INFO`: `_IOWR(0xFF, 11, struct pidfd_info)`, 64 bytes.
const PIDFD_GET_INFO: libc::c_ulong =
    (3 << 30) | ((PIDFD_INFO_SIZE as libc::c_ulong) << 16) | (0xFF << 8) | 11;
const PIDFD_INFO_SIZE: usize = 64;
/// `PIDFD_INFO_CGROUPID`.
const PIDFD_INFO_CGROUPID: u64 = 1 << 2;

/// `struct pidfd_info` (`<linux/pidfd.h>`, version 0).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    spare0: u32,
}

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
}

/// Idle `sock_diag` sockets kept per client process, at most.
const DIAG_IDLE: usize = 4;

impl NetNs {
    pub fn new(inode: u64, fd: OwnedFd) -> NetNs {
        NetNs { inode, fd, diag: Mutex::default(), released: AtomicBool::new(false) }
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
        Tenant { cgroup_id, cgroup, gpus, net }
    }

    /// How logs and `status` name it.
    pub fn name(&self) -> String {
        self.cgroup.clone().unwrap_or_else(|| format!("cgroup id {}", self.cgroup_id))
    }

    #[cfg(test)]
    pub(crate) fn for_test(cgroup_id: u64, gpus: u64) -> Tenant {
        Tenant { cgroup_id, cgroup: Some(format!("/test/{cgroup_id}")), gpus, net: None }
    }
}

/// Finds the tenant of the process behind `pidfd` (`pid`: its pid in the
/// daemon's namespace, where visible). `None`: its cgroup cannot be told.
pub fn identify(
    pidfd: BorrowedFd<'_>,
    pid: Option<u32>,
    devices: &GpuDevices,
    cgroup2: Option<&Path>,
) -> Option<Tenant> {
    let cgroup = pid
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/cgroup")).ok())
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("0::")).map(|s| s.trim().to_string()));
    let cgroup_id = match pidfd_cgroup_id(pidfd) {
        Ok(id) => id,
        Err(_) => {
            let (root, path) = (cgroup2?, cgroup.as_deref()?);
            std::fs::metadata(root.join(path.trim_start_matches('/'))).ok()?.ino()
        }
    };
    let gpus = match pid {
        Some(p) => gpus_of_visible(pidfd, p, devices),
        None => gpus_of_hidden(pidfd, devices),
    };
    let net = open_net(pidfd, pid);
    Some(Tenant { cgroup_id, cgroup, gpus, net })
}

/// The network namespace of the process behind `pidfd` (`pid`: its pid in
/// the daemon's namespace, where visible): `/proc/<pid>/ns/net`, else
/// `PIDFD_GET_NET_NAMESPACE` (Linux 6.11).
pub fn open_net(pidfd: BorrowedFd<'_>, pid: Option<u32>) -> Option<NetNs> {
    let fd = pid
        .and_then(|p| std::fs::File::open(format!("/proc/{p}/ns/net")).ok().map(OwnedFd::from))
        .or_else(|| pidfd_ns(pidfd, PIDFD_GET_NET_NAMESPACE).ok())?;
    let inode = nix::sys::stat::fstat(fd.as_fd()).ok()?.st_ino;
    // Read by pid: only if the process is still there did the pid name it.
    (pid.is_none() || held::still_there(pidfd)).then(|| NetNs::new(inode, fd))
}

/// The cgroup v2 id of the process behind `pidfd` (`PIDFD_GET_INFO`).
pub fn pidfd_cgroup_id(pidfd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut info = PidfdInfo { mask: PIDFD_INFO_CGROUPID, ..PidfdInfo::default() };
    // SAFETY: `info` is a valid, writable pidfd_info of the size the request encodes.
    let r = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_INFO as _, &mut info as *mut PidfdInfo) };
    if r != 0 {
        return Err(Errno::last());
    }
    if info.mask & PIDFD_INFO_CGROUPID == 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(info.cgroupid)
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

/// The GPUs that process `pid` (behind `pidfd`) holds open, read through `/proc/<pid>`.
fn gpus_of_visible(pidfd: BorrowedFd<'_>, pid: u32, devices: &GpuDevices) -> u64 {
    // `/proc/<pid>/fd` is its owner's (0500): a daemon of another user
    // without CAP_DAC_READ_SEARCH (the systemd unit keeps only CAP_SYS_PTRACE)
    // cannot list it, but may duplicate the descriptors through the pidfd.
    let open = match held::open_files_of_pid(pid).or_else(|e| {
        if e == Errno::EACCES {
            held::open_files_of_pidfd(pidfd, held::PIDFD_SCAN)
        } else {
            Err(e)
        }
    }) {
        Ok(open) => open,
        Err(e) => {
            tracing::debug!(pid, error = %e, "cannot read a client's open files");
            return 0;
        }
    };
    let stand_ins = match devices.simulated {
        true => std::fs::File::open(format!("/proc/{pid}/root"))
            .map(|root| held::stand_ins_under(root.as_fd(), devices))
            .unwrap_or_default(),
        false => Vec::new(),
    };
    // Read by pid: only if the process is still there did the pid name it throughout.
    match held::still_there(pidfd) {
        true => held::held_gpus(&open, devices, &stand_ins),
        false => 0,
    }
}

/// The GPUs that the process behind `pidfd`, whose pid is not visible here,
/// holds open: its descriptors through the pidfd, a simulated GPU's stand-in
/// inside its mount namespace.
fn gpus_of_hidden(pidfd: BorrowedFd<'_>, devices: &GpuDevices) -> u64 {
    let open = match held::open_files_of_pidfd(pidfd, held::PIDFD_SCAN) {
        Ok(open) => open,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the open files of a client in another pid namespace");
            return 0;
        }
    };
    let stand_ins = match (devices.simulated, open.iter().any(|f| matches!(f, OpenFile::Regular(_)))) {
        (true, true) => pidfd_ns(pidfd, PIDFD_GET_MNT_NAMESPACE)
            .map(|ns| stand_ins_in_mount_ns(ns.as_fd(), devices))
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    held::held_gpus(&open, devices, &stand_ins)
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
    fn pidfd_info_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<PidfdInfo>(), PIDFD_INFO_SIZE);
        assert_eq!(std::mem::offset_of!(PidfdInfo, cgroupid), 8);
        assert_eq!(std::mem::offset_of!(PidfdInfo, pid), 16);
        assert_eq!(std::mem::offset_of!(PidfdInfo, fsgid), 56);
        assert_eq!(PIDFD_GET_INFO, 0xC040_FF0B);
    }

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
        if let (Some(root), Some(path)) = (root, &t.cgroup) {
            let ino = std::fs::metadata(root.join(path.trim_start_matches('/'))).unwrap().ino();
            assert_eq!(t.cgroup_id, ino, "PIDFD_GET_INFO and the cgroup folder agree");
        }
        assert!(t.net.is_some());
    }
}
