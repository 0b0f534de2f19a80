//! Where log lines go and which are kept, for the daemon, the webhook and the
//! short commands alike.
//!
//! Lines go to standard error, written so that a reader that goes away (a
//! closed pipe behind `| tee`, `| head`, journald restarting) costs the
//! lines written meanwhile, never the process: the standard writer reports
//! `EPIPE`, tracing then prints its own complaint to standard error, and
//! that print panics where no panic can unwind, aborting a daemon that holds
//! the NICs without restoring them.
//!
//! The filter is `RUST_LOG` where it is set, else `--log_level` (or the
//! command's default). A `RUST_LOG` that cannot be read is said in words: the
//! daemon and the webhook refuse to start (as a bad `--log_level` does), a
//! short command says so and goes on with its default.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::flags::{Flags, LogFormat};

/// The variable read for a log filter.
pub const VAR: &str = "RUST_LOG";

/// A `RUST_LOG` that is not a filter.
#[derive(Debug, thiserror::Error)]
#[error(
    "{VAR}={value} cannot be read as a log filter ({reason}); write levels as error, warn, info, debug \
     or trace, e.g. {VAR}=debug or {VAR}=tcpx_rxdm=debug,info, or unset {VAR} to use --log_level"
)]
pub struct BadFilter {
    pub value: String,
    pub reason: String,
}

/// The filter `RUST_LOG` asks for, if set and not empty; `fallback` otherwise.
pub fn filter(rust_log: Option<&str>, fallback: &str) -> Result<EnvFilter, BadFilter> {
    match rust_log.map(str::trim).filter(|v| !v.is_empty()) {
        Some(value) => EnvFilter::try_new(value)
            .map_err(|e| BadFilter { value: value.to_string(), reason: e.to_string() }),
        None => Ok(EnvFilter::new(fallback)),
    }
}

fn rust_log() -> Option<String> {
    std::env::var(VAR).ok()
}

/// The daemon's logging: `--log_format`, `RUST_LOG` or `--log_level`.
pub fn init_daemon(flags: &Flags) -> Result<(), BadFilter> {
    let filter = filter(rust_log().as_deref(), flags.log_level.name())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(stderr_is_terminal())
        .with_writer(Stderr)
        .log_internal_errors(false);
    let _ = match flags.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    Ok(())
}

/// The webhook's logging: `RUST_LOG`, else `info`.
pub fn init_webhook() -> Result<(), BadFilter> {
    let filter = filter(rust_log().as_deref(), "info")?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(stderr_is_terminal())
        .with_writer(Stderr)
        .log_internal_errors(false)
        .try_init();
    Ok(())
}

/// A short command's logging: quiet (errors only) unless `RUST_LOG` asks
/// for more; one that cannot be read is said once and the default kept.
pub fn init_quiet() {
    let filter = filter(rust_log().as_deref(), "error").unwrap_or_else(|e| {
        let _ = writeln!(io::stderr(), "tcpx-rxdm: {e}; logging errors only");
        EnvFilter::new("error")
    });
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(Stderr).try_init();
}

fn stderr_is_terminal() -> bool {
    std::io::IsTerminal::is_terminal(&io::stderr())
}

/// Standard error for log lines: a line the reader does not take is dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Dropping<io::StderrLock<'static>>;

    fn make_writer(&'a self) -> Self::Writer {
        Dropping(io::stderr().lock())
    }
}

/// A writer that takes every byte: what `W` refuses (other than an
/// interrupted call, which is retried) is dropped. Log lines are not worth
/// the process; the reader may come back (journald keeps a service's stream
/// across its restart) and later lines reach it.
#[derive(Debug)]
pub struct Dropping<W>(pub W);

impl<W: Write> Write for Dropping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.0.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            // Zero would make write_all fail; the rest of the line is dropped.
            Ok(0) | Err(_) => Ok(buf.len()),
            Ok(n) => Ok(n),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refuses every write as a closed pipe does.
    struct ClosedPipe(usize);

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            self.0 += 1;
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    #[test]
    fn a_closed_reader_costs_the_line_not_the_writer() {
        let mut w = Dropping(ClosedPipe(0));
        w.write_all(b"a line nobody reads\n").unwrap();
        w.flush().unwrap();
        writeln!(w, "and the next").unwrap();
        assert_eq!(w.0 .0, 2, "each line is tried: the reader may be back");
    }

    #[test]
    fn what_the_reader_takes_is_passed_on() {
        let mut w = Dropping(Vec::new());
        w.write_all(b"kept\n").unwrap();
        assert_eq!(w.0, b"kept\n");
    }

    #[test]
    fn a_rust_log_that_is_no_filter_is_refused_in_words() {
        for bad in ["tcpx_rxdm=dbug", "bogus[["] {
            let e = filter(Some(bad), "info").err().unwrap_or_else(|| panic!("{bad} accepted"));
            let text = e.to_string();
            assert!(text.starts_with(&format!("RUST_LOG={bad} cannot be read as a log filter (")), "{text}");
            assert!(!text.contains("Some("), "{text}");
        }
        for good in ["debug", "tcpx_rxdm=debug,info", "warn,tcpx_rxdm::daemon=trace"] {
            assert!(filter(Some(good), "info").is_ok(), "{good}");
        }
        // Unset or empty: the fallback.
        assert_eq!(filter(None, "warn").unwrap().to_string(), "warn");
        assert_eq!(filter(Some(" "), "warn").unwrap().to_string(), "warn");
    }
}
