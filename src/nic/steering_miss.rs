//! Steering-miss detection: rules are installed on a NIC, its RSS (host)
//! queues receive bytes faster than a threshold, and its GPU queues receive
//! nothing, over a whole window. Then the flows the rules were meant for are
//! landing on the host queues and the job runs slowly without an error.
//!
//! Pure logic on an injected clock: the caller passes each sample's time and
//! counters, and gets back the start or end of an episode, so that it logs
//! once per episode.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// When a NIC counts as missing its steering.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MissConfig {
    /// RSS-queue receive rate (bytes per second, over the window) above which
    /// traffic is more than background noise.
    pub min_rss_bytes_per_sec: f64,
    /// How long the pattern must hold before it is reported.
    pub window: Duration,
}

impl Default for MissConfig {
    /// 10 MB/s on the host queues for 10 s: far above control traffic, far
    /// below what one steered flow carries.
    fn default() -> Self {
        MissConfig { min_rss_bytes_per_sec: 10e6, window: Duration::from_secs(10) }
    }
}

/// One reading of a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at: Instant,
    /// Steering rules installed now.
    pub rules: u64,
    /// Bytes received so far on the RSS queues, summed.
    pub rss_bytes: u64,
    /// Bytes received so far on the queues bound to GPU pools, summed.
    pub gpu_bytes: u64,
}

/// A change of a NIC's state, to be logged.
#[derive(Debug, Clone, PartialEq)]
pub enum Episode {
    /// A miss began: the RSS queues' rate over the window.
    Started { nic: String, rss_bytes_per_sec: f64, rules: u64 },
    /// It ended, and why.
    Ended { nic: String, reason: &'static str },
}

#[derive(Debug, Default)]
struct NicState {
    /// Samples newer than the window, plus the newest one older than it.
    samples: VecDeque<Sample>,
    missing: bool,
}

/// The detector for every NIC.
#[derive(Debug, Default)]
pub struct SteeringWatch {
    cfg: MissConfig,
    nics: HashMap<String, NicState>,
}

impl SteeringWatch {
    pub fn new(cfg: MissConfig) -> Self {
        SteeringWatch { cfg, nics: HashMap::new() }
    }

    /// Whether `nic` is in a miss episode now.
    pub fn missing(&self, nic: &str) -> bool {
        self.nics.get(nic).is_some_and(|s| s.missing)
    }

    /// Takes a reading; returns the episode it starts or ends, if any.
    pub fn observe(&mut self, nic: &str, s: Sample) -> Option<Episode> {
        let cfg = self.cfg;
        let st = self.nics.entry(nic.to_string()).or_default();
        // Counters that went back (driver reset, NIC re-created) start a new
        // history; so does a time without rules: host traffic from before the
        // rules is no miss, so the window starts when they appear.
        let went_back = st
            .samples
            .back()
            .is_some_and(|b| s.rss_bytes < b.rss_bytes || s.gpu_bytes < b.gpu_bytes || s.at < b.at);
        if s.rules == 0 || went_back {
            st.samples.clear();
        }
        let gpu_moved = st.samples.back().is_some_and(|b| s.gpu_bytes > b.gpu_bytes);
        st.samples.push_back(s);
        // Keep one sample at least a window old as the baseline.
        while st.samples.len() > 2 && s.at.duration_since(st.samples[1].at) >= cfg.window {
            st.samples.pop_front();
        }
        let base = st.samples.front().copied().expect("just pushed");
        let span = s.at.duration_since(base.at);
        let rate =
            if span.is_zero() { 0.0 } else { (s.rss_bytes - base.rss_bytes) as f64 / span.as_secs_f64() };
        let full_window = span >= cfg.window;
        let was = st.missing;
        let ended = if s.rules == 0 {
            Some("no rules installed")
        } else if gpu_moved {
            Some("GPU queues receive")
        } else if full_window && rate < cfg.min_rss_bytes_per_sec {
            Some("host queues quiet")
        } else {
            None
        };
        st.missing = match ended {
            Some(_) => false,
            None => {
                was || (full_window && s.gpu_bytes == base.gpu_bytes && rate >= cfg.min_rss_bytes_per_sec)
            }
        };
        match (was, st.missing) {
            (false, true) => {
                Some(Episode::Started { nic: nic.to_string(), rss_bytes_per_sec: rate, rules: s.rules })
            }
            (true, false) => {
                Some(Episode::Ended { nic: nic.to_string(), reason: ended.expect("set when cleared") })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NIC read every second; `rss`/`gpu` are the bytes received in that second.
    struct Drive {
        w: SteeringWatch,
        t0: Instant,
        secs: u64,
        rss: u64,
        gpu: u64,
    }

    impl Drive {
        fn new() -> Self {
            Drive {
                w: SteeringWatch::new(MissConfig::default()),
                t0: Instant::now(),
                secs: 0,
                rss: 0,
                gpu: 0,
            }
        }

        /// `n` seconds at the given per-second rates; the episodes they produced.
        fn run(&mut self, n: u64, rules: u64, rss: u64, gpu: u64) -> Vec<Episode> {
            let mut out = Vec::new();
            for _ in 0..n {
                self.secs += 1;
                self.rss += rss;
                self.gpu += gpu;
                let s = Sample {
                    at: self.t0 + Duration::from_secs(self.secs),
                    rules,
                    rss_bytes: self.rss,
                    gpu_bytes: self.gpu,
                };
                out.extend(self.w.observe("eth1", s));
            }
            out
        }
    }

    const BUSY: u64 = 100_000_000;

    #[test]
    fn a_miss_is_reported_once_within_the_window_and_cleared_when_gpu_queues_receive() {
        let mut d = Drive::new();
        // Not before a whole window has been seen.
        assert_eq!(d.run(9, 5, BUSY, 0), []);
        let ep = d.run(2, 5, BUSY, 0);
        assert!(matches!(ep.as_slice(), [Episode::Started { rules: 5, .. }]), "{ep:?}");
        assert!(d.w.missing("eth1"));
        // Once per episode.
        assert_eq!(d.run(30, 5, BUSY, 0), []);
        assert_eq!(
            d.run(1, 5, BUSY, 4096),
            [Episode::Ended { nic: "eth1".into(), reason: "GPU queues receive" }]
        );
        assert!(!d.w.missing("eth1"));
        // Steered traffic: never a miss, however busy the host queues are.
        assert_eq!(d.run(30, 5, BUSY, BUSY), []);
    }

    #[test]
    fn no_report_while_idle_or_without_rules() {
        let mut d = Drive::new();
        assert_eq!(d.run(30, 5, 0, 0), [], "idle with rules");
        assert_eq!(d.run(30, 5, 1_000_000, 0), [], "below the threshold");
        assert_eq!(d.run(30, 0, BUSY, 0), [], "no rules: host traffic is expected on RSS queues");
    }

    #[test]
    fn the_episode_ends_when_rules_go_or_the_host_queues_quiet_down() {
        let mut d = Drive::new();
        assert_eq!(d.run(11, 5, BUSY, 0).len(), 1);
        assert_eq!(
            d.run(1, 0, BUSY, 0),
            [Episode::Ended { nic: "eth1".into(), reason: "no rules installed" }]
        );
        assert_eq!(d.run(11, 5, BUSY, 0).len(), 1);
        let ep = d.run(11, 5, 0, 0);
        assert_eq!(ep, [Episode::Ended { nic: "eth1".into(), reason: "host queues quiet" }]);
    }

    #[test]
    fn the_window_starts_when_rules_appear() {
        let mut d = Drive::new();
        assert_eq!(d.run(30, 0, BUSY, 0), []);
        assert_eq!(d.run(9, 5, BUSY, 0), [], "host traffic from before the rules does not count");
        assert_eq!(d.run(1, 5, BUSY, 0).len(), 1);
    }

    #[test]
    fn counters_that_go_back_restart_the_history() {
        let mut d = Drive::new();
        d.run(5, 5, BUSY, 0);
        d.rss = 0; // a driver reset zeroes its counters
        assert_eq!(d.run(9, 5, BUSY, 0), [], "the window restarts");
        assert_eq!(d.run(2, 5, BUSY, 0).len(), 1);
    }

    #[test]
    fn irregular_reads_use_the_real_elapsed_time() {
        let mut w = SteeringWatch::new(MissConfig::default());
        let t0 = Instant::now();
        let s = |secs: u64, rss: u64| Sample {
            at: t0 + Duration::from_secs(secs),
            rules: 1,
            rss_bytes: rss,
            gpu_bytes: 7,
        };
        assert_eq!(w.observe("eth2", s(0, 0)), None);
        // 50 MB over 30 s: above 10 MB/s? No: 1.7 MB/s.
        assert_eq!(w.observe("eth2", s(30, 50_000_000)), None);
        // 1 GB more in 10 s: 100 MB/s over the window.
        assert!(matches!(w.observe("eth2", s(40, 1_050_000_000)), Some(Episode::Started { .. })));
        assert!(!w.missing("eth1"));
    }
}
