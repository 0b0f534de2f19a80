//! Percentiles, per-run measures and the best-of-rounds summary.

use std::time::Duration;

/// Nearest-rank percentile of an ascending slice (`p` in 0..=1): the smallest
/// value with at least `p` of the samples at or below it. `None` when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One timed run against one server.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    /// Requests answered with exactly the expected reply.
    pub ok: usize,
    /// Requests that failed or got any other reply.
    pub errors: usize,
    /// Correct replies per second of wall time.
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Server CPU (user + system) per correct reply, in µs.
    pub cpu_us: Option<f64>,
}

impl Measure {
    /// From the latencies of the correct replies (any order), the error count,
    /// the run's wall time and the server's CPU seconds over the run.
    pub fn new(mut lat: Vec<Duration>, errors: usize, wall: Duration, cpu_s: Option<f64>) -> Measure {
        lat.sort_unstable();
        let ok = lat.len();
        let secs = wall.as_secs_f64();
        Measure {
            ok,
            errors,
            rate: if secs > 0.0 { ok as f64 / secs } else { 0.0 },
            p50: percentile(&lat, 0.50).unwrap_or_default(),
            p99: percentile(&lat, 0.99).unwrap_or_default(),
            cpu_us: cpu_s.filter(|_| ok > 0).map(|c| c / ok as f64 * 1e6),
        }
    }
}

/// Best of several rounds of one configuration: each figure is its own best
/// (highest rate, lowest p50, p99 and CPU); counts are summed, so an error in
/// any round stays visible.
pub fn best(rounds: &[Measure]) -> Option<Measure> {
    let first = rounds.first()?.clone();
    Some(rounds[1..].iter().fold(first, |b, m| Measure {
        ok: b.ok + m.ok,
        errors: b.errors + m.errors,
        rate: b.rate.max(m.rate),
        p50: b.p50.min(m.p50),
        p99: b.p99.min(m.p99),
        cpu_us: match (b.cpu_us, m.cpu_us) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        },
    }))
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us_list(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_micros(x)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v = us_list(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&v, 0.50), Some(Duration::from_micros(50)));
        assert_eq!(percentile(&v, 0.99), Some(Duration::from_micros(99)));
        assert_eq!(percentile(&v, 1.0), Some(Duration::from_micros(100)));
        assert_eq!(percentile(&v, 0.0), Some(Duration::from_micros(1)));
        // Ten samples: p99 is the largest, p50 the fifth.
        let v = us_list(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 1000]);
        assert_eq!(percentile(&v, 0.99), Some(Duration::from_micros(1000)));
        assert_eq!(percentile(&v, 0.50), Some(Duration::from_micros(5)));
        assert_eq!(percentile(&us_list(&[7]), 0.5), Some(Duration::from_micros(7)));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn measure_sorts_and_counts_only_correct_replies() {
        let m = Measure::new(us_list(&[40, 10, 30, 20]), 3, Duration::from_millis(2), Some(0.0004));
        assert_eq!(m.ok, 4);
        assert_eq!(m.errors, 3);
        assert!((m.rate - 2000.0).abs() < 1e-6, "{}", m.rate);
        assert_eq!(m.p50, Duration::from_micros(20));
        assert_eq!(m.p99, Duration::from_micros(40));
        assert!((m.cpu_us.unwrap() - 100.0).abs() < 1e-9);
        let none = Measure::new(vec![], 5, Duration::from_secs(1), Some(1.0));
        assert_eq!((none.ok, none.rate, none.cpu_us), (0, 0.0, None));
    }

    #[test]
    fn best_takes_each_figure_from_its_best_round_and_sums_errors() {
        let a = Measure::new(us_list(&[10, 90]), 0, Duration::from_millis(1), Some(0.00002));
        let b = Measure::new(us_list(&[20, 30, 40, 50]), 2, Duration::from_millis(1), None);
        let m = best(&[a.clone(), b]).unwrap();
        assert_eq!(m.rate, 4000.0);
        assert_eq!(m.p50, Duration::from_micros(10));
        assert_eq!(m.p99, Duration::from_micros(50));
        assert_eq!((m.ok, m.errors), (6, 2));
        assert!((m.cpu_us.unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(best(std::slice::from_ref(&a)), Some(a.clone()));
        assert_eq!(best(&[]), None);
    }
}
