//! Finding a client process's tenant: its cgroup (v2), the GPUs whose
//! device nodes it can see, and its network namespace.
//!
//! - The cgroup id comes from `PIDFD_GET_INFO` (Linux 6.13), which works
//!   even when the process lives in a pid namespace the daemon cannot see;
//!   else from `/proc/<pid>/cgroup` (the `0::` line) and the inode of that
//!   folder under the cgroup2 mount, which is the same id.
//! - The GPUs: `/dev/nvidia<minor>` as the process sees it, through
//!   `/proc/<pid>/root`; where the pid is not visible, inside its mount
//!   namespace (from `PIDFD_GET_MNT_NAMESPACE`, Linux 6.11) on a short-lived
//!   thread. A character device must carry the GPU's minor; a regular file
//!   counts only for simulated GPUs (host pools), which tests use.
//! - The network namespace: `/proc/<pid>/ns/net`, or
//!   `PIDFD_GET_NET_NAMESPACE`. Kept open: flow checks look sockets up in it.
//!
//! All of this is read once per client process, when it is first seen.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use nix::errno::Errno;

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
/// The NVIDIA character devices' major number.
const NVIDIA_MAJOR: u64 = 195;

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

/// How the daemon's GPUs appear as device nodes, in topology order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuDevices {
    /// The minor of each GPU's `/dev/nvidia<minor>`.
    pub minors: Vec<u32>,
    /// Simulated GPUs: a regular file of that name counts too.
    pub simulated: bool,
}

impl GpuDevices {
    /// The minors of `pcis` from the NVIDIA driver's
    /// `<procfs>/driver/nvidia/gpus/<pci>/information` (`Device Minor:`); a
    /// GPU the driver does not list gets its place in the topology.
    pub fn from_driver(procfs: &Path, pcis: &[String], simulated: bool) -> GpuDevices {
        let minors = pcis
            .iter()
            .enumerate()
            .map(|(i, pci)| {
                let info = procfs.join("driver/nvidia/gpus").join(pci).join("information");
                std::fs::read_to_string(info).ok().and_then(|t| device_minor(&t)).unwrap_or(i as u32)
            })
            .collect();
        GpuDevices { minors, simulated }
    }
}

/// The `Device Minor:` of the NVIDIA driver's information file.
pub fn device_minor(information: &str) -> Option<u32> {
    information.lines().find_map(|l| l.trim().strip_prefix("Device Minor:")?.trim().parse().ok())
}

/// A network namespace, kept open.
#[derive(Debug)]
pub struct NetNs {
    /// Its nsfs inode: names the namespace.
    pub inode: u64,
    pub fd: OwnedFd,
}

/// What a client process is, as far as isolation goes.
#[derive(Debug)]
pub struct Tenant {
    /// The id of its cgroup v2 (the folder's inode number).
    pub cgroup_id: u64,
    /// The cgroup's path, where it could be read (for logs and `status`).
    pub cgroup: Option<String>,
    /// The GPUs (topology order) whose device node it sees, as a bit set.
    gpus: u64,
    /// Its network namespace, where it could be opened.
    pub net: Option<NetNs>,
}

impl Tenant {
    /// Whether it sees the device node of the GPU at topology place `gpu`.
    pub fn sees_gpu(&self, gpu: usize) -> bool {
        gpu < 64 && self.gpus & (1 << gpu) != 0
    }

    /// The GPUs it sees, as a bit set (topology order).
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
        Some(p) => visible_gpus(&format!("/proc/{p}/root"), devices),
        None => pidfd_ns(pidfd, PIDFD_GET_MNT_NAMESPACE)
            .map(|ns| gpus_in_mount_ns(ns.as_fd(), devices))
            .unwrap_or(0),
    };
    let net_fd = pid
        .and_then(|p| std::fs::File::open(format!("/proc/{p}/ns/net")).ok().map(OwnedFd::from))
        .or_else(|| pidfd_ns(pidfd, PIDFD_GET_NET_NAMESPACE).ok());
    let net = net_fd.and_then(|fd| Some(NetNs { inode: nix::sys::stat::fstat(fd.as_fd()).ok()?.st_ino, fd }));
    Some(Tenant { cgroup_id, cgroup, gpus, net })
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

/// Whether `path` is the device node of minor `minor` (or, for simulated
/// GPUs, any regular file).
fn is_gpu_node(path: &str, minor: u32, simulated: bool) -> bool {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() => {
            let rdev = m.rdev();
            nix::sys::stat::major(rdev) == NVIDIA_MAJOR && nix::sys::stat::minor(rdev) == u64::from(minor)
        }
        Ok(m) => simulated && m.is_file(),
        Err(_) => false,
    }
}

/// The GPUs whose device node exists under `root`/dev.
fn visible_gpus(root: &str, devices: &GpuDevices) -> u64 {
    let mut set = 0u64;
    for (i, minor) in devices.minors.iter().enumerate().take(64) {
        if is_gpu_node(&format!("{root}/dev/nvidia{minor}"), *minor, devices.simulated) {
            set |= 1 << i;
        }
    }
    set
}

/// The GPUs visible in mount namespace `ns`, looked at from a thread that
/// enters it (its own filesystem context first, so nothing else moves).
fn gpus_in_mount_ns(ns: BorrowedFd<'_>, devices: &GpuDevices) -> u64 {
    let raw = ns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: `raw` stays open for the scope (borrowed by the caller).
            let ns = unsafe { BorrowedFd::borrow_raw(raw) };
            let entered = nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)
                .and_then(|_| nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNS));
            match entered {
                Ok(()) => visible_gpus("", devices),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot enter a client's mount namespace");
                    0
                }
            }
        })
        .join()
        .unwrap_or(0)
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
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("dev/nvidia1"), b"").unwrap();
        let devices = GpuDevices { minors: vec![0, 1], simulated: true };
        let t =
            identify(own.as_fd(), Some(std::process::id()), &devices, root.as_deref()).expect("identified");
        if let (Some(root), Some(path)) = (root, &t.cgroup) {
            let ino = std::fs::metadata(root.join(path.trim_start_matches('/'))).unwrap().ino();
            assert_eq!(t.cgroup_id, ino, "PIDFD_GET_INFO and the cgroup folder agree");
        }
        assert!(t.net.is_some());
        // The device check itself, on a root of our own.
        let root = dir.path().display().to_string();
        assert_eq!(visible_gpus(&root, &devices), 0b10);
        assert_eq!(
            visible_gpus(&root, &GpuDevices { simulated: false, ..devices }),
            0,
            "a file is no device"
        );
    }
}
