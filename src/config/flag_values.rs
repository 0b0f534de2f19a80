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

/// A duration flag (`--wait_for_nics`, `--takeover_timeout`, `upgrade
/// --timeout`): whole seconds, or a whole number with `ms`, `s`, `m` (or
/// `min`) or `h`, as systemd writes time spans; at most an hour.
pub fn parse_wait(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit_ms = match unit {
        "ms" => Some(1),
        "" | "s" => Some(1000),
        "m" | "min" => Some(60_000),
        "h" => Some(3_600_000),
        _ => None,
    };
    unit_ms
        .zip(digits.parse::<u64>().ok())
        .and_then(|(unit, n)| n.checked_mul(unit))
        .filter(|ms| *ms <= 3_600_000)
        .map(Duration::from_millis)
        .ok_or_else(|| "expected a duration of at most 1 hour: 90, 90s, 1500ms, 2m or 1h".into())
}

/// `--metrics_address`: `None` when set empty (HTTP disabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenAddr(pub Option<SocketAddr>);

/// Also `:PORT` (every address, as Go servers and Prometheus write it) and
/// `localhost:PORT` (loopback); no other host name is looked up.
pub(super) fn parse_listen_addr(s: &str) -> Result<ListenAddr, String> {
    if s.is_empty() {
        return Ok(ListenAddr(None));
    }
    let spelled = if let Some(port) = s.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else if let Some(port) = s.strip_prefix("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        s.to_string()
    };
    spelled.parse().map(|a| ListenAddr(Some(a))).map_err(|_| {
        "expected IP:PORT (0.0.0.0:9467, 127.0.0.1:9467, [::]:9467), :PORT for every address, \
         localhost:PORT, or empty to turn HTTP off"
            .into()
    })
}

/// `--log_level`: the least severe events logged. `RUST_LOG` (a tracing
/// filter with per-module directives) overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "lower")]
pub enum LogLevel {
    /// Only errors, fatal ones included.
    Error,
    /// Errors and warnings (`warning` is taken too).
    #[value(alias = "warning")]
    Warn,
    /// Startup steps, the ready line, shutdown, each NIC restored (the default).
    Info,
    /// Also per-request detail.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The accepted names, as `--help` and errors list them (`warning` is an alias of `warn`).
    pub const NAMES: [&'static str; 5] = ["error", "warn", "info", "debug", "trace"];

    /// The level's name: what `tracing` takes as a filter.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }

    /// The one check of a `--log_level` value, for every command that takes
    /// one (the daemon's own parser uses it through clap, `inject` for the
    /// flags it writes into a manifest): a level name in any case, or
    /// `warning`. The error lists what is accepted.
    pub fn parse(s: &str) -> Result<LogLevel, String> {
        <LogLevel as clap::ValueEnum>::from_str(s.trim(), true).map_err(|_| {
            format!(
                "invalid value '{s}' for '--log_level': expected one of {} (`warning` is taken for warn; \
                 per-module filters go in RUST_LOG)",
                Self::NAMES.join(", ")
            )
        })
    }
}

/// `--rx_pool_size`: bytes, or a number with a binary unit: `K`, `M`, `G`,
/// `T` (also written `Ki`/`KiB`, ...), each a power of 1024 as with
/// `docker --memory`. `GB`, `MB` and the like are refused: they are powers
/// of 1000 to some readers and of 1024 to others.
pub fn parse_byte_size(s: &str) -> Result<u64, String> {
    const FORMS: &str =
        "bytes (2147483648), or a number with K, M, G or T (powers of 1024: 2G = 2GiB = 2147483648)";
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("expected {FORMS}"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kib" => 10,
        "m" | "mi" | "mib" => 20,
        "g" | "gi" | "gib" => 30,
        "t" | "ti" | "tib" => 40,
        "kb" | "mb" | "gb" | "tb" => {
            let binary = format!("{}iB", &unit[..1].to_ascii_uppercase());
            return Err(format!(
                "{unit} is ambiguous (1000 or 1024?): write {digits}{} or {digits}{binary} for powers of 1024, or the bytes",
                &unit[..1].to_ascii_uppercase()
            ));
        }
        u if u.starts_with(['.', ',']) => {
            return Err(format!("whole numbers only (1536M rather than 1.5G): expected {FORMS}"))
        }
        _ => return Err(format!("unknown unit '{unit}': expected {FORMS}")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("{t} is more bytes than fit in 64 bits"))
}

/// A value parser that parses as `inner` does but offers `names` to shell
/// completion (and nowhere else): `--gpu_nic_preset` takes a preset's name
/// or a file's path, so its parser cannot be a list of names, yet the names
/// are what a person completes. Its arguments hide the list from `--help`,
/// whose text names the presets itself.
#[derive(Clone)]
pub struct OfferingNames<P> {
    pub inner: P,
    pub names: &'static [&'static str],
}

impl<P> clap::builder::TypedValueParser for OfferingNames<P>
where
    P: clap::builder::TypedValueParser,
{
    type Value = P::Value;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        self.inner.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(self.names.iter().map(|n| clap::builder::PossibleValue::new(*n))))
    }
}
