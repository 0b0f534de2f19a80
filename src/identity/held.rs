//! Which GPUs a client process can use: those whose device node it holds open.
//!
//! A device node in a container's `/dev` proves nothing. A container may
//! create a node (`mknod`), a symlink or a plain file of any name, including
//! one it is not allowed to open: the device cgroup decides what it may open.
//! A process that holds the node open was allowed to, and a CUDA process
//! holds `/dev/nvidia<minor>` of every GPU it can use open from `cuInit` on.
//! So a client's GPUs are the character devices 195:`<minor>` among its open
//! files, whatever name it opened them by.
//!
//! Simulated GPUs (host pools) have no device. A regular file at
//! `/dev/nvidia<minor>` of the client's root stands in for one, when the
//! client holds that very file open (same device and inode) and no part of
//! the path is a symlink: `dev` and `nvidia<minor>` are opened one at a time
//! with `O_NOFOLLOW`, so a link is never followed, least of all an absolute
//! one, which would resolve against the daemon's root.
//!
//! The open files come from `/proc/<pid>/fd`, or, where the pid is not
//! visible, one by one through the pidfd (`pidfd_getfd`, the first
//! [`PIDFD_SCAN`] descriptors). Each is looked at with
//! `statx(AT_STATX_DONT_SYNC)`: cached attributes, so that a file on a hung
//! network or FUSE mount costs no round trip. Nothing is opened by a path the
//! client controls except, for simulated GPUs, the stand-in.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

/// The NVIDIA character devices' major number.
pub const NVIDIA_MAJOR: u32 = 195;
/// Descriptors looked at through a pidfd, at most: CUDA opens its device
/// nodes at `cuInit`, early in a process's life, so they have low numbers.
pub const PIDFD_SCAN: i32 = 4096;

/// How the daemon's GPUs appear as device nodes, in topology order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuDevices {
    /// The minor of each GPU's `/dev/nvidia<minor>`.
    pub minors: Vec<u32>,
    /// Simulated GPUs: a regular file of that name, held open, counts too.
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

/// A file, as the kernel names it: its filesystem's device and its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: (u32, u32),
    pub ino: u64,
}

/// An open file of a process, as far as the GPU check goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFile {
    /// A character device, by its numbers.
    CharDevice {
        major: u32,
        minor: u32,
    },
    Regular(FileId),
    /// A socket, pipe, folder, ...: never a GPU.
    Other,
}

/// The GPUs (topology order, as a bit set) that a process holding `open`
/// can use. `stand_ins[i]`: the regular file standing in for GPU `i`'s node,
/// for simulated GPUs.
pub fn held_gpus(open: &[OpenFile], devices: &GpuDevices, stand_ins: &[Option<FileId>]) -> u64 {
    let mut set = 0u64;
    for (i, minor) in devices.minors.iter().enumerate().take(64) {
        let stand_in = stand_ins.get(i).copied().flatten().filter(|_| devices.simulated);
        let held = open.iter().any(|f| match *f {
            OpenFile::CharDevice { major, minor: m } => major == NVIDIA_MAJOR && m == *minor,
            OpenFile::Regular(id) => stand_in == Some(id),
            OpenFile::Other => false,
        });
        if held {
            set |= 1 << i;
        }
    }
    set
}

/// `statx` of `name` under the folder fd `dir` (or `AT_FDCWD`; an empty
/// name with `AT_EMPTY_PATH`: `dir` itself), from cached
/// attributes only; symlinks are followed unless `flags` says otherwise.
fn statx_at(dir: libc::c_int, name: &CStr, flags: libc::c_int) -> Result<libc::statx, Errno> {
    // SAFETY: statx is plain data: all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = flags | libc::AT_STATX_DONT_SYNC;
    let mask = libc::STATX_TYPE | libc::STATX_INO;
    // SAFETY: `name` is NUL-terminated and `stx` valid for writes; a bad
    // `dir` is an error return, not undefined behaviour.
    let r = unsafe { libc::statx(dir, name.as_ptr(), flags, mask, &mut stx) };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(stx)
}

fn classify(stx: &libc::statx) -> OpenFile {
    match u32::from(stx.stx_mode) & libc::S_IFMT {
        libc::S_IFCHR => OpenFile::CharDevice { major: stx.stx_rdev_major, minor: stx.stx_rdev_minor },
        libc::S_IFREG => OpenFile::Regular(file_id(stx)),
        _ => OpenFile::Other,
    }
}

fn file_id(stx: &libc::statx) -> FileId {
    FileId { dev: (stx.stx_dev_major, stx.stx_dev_minor), ino: stx.stx_ino }
}

/// The open files of process `pid`, from `/proc/<pid>/fd`. Descriptors
/// closed while the folder is read are left out.
pub fn open_files_of_pid(pid: u32) -> Result<Vec<OpenFile>, Errno> {
    let folder = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&folder).map_err(errno_of)?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(errno_of)?;
        let Ok(path) = std::ffi::CString::new(entry.path().into_os_string().into_encoded_bytes()) else {
            continue;
        };
        // Following the magic link: the open file itself.
        match statx_at(libc::AT_FDCWD, &path, 0) {
            Ok(stx) => out.push(classify(&stx)),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn errno_of(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// `pidfd_getfd(pidfd, fd, 0)` (Linux 5.6): a duplicate of another
/// process's descriptor.
fn pidfd_getfd(pidfd: BorrowedFd<'_>, fd: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: plain syscall with integer arguments; on success it returns a new fd we own.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0 as libc::c_uint) };
    if r < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `r` is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// The open files among the first `limit` descriptors of the process behind
/// `pidfd`, duplicated one at a time (needs the right to ptrace it).
pub fn open_files_of_pidfd(pidfd: BorrowedFd<'_>, limit: i32) -> Result<Vec<OpenFile>, Errno> {
    let mut out = Vec::new();
    for n in 0..limit {
        match pidfd_getfd(pidfd, n) {
            Ok(fd) => {
                if let Ok(stx) = statx_at(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH) {
                    out.push(classify(&stx));
                }
            }
            Err(Errno::EBADF) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// For each GPU of `devices`: the regular file at `dev/nvidia<minor>` under
/// `root`, where neither `dev` nor the file is a symlink (`None` otherwise,
/// and for every GPU when they are not simulated).
pub fn stand_ins_under(root: BorrowedFd<'_>, devices: &GpuDevices) -> Vec<Option<FileId>> {
    if !devices.simulated {
        return Vec::new();
    }
    let path = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Ok(dev) = openat(root, "dev", path | OFlag::O_DIRECTORY, Mode::empty()) else {
        return vec![None; devices.minors.len()];
    };
    devices
        .minors
        .iter()
        .map(|minor| {
            let node = openat(dev.as_fd(), format!("nvidia{minor}").as_str(), path, Mode::empty()).ok()?;
            let stx =
                statx_at(node.as_raw_fd(), c"", libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW).ok()?;
            (u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFREG).then(|| file_id(&stx))
        })
        .collect()
}

/// Whether the process behind `pidfd` is still running (or a zombie): then
/// its pid named it all along.
pub fn still_there(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: plain syscall: signal 0 only checks that the process exists.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    r == 0 || Errno::last() == Errno::EPERM
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn devices(simulated: bool) -> GpuDevices {
        GpuDevices { minors: vec![0, 1, 5], simulated }
    }

    #[test]
    fn a_gpu_is_held_by_its_device_or_for_simulated_gpus_its_stand_in() {
        let stand_in = FileId { dev: (0, 40), ino: 7 };
        let other = FileId { dev: (0, 40), ino: 8 };
        let stand_ins = [None, Some(stand_in), None];
        let open = [
            OpenFile::Other,
            OpenFile::CharDevice { major: NVIDIA_MAJOR, minor: 5 },
            OpenFile::CharDevice { major: 10, minor: 0 },
            OpenFile::Regular(other),
        ];
        assert_eq!(held_gpus(&open, &devices(false), &stand_ins), 0b100, "195:5 is the third GPU");
        assert_eq!(held_gpus(&open, &devices(true), &stand_ins), 0b100, "another file stands in for nothing");
        let open = [OpenFile::Regular(stand_in)];
        assert_eq!(held_gpus(&open, &devices(true), &stand_ins), 0b010);
        assert_eq!(held_gpus(&open, &devices(false), &stand_ins), 0, "real GPUs: only the device counts");
        assert_eq!(held_gpus(&[], &devices(true), &stand_ins), 0, "present, not held");
    }

    #[test]
    fn only_a_held_regular_file_reached_without_a_link_stands_in() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        std::fs::write(dev.join("nvidia0"), b"").unwrap();
        symlink("nvidia0", dev.join("nvidia1")).unwrap();
        std::fs::write(dev.join("nvidia5"), b"").unwrap();
        // Through the link, this process holds nvidia0 twice; nvidia5 not at all.
        let _a = std::fs::File::open(dev.join("nvidia0")).unwrap();
        let _b = std::fs::File::open(dev.join("nvidia1")).unwrap();
        let rootfd = std::fs::File::open(root.path()).unwrap();
        let d = devices(true);
        let stand_ins = stand_ins_under(rootfd.as_fd(), &d);
        assert!(stand_ins[0].is_some() && stand_ins[1].is_none() && stand_ins[2].is_some(), "{stand_ins:?}");
        let open = open_files_of_pid(std::process::id()).unwrap();
        assert_eq!(held_gpus(&open, &d, &stand_ins), 0b001);
        // The same files through the pidfd.
        let own = crate::identity::pidfd_open(std::process::id()).unwrap();
        let mut through_pidfd = open_files_of_pidfd(own.as_fd(), PIDFD_SCAN).unwrap();
        assert_eq!(held_gpus(&through_pidfd, &d, &stand_ins), 0b001);
        let id = stand_ins[0].unwrap();
        through_pidfd.retain(|f| *f == OpenFile::Regular(id));
        assert!(through_pidfd.len() >= 2, "both descriptors of nvidia0 are seen");
        // A `dev` that is itself a link is not followed.
        let other = tempfile::tempdir().unwrap();
        symlink(&dev, other.path().join("dev")).unwrap();
        let otherfd = std::fs::File::open(other.path()).unwrap();
        assert_eq!(stand_ins_under(otherfd.as_fd(), &d), vec![None; 3]);
        assert!(still_there(own.as_fd()));
    }

    #[test]
    fn an_exited_process_is_not_there() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = crate::identity::pidfd_open(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!still_there(pidfd.as_fd()));
    }
}
