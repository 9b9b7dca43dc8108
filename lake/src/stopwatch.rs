//! Lap timing for the steps of a round (logged at debug so an operator can see which
//! step of a slow round to tune).

use std::time::{Duration, Instant};

pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Self(Instant::now())
    }

    /// The time since the last lap (or the start), restarting it.
    pub(crate) fn lap(&mut self) -> Duration {
        let now = Instant::now();
        let d = now - self.0;
        self.0 = now;
        d
    }
}
