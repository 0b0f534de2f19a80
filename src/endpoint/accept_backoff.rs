//! What an accept loop does when accepting fails, above all when the process
//! or the system is out of file descriptors (`EMFILE`/`ENFILE`): wait a
//! growing delay instead of spinning on a listener that stays readable, log
//! one line per few seconds with the count of failures, and say once when
//! accepting works again.

use std::io;
use std::time::{Duration, Instant};

/// Shortest and longest pause after a failed accept.
pub const MIN_DELAY: Duration = Duration::from_millis(10);
pub const MAX_DELAY: Duration = Duration::from_millis(500);
/// At most one log line per this period while failures go on.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// Whether `e` means "no file descriptor left" (process or system wide).
pub fn is_fd_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// Per-listener failure state.
#[derive(Debug)]
pub struct AcceptBackoff {
    what: &'static str,
    delay: Duration,
    /// Failures since accepting last worked.
    failures: u64,
    /// Failures not yet reported in a log line.
    unlogged: u64,
    last_log: Option<Instant>,
}

impl AcceptBackoff {
    pub fn new(what: &'static str) -> Self {
        AcceptBackoff { what, delay: MIN_DELAY, failures: 0, unlogged: 0, last_log: None }
    }

    /// Records a failed accept; returns how long to pause before the next.
    pub fn failed(&mut self, e: &io::Error) -> Duration {
        self.failures += 1;
        self.unlogged += 1;
        let now = Instant::now();
        if self.last_log.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
            let hint = if is_fd_exhaustion(e) {
                "out of file descriptors; waiting for clients to leave"
            } else {
                "accept failed"
            };
            tracing::warn!(
                listener = self.what,
                error = %e,
                failures = self.unlogged,
                since_last_success = self.failures,
                "{hint}"
            );
            self.unlogged = 0;
            self.last_log = Some(now);
        }
        let d = self.delay;
        self.delay = (self.delay * 2).min(MAX_DELAY);
        d
    }

    /// Records a successful accept.
    pub fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!(listener = self.what, failures = self.failures, "accepting connections again");
            self.failures = 0;
            self.unlogged = 0;
            self.last_log = None;
            self.delay = MIN_DELAY;
        }
    }

    pub fn failures(&self) -> u64 {
        self.failures
    }
}

/// A spare file descriptor kept open so that, when the process runs out, one
/// can be given up to accept a connection and answer it (a health check)
/// instead of leaving it in the backlog.
#[derive(Debug)]
pub struct ReserveFd(Option<std::fs::File>);

impl ReserveFd {
    pub fn new() -> Self {
        ReserveFd(std::fs::File::open("/dev/null").ok())
    }

    /// Gives the spare fd up; `false` when there was none to give.
    pub fn release(&mut self) -> bool {
        self.0.take().is_some()
    }

    /// Takes a spare fd again if there is none (may fail while fds are short).
    pub fn refill(&mut self) {
        if self.0.is_none() {
            self.0 = std::fs::File::open("/dev/null").ok();
        }
    }

    pub fn held(&self) -> bool {
        self.0.is_some()
    }
}

impl Default for ReserveFd {
    fn default() -> Self {
        Self::new()
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (systemd and containerd
/// start services with a soft limit of 1024, too few for thousands of NCCL
/// connections). Returns `(soft before, soft now, hard)`.
pub fn raise_nofile_limit() -> io::Result<(u64, u64, u64)> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads one rlimit from a struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok((before, lim.rlim_cur, lim.rlim_max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_to_a_cap_and_resets_on_success() {
        let mut b = AcceptBackoff::new("test");
        let e = io::Error::from_raw_os_error(libc::EMFILE);
        assert!(is_fd_exhaustion(&e));
        assert!(!is_fd_exhaustion(&io::Error::from_raw_os_error(libc::ECONNABORTED)));
        let delays: Vec<_> = (0..10).map(|_| b.failed(&e)).collect();
        assert_eq!(delays[0], MIN_DELAY);
        assert_eq!(delays[1], MIN_DELAY * 2);
        assert_eq!(*delays.last().unwrap(), MAX_DELAY);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(b.failures(), 10);
        // Only the first failure was logged; the rest wait for LOG_EVERY.
        assert_eq!(b.unlogged, 9);
        b.succeeded();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.failed(&e), MIN_DELAY);
    }

    #[test]
    fn reserve_fd_is_released_and_refilled() {
        let mut r = ReserveFd::new();
        assert!(r.held());
        assert!(r.release());
        assert!(!r.release());
        r.refill();
        assert!(r.held());
    }
}
