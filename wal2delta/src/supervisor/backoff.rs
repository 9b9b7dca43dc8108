//! Exponential backoff with jitter, reset after success.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The waits between attempts: `first`, doubling up to `max`, each drawn at random from
/// its upper half so that stages (and daemons) failing together do not retry in step.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
    draws: u64,
    seed: std::collections::hash_map::RandomState,
}

impl Backoff {
    /// The policy every stage uses: 0.5 s, doubling, at most 30 s.
    pub fn standard() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(30))
    }

    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max: max.max(first),
            next: first,
            draws: 0,
            seed: Default::default(),
        }
    }

    /// The wait before the next attempt; the one after is twice as long (up to `max`).
    pub fn next_wait(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = ceiling / 2;
        half + half.mul_f64(self.unit())
    }

    /// After a success the next failure starts the series over.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// A number in [0, 1) from the process's random hasher keys (no RNG dependency for
    /// one jitter draw per failure).
    fn unit(&mut self) -> f64 {
        self.draws += 1;
        let mut h = self.seed.build_hasher();
        h.write_u64(self.draws);
        (h.finish() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_within_their_upper_half_and_reset_after_success() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let ceilings = [100, 200, 400, 800, 800];
        for c in ceilings {
            let w = b.next_wait();
            let c = Duration::from_millis(c);
            assert!(w >= c / 2 && w <= c, "{w:?} outside [{:?}, {c:?}]", c / 2);
        }
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_the_waits() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
        let waits: std::collections::BTreeSet<_> = (0..20).map(|_| b.next_wait()).collect();
        assert!(waits.len() > 10, "{waits:?}");
    }
}
