//! `[capture]`: tuning of the capture stage.

use std::path::PathBuf;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[capture]`: tuning of the capture stage. The defaults suit most databases.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// Minimum time between standby status updates sent to PostgreSQL, in milliseconds.
    /// Keepalives that ask for a reply are always answered at once.
    #[serde(default = "CaptureConfig::default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// At most this many events may wait for Kafka acknowledgement; reading the slot
    /// pauses beyond it, which bounds memory.
    #[serde(default = "CaptureConfig::default_max_in_flight")]
    pub max_in_flight: usize,
    /// Interval of heartbeat messages (`pg_logical_emit_message`) written to the source so
    /// the slot keeps moving on an idle database; 0 disables them.
    #[serde(default = "CaptureConfig::default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// Ask PostgreSQL (14+) to stream large transactions while in progress (pgoutput
    /// protocol 2) instead of spilling them to disk on the primary.
    #[serde(default = "CaptureConfig::default_stream_in_progress")]
    pub stream_in_progress: bool,
    /// Where streamed transactions are buffered until their commit (scratch files, safe to
    /// delete when capture is stopped). Default: `$TMPDIR/wal2delta-{slot}`.
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
    /// Memory for buffered streamed transactions before they go to `spill_dir`.
    #[serde(default = "CaptureConfig::default_stream_memory_bytes")]
    pub stream_memory_bytes: usize,
    /// Publish no `t` (TRUNCATE) events, for consumers that reject them (Flink's
    /// Debezium format). Default false. **Silver then keeps the rows a TRUNCATE removed
    /// at the source** (it never sees the TRUNCATE) and `reconcile` reports them; each
    /// skipped TRUNCATE is logged and counted (`wal2delta_capture_truncates_skipped_total`).
    #[serde(default)]
    pub skip_truncate: bool,
}

impl CaptureConfig {
    fn default_status_interval_ms() -> u64 {
        1_000
    }
    /// librdkafka's idempotent producer keeps one produce request in flight per
    /// partition, and its broker thread polls without sleeping while the oldest queued
    /// event has waited longer than `linger.ms`. A shorter queue keeps that wait short:
    /// 10,000 halved capture's CPU per event against 50,000 (14.5 to 7.2 µs) and drained
    /// faster, and with the default `linger.ms` of 100 the queue never waits that long
    /// (docs/benchmarks.md, "What each change bought (capture)").
    fn default_max_in_flight() -> usize {
        10_000
    }
    fn default_heartbeat_interval_ms() -> u64 {
        10_000
    }
    fn default_stream_in_progress() -> bool {
        true
    }
    /// 64 MiB: large enough that most streamed transactions never touch the disk.
    fn default_stream_memory_bytes() -> usize {
        64 * 1024 * 1024
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.status_interval_ms == 0 || self.status_interval_ms > 60_000 {
            return Err(invalid(
                "capture.status_interval_ms",
                "must be between 1 and 60000",
            ));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("capture.max_in_flight", "must be greater than 0"));
        }
        Ok(())
    }

    /// The directory for streamed transactions of `slot`.
    pub fn spill_dir(&self, slot: &str) -> PathBuf {
        self.spill_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("wal2delta-{slot}")))
    }
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            status_interval_ms: Self::default_status_interval_ms(),
            max_in_flight: Self::default_max_in_flight(),
            heartbeat_interval_ms: Self::default_heartbeat_interval_ms(),
            stream_in_progress: Self::default_stream_in_progress(),
            spill_dir: None,
            stream_memory_bytes: Self::default_stream_memory_bytes(),
            skip_truncate: false,
        }
    }
}
