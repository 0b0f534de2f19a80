//! What the daemon writes into its socket folder once it serves: the NCCL
//! plugin's settings (`nccl.env`) and the health file's ready line.

use std::io::Write as _;

use super::{Config, READY_LINE};

/// Writes `<uds_path>/nccl.env` (the NCCL plugin's settings for this node
/// and daemon). What the node cannot tell is left out of the file, with a
/// comment and a warning here; only a failure to write is not written.
pub(super) fn write_nccl_env(config: &Config, gid: Option<u32>) {
    let flags = &config.flags;
    let view = crate::nccl::Sysfs::for_flags(flags);
    let written = crate::nccl::generate(&view, &config.topology, &flags.uds_path)
        .map_err(|e| e.to_string())
        .and_then(|env| {
            for note in &env.notes {
                tracing::warn!(note = %note, "NCCL settings: left out on this node");
            }
            crate::nccl::file::write(&flags.uds_path, &env.to_env(), flags.socket_mode, gid)
                .map_err(|e| e.to_string())
        });
    match written {
        Ok(path) => tracing::info!(path = %path.display(), "NCCL settings written"),
        Err(error) => tracing::warn!(error, "NCCL settings not written; `tcpx-rxdm nccl-env` says why"),
    }
}

/// Appends the ready line to `path`. Its folder may be shared with the
/// workload: the file is created anew or opened only if it is a plain file
/// of its own, never through a link (see `host::shared_dir`).
pub(super) fn write_health_line(path: &str) -> std::io::Result<()> {
    let path = std::path::Path::new(path);
    let Some(name) = path.file_name() else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"));
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let folder = crate::host::shared_dir::SharedDir::open(dir)?;
    let mut f =
        folder.open_or_create(name, 0o666, nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_APPEND)?;
    writeln!(f, "{READY_LINE}")
}
