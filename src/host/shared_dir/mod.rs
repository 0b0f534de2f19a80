//! A folder others may write (the socket folder, shared with the workload;
//! the folders of the shutdown and health files): opened once, then every
//! entry handled by name relative to its descriptor, never through a
//! symbolic link. A root daemon that followed a link a client planted there
//! would write, chmod or chown a file of the client's choosing anywhere on
//! the host.
//!
//! - The folder's own path is resolved once, component by component: a
//!   symbolic link is followed only where it lies in a folder no one but
//!   root (or this user) may write, so a link planted in `/tmp` never
//!   redirects the daemon. Folders it creates are made and then opened
//!   without following, and get their mode and group through that descriptor.
//! - Files are created with `O_EXCL|O_NOFOLLOW`; an existing one is opened
//!   only if it is a plain file with a single name, checked on a descriptor
//!   that does not open the file itself (`O_PATH`), so neither a FIFO nor a
//!   device node is ever opened.
//! - Entries are removed with `unlinkat`, which removes a name and never
//!   touches what a link points to.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, FileStat, Mode};
use nix::unistd::{fchown, unlinkat, Gid, UnlinkatFlags};

/// What an entry is, as the folder holds it (a link is not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File { links: u64 },
    Folder,
    Link,
    Socket,
    Fifo,
    Device,
}

impl Kind {
    pub fn of(st: &FileStat) -> Kind {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Folder,
            libc::S_IFLNK => Kind::Link,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFCHR | libc::S_IFBLK => Kind::Device,
            _ => Kind::File { links: st.st_nlink },
        }
    }

    /// A plain file with no other name: the only kind opened.
    pub fn is_plain(self) -> bool {
        self == Kind::File { links: 1 }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::File { links: 1 } => f.write_str("a plain file"),
            Kind::File { links } => write!(f, "a file with {links} names (a hard link)"),
            Kind::Folder => f.write_str("a folder"),
            Kind::Link => f.write_str("a symbolic link"),
            Kind::Socket => f.write_str("a socket"),
            Kind::Fifo => f.write_str("a FIFO"),
            Kind::Device => f.write_str("a device node"),
        }
    }
}

/// An entry as `fstatat` saw it without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub dev: u64,
    pub ino: u64,
    /// When its inode last changed (mode, owner, names): with the inode
    /// number, tells a file from a later one that reused the number.
    pub changed: (i64, i64),
}

impl Entry {
    pub fn of(st: &FileStat) -> Entry {
        Entry { kind: Kind::of(st), dev: st.st_dev, ino: st.st_ino, changed: (st.st_ctime, st.st_ctime_nsec) }
    }

    /// Whether `st` is the same inode; reliable while a descriptor of
    /// that inode is held open (its number cannot be reused meanwhile).
    pub fn is(&self, st: &FileStat) -> bool {
        self.dev == st.st_dev && self.ino == st.st_ino
    }
}

/// Why an entry was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("it is {0}, and only a plain file of its own is opened there")]
    NotPlain(Kind),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> io::Error {
        match e {
            OpenError::Io(e) => e,
            e => io::Error::other(e),
        }
    }
}

/// A refused change of group, naming the capability it needs.
pub fn chown_error(e: Errno) -> io::Error {
    match crate::caps::refusal(e as i32, crate::caps::Cap::Chown) {
        Some(why) => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("setting its group (--socket_group): {e} ({why})"),
        ),
        None => errno(e),
    }
}

fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// `/proc/self/fd/N`: the file `fd` refers to, for the calls that take only
/// a path (`bind`, `connect`, `chmod`, inotify). The kernel resolves it to
/// that very file, whatever its name now is.
pub fn proc_fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A name inside the folder: one component, not `.` or `..`.
fn check_name(name: &OsStr) -> io::Result<&Path> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        let shown = name.to_string_lossy();
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("'{shown}' is not a file name")));
    }
    Ok(Path::new(name))
}

/// An open folder. Its entries are handled through its descriptor only.
pub struct SharedDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// A folder [`SharedDir::create`] made, to remove again when done.
pub struct Created {
    parent: OwnedFd,
    name: OsString,
    path: PathBuf,
    /// The folder itself, held so that its inode number stays its own.
    own: OwnedFd,
}

impl Created {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What another process needs to remove it as this one would (a
    /// takeover hands it on): its parent, its name, its path, itself.
    pub fn parts(&self) -> (BorrowedFd<'_>, &OsStr, &Path, BorrowedFd<'_>) {
        (self.parent.as_fd(), &self.name, &self.path, self.own.as_fd())
    }

    /// A folder another process made, from its [`Self::parts`]; the name
    /// must be one component.
    pub fn from_parts(parent: OwnedFd, name: OsString, path: PathBuf, own: OwnedFd) -> io::Result<Created> {
        check_name(&name)?;
        Ok(Created { parent, name, path, own })
    }

    /// Removes the folder if it is still the one made and is empty;
    /// `Ok(false)` when it stays (not empty, replaced, or a mount point now).
    pub fn remove_if_empty(&self) -> io::Result<bool> {
        let own = Entry::of(&fstat(&self.own).map_err(errno)?);
        match fstatat(&self.parent, self.name.as_os_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if own.is(&st) => {}
            Ok(_) | Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(errno(e)),
        }
        match unlinkat(&self.parent, self.name.as_os_str(), UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::EBUSY | Errno::ENOENT) => Ok(false),
            Err(e) => Err(errno(e)),
        }
    }
}

/// Whether a symbolic link in the folder `st` may be followed: only root or
/// this user can have put it there.
fn trusted(st: &FileStat) -> bool {
    let owner_ok = st.st_uid == 0 || st.st_uid == nix::unistd::geteuid().as_raw();
    owner_ok && st.st_mode & 0o022 == 0
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_CLOEXEC);

impl SharedDir {
    /// Opens the folder `path` (see the module's notes on links in it).
    pub fn open(path: &Path) -> io::Result<SharedDir> {
        Self::walk(path, None).map(|(d, _)| d)
    }

    /// Opens `path`, creating the folders missing on the way with `mode`
    /// and group `gid` (whatever the umask); returns those it made,
    /// outermost first. Folders that exist are left as they are.
    pub fn create(path: &Path, mode: u32, gid: Option<Gid>) -> io::Result<(SharedDir, Vec<Created>)> {
        Self::walk(path, Some((mode, gid)))
    }

    fn walk(path: &Path, create: Option<(u32, Option<Gid>)>) -> io::Result<(SharedDir, Vec<Created>)> {
        let start = if path.is_absolute() { "/" } else { "." };
        let mut cur = openat(AT_FDCWD, start, DIR_FLAGS, Mode::empty()).map_err(errno)?;
        let mut so_far = PathBuf::from(start);
        let mut created = Vec::new();
        for c in path.components() {
            let name = match c {
                Component::Normal(n) => n,
                Component::ParentDir => OsStr::new(".."),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            };
            so_far.push(name);
            cur = Self::step(cur, name, &so_far, create, &mut created)?;
        }
        Ok((SharedDir { fd: cur, path: path.to_path_buf() }, created))
    }

    /// The folder `name` in `cur`, opened (or made).
    fn step(
        cur: OwnedFd,
        name: &OsStr,
        so_far: &Path,
        create: Option<(u32, Option<Gid>)>,
        created: &mut Vec<Created>,
    ) -> io::Result<OwnedFd> {
        let in_path = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", so_far.display()));
        // Two rounds: a folder made by someone else between our look and our mkdir is taken as found.
        for _ in 0..2 {
            let st = match fstatat(&cur, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) if create.is_some() => {
                    let (mode, gid) = create.expect("checked");
                    match mkdirat(&cur, name, Mode::from_bits_truncate(0o700)) {
                        Ok(()) => {}
                        Err(Errno::EEXIST) => continue,
                        Err(e) => return Err(in_path(errno(e))),
                    }
                    let fd = openat(&cur, name, DIR_FLAGS | OFlag::O_NOFOLLOW, Mode::empty())
                        .map_err(|e| in_path(errno(e)))?;
                    if let Some(gid) = gid {
                        fchown(&fd, None, Some(gid)).map_err(|e| in_path(chown_error(e)))?;
                    }
                    fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(|e| in_path(errno(e)))?;
                    let own = fd.try_clone().map_err(in_path)?;
                    created.push(Created {
                        parent: cur,
                        name: name.to_owned(),
                        path: so_far.to_path_buf(),
                        own,
                    });
                    return Ok(fd);
                }
                Err(e) => return Err(in_path(errno(e))),
            };
            let flags = match Kind::of(&st) {
                Kind::Folder => DIR_FLAGS | OFlag::O_NOFOLLOW,
                Kind::Link if fstat(&cur).is_ok_and(|d| trusted(&d)) => DIR_FLAGS,
                Kind::Link => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "{} is a symbolic link in a folder others may write; it is not followed: \
                             give the real path",
                            so_far.display()
                        ),
                    ))
                }
                kind => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotADirectory,
                        format!("{} is {kind}, not a folder", so_far.display()),
                    ))
                }
            };
            return openat(&cur, name, flags, Mode::empty()).map_err(|e| in_path(errno(e)));
        }
        Err(in_path(io::Error::other("it keeps appearing and disappearing")))
    }

    /// The path it was opened by, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name`'s path, for messages.
    pub fn join(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// The folder's own descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The folder's path through this process's descriptor (see [`proc_fd_path`]).
    pub fn proc_path(&self) -> PathBuf {
        proc_fd_path(self.fd.as_fd())
    }

    /// The entry `name`, link or not, or `None` when there is none.
    pub fn entry(&self, name: impl AsRef<OsStr>) -> io::Result<Option<Entry>> {
        let name = check_name(name.as_ref())?;
        match fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(Entry::of(&st))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// Removes the entry `name` unless it is a folder; `Ok(false)` when there was none.
    pub fn unlink(&self, name: impl AsRef<OsStr>) -> io::Result<bool> {
        let name = check_name(name.as_ref())?;
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(Errno::EISDIR) => Err(io::Error::new(io::ErrorKind::IsADirectory, "it is a folder")),
            Err(e) => Err(errno(e)),
        }
    }

    /// Removes `name` if `same` says it is still the file meant (a client
    /// may have put something else there); `Ok(false)` when it was not.
    pub fn unlink_if(&self, name: impl AsRef<OsStr>, same: impl FnOnce(&Entry) -> bool) -> io::Result<bool> {
        let name = name.as_ref();
        match self.entry(name)? {
            Some(now) if same(&now) => self.unlink(name),
            _ => Ok(false),
        }
    }

    /// Creates `name` as a new file (never an existing one, never through a
    /// link), opened with `access` (`O_WRONLY`, `O_RDWR`…).
    pub fn create_new(&self, name: impl AsRef<OsStr>, mode: u32, access: OFlag) -> io::Result<File> {
        let name = check_name(name.as_ref())?;
        let flags = access | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        openat(&self.fd, name, flags, Mode::from_bits_truncate(mode)).map(File::from).map_err(errno)
    }

    /// `name` as a path-only descriptor (the file itself is not opened,
    /// a link is not followed) and what it is.
    pub fn open_path(&self, name: impl AsRef<OsStr>) -> io::Result<(OwnedFd, FileStat)> {
        let name = check_name(name.as_ref())?;
        let fd = openat(&self.fd, name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(errno)?;
        let st = fstat(&fd).map_err(errno)?;
        Ok((fd, st))
    }

    /// Opens the existing `name` with `access` if it is a plain file with
    /// no other name; anything else is refused without being opened.
    pub fn open_plain(&self, name: impl AsRef<OsStr>, access: OFlag) -> Result<File, OpenError> {
        let (path_fd, st) = self.open_path(name)?;
        let kind = Kind::of(&st);
        if !kind.is_plain() {
            return Err(OpenError::NotPlain(kind));
        }
        // Reopened through the path descriptor: the very file just checked.
        let flags = access | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        match openat(AT_FDCWD, &proc_fd_path(path_fd.as_fd()), flags, Mode::empty()) {
            Ok(fd) => Ok(File::from(fd)),
            // Not "not found": the file was there a moment ago.
            Err(Errno::ENOENT) => Err(OpenError::Io(io::Error::other(
                "it cannot be reopened through /proc/self/fd: is /proc mounted?",
            ))),
            Err(e) => Err(OpenError::Io(errno(e))),
        }
    }

    /// Opens `name` as [`Self::open_plain`] does, or creates it with `mode`
    /// (less the umask) when there is none.
    pub fn open_or_create(
        &self,
        name: impl AsRef<OsStr>,
        mode: u32,
        access: OFlag,
    ) -> Result<File, OpenError> {
        let name = name.as_ref();
        // Rounds, in case the name comes and goes between the two attempts.
        for _ in 0..4 {
            match self.create_new(name, mode, access) {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                done => return done.map_err(OpenError::Io),
            }
            match self.open_plain(name, access) {
                Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {}
                done => return done,
            }
        }
        Err(OpenError::Io(io::Error::other("it keeps appearing and disappearing")))
    }

    /// Renames `from` to `to` in the folder, replacing what `to` was (a
    /// link is replaced, not followed).
    pub fn rename(&self, from: impl AsRef<OsStr>, to: impl AsRef<OsStr>) -> io::Result<()> {
        let (from, to) = (check_name(from.as_ref())?, check_name(to.as_ref())?);
        renameat(&self.fd, from, &self.fd, to).map_err(errno)
    }

    /// The names in the folder.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(self.proc_path())?.map(|e| e.map(|e| e.file_name())).collect()
    }
}

#[cfg(test)]
mod tests;
