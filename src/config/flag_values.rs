//! Values of single flags: octal modes, the socket folder, durations,
//! listen addresses. Each parser's error names what it expected.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub(super) fn parse_mode(s: &str) -> Result<u32, String> {
    let m =
        u32::from_str_radix(s.trim_start_matches("0o"), 8).map_err(|_| "not an octal mode".to_string())?;
    if m > 0o777 {
        return Err("mode must be at most 0777".into());
    }
    Ok(m)
}

/// The longest `--uds_path` the NCCL GPUDirect-TCPX plugin can use: it builds
/// each socket's path (folder, `/`, the longest socket name) in a 128-byte
/// buffer.
pub const UDS_PATH_MAX: usize = 76;

/// `--uds_path`: refused here, before any NIC or pool is touched, when the
/// plugin could not reach sockets under it.
pub(super) fn parse_uds_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("empty; expected the socket folder, e.g. /run/tcpx".into());
    }
    let n = s.len();
    if n > UDS_PATH_MAX {
        return Err(format!(
            "{n} characters; the NCCL GPUDirect-TCPX plugin can use at most {UDS_PATH_MAX} \
             (it builds socket paths in a 128-byte buffer)"
        ));
    }
    Ok(PathBuf::from(s))
}

/// `--wait_for_nics`: whole seconds, or a number with `ms`, `s` or `m`.
pub(super) fn parse_wait(s: &str) -> Result<Duration, String> {
    let (digits, unit_ms) = if let Some(d) = s.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = s.strip_suffix('s') {
        (d, 1000)
    } else if let Some(d) = s.strip_suffix('m') {
        (d, 60_000)
    } else {
        (s, 1000)
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_ms))
        .filter(|ms| *ms <= 3_600_000)
        .map(Duration::from_millis)
        .ok_or_else(|| "expected a duration of at most 1 hour: 90, 90s, 1500ms or 2m".into())
}

/// `--metrics_address`: `None` when set empty (HTTP disabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenAddr(pub Option<SocketAddr>);

pub(super) fn parse_listen_addr(s: &str) -> Result<ListenAddr, String> {
    if s.is_empty() {
        return Ok(ListenAddr(None));
    }
    s.parse()
        .map(|a| ListenAddr(Some(a)))
        .map_err(|_| "expected HOST:PORT, e.g. 0.0.0.0:9467, or empty".into())
}
