//! Ending a sidecar when its job ends. The NCCL plugin registers with the
//! application registry only when asked to, so a classic sidecar would outlive
//! its job (and a Kubernetes Job with one never completes). Two signals work
//! without the plugin's help:
//! - a shutdown file (`<uds_path>/terminated` by default) that the workload
//!   creates when it is done, seen through inotify (no polling);
//! - every client process gone for a while (`--shutdown_when_all_clients_exited`).
//!
//! The shutdown file's folder is usually the socket folder, which the
//! workload writes: it is watched and looked into through its descriptor,
//! and a stale file is removed as a name, never followed.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;

use crate::host::shared_dir::{Kind, SharedDir};
use crate::identity::ClientCount;

#[derive(Debug, thiserror::Error)]
pub enum JobEndError {
    #[error("--shutdown_file {path}: its folder {dir} does not exist")]
    NoFolder { path: PathBuf, dir: PathBuf },
    #[error("--shutdown_file {path}: opening its folder: {err}")]
    OpenFolder {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("--shutdown_file {path}: removing a stale file left by an earlier job: {err}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("--shutdown_file {path}: watching {dir} with inotify: {err}")]
    Watch {
        path: PathBuf,
        dir: PathBuf,
        #[source]
        err: nix::errno::Errno,
    },
}

struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A watch for the shutdown file's creation.
pub struct ShutdownFile {
    path: PathBuf,
    name: OsString,
    dir: SharedDir,
    inotify: AsyncFd<InotifyFd>,
}

impl ShutdownFile {
    /// Removes a file left by an earlier job (the caller holds the socket
    /// folder's lock) and starts watching for a new one.
    pub fn watch(path: &Path) -> Result<ShutdownFile, JobEndError> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        let name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        let folder = match SharedDir::open(&dir) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(JobEndError::NoFolder { path: path.to_path_buf(), dir })
            }
            Err(err) => return Err(JobEndError::OpenFolder { path: path.to_path_buf(), err }),
        };
        let stale = |err| JobEndError::RemoveStale { path: path.to_path_buf(), err };
        match folder.entry(&name).map_err(stale)? {
            None => {}
            Some(e) if e.kind == Kind::Folder => {
                return Err(stale(std::io::Error::new(std::io::ErrorKind::IsADirectory, "it is a folder")))
            }
            Some(e) => {
                folder.unlink(&name).map_err(stale)?;
                tracing::warn!(path = %path.display(), "removed a stale shutdown file left by an earlier job ({})", e.kind);
            }
        }
        let werr = |err| JobEndError::Watch { path: path.to_path_buf(), dir: dir.clone(), err };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(werr)?;
        // Created in place, moved in (an atomic rename), or a hard link; the
        // folder opened above, whatever its path now leads to.
        inotify
            .add_watch(
                &folder.proc_path(),
                AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR,
            )
            .map_err(werr)?;
        // SAFETY: the AsyncFd owns the Inotify, so its descriptor stays open
        // and unchanged for the AsyncFd's whole life.
        let inotify = unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }
            .map_err(|e| werr(nix::errno::Errno::from_raw(e.into_parts().1.raw_os_error().unwrap_or(0))))?;
        Ok(ShutdownFile { path: path.to_path_buf(), name, dir: folder, inotify })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves once the file exists.
    pub async fn appeared(&self) {
        loop {
            // Also covers a file created between the removal and the watch.
            // Whatever is at the name counts; nothing is followed.
            if self.dir.entry(&self.name).is_ok_and(|e| e.is_some()) {
                return;
            }
            let Ok(mut guard) = self.inotify.readable().await else {
                return std::future::pending().await;
            };
            match guard.get_inner().0.read_events() {
                Ok(events) => {
                    if events.iter().any(|e| e.name.as_ref() == Some(&self.name)) {
                        return;
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
                Err(e) => {
                    tracing::warn!(error = %e, "reading inotify events failed; the shutdown file is no longer watched");
                    return std::future::pending().await;
                }
            }
        }
    }
}

/// Resolves once client processes were seen and none has been alive for `grace`.
pub async fn all_clients_exited(mut count: watch::Receiver<ClientCount>, grace: Duration) {
    loop {
        let idle = count.wait_for(|c| c.seen_any && c.alive == 0).await.map(|_| ());
        if idle.is_err() {
            return std::future::pending().await;
        }
        tokio::select! {
            _ = tokio::time::sleep(grace) => return,
            // A client came (back) in the meantime: wait again.
            r = async { count.wait_for(|c| c.alive > 0).await.map(|_| ()) } => {
                if r.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stale_file_is_removed_and_a_new_one_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("terminated");
        std::fs::write(&path, b"old job").unwrap();
        let f = ShutdownFile::watch(&path).unwrap();
        assert!(!path.exists(), "stale file removed");
        // Unrelated files do not count.
        std::fs::write(dir.path().join("other"), b"").unwrap();
        let early = tokio::time::timeout(Duration::from_millis(100), f.appeared()).await;
        assert!(early.is_err(), "fired without the file");
        let p = path.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            std::fs::write(p, b"").unwrap();
        });
        tokio::time::timeout(Duration::from_secs(5), f.appeared()).await.expect("file seen");
    }

    #[tokio::test]
    async fn a_planted_link_is_removed_as_a_name_and_a_new_link_counts() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let victim = out.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o640)).unwrap();
        let path = dir.path().join("terminated");
        symlink(&victim, &path).unwrap();
        let f = ShutdownFile::watch(&path).unwrap();
        assert!(std::fs::symlink_metadata(&path).is_err(), "the link is gone");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "its target stays");
        // A dangling link made later is the workload's signal as well.
        symlink(out.path().join("absent"), &path).unwrap();
        tokio::time::timeout(Duration::from_secs(5), f.appeared()).await.expect("link seen");
        // A folder at the name is refused, by name.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let e = ShutdownFile::watch(&path).err().unwrap().to_string();
        assert!(e.contains("stale") && e.contains("it is a folder"), "{e}");
    }

    #[test]
    fn missing_folder_is_an_error() {
        let e = ShutdownFile::watch(Path::new("/nonexistent-tcpx-dir/terminated")).err().unwrap();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn clients_exited_waits_for_the_grace_period_and_restarts_on_a_new_client() {
        let (tx, rx) = watch::channel(ClientCount::default());
        let waiter = tokio::spawn(all_clients_exited(rx, Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiter.is_finished(), "no client ever seen: never fires");
        tx.send_replace(ClientCount { seen_any: true, alive: 1 });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiter.is_finished(), "a client is alive");
        tx.send_replace(ClientCount { seen_any: true, alive: 0 });
        tokio::time::sleep(Duration::from_secs(3)).await;
        tx.send_replace(ClientCount { seen_any: true, alive: 1 });
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!waiter.is_finished(), "a new client within the grace period resets it");
        tx.send_replace(ClientCount { seen_any: true, alive: 0 });
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!waiter.is_finished());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(waiter.is_finished(), "fires after 5 s with no client");
    }
}
