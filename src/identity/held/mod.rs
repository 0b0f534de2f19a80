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
//! pid (the descriptor keeps naming it, whoever gets the pid later). Only
//! the descriptors numbered below [`SCAN_LIMIT`] are looked at: a process
//! may hold hundreds of thousands, and the kernel's listing alone costs
//! microseconds per descriptor. CUDA opens its device nodes at `cuInit`,
//! early in a process's life, so they have low numbers; a GPU opened beyond
//! the limit is not seen, and its refusal says so.
//!
//! Nothing here waits on a file system the client controls, which may be
//! served by the client itself (FUSE) and never answer. Each descriptor is
//! looked at with `statx(AT_STATX_DONT_SYNC)` of its `fd/<n>` link: the
//! kernel follows the link to the open file without a lookup and answers
//! from the attributes it has cached, so a FUSE or network file costs no
//! round trip. The open mode of the few that may be GPUs comes from
//! `fdinfo/<n>` of the same folder (see `fdinfo`), which must name the same
//! file; no other descriptor's `fdinfo` is read, since some files' lines
//! take locks their process may hold for as long as it likes (an epoll
//! whose `epoll_ctl` waits on a FUSE `poll` that is never answered). No
//! descriptor is ever copied out of the client (`pidfd_getfd`): closing the
//! copy of a FUSE file sends `FLUSH`, and a server that never answers holds
//! the closing thread in an uninterruptible wait that not even the
//! daemon's exit ends. Where the `fd` folder cannot be listed (another
//! user's process, and no `CAP_DAC_READ_SEARCH`), or the pid is not
//! visible, the open files are not read at all ([`NotRead`]). A simulated
//! GPU's stand-in is looked up only through names the kernel has cached
//! (`RESOLVE_CACHED`), never asking the file system.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

mod fdinfo;
use fdinfo::Fdinfo;

/// The NVIDIA character devices' major number.
pub const NVIDIA_MAJOR: u32 = 195;
/// Descriptors looked at per process: those numbered below this. CUDA opens its device nodes at
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
    /// looked at.
    pub beyond_limit: bool,
}

/// How much of a process's open files was read, as a GPU refusal tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilesRead {
    /// Every descriptor it held.
    All,
    /// Those numbered below the scan limit (`SCAN_LIMIT`); it held more.
    UpToLimit,
    /// None of them: why.
    None(NotRead),
    /// Not known (a tenant handed over by a takeover).
    Unknown,
}

/// Why a process's open files were not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRead {
    /// Its `/proc/<pid>/fd` cannot be listed: the folder is its owner's
    /// (0500), the process another user's, and the daemon lacks
    /// `CAP_DAC_READ_SEARCH` (or a security module refused). Every other way
    /// to read them can wait for good on a file system the client serves,
    /// so there is none.
    Unlisted,
    /// Its pid is not visible here: it has no `/proc/<pid>`.
    Hidden,
    /// The kernel would not show its descriptors (the right to trace it:
    /// `CAP_SYS_PTRACE`, or a security module), or failed otherwise.
    Refused(Errno),
}

impl std::fmt::Display for NotRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRead::Unlisted => f.write_str(
                "its process runs as another user, whose open files (/proc/<pid>/fd) the daemon may list \
                 only with CAP_DAC_READ_SEARCH, which it lacks, and it reads them no other way, \
                 because every other way can wait without end on a file system the client serves",
            ),
            NotRead::Hidden => f.write_str(
                "its pid is not visible to the daemon (it runs in a pid namespace the daemon cannot see), \
                 and open files are read only through /proc/<pid>",
            ),
            NotRead::Refused(e) => write!(f, "the kernel did not show them to the daemon ({e})"),
        }
    }
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

    /// A regular file (simulated GPUs) whose descriptor's link names it
    /// `/dev/nvidia<minor>` in the process's own root: the stand-in of that
    /// GPU. The link's text is the kernel's own path of the open file (no
    /// symlink in it, nothing asked of its file system), so it needs no
    /// lookup, which on some file systems (overlay roots) could not be made
    /// from cached names alone.
    fn named(self, dir_fd: libc::c_int, name: &CStr, devices: &GpuDevices) -> Candidate {
        let Candidate::Regular(_) = self else { return self };
        // SAFETY: `dir_fd` is the open `fd` folder of the caller, alive for this call.
        let dir = unsafe { BorrowedFd::borrow_raw(dir_fd) };
        let Ok(link) = nix::fcntl::readlinkat(dir, name) else { return self };
        let minor =
            link.to_str().and_then(|l| l.strip_prefix("/dev/nvidia")).and_then(|m| m.parse::<u32>().ok());
        match minor.filter(|m| devices.minors.contains(m)) {
            Some(m) => Candidate::Nvidia(m),
            None => self,
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

/// The number a `/proc/<pid>/fd` entry names, if it names one.
fn fd_number(name: &CStr) -> Option<i32> {
    std::str::from_utf8(name.to_bytes()).ok()?.parse().ok()
}

/// The open files that may give process `proc_dir` (its `/proc/<pid>`
/// folder, opened while it was known to be that process: the folder names
/// it and no later holder of the pid) one of `devices`, among its
/// descriptors numbered below `limit`, each with its open mode read from
/// `fdinfo/<fd>` of the same folder (once a file is found open for reading
/// and writing, its other descriptors are not read). Regular files only
/// where GPUs are simulated. Descriptors closed meanwhile are left out. The
/// kernel lists the folder in descriptor order, so the listing stops at the
/// first number past the limit.
pub fn open_files_in(
    proc_dir: BorrowedFd<'_>,
    limit: i32,
    devices: &GpuDevices,
) -> Result<OpenFiles, NotRead> {
    let folder = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut fds = match Dir::openat(proc_dir, "fd", folder, Mode::empty()) {
        Ok(fds) => fds,
        // The folder's mode (0500, its owner's): not the right to trace it,
        // which is asked for each descriptor.
        Err(Errno::EACCES) => return Err(NotRead::Unlisted),
        Err(e) => return Err(NotRead::Refused(e)),
    };
    let dir_fd = fds.as_raw_fd();
    let mut out = Vec::new();
    let mut beyond_limit = false;
    for entry in fds.iter() {
        let entry = entry.map_err(NotRead::Refused)?;
        let name = entry.file_name();
        let Some(number) = fd_number(name) else { continue };
        if number >= limit {
            beyond_limit = true;
            break;
        }
        // Following the magic link: the open file itself, from the
        // attributes the kernel holds.
        let stx = match statx_at(dir_fd, name, 0) {
            Ok(stx) => stx,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(NotRead::Refused(e)),
        };
        let Some(c) = Candidate::of(&stx, devices) else { continue };
        let c = c.named(dir_fd, name, devices);
        if out.contains(&c.opened(true)) {
            continue;
        }
        let info = format!("fdinfo/{}", name.to_string_lossy());
        let read_write = match Fdinfo::read(proc_dir, &info) {
            Ok(text) => Fdinfo::parse(&text).is_some_and(|f| f.names(&stx) && f.read_write()),
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(NotRead::Refused(e)),
        };
        out.push(c.opened(read_write));
    }
    Ok(OpenFiles { files: out, beyond_limit })
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

/// `RESOLVE_CACHED` (Linux 5.12): resolve from the kernel's cache of names
/// only; fail with `EAGAIN` where a name would have to be looked up or
/// revalidated by its file system.
const RESOLVE_CACHED: u64 = 0x20;

/// `path` under `dir` as an `O_PATH` descriptor (nothing is opened, so no
/// file system's `open` runs), resolved without following any symlink and
/// only through names the kernel has cached: a name on a mount whose server
/// does not answer is `EAGAIN`, never a wait.
fn cached_path(dir: BorrowedFd<'_>, path: &str) -> Result<OwnedFd, Errno> {
    let resolve = ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::from_bits_retain(RESOLVE_CACHED);
    let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC).resolve(resolve);
    openat2(dir, path, how)
}

/// The root folder of process `proc_dir` (its `/proc/<pid>` folder), as an
/// `O_PATH` descriptor: opening it for reading would ask its file system.
pub fn root_of(proc_dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    openat(proc_dir, "root", flags, Mode::empty())
}

/// For each GPU of `devices`: the regular file at `dev/nvidia<minor>` under
/// `root`, where neither `dev` nor the file is a symlink and both names are
/// in the kernel's cache (`None` otherwise, and for every GPU when they are
/// not simulated). A stand-in the client opened has its names cached; one
/// whose names would have to be asked of the file system counts as absent.
pub fn stand_ins_under(root: BorrowedFd<'_>, devices: &GpuDevices) -> Vec<Option<FileId>> {
    if !devices.simulated {
        return Vec::new();
    }
    devices
        .minors
        .iter()
        .map(|minor| {
            let node = cached_path(root, &format!("dev/nvidia{minor}")).ok()?;
            let stx =
                statx_at(node.as_raw_fd(), c"", libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW).ok()?;
            (u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFREG).then(|| file_id(&stx))
        })
        .collect()
}

#[cfg(test)]
mod tests;
