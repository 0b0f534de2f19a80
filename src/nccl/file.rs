//! `<uds_path>/nccl.env`: the daemon's settings for workloads to source,
//! written atomically (a reader sees the old file or the whole new one) and
//! readable by whoever may use the sockets.
//!
//! The folder is shared with the workload, which may plant links at any
//! name: the file is written under a temporary name no one can guess,
//! created anew (`O_EXCL`, never through a link), given its mode and group
//! through its descriptor, and renamed over whatever stood at `nccl.env`.

use std::ffi::OsString;
use std::hash::{BuildHasher, RandomState};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::{fchmod, Mode};

use crate::host::shared_dir::SharedDir;

/// The file's name in the socket folder.
pub const FILE_NAME: &str = "nccl.env";

/// The temporary files' names start so.
const TEMP_PREFIX: &str = ".nccl.env.";

/// The file's mode for sockets of mode `socket_mode`: read for every class
/// that may use the sockets, write for the owner only.
pub fn mode_for(socket_mode: u32) -> u32 {
    crate::types::mode::granted_to_socket_users(socket_mode, 0o600, 0o4)
}

/// A temporary name: the pid, and 64 random bits so that nobody can plant
/// something at it beforehand.
fn temp_name() -> OsString {
    let noise = RandomState::new().hash_one(std::time::SystemTime::now());
    format!("{TEMP_PREFIX}{}.{noise:016x}", std::process::id()).into()
}

/// Writes `text` to `dir/nccl.env` through a temporary file renamed over it,
/// with [`mode_for`]`(socket_mode)` and group `gid` (when given).
pub fn write(dir: &Path, text: &str, socket_mode: u32, gid: Option<u32>) -> std::io::Result<PathBuf> {
    let folder = SharedDir::open(dir)?;
    write_in(&folder, text, socket_mode, gid)?;
    Ok(folder.join(FILE_NAME))
}

/// [`write`] in an open folder. Temporary files left by an earlier daemon
/// (or planted under their names) are removed first: whoever writes here
/// holds the folder's lock, so none is being written.
fn write_in(folder: &SharedDir, text: &str, socket_mode: u32, gid: Option<u32>) -> std::io::Result<()> {
    for name in folder.names()? {
        if name.as_encoded_bytes().starts_with(TEMP_PREFIX.as_bytes()) {
            // A folder stays: it is not ours to empty.
            let _ = folder.unlink(&name);
        }
    }
    let (tmp, mut f) = create_temp(folder)?;
    let result = (|| {
        f.write_all(text.as_bytes())?;
        if let Some(gid) = gid {
            std::os::unix::fs::fchown(&f, None, Some(gid)).map_err(|e| match e.raw_os_error() {
                Some(n) => crate::host::shared_dir::chown_error(nix::errno::Errno::from_raw(n)),
                None => e,
            })?;
        }
        // Explicitly, whatever the umask.
        fchmod(f.as_fd(), Mode::from_bits_truncate(mode_for(socket_mode)))?;
        f.sync_all()?;
        folder.rename(&tmp, FILE_NAME)
    })();
    if result.is_err() {
        let _ = folder.unlink(&tmp);
    }
    result
}

/// A new temporary file (a fresh name if one is somehow taken).
fn create_temp(folder: &SharedDir) -> std::io::Result<(OsString, std::fs::File)> {
    let mut last = None;
    for _ in 0..4 {
        let name = temp_name();
        match folder.create_new(&name, 0o600, OFlag::O_WRONLY) {
            Ok(f) => return Ok((name, f)),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("four tries"))
}

/// Removes `dir/nccl.env` (the name: a link there is removed, not
/// followed); a missing file is not an error.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    SharedDir::open(dir)?.unlink(FILE_NAME).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    #[test]
    fn the_file_is_replaced_whole_with_the_socket_readers_mode() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(mode_for(0o660), 0o640);
        assert_eq!(mode_for(0o600), 0o600);
        assert_eq!(mode_for(0o666), 0o644);
        let p = write(dir.path(), "export A=1\n", 0o660, None).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o640);
        write(dir.path(), "export A=2\n", 0o666, None).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "export A=2\n");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o644);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [FILE_NAME]);
        remove(dir.path()).unwrap();
        remove(dir.path()).unwrap();
        assert!(!p.exists());
    }

    #[test]
    fn a_folder_that_cannot_be_written_is_an_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write(&dir.path().join("missing"), "x", 0o660, None).is_err());
    }

    #[test]
    fn links_planted_at_the_file_and_at_every_temporary_name_are_never_written_through() {
        let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let victim = out.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
        // The names an earlier version used (the pid), and a link at the file itself.
        let pid = std::process::id();
        for p in pid.saturating_sub(50)..pid + 50 {
            symlink(&victim, dir.path().join(format!(".nccl.env.{p}"))).unwrap();
        }
        symlink(&victim, dir.path().join(format!(".nccl.env.{pid}.0000000000000000"))).unwrap();
        symlink(&victim, dir.path().join(FILE_NAME)).unwrap();
        let p = write(dir.path(), "export A=1\n", 0o666, None).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::metadata(&victim).unwrap().mode() & 0o777, 0o600);
        assert!(fs::symlink_metadata(&p).unwrap().is_file(), "the link was replaced by the file");
        assert_eq!(fs::read_to_string(&p).unwrap(), "export A=1\n");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [FILE_NAME], "the planted temporary names are gone");
        // Removing a link removes the link.
        fs::remove_file(&p).unwrap();
        symlink(&victim, &p).unwrap();
        remove(dir.path()).unwrap();
        assert!(victim.exists() && fs::symlink_metadata(&p).is_err());
    }

    #[test]
    fn temporary_names_cannot_be_guessed() {
        let (a, b) = (temp_name(), temp_name());
        assert_ne!(a, b);
        assert!(a.to_string_lossy().starts_with(&format!("{TEMP_PREFIX}{}.", std::process::id())));
    }
}
