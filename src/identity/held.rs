//! Which GPUs a client process can use: those whose device node it holds
//! open for reading and writing.
//!
//! A device node in a container's `/dev` proves nothing. A container may
//! create a node (`mknod`), a symlink or a plain file of any name, including
//! one it is not allowed to open: the device cgroup decides what it may open.
//! A process that holds the node open was allowed to, and a CUDA process
//! holds `/dev/nvidia<minor>` of every GPU it can use open from `cuInit` on.
//! So a client's GPUs are the character devices 195:`<minor>` among its open
//! files, whatever name it opened them by, opened for reading and writing
//! (`O_RDWR`, as CUDA opens them). A descriptor that only names the node
//! (`O_PATH`, which needs no permission on the device) or opens it one way
//! (`O_RDONLY`, `O_WRONLY`) gives no GPU.
//!
//! Simulated GPUs (host pools) have no device. A regular file at
//! `/dev/nvidia<minor>` of the client's root stands in for one, when the
//! client holds that very file open (same device and inode) and no part of
//! the path is a symlink: `dev` and `nvidia<minor>` are opened one at a time
//! with `O_NOFOLLOW`, so a link is never followed, least of all an absolute
//! one, which would resolve against the daemon's root.
//!
//! The open files come from the `fd` folder of the process's `/proc/<pid>`,
//! opened as a folder descriptor while the process was known to hold that
//! pid (the descriptor keeps naming it, whoever gets the pid later), or,
//! where the pid is not visible, one by one through the pidfd
//! (`pidfd_getfd`). Either way only the descriptors numbered below
//! [`SCAN_LIMIT`] are looked at: a process may hold hundreds of thousands,
//! and the kernel's listing alone costs microseconds per descriptor. CUDA
//! opens its device nodes at `cuInit`, early in a process's life, so they
//! have low numbers; a GPU opened beyond the limit is not seen, and its
//! refusal says so. Each descriptor is looked at
//! with `statx(AT_STATX_DONT_SYNC)`: cached attributes, so that a file on a
//! hung network or FUSE mount costs no round trip. The open mode of the few
//! that may be GPUs comes from `fdinfo/<fd>` of the same folder, which must
//! name the same file (mount and inode: the process may have swapped the
//! descriptor meanwhile), or from `F_GETFL` on the duplicate. Nothing is
//! opened by a path the client controls except, for simulated GPUs, the
//! stand-in.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

/// The NVIDIA character devices' major number.
pub const NVIDIA_MAJOR: u32 = 195;
/// Descriptors looked at per process: those numbered below this, on both
/// paths (`/proc/<pid>/fd` and the pidfd). CUDA opens its device nodes at
/// `cuInit`, early in a process's life, so they have low numbers; the
/// limit bounds what a process holding very many files costs the daemon
/// (a few milliseconds at most).
pub const SCAN_LIMIT: i32 = 4096;

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

/// The open files of a process that may give it a GPU, among its
/// descriptors numbered below the scan's limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenFiles {
    pub files: Vec<OpenFile>,
    /// It also holds descriptors at or above the limit, which were not
    /// looked at; `None` where that cannot be told (the pidfd path).
    pub beyond_limit: Option<bool>,
}

/// An open file of a process that may give it a GPU: an NVIDIA device node
/// or, for simulated GPUs, a regular file (a stand-in, perhaps). Other files
/// are not listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFile {
    /// Character device 195:`minor`.
    Nvidia {
        minor: u32,
        read_write: bool,
    },
    Regular {
        id: FileId,
        read_write: bool,
    },
}

/// The GPUs (topology order, as a bit set) that a process holding `open`
/// can use: those whose node it holds open for reading and writing.
/// `stand_ins[i]`: the regular file standing in for GPU `i`'s node, for
/// simulated GPUs.
pub fn held_gpus(open: &[OpenFile], devices: &GpuDevices, stand_ins: &[Option<FileId>]) -> u64 {
    let mut set = 0u64;
    for (i, minor) in devices.minors.iter().enumerate().take(64) {
        let stand_in = stand_ins.get(i).copied().flatten().filter(|_| devices.simulated);
        let held = open.iter().any(|f| match *f {
            OpenFile::Nvidia { minor: m, read_write } => read_write && m == *minor,
            OpenFile::Regular { id, read_write } => read_write && stand_in == Some(id),
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
    let mask = libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID;
    // SAFETY: `name` is NUL-terminated and `stx` valid for writes; a bad
    // `dir` is an error return, not undefined behaviour.
    let r = unsafe { libc::statx(dir, name.as_ptr(), flags, mask, &mut stx) };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(stx)
}

/// What an open file may be to the GPU check, before its open mode is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
    Nvidia(u32),
    Regular(FileId),
}

impl Candidate {
    /// `stx` as a candidate: the NVIDIA node of one of `devices`, or a
    /// regular file where they are simulated.
    fn of(stx: &libc::statx, devices: &GpuDevices) -> Option<Candidate> {
        let minor = stx.stx_rdev_minor;
        match u32::from(stx.stx_mode) & libc::S_IFMT {
            libc::S_IFCHR if stx.stx_rdev_major == NVIDIA_MAJOR && devices.minors.contains(&minor) => {
                Some(Candidate::Nvidia(minor))
            }
            libc::S_IFREG if devices.simulated => Some(Candidate::Regular(file_id(stx))),
            _ => None,
        }
    }

    fn opened(self, read_write: bool) -> OpenFile {
        match self {
            Candidate::Nvidia(minor) => OpenFile::Nvidia { minor, read_write },
            Candidate::Regular(id) => OpenFile::Regular { id, read_write },
        }
    }
}

fn file_id(stx: &libc::statx) -> FileId {
    FileId { dev: (stx.stx_dev_major, stx.stx_dev_minor), ino: stx.stx_ino }
}

/// `O_PATH`: a descriptor that names a file without opening it.
const O_PATH: u32 = 0o10000000;

/// Whether open-file flags say "for reading and writing" (`O_RDWR`, not `O_PATH`).
fn flags_read_write(flags: u32) -> bool {
    flags & O_PATH == 0 && flags & (libc::O_ACCMODE as u32) == libc::O_RDWR as u32
}

/// Whether the text of `/proc/<pid>/fdinfo/<fd>` says that descriptor is
/// open for reading and writing, and is still the file `stx` describes (the
/// same mount and inode: the process may have put another file at that
/// number since; then nothing is proved).
fn fdinfo_read_write(fdinfo: &str, stx: &libc::statx) -> bool {
    let field = |name: &str| fdinfo.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    let same = stx.stx_mask & libc::STATX_MNT_ID != 0
        && number("mnt_id:") == Some(stx.stx_mnt_id)
        && number("ino:") == Some(stx.stx_ino);
    let flags = field("flags:").and_then(|v| u32::from_str_radix(v, 8).ok());
    same && flags.is_some_and(flags_read_write)
}

/// The number a `/proc/<pid>/fd` entry names, if it names one.
fn fd_number(name: &CStr) -> Option<i32> {
    std::str::from_utf8(name.to_bytes()).ok()?.parse().ok()
}

/// The open files that may give process `proc_dir` (its `/proc/<pid>`
/// folder, opened while it was known to be that process: the folder names
/// it and no later holder of the pid) one of `devices`, among its
/// descriptors numbered below `limit`, each with its open
/// mode read from `fdinfo/<fd>` of the same folder (once a file is found
/// open for reading and writing, its other descriptors are not read).
/// Regular files only where GPUs are simulated. Descriptors closed
/// meanwhile are left out. The kernel lists the folder in descriptor
/// order, so the listing stops at the first number past the limit.
pub fn open_files_in(proc_dir: BorrowedFd<'_>, limit: i32, devices: &GpuDevices) -> Result<OpenFiles, Errno> {
    let folder = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut fds = Dir::openat(proc_dir, "fd", folder, Mode::empty())?;
    let dir_fd = fds.as_raw_fd();
    let mut out = Vec::new();
    let mut beyond_limit = false;
    for entry in fds.iter() {
        let entry = entry?;
        let name = entry.file_name();
        let Some(number) = fd_number(name) else { continue };
        if number >= limit {
            beyond_limit = true;
            break;
        }
        // Following the magic link: the open file itself.
        let stx = match statx_at(dir_fd, name, 0) {
            Ok(stx) => stx,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let Some(c) = Candidate::of(&stx, devices) else { continue };
        if out.contains(&c.opened(true)) {
            continue;
        }
        let info = format!("fdinfo/{}", name.to_string_lossy());
        let read_write =
            match openat(proc_dir, info.as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()) {
                Ok(fd) => {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text).is_ok()
                        && fdinfo_read_write(&text, &stx)
                }
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            };
        out.push(c.opened(read_write));
    }
    Ok(OpenFiles { files: out, beyond_limit: Some(beyond_limit) })
}

/// Whether the process whose `/proc` folder is `proc_dir` holds the socket
/// of inode `ino` among its descriptors numbered below [`SCAN_LIMIT`]
/// (before Linux 6.5, how the daemon tells that a process holds the client
/// end of a connection).
pub fn holds_socket(proc_dir: BorrowedFd<'_>, ino: u32) -> bool {
    let folder = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(mut fds) = Dir::openat(proc_dir, "fd", folder, Mode::empty()) else { return false };
    let dir_fd = fds.as_raw_fd();
    let found = fds
        .iter()
        .filter_map(Result::ok)
        .take_while(|entry| fd_number(entry.file_name()).is_none_or(|n| n < SCAN_LIMIT))
        .any(|entry| {
            statx_at(dir_fd, entry.file_name(), 0).is_ok_and(|stx| {
                u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFSOCK && stx.stx_ino == u64::from(ino)
            })
        });
    found
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

/// The open files that may give the process behind `pidfd` one of
/// `devices`, among its descriptors numbered below `limit`, duplicated one
/// at a time (needs the right to ptrace it); each duplicate shares the open
/// file, so its flags (`F_GETFL`) are the process's open mode.
pub fn open_files_of_pidfd(
    pidfd: BorrowedFd<'_>,
    limit: i32,
    devices: &GpuDevices,
) -> Result<OpenFiles, Errno> {
    let mut out = Vec::new();
    for n in 0..limit {
        match pidfd_getfd(pidfd, n) {
            Ok(fd) => {
                let Ok(stx) = statx_at(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH) else { continue };
                let Some(c) = Candidate::of(&stx, devices) else { continue };
                let flags = nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_GETFL);
                out.push(c.opened(flags.is_ok_and(|f| flags_read_write(f as u32))));
            }
            Err(Errno::EBADF) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(OpenFiles { files: out, beyond_limit: None })
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

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
