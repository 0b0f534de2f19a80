//! `<uds_path>/nccl.env`: the daemon's settings for workloads to source,
//! written atomically (a reader sees the old file or the whole new one) and
//! readable by whoever may use the sockets.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The file's name in the socket folder.
pub const FILE_NAME: &str = "nccl.env";

/// The file's mode for sockets of mode `socket_mode`: read for every class
/// that may use the sockets, write for the owner only.
pub fn mode_for(socket_mode: u32) -> u32 {
    crate::types::mode::granted_to_socket_users(socket_mode, 0o600, 0o4)
}

/// Writes `text` to `dir/nccl.env` through a temporary file renamed over it,
/// with [`mode_for`]`(socket_mode)` and group `gid` (when given).
pub fn write(dir: &Path, text: &str, socket_mode: u32, gid: Option<u32>) -> std::io::Result<PathBuf> {
    let path = dir.join(FILE_NAME);
    let tmp = dir.join(format!(".{FILE_NAME}.{}", std::process::id()));
    let result = (|| {
        let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        if let Some(gid) = gid {
            std::os::unix::fs::fchown(&f, None, Some(gid))?;
        }
        // Explicitly, whatever the umask.
        f.set_permissions(fs::Permissions::from_mode(mode_for(socket_mode)))?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| path)
}

/// Removes `dir/nccl.env`; a missing file is not an error.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    match fs::remove_file(dir.join(FILE_NAME)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

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
}
