//! The simulator's random numbers, for probabilistic faults: xorshift64*,
//! seeded from the clock. Plenty for deciding whether a fault fires, and no
//! dependency.

use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub(super) struct Rng(u64);

impl Rng {
    /// Seeded from the wall clock, so that runs sample differently.
    pub(super) fn from_clock() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        // xorshift never leaves zero: keep the seed odd.
        Rng(nanos | 1)
    }

    /// A uniform sample of [0, 1).
    pub(super) fn next_f64(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_stay_in_the_unit_interval_and_vary() {
        let mut rng = Rng(1);
        let samples: Vec<f64> = (0..1000).map(|_| rng.next_f64()).collect();
        assert!(samples.iter().all(|s| (0.0..1.0).contains(s)));
        let below_half = samples.iter().filter(|s| **s < 0.5).count();
        assert!((400..600).contains(&below_half), "{below_half} of 1000 below 0.5");
    }
}
