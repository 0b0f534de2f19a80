//! Giving memory back after peaks. Freed buffers and shrunk tables go back to
//! the allocator, but glibc keeps freed memory in its arenas (one per busy
//! thread) unless asked: after 2000 connections with 64 KiB partial frames
//! left, RSS stayed above 128 MiB. A background task calls `malloc_trim(0)`
//! after a large free: a rule table shrank, or the number of open
//! connections fell well below its peak. It checks every
//! [`CHECK_EVERY`] and does nothing while load is steady, so installs never
//! wait behind a trim in the busy case.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::budget::ConnBudget;
use crate::host::memory::take_trim_request;
pub use crate::host::memory::{fix_mmap_threshold, note_large_free, trim};

pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Connections that must have gone (and at least half of the peak) to trim.
pub const CONNECTIONS_GONE: usize = 64;

/// Read buffers above this capacity are shrunk once their frame is consumed.
pub const BUFFER_KEEP: usize = 4096;

/// Shrinks a connection's read buffer that a large frame grew.
pub fn shrink_buffer(buf: &mut Vec<u8>) {
    if buf.capacity() > BUFFER_KEEP && buf.len() <= BUFFER_KEEP / 8 {
        buf.shrink_to(BUFFER_KEEP / 8);
    }
}

/// Whether the open-connection count fell far enough below its peak.
pub fn connections_fell(peak: usize, now: usize) -> bool {
    peak >= now + CONNECTIONS_GONE && now <= peak / 2
}

/// Runs the trimmer until shutdown.
pub fn spawn_trimmer(budget: Arc<ConnBudget>, mut shutdown: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let mut peak = 0usize;
        loop {
            tokio::select! {
                _ = super::stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            let open = budget.open();
            peak = peak.max(budget.take_peak());
            let tables = take_trim_request();
            if tables || connections_fell(peak, open) {
                let t = std::time::Instant::now();
                let released = trim();
                tracing::debug!(
                    open,
                    peak,
                    tables,
                    released,
                    elapsed_us = t.elapsed().as_micros() as u64,
                    "malloc_trim"
                );
                peak = open;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_shrink_small_ones_stay() {
        let mut b = Vec::with_capacity(65_536);
        b.extend_from_slice(&[1, 2, 3]);
        shrink_buffer(&mut b);
        assert!(b.capacity() <= BUFFER_KEEP, "{}", b.capacity());
        assert_eq!(b, [1, 2, 3]);
        let mut small: Vec<u8> = Vec::with_capacity(512);
        shrink_buffer(&mut small);
        assert_eq!(small.capacity(), 512);
        // Still holding most of a big frame: left alone.
        let mut busy = vec![0u8; 60_000];
        busy.reserve(5_000);
        let cap = busy.capacity();
        shrink_buffer(&mut busy);
        assert_eq!(busy.capacity(), cap);
    }

    #[test]
    fn trims_only_after_a_large_fall() {
        assert!(!connections_fell(10, 0), "small peaks are not worth a trim");
        assert!(connections_fell(2000, 0));
        assert!(connections_fell(200, 100));
        assert!(!connections_fell(200, 150));
        assert!(!connections_fell(5000, 4900));
    }
}
