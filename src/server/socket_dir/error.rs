//! Why a socket folder could not be locked or served, in words that say what to do.

use std::path::{Path, PathBuf};

use crate::host::shared_dir::Kind;

/// Why giving a file the socket group was refused: a group the process is
/// not a member of needs `CAP_CHOWN`.
fn chown_hint(e: &std::io::Error) -> String {
    e.raw_os_error()
        .and_then(|n| crate::caps::refusal(n, crate::caps::Cap::Chown))
        .map(|w| format!(" ({w})"))
        .unwrap_or_default()
}

/// `err`'s words without a leading `path: ` (the folder's own failure names
/// it already; one of a folder above it keeps that folder's name), and what
/// to do when the refusal is this user's rights.
fn without_path(path: &Path, err: &std::io::Error) -> String {
    let text = err.to_string();
    let text = match text.strip_prefix(&format!("{}: ", path.display())) {
        Some(rest) => rest.to_string(),
        None => text,
    };
    format!("{text}{}", access_hint(err))
}

/// What to do when the folder is not this process's to write: the default
/// `/run/tcpx` is root's, and a first try as a normal user lands here.
fn access_hint(err: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match err.kind() {
        ErrorKind::PermissionDenied if !nix::unistd::geteuid().is_root() => format!(
            " (uid {} may not write there: run the daemon as root, or give it a folder this user may \
             write with --uds_path, e.g. --uds_path=/tmp/tcpx)",
            nix::unistd::geteuid()
        ),
        ErrorKind::PermissionDenied => " (root without the right to write there, e.g. no \
             CAP_DAC_OVERRIDE, or a security module refused: choose another folder with --uds_path)"
            .to_string(),
        ErrorKind::ReadOnlyFilesystem => {
            " (choose a folder on a writable file system with --uds_path)".to_string()
        }
        _ => String::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SocketDirError {
    #[error("creating socket folder {path}: {}", without_path(path, err))]
    CreateDir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("opening socket folder {path}: {}", without_path(path, err))]
    OpenDir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("opening lock file {path}: {}", without_path(path, err))]
    OpenLock {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("another tcpx-rxdm{holder} already serves {dir}; refusing to start a second one")]
    Locked { dir: PathBuf, holder: String },
    #[error(
        "the lock handed over is {why}, not the lock of {path}: the process that answered does not \
         hold this folder"
    )]
    NotTheLock { path: PathBuf, why: &'static str },
    #[error("locking {path}: {err}")]
    Lock {
        path: PathBuf,
        #[source]
        err: nix::errno::Errno,
    },
    #[error(
        "{path} is {kind}, not a socket; refusing to replace it: remove it, or choose another --uds_path"
    )]
    NotASocket { path: PathBuf, kind: Kind },
    #[error("binding {path}: {}", without_path(path, err))]
    Bind {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "{path} was replaced while it was being bound: something else writes in the socket folder; \
         find it, or choose another --uds_path"
    )]
    Replaced { path: PathBuf },
    #[error("setting the group of {path} (--socket_group): {err}{}", chown_hint(.err))]
    Chown {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("setting the mode of {path}: {err}")]
    Chmod {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("--socket_group {0}: no such group")]
    UnknownGroup(String),
}
