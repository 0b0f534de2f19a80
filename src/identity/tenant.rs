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
//!   the cgroup2 mount, which is the same id. Its workload, what budgets
//!   count by, comes from that path (see `identity::workload`).
//! - The GPUs: the device nodes among its open files, read through the
//!   folder's `fd` and `fdinfo` without waiting on any file system the
//!   client controls (see `identity::held`). A simulated GPU's stand-in file
//!   is looked up under the folder's `root`, through cached names only.
//!   Where the pid is not visible there is no folder, and the open files are
//!   not read: the process holds no GPU here, and a refusal says why.
//! - The network namespace: `PIDFD_GET_NET_NAMESPACE` (Linux 6.11), or the
//!   folder's `ns/net`. Kept open: flow checks look sockets up in it.
//!
//! All of this is read once per client process, when it is first seen.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::flows_space::FlowSpace;
use super::held::{self, NotRead, OpenFile};
pub use super::held::{device_minor, FilesRead, GpuDevices};
pub use super::workload::cgroup2_mount;
use super::workload::{self, Workload};
use crate::netlink::sock_diag::SockDiag;
use crate::pidfd::{Namespace, Pidfd};

/// A network namespace, kept open.
#[derive(Debug)]
pub struct NetNs {
    /// Its nsfs inode: names the namespace.
    pub inode: u64,
    /// The handle that keeps it open: closed when its process exits
    /// ([`NetNs::release`]), so that a deleted Pod namespace can go.
    fd: RwLock<Option<OwnedFd>>,
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
        NetNs {
            inode,
            fd: RwLock::new(Some(fd)),
            diag: Mutex::default(),
            released: AtomicBool::new(false),
            space: OnceLock::new(),
        }
    }

    /// `f` on the namespace's handle, while it is held; `None` once released.
    pub fn with_fd<T>(&self, f: impl FnOnce(BorrowedFd<'_>) -> T) -> Option<T> {
        let fd = self.fd.read().unwrap_or_else(|p| p.into_inner());
        fd.as_ref().map(|fd| f(fd.as_fd()))
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

    /// The process whose namespace this is has exited: its handle and its
    /// sockets close now (those in use close when given back), so that they
    /// pin nothing.
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        let idle = std::mem::take(&mut *self.diag.lock().expect("sock_diag cache lock"));
        drop(idle);
        drop(self.fd.write().unwrap_or_else(|p| p.into_inner()).take());
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
    /// The workload it belongs to: what its budgets are counted by, and
    /// whose rules it may remove.
    pub workload: Workload,
    /// The GPUs (topology order) whose device node it holds open, as a bit set.
    gpus: u64,
    /// Its network namespace, where it could be opened.
    pub net: Option<NetNs>,
    /// How much of its open files was read, when it was first seen.
    pub files: FilesRead,
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

    /// A tenant as a takeover hands it on, in `workload` as this daemon tells it.
    pub fn from_parts(
        id: u64,
        cgroup: Option<String>,
        workload: Workload,
        gpus: u64,
        net: Option<NetNs>,
    ) -> Tenant {
        Tenant { cgroup_id: id, cgroup, workload, gpus, net, files: FilesRead::Unknown }
    }

    /// How refusals, logs and `status` name it: its workload.
    pub fn name(&self) -> String {
        self.workload.name()
    }

    #[cfg(test)]
    pub(crate) fn for_test(cgroup_id: u64, gpus: u64) -> Tenant {
        let cgroup = Some(format!("/test/{cgroup_id}"));
        Tenant {
            cgroup_id,
            workload: Workload::cgroup(cgroup_id, cgroup.clone()),
            cgroup,
            gpus,
            net: None,
            files: FilesRead::All,
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

/// Finds the tenant of the process behind `pidfd`, its workload told by
/// `rule`. `pid`: its pid in the daemon's namespace as its pidfd gave it
/// (`None`: not visible), never a number from anywhere else.
pub fn identify(
    pidfd: &Pidfd,
    pid: Option<u32>,
    devices: &GpuDevices,
    cgroup2: Option<&Path>,
    rule: workload::Rule,
) -> Result<Tenant, Unread> {
    let t = match pid {
        Some(p) => identify_visible(pidfd, p, devices, cgroup2, rule)?,
        None => identify_hidden(pidfd)?,
    };
    match pidfd.exited() {
        true => Err(Unread::Exited),
        false => Ok(t),
    }
}

/// `/proc/<pid>` of the process behind `pidfd`, which has pid `pid`: the
/// folder is opened, then the process is checked not to have exited, so
/// the pid named it when the folder was opened, and the folder names it
/// from then on.
pub fn proc_dir(pidfd: &Pidfd, pid: u32) -> Result<OwnedFd, Unread> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let dir = nix::fcntl::open(format!("/proc/{pid}").as_str(), flags, Mode::empty());
    match (dir, pidfd.exited()) {
        (_, true) => Err(Unread::Exited),
        (Ok(dir), false) => Ok(dir),
        (Err(e), false) => {
            tracing::debug!(pid, error = %e, "cannot open a client's /proc folder");
            Err(Unread::Unknown)
        }
    }
}

fn identify_visible(
    pidfd: &Pidfd,
    pid: u32,
    devices: &GpuDevices,
    cgroup2: Option<&Path>,
    rule: workload::Rule,
) -> Result<Tenant, Unread> {
    let dir = proc_dir(pidfd, pid)?;
    let cgroup = cgroup_path(dir.as_fd());
    let cgroup_id = match pidfd.cgroup_id() {
        Ok(id) => id,
        Err(_) => {
            let (root, path) = (cgroup2.ok_or(Unread::Unknown)?, cgroup.as_deref().ok_or(Unread::Unknown)?);
            std::fs::metadata(root.join(path.trim_start_matches('/'))).map_err(|_| Unread::Unknown)?.ino()
        }
    };
    let workload = workload::resolve(cgroup_id, cgroup.as_deref(), rule, cgroup2);
    let (gpus, files) = gpus_of_visible(dir.as_fd(), devices);
    let net = open_net(pidfd, Some(dir.as_fd()));
    Ok(Tenant { cgroup_id, cgroup, workload, gpus, net, files })
}

/// A process whose pid is not visible here: its cgroup and network
/// namespace through the pidfd, and no GPU. Its open files could be had
/// only by copying each descriptor out of it (`pidfd_getfd`) and closing
/// the copy, and closing a copy of a file whose FUSE server never answers
/// waits for good, past the daemon's own exit; so they are not read.
fn identify_hidden(pidfd: &Pidfd) -> Result<Tenant, Unread> {
    let cgroup_id = pidfd.cgroup_id().map_err(|_| Unread::Unknown)?;
    let net = open_net(pidfd, None);
    let workload = Workload::hidden(cgroup_id);
    Ok(Tenant { cgroup_id, cgroup: None, workload, gpus: 0, net, files: FilesRead::None(NotRead::Hidden) })
}

/// The cgroup v2 path (the `0::` line) in a process's `/proc` folder `dir`.
pub fn cgroup_path(dir: BorrowedFd<'_>) -> Option<String> {
    let text = read_in(dir, "cgroup")?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(|s| s.trim().to_string())
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
pub fn open_net(pidfd: &Pidfd, proc_dir: Option<BorrowedFd<'_>>) -> Option<NetNs> {
    let fd = pidfd.namespace(Namespace::Net).ok().or_else(|| {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        nix::fcntl::openat(proc_dir?, "ns/net", flags, Mode::empty()).ok()
    })?;
    let inode = nix::sys::stat::fstat(fd.as_fd()).ok()?.st_ino;
    Some(NetNs::new(inode, fd))
}

/// The GPUs that a process holds open, read through its `/proc` folder
/// `dir`, and how much of its open files was read.
fn gpus_of_visible(dir: BorrowedFd<'_>, devices: &GpuDevices) -> (u64, FilesRead) {
    let open = match held::open_files_in(dir, held::SCAN_LIMIT, devices) {
        Ok(open) => open,
        Err(why) => {
            unreadable(why);
            return (0, FilesRead::None(why));
        }
    };
    let files = if open.beyond_limit { FilesRead::UpToLimit } else { FilesRead::All };
    let stand_ins = match has_regular(&open.files) {
        true => {
            held::root_of(dir).map(|root| held::stand_ins_under(root.as_fd(), devices)).unwrap_or_default()
        }
        false => Vec::new(),
    };
    (held::held_gpus(&open.files, devices, &stand_ins), files)
}

/// A client's open files could not be read, so it holds no GPU here; the
/// log says why once for each cause an operator can change. A folder that
/// cannot be listed is a process of another user and no
/// `CAP_DAC_READ_SEARCH`; a refusal to show a descriptor (`EACCES`,
/// `EPERM`: a process of another user, or one with capabilities the daemon
/// lacks) is a missing `CAP_SYS_PTRACE`; the rest at debug level.
fn unreadable(why: NotRead) {
    static UNLISTED: AtomicBool = AtomicBool::new(false);
    static REFUSED: AtomicBool = AtomicBool::new(false);
    match why {
        NotRead::Unlisted if !UNLISTED.swap(true, Ordering::Relaxed) => tracing::warn!(
            "cannot list the open files of a client process of another user (/proc/<pid>/fd is its owner's), \
             so no GPU counts as its own: listing them {}; they are not read another way, since copying a \
             descriptor out of the process or reading every descriptor's fdinfo can wait without end on a \
             file system the client serves (said once)",
            crate::caps::lacking(crate::caps::Cap::DacReadSearch)
        ),
        NotRead::Refused(e) => match crate::caps::refusal(e as i32, crate::caps::Cap::SysPtrace) {
            Some(why) if !REFUSED.swap(true, Ordering::Relaxed) => tracing::warn!(
                error = %e,
                "cannot read a client's open files, so no GPU counts as its own: reading another \
                 process's descriptors {why} (said once)"
            ),
            _ => tracing::debug!(error = %e, "cannot read a client's open files"),
        },
        _ => tracing::debug!("a client's open files were not read: {why}"),
    }
}

/// Whether `open` lists a regular file (which may stand in for a simulated GPU).
fn has_regular(open: &[OpenFile]) -> bool {
    open.iter().any(|f| matches!(f, OpenFile::Regular { .. }))
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
    fn this_process_is_its_own_tenant() {
        let own = Pidfd::own().unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let root = cgroup2_mount(&mounts);
        let devices = GpuDevices { minors: vec![0, 1], simulated: true };
        let rule = workload::Rule::Layouts;
        let t =
            identify(&own, Some(std::process::id()), &devices, root.as_deref(), rule).expect("identified");
        if let Ok(id) = own.cgroup_id() {
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
        let pidfd = Pidfd::open(child.id()).unwrap();
        while !pidfd.exited() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let devices = GpuDevices { minors: vec![0], simulated: true };
        // A zombie: its pid is its own still, and nothing it held is left.
        let rule = workload::Rule::Layouts;
        assert_eq!(identify(&pidfd, Some(child.id()), &devices, None, rule).err(), Some(Unread::Exited));
        assert_eq!(proc_dir(&pidfd, child.id()).err(), Some(Unread::Exited));
        child.wait().unwrap();
        assert_eq!(identify(&pidfd, Some(child.id()), &devices, None, rule).err(), Some(Unread::Exited));
    }
}
