//! The socket folder: the single-instance lock, endpoint files with the
//! configured mode and group, and their removal on exit.
//!
//! The folder is shared with the workload (a Pod's `emptyDir`, a host path),
//! which may plant anything in it. Every entry is handled through the
//! folder's descriptor without following a link (`host::shared_dir`):
//! whatever stands at a name the daemon uses is removed as a name or
//! refused, never written, chmod-ed or chown-ed through.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::unistd::{Gid, Group};
use tokio::net::UnixListener;

use crate::host::shared_dir::{proc_fd_path, Created, Entry, Kind, OpenError, SharedDir};

pub use super::folder_access::dir_mode_for;
use super::folder_access::warn_if_unreachable;

pub const LOCK_FILE: &str = ".rxdm.lock";

pub use error::SocketDirError;

/// The locked socket folder. Dropping it removes the socket files it bound
/// and the lock file (each only if it is still the one it made), then the
/// folders it created, if empty.
pub struct SocketDir {
    dir: SharedDir,
    mode: u32,
    gid: Option<Gid>,
    /// Each socket file by name, as it was once bound (`None`: not known).
    sockets: Vec<(String, Option<Entry>)>,
    lock: Option<Flock<File>>,
    /// Each bound listener by name, duplicated for a takeover.
    listeners: Vec<(String, OwnedFd)>,
    /// Listeners taken over from the daemon this one replaced, not yet bound.
    handed: HashMap<String, OwnedFd>,
    /// The folders (the socket folder and missing parents) this daemon made, outermost first.
    created: Vec<Created>,
    /// [`Self::cleanup`] removes nothing (see [`Self::disarm`]).
    disarmed: bool,
}

/// Resolves `--socket_group` (a name or a numeric gid).
pub fn resolve_group(group: &str) -> Result<Gid, SocketDirError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(Gid::from_raw(gid));
    }
    match Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid),
        _ => Err(SocketDirError::UnknownGroup(group.to_string())),
    }
}

/// Opens (or creates) the lock file. Whatever else stands at its name (a
/// link, a FIFO, a device node, a second name of another file) was not made
/// by a daemon: it is removed as a name, never opened, and a file of our own
/// made in its place. Refusing would let anyone who can write the folder
/// keep the daemon from starting; a folder there is refused (removing it
/// could lose what it holds).
fn open_lock(dir: &SharedDir) -> Result<File, SocketDirError> {
    let path = dir.join(LOCK_FILE);
    let err = |err: std::io::Error| SocketDirError::OpenLock { path: path.clone(), err };
    for _ in 0..3 {
        match dir.open_or_create(LOCK_FILE, 0o600, OFlag::O_RDWR) {
            Ok(f) => return Ok(f),
            Err(e @ OpenError::NotPlain(Kind::Folder)) => return Err(err(e.into())),
            Err(OpenError::NotPlain(kind)) => {
                tracing::warn!(
                    path = %path.display(),
                    "the lock file's name held {kind}, which no daemon makes; removed it (the name only: \
                     what it pointed to is untouched) to make the lock file anew"
                );
                dir.unlink(LOCK_FILE).map_err(err)?;
            }
            Err(OpenError::Io(e)) => return Err(err(e)),
        }
    }
    Err(err(std::io::Error::other("something keeps putting other files at its name")))
}

/// Whether `file` (the entry bound a moment ago, as a path descriptor) is
/// `listener`'s socket file: a connection made through it arrives there.
/// (A socket's own `fstat` names its socket inode, not its file, so the
/// two cannot be compared directly.)
fn is_bound_to(listener: &StdUnixListener, file: BorrowedFd<'_>) -> std::io::Result<bool> {
    let probe = match StdUnixStream::connect(proc_fd_path(file)) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(false),
        Err(e) => return Err(e),
    };
    listener.set_nonblocking(true)?;
    let me = std::process::id() as i32;
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                let cred = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials);
                if cred.is_ok_and(|c| c.pid() == me) {
                    drop(probe);
                    return Ok(true);
                }
                // Someone else's, on a socket not serving yet: dropped.
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

impl SocketDir {
    /// Creates the folder if needed and takes the exclusive lock.
    pub fn lock(dir: &Path, mode: u32, gid: Option<Gid>) -> Result<SocketDir, SocketDirError> {
        let (folder, created) = SharedDir::create(dir, dir_mode_for(mode), gid)
            .map_err(|err| SocketDirError::CreateDir { path: dir.to_path_buf(), err })?;
        // A failure leaves no folder it made behind (when it is empty).
        let undo = |created: &[Created]| {
            for c in created.iter().rev() {
                let _ = c.remove_if_empty();
            }
        };
        warn_if_unreachable(&folder, mode, gid);
        let file = open_lock(&folder).inspect_err(|_| undo(&created))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let holder = match pid.trim() {
                    "" => String::new(),
                    p => format!(" (pid {p})"),
                };
                return Err(SocketDirError::Locked { dir: dir.to_path_buf(), holder });
            }
            Err((file, err)) => {
                if let Ok(st) = nix::sys::stat::fstat(&file) {
                    let _ = folder.unlink_if(LOCK_FILE, |now| now.is(&st));
                }
                undo(&created);
                return Err(SocketDirError::Lock { path: folder.join(LOCK_FILE), err });
            }
        };
        // Record our pid for the message a second instance prints.
        let _ = lock.set_len(0);
        let _ = lock.rewind();
        let _ = write!(*lock, "{}", std::process::id());
        Ok(SocketDir::with_lock(folder, mode, gid, lock, HashMap::new(), created))
    }

    fn with_lock(
        dir: SharedDir,
        mode: u32,
        gid: Option<Gid>,
        lock: Flock<File>,
        handed: HashMap<String, OwnedFd>,
        created: Vec<Created>,
    ) -> SocketDir {
        SocketDir {
            dir,
            mode,
            gid,
            sockets: Vec::new(),
            lock: Some(lock),
            listeners: Vec::new(),
            handed,
            created,
            disarmed: false,
        }
    }

    /// The folder as the daemon this one takes over from held it: its lock
    /// (the same open file, so the lock is already ours) and its listeners,
    /// which [`Self::bind`] hands out instead of binding anew. The lock must
    /// be this folder's lock file and the very open file that holds it: an
    /// exclusive `flock` through it succeeds only on the holder's open file,
    /// so a process that answered without holding the folder is found out
    /// here. The lock file is written only once this daemon serves
    /// ([`Self::record_holder`]).
    /// `created`: the folders the first daemon made, now this one's to remove.
    pub fn adopt(
        dir: &Path,
        mode: u32,
        gid: Option<Gid>,
        lock: OwnedFd,
        listeners: HashMap<String, OwnedFd>,
        created: Vec<Created>,
    ) -> Result<SocketDir, SocketDirError> {
        let folder =
            SharedDir::open(dir).map_err(|err| SocketDirError::OpenDir { path: dir.to_path_buf(), err })?;
        let path = folder.join(LOCK_FILE);
        let held = nix::sys::stat::fstat(&lock)
            .map_err(|e| SocketDirError::OpenLock { path: path.clone(), err: e.into() })?;
        match folder.entry(LOCK_FILE) {
            Ok(Some(e)) if e.kind.is_plain() && e.is(&held) => {}
            _ => return Err(SocketDirError::NotTheLock { path, why: "another file" }),
        }
        let lock = match Flock::lock(File::from(lock), FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(SocketDirError::NotTheLock { path, why: "not the open file that holds it" })
            }
            Err((_, err)) => return Err(SocketDirError::Lock { path, err }),
        };
        Ok(SocketDir::with_lock(folder, mode, gid, lock, listeners, created))
    }

    /// The lock file, every listener and the folders made, for a takeover.
    pub fn handover(
        &self,
    ) -> (Option<BorrowedFd<'_>>, impl Iterator<Item = (&str, BorrowedFd<'_>)>, &[Created]) {
        let lock = self.lock.as_ref().map(|l| l.as_fd());
        (lock, self.listeners.iter().map(|(n, fd)| (n.as_str(), fd.as_fd())), &self.created)
    }

    /// Binds endpoint `name`, replacing a stale socket file (we hold the lock,
    /// so no live daemon owns it).
    pub fn bind(&mut self, name: &str) -> Result<UnixListener, SocketDirError> {
        self.bind_with_mode(name, self.mode)
    }

    /// Like [`Self::bind`], with a mode of its own (the status socket's).
    pub fn bind_with_mode(&mut self, name: &str, mode: u32) -> Result<UnixListener, SocketDirError> {
        let path = self.dir.join(name);
        let bind_err = |err| SocketDirError::Bind { path: path.clone(), err };
        if let Some(fd) = self.handed.remove(name) {
            let std = StdUnixListener::from(fd);
            let bound =
                std.set_nonblocking(true).and_then(|()| UnixListener::from_std(std)).map_err(bind_err)?;
            // The file its predecessor bound, as it stands now.
            let file = self.dir.entry(name).ok().flatten().filter(|e| e.kind == Kind::Socket);
            self.keep(name, &bound, file)?;
            return Ok(bound);
        }
        match self.dir.entry(name).map_err(bind_err)? {
            None => {}
            Some(e) if e.kind == Kind::Socket => {
                self.dir.unlink(name).map_err(bind_err)?;
            }
            // Removing a link loses nothing: what it points to is untouched.
            Some(e) if e.kind == Kind::Link => {
                tracing::warn!(path = %path.display(), "a symbolic link stood where a socket goes; removed it");
                self.dir.unlink(name).map_err(bind_err)?;
            }
            Some(e) => return Err(SocketDirError::NotASocket { path, kind: e.kind }),
        }
        // Bound through the folder's descriptor, created private (the
        // daemon's umask is 077), then opened as a path without following
        // and checked to be this listener's file before its mode and group
        // are set through that descriptor.
        let std = StdUnixListener::bind(self.dir.proc_path().join(name)).map_err(bind_err)?;
        let (file, st) = self.dir.open_path(name).map_err(bind_err)?;
        let result = (|| {
            if Kind::of(&st) != Kind::Socket || !is_bound_to(&std, file.as_fd()).map_err(bind_err)? {
                return Err(SocketDirError::Replaced { path: path.clone() });
            }
            let through = proc_fd_path(file.as_fd());
            if let Some(gid) = self.gid {
                std::os::unix::fs::chown(&through, None, Some(gid.as_raw()))
                    .map_err(|err| SocketDirError::Chown { path: path.clone(), err })?;
            }
            std::fs::set_permissions(&through, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(|err| SocketDirError::Chmod { path: path.clone(), err })?;
            nix::sys::stat::fstat(&file).map(|st| Entry::of(&st)).map_err(|e| bind_err(e.into()))
        })();
        let entry = match result {
            Ok(entry) => entry,
            Err(e) => {
                // Ours (the descriptor keeps its inode number from being reused): removed.
                let _ = self.dir.unlink_if(name, |now| now.is(&st));
                return Err(e);
            }
        };
        let listener =
            std.set_nonblocking(true).and_then(|()| UnixListener::from_std(std)).map_err(bind_err)?;
        self.keep(name, &listener, Some(entry))?;
        Ok(listener)
    }

    /// Records a listener: its file to remove at exit, a duplicate to hand over.
    fn keep(&mut self, name: &str, l: &UnixListener, file: Option<Entry>) -> Result<(), SocketDirError> {
        let dup = l
            .as_fd()
            .try_clone_to_owned()
            .map_err(|err| SocketDirError::Bind { path: self.dir.join(name), err })?;
        self.listeners.push((name.to_string(), dup));
        self.sockets.push((name.to_string(), file));
        Ok(())
    }

    /// Removes the socket files and the lock file, each only if it is still
    /// the one this daemon made (a client may have put another there), then
    /// the folders it created, if they are empty; idempotent. Disarmed: nothing. A folder that
    /// existed before, or a mount point, stays.
    pub fn cleanup(&mut self) {
        if self.disarmed {
            return;
        }
        for (name, file) in std::mem::take(&mut self.sockets) {
            if let Some(file) = file {
                let _ = self.dir.unlink_if(&name, |now| *now == file);
            }
        }
        if let Some(lock) = self.lock.take() {
            if let Ok(st) = nix::sys::stat::fstat(lock.as_fd()) {
                let _ = self.dir.unlink_if(LOCK_FILE, |now| now.is(&st));
            }
            drop(lock);
        }
        for c in std::mem::take(&mut self.created).iter().rev() {
            match c.remove_if_empty() {
                Ok(true) => tracing::info!(path = %c.path().display(), "removed the folder it had created"),
                Ok(false) => tracing::info!(
                    path = %c.path().display(),
                    "left the folder it had created: not empty, or no longer the one it made"
                ),
                Err(e) => {
                    tracing::warn!(path = %c.path().display(), error = %e, "could not remove the folder it had created")
                }
            }
        }
    }

    /// Makes [`Self::cleanup`] (and so dropping) remove nothing until
    /// [`Self::arm`]: a daemon taking over holds the files of one that still
    /// serves until the commit.
    pub fn disarm(&mut self) {
        self.disarmed = true;
    }

    /// The files are this daemon's to remove from now on.
    pub fn arm(&mut self) {
        self.disarmed = false;
    }

    /// Names this process as the folder's holder: the lock file gets its pid
    /// (written through the open lock), and each listener is listened on
    /// again, because a client's `SO_PEERCRED`/`SO_PEERPIDFD` names whoever
    /// called `listen` last: after a takeover, a daemon that may be gone.
    pub fn record_holder(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if let Some(lock) = self.lock.as_mut() {
            lock.set_len(0)?;
            lock.write_all_at(std::process::id().to_string().as_bytes(), 0)?;
        }
        for (_, l) in &self.listeners {
            nix::sys::socket::listen(l, nix::sys::socket::Backlog::MAXALLOWABLE)?;
        }
        Ok(())
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        self.cleanup();
    }
}

mod aside;
mod error;
#[cfg(test)]
mod tests;
