//! The socket folder: the single-instance lock, endpoint files with the
//! configured mode and group, and their removal on exit (SPEC §2 step 2, §5).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::unistd::{chown, Gid, Group};
use tokio::net::UnixListener;

pub const LOCK_FILE: &str = ".rxdm.lock";

#[derive(Debug, thiserror::Error)]
pub enum SocketDirError {
    #[error("creating socket folder {path}: {err}")]
    CreateDir { path: PathBuf, err: std::io::Error },
    #[error("opening lock file {path}: {err}")]
    OpenLock { path: PathBuf, err: std::io::Error },
    #[error("another tcpx-rxdm{holder} already serves {dir}; refusing to start a second one")]
    Locked { dir: PathBuf, holder: String },
    #[error("locking {path}: {err}")]
    Lock { path: PathBuf, err: nix::errno::Errno },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("binding {path}: {err}")]
    Bind { path: PathBuf, err: std::io::Error },
    #[error("setting mode/group of {path}: {err}")]
    Permissions { path: PathBuf, err: String },
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

impl SocketDir {
    /// Creates the folder if needed and takes the exclusive lock.
    pub fn lock(dir: &Path, mode: u32, gid: Option<Gid>) -> Result<SocketDir, SocketDirError> {
        fs::create_dir_all(dir).map_err(|err| SocketDirError::CreateDir { path: dir.to_path_buf(), err })?;
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
        Ok(SocketDir { dir: dir.to_path_buf(), mode, gid, sockets: Vec::new(), lock: Some(lock) })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Binds endpoint `name`, replacing a stale socket file (we hold the lock,
    /// so no live daemon owns it).
    pub fn bind(&mut self, name: &str) -> Result<UnixListener, SocketDirError> {
        let path = self.dir.join(name);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                let _ = fs::remove_file(&path);
            }
            Ok(_) => return Err(SocketDirError::NotASocket { path }),
            Err(_) => {}
        }
        let listener =
            UnixListener::bind(&path).map_err(|err| SocketDirError::Bind { path: path.clone(), err })?;
        self.sockets.push(path.clone());
        let perr = |err: String| SocketDirError::Permissions { path: path.clone(), err };
        if let Some(gid) = self.gid {
            chown(&path, None, Some(gid)).map_err(|e| perr(e.to_string()))?;
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(self.mode)).map_err(|e| perr(e.to_string()))?;
        Ok(listener)
    }

    /// Removes the socket files and the lock file; idempotent.
    pub fn cleanup(&mut self) {
        for s in self.sockets.drain(..) {
            let _ = fs::remove_file(s);
        }
        if let Some(lock) = self.lock.take() {
            let _ = fs::remove_file(self.dir.join(LOCK_FILE));
            drop(lock);
        }
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        self.cleanup();
    }
}
