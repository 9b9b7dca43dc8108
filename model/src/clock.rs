//! The wall clock, in the units the product records (Unix epoch). A clock set before 1970
//! reads as 0 rather than failing: these times label records, they order nothing.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Microseconds since the Unix epoch.
pub fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The clock's nanoseconds within the current second: with the process id, enough to
/// make a name (a temporary slot, a consumer group) unique across processes.
pub fn subsec_nanos() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    #[test]
    fn units_agree() {
        let ms = super::unix_ms();
        let us = super::unix_us();
        assert!(ms > 1_600_000_000_000, "after 2020: {ms}");
        assert!((us / 1000 - ms).abs() < 1000, "{us} µs vs {ms} ms");
    }
}
