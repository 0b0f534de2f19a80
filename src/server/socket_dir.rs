//! The socket folder: the single-instance lock, endpoint files with the
//! configured mode and group, and their removal on exit.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::unistd::{chown, Gid, Group};
use tokio::net::UnixListener;

pub const LOCK_FILE: &str = ".rxdm.lock";

#[derive(Debug, thiserror::Error)]
pub enum SocketDirError {
    #[error("creating socket folder {path}: {err}")]
    CreateDir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("opening lock file {path}: {err}")]
    OpenLock {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("another tcpx-rxdm{holder} already serves {dir}; refusing to start a second one")]
    Locked { dir: PathBuf, holder: String },
    #[error("locking {path}: {err}")]
    Lock {
        path: PathBuf,
        #[source]
        err: nix::errno::Errno,
    },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("binding {path}: {err}")]
    Bind {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("setting the group of {path}: {err}")]
    Chown {
        path: PathBuf,
        #[source]
        err: nix::errno::Errno,
    },
    #[error("setting the mode of {path}: {err}")]
    Chmod {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("--socket_group {0:?}: no such group")]
    UnknownGroup(String),
}

/// The locked socket folder. Dropping it removes the socket files it created
/// and the lock file.
pub struct SocketDir {
    dir: PathBuf,
    mode: u32,
    gid: Option<Gid>,
    sockets: Vec<PathBuf>,
    lock: Option<Flock<File>>,
    /// Each bound listener by name, duplicated for a takeover.
    listeners: Vec<(String, OwnedFd)>,
    /// Listeners taken over from the daemon this one replaced, not yet bound.
    handed: HashMap<String, OwnedFd>,
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

/// The mode a folder for sockets of mode `socket_mode` gets: every class that
/// may use the sockets (read or write bit) gets search and list (`r-x`); the
/// owner gets `rwx`. Write is never handed on: it would let a client delete
/// or replace the daemon's sockets. `0660` → `0750`, `0666` → `0755`, `0600` → `0700`.
pub fn dir_mode_for(socket_mode: u32) -> u32 {
    crate::types::mode::granted_to_socket_users(socket_mode, 0o700, 0o5)
}

/// Creates `dir` and any missing parents with [`dir_mode_for`] and group
/// `gid`, regardless of the umask (the daemon runs with 077). Folders that
/// already exist are left as they are.
fn create_dir(dir: &Path, socket_mode: u32, gid: Option<Gid>) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut p = dir;
    while fs::symlink_metadata(p).is_err() {
        missing.push(p.to_path_buf());
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent,
            _ => break,
        }
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            // Someone else made it meanwhile: theirs, left alone.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
        if let Some(gid) = gid {
            chown(d.as_path(), None, Some(gid)).map_err(std::io::Error::from)?;
        }
        fs::set_permissions(d, fs::Permissions::from_mode(dir_mode_for(socket_mode)))?;
    }
    if !fs::metadata(dir)?.is_dir() {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "exists and is not a folder"));
    }
    Ok(())
}

/// Which clients the socket mode admits but the folder's own mode keeps out
/// (they need search permission on it); `None` when all can reach the sockets.
pub fn unreachable_by(
    dir_mode: u32,
    dir_gid: u32,
    socket_mode: u32,
    socket_gid: u32,
) -> Option<&'static str> {
    let others_in = dir_mode & 0o001 != 0;
    if socket_mode & 0o060 != 0 && !(others_in || (dir_gid == socket_gid && dir_mode & 0o010 != 0)) {
        return Some("the socket group");
    }
    if socket_mode & 0o006 != 0 && !others_in {
        return Some("other users");
    }
    None
}

/// Warns when an existing folder's mode stops clients the sockets are meant for.
fn warn_if_unreachable(dir: &Path, socket_mode: u32, gid: Option<Gid>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::metadata(dir) else { return };
    let socket_gid = gid.map(|g| g.as_raw()).unwrap_or_else(|| nix::unistd::getegid().as_raw());
    if let Some(who) = unreachable_by(m.mode() & 0o7777, m.gid(), socket_mode, socket_gid) {
        tracing::warn!(
            path = %dir.display(),
            mode = format!("{:04o}", m.mode() & 0o7777),
            gid = m.gid(),
            socket_mode = format!("{socket_mode:04o}"),
            socket_gid,
            "{who} cannot reach the sockets: the folder lacks search (x) permission for them; \
             change its mode or group, or let the daemon create it"
        );
    }
}

impl SocketDir {
    /// Creates the folder if needed and takes the exclusive lock.
    pub fn lock(dir: &Path, mode: u32, gid: Option<Gid>) -> Result<SocketDir, SocketDirError> {
        create_dir(dir, mode, gid)
            .map_err(|err| SocketDirError::CreateDir { path: dir.to_path_buf(), err })?;
        warn_if_unreachable(dir, mode, gid);
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|err| SocketDirError::OpenLock { path: path.clone(), err })?;
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
            Err((_, err)) => return Err(SocketDirError::Lock { path, err }),
        };
        // Record our pid for the message a second instance prints.
        let _ = lock.set_len(0);
        let _ = lock.rewind();
        let _ = write!(*lock, "{}", std::process::id());
        Ok(SocketDir::with_lock(dir, mode, gid, lock, HashMap::new()))
    }

    fn with_lock(
        dir: &Path,
        mode: u32,
        gid: Option<Gid>,
        lock: Flock<File>,
        handed: HashMap<String, OwnedFd>,
    ) -> SocketDir {
        SocketDir {
            dir: dir.to_path_buf(),
            mode,
            gid,
            sockets: Vec::new(),
            lock: Some(lock),
            listeners: Vec::new(),
            handed,
            disarmed: false,
        }
    }

    /// The folder as the daemon this one takes over from held it: its lock
    /// (the same open file, so the lock is already ours) and its listeners,
    /// which [`Self::bind`] hands out instead of binding anew.
    pub fn adopt(
        dir: &Path,
        mode: u32,
        gid: Option<Gid>,
        lock: OwnedFd,
        listeners: HashMap<String, OwnedFd>,
    ) -> Result<SocketDir, SocketDirError> {
        let path = dir.join(LOCK_FILE);
        let mut lock = Flock::lock(File::from(lock), FlockArg::LockExclusiveNonblock)
            .map_err(|(_, err)| SocketDirError::Lock { path, err })?;
        let _ = lock.set_len(0);
        let _ = lock.rewind();
        let _ = write!(*lock, "{}", std::process::id());
        Ok(SocketDir::with_lock(dir, mode, gid, lock, listeners))
    }

    /// The lock file and every listener, for a takeover.
    pub fn handover(&self) -> (Option<BorrowedFd<'_>>, impl Iterator<Item = (&str, BorrowedFd<'_>)>) {
        let lock = self.lock.as_ref().map(|l| l.as_fd());
        (lock, self.listeners.iter().map(|(n, fd)| (n.as_str(), fd.as_fd())))
    }

    /// Binds endpoint `name`, replacing a stale socket file (we hold the lock,
    /// so no live daemon owns it).
    pub fn bind(&mut self, name: &str) -> Result<UnixListener, SocketDirError> {
        self.bind_with_mode(name, self.mode)
    }

    /// Like [`Self::bind`], with a mode of its own (the status socket's).
    pub fn bind_with_mode(&mut self, name: &str, mode: u32) -> Result<UnixListener, SocketDirError> {
        let path = self.dir.join(name);
        if let Some(fd) = self.handed.remove(name) {
            let std = std::os::unix::net::UnixListener::from(fd);
            let bound = std
                .set_nonblocking(true)
                .and_then(|()| UnixListener::from_std(std))
                .map_err(|err| SocketDirError::Bind { path: path.clone(), err })?;
            self.keep(name, &bound, path)?;
            return Ok(bound);
        }
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                let _ = fs::remove_file(&path);
            }
            Ok(_) => return Err(SocketDirError::NotASocket { path }),
            Err(_) => {}
        }
        let listener =
            UnixListener::bind(&path).map_err(|err| SocketDirError::Bind { path: path.clone(), err })?;
        self.keep(name, &listener, path.clone())?;
        if let Some(gid) = self.gid {
            chown(&path, None, Some(gid)).map_err(|err| SocketDirError::Chown { path: path.clone(), err })?;
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .map_err(|err| SocketDirError::Chmod { path: path.clone(), err })?;
        Ok(listener)
    }

    /// Records a listener: its file to remove at exit, a duplicate to hand over.
    fn keep(&mut self, name: &str, l: &UnixListener, path: PathBuf) -> Result<(), SocketDirError> {
        let dup =
            l.as_fd().try_clone_to_owned().map_err(|err| SocketDirError::Bind { path: path.clone(), err })?;
        self.listeners.push((name.to_string(), dup));
        self.sockets.push(path);
        Ok(())
    }

    /// Removes the socket files and the lock file; idempotent. Disarmed: nothing.
    pub fn cleanup(&mut self) {
        if self.disarmed {
            return;
        }
        for s in self.sockets.drain(..) {
            let _ = fs::remove_file(s);
        }
        if let Some(lock) = self.lock.take() {
            let _ = fs::remove_file(self.dir.join(LOCK_FILE));
            drop(lock);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn folder_mode_follows_the_socket_mode_without_write() {
        assert_eq!(dir_mode_for(0o660), 0o750);
        assert_eq!(dir_mode_for(0o600), 0o700);
        assert_eq!(dir_mode_for(0o666), 0o755);
        assert_eq!(dir_mode_for(0o640), 0o750);
        assert_eq!(dir_mode_for(0o602), 0o705);
    }

    #[tokio::test]
    async fn an_adopted_folder_keeps_the_lock_and_serves_the_same_listeners() {
        let tmp = tempfile::tempdir().unwrap();
        let mut first = SocketDir::lock(tmp.path(), 0o660, None).unwrap();
        let l = first.bind("a").unwrap();
        let (lock, listeners) = first.handover();
        let lock = lock.unwrap().try_clone_to_owned().unwrap();
        let handed: HashMap<String, OwnedFd> =
            listeners.map(|(n, fd)| (n.to_string(), fd.try_clone_to_owned().unwrap())).collect();
        let mut second = SocketDir::adopt(tmp.path(), 0o660, None, lock, handed).unwrap();
        let l2 = second.bind("a").unwrap();
        let ino = |fd: BorrowedFd<'_>| nix::sys::stat::fstat(fd).unwrap().st_ino;
        assert_eq!(ino(l.as_fd()), ino(l2.as_fd()), "the same socket");
        // A third daemon still finds the folder locked, naming the new holder.
        std::mem::forget(first); // as a daemon that handed over: exits without cleanup
        drop(l);
        let err = SocketDir::lock(tmp.path(), 0o660, None).err().unwrap().to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        let c = tokio::net::UnixStream::connect(tmp.path().join("a")).await;
        assert!(c.is_ok(), "the socket file stayed and the listener serves");
        drop(second);
        assert!(!tmp.path().join("a").exists(), "the last holder removes it");
    }

    #[tokio::test]
    async fn a_disarmed_folder_removes_nothing_and_the_holder_is_written_anew() {
        let tmp = tempfile::tempdir().unwrap();
        let mut first = SocketDir::lock(tmp.path(), 0o660, None).unwrap();
        let _l = first.bind("a").unwrap();
        let (lock, listeners) = first.handover();
        let lock = lock.unwrap().try_clone_to_owned().unwrap();
        let handed: HashMap<String, OwnedFd> =
            listeners.map(|(n, fd)| (n.to_string(), fd.try_clone_to_owned().unwrap())).collect();
        let mut second = SocketDir::adopt(tmp.path(), 0o660, None, lock, handed).unwrap();
        second.disarm();
        let _l2 = second.bind("a").unwrap();
        // A successor that fails before the commit lets go of the folder as it found it.
        drop(second);
        assert!(tmp.path().join("a").exists() && tmp.path().join(LOCK_FILE).exists());
        // The lock named someone else (a successor that is gone): written anew.
        fs::write(tmp.path().join(LOCK_FILE), "4194304").unwrap();
        first.record_holder().unwrap();
        let named = fs::read_to_string(tmp.path().join(LOCK_FILE)).unwrap();
        assert_eq!(named, std::process::id().to_string());
        let c = tokio::net::UnixStream::connect(tmp.path().join("a")).await;
        assert!(c.is_ok(), "listened on again, still serving");
        first.disarm();
        first.arm();
        drop(first);
        assert!(!tmp.path().join("a").exists() && !tmp.path().join(LOCK_FILE).exists());
    }

    #[test]
    fn reachability() {
        // Group-only sockets in a 0700 folder: the group is kept out.
        assert_eq!(unreachable_by(0o700, 5, 0o660, 5), Some("the socket group"));
        // 0750 of the right group: fine; of another group: kept out.
        assert_eq!(unreachable_by(0o750, 5, 0o660, 5), None);
        assert_eq!(unreachable_by(0o750, 6, 0o660, 5), Some("the socket group"));
        // o+x lets everyone search.
        assert_eq!(unreachable_by(0o711, 6, 0o660, 5), None);
        assert_eq!(unreachable_by(0o750, 5, 0o666, 5), Some("other users"));
        assert_eq!(unreachable_by(0o700, 0, 0o600, 0), None);
    }

    #[test]
    fn created_folders_get_the_mode_whatever_the_umask() {
        let tmp = tempfile::tempdir().unwrap();
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        let dir = tmp.path().join("a/b");
        let r = create_dir(&dir, 0o660, None);
        nix::sys::stat::umask(old);
        r.unwrap();
        for d in [tmp.path().join("a"), dir.clone()] {
            assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o750, "{}", d.display());
        }
        // An existing folder is left as it is.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        create_dir(&dir, 0o666, None).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        // A file in the way is an error.
        let file = tmp.path().join("f");
        fs::write(&file, b"").unwrap();
        assert!(create_dir(&file, 0o660, None).is_err());
    }
}
