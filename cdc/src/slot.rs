//! The replication slot as PostgreSQL reports it, and the health figures derived from it
//! (promise 3: the source is protected).

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use wal2delta_model::Lsn;

use crate::CdcError;

/// A row of `pg_replication_slots` joined with `pg_stat_replication_slots`, plus the
/// server settings that bound it.
#[derive(Debug, Clone)]
pub struct SlotInfo {
    pub name: String,
    pub plugin: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub confirmed_flush: Option<Lsn>,
    pub restart_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// Bytes that can still be written before the slot is invalidated; `None` when
    /// `max_slot_wal_keep_size` is unlimited.
    pub safe_wal_size: Option<i64>,
    /// Effective `max_slot_wal_keep_size` in bytes; `None` when unlimited (-1).
    pub max_slot_wal_keep_size: Option<i64>,
    pub current_wal: Lsn,
    pub spill: SpillStats,
    /// The walsender serving the slot: `state` from `pg_stat_replication` (`streaming`,
    /// `catchup`, ...), `None` when no walsender is attached.
    pub walsender_state: Option<String>,
}

/// Logical decoding spill and stream counters (`pg_stat_replication_slots`).
#[derive(Debug, Clone, Default)]
pub struct SpillStats {
    pub spill_txns: i64,
    pub spill_count: i64,
    pub spill_bytes: i64,
    pub stream_txns: i64,
    pub stream_bytes: i64,
    pub total_txns: i64,
    pub total_bytes: i64,
}

impl SlotInfo {
    /// Bytes of WAL written since the slot's confirmed position: what capture still has to read.
    pub fn lag_bytes(&self) -> Option<u64> {
        self.confirmed_flush
            .map(|c| self.current_wal.0.saturating_sub(c.0))
    }

    /// Bytes of WAL the slot forces the server to keep.
    pub fn retained_bytes(&self) -> Option<u64> {
        self.restart_lsn
            .map(|r| self.current_wal.0.saturating_sub(r.0))
    }

    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }

    /// Estimated time until PostgreSQL invalidates the slot at `wal_bytes_per_second`:
    /// `safe_wal_size ÷ rate`. `None` when unlimited or when no WAL is being written.
    pub fn time_to_invalidation(&self, wal_bytes_per_second: f64) -> Option<Duration> {
        let safe = self.safe_wal_size?;
        if wal_bytes_per_second <= 0.0 {
            return None;
        }
        Some(Duration::from_secs_f64(
            safe.max(0) as f64 / wal_bytes_per_second,
        ))
    }
}

fn lsn(s: Option<String>) -> Option<Lsn> {
    s.and_then(|s| s.parse().ok())
}

/// Reads the slot, or `None` when it does not exist.
pub async fn slot_info(client: &Client, slot: &str) -> Result<Option<SlotInfo>, CdcError> {
    let row = client
        .query_opt(
            "SELECT s.slot_name::text, s.plugin::text, s.active, s.active_pid, s.confirmed_flush_lsn::text, \
                    s.restart_lsn::text, s.wal_status, s.safe_wal_size, pg_current_wal_lsn()::text, \
                    (SELECT CASE WHEN setting::bigint < 0 THEN NULL ELSE setting::bigint * 1024 * 1024 END \
                       FROM pg_settings WHERE name = 'max_slot_wal_keep_size'), \
                    st.spill_txns, st.spill_count, st.spill_bytes, st.stream_txns, st.stream_bytes, \
                    st.total_txns, st.total_bytes, \
                    (SELECT r.state FROM pg_stat_replication r WHERE r.pid = s.active_pid) \
             FROM pg_replication_slots s \
             LEFT JOIN pg_stat_replication_slots st ON st.slot_name = s.slot_name \
             WHERE s.slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|r| SlotInfo {
        name: r.get(0),
        plugin: r.get(1),
        active: r.get(2),
        active_pid: r.get(3),
        confirmed_flush: lsn(r.get(4)),
        restart_lsn: lsn(r.get(5)),
        wal_status: r.get(6),
        safe_wal_size: r.get(7),
        current_wal: lsn(r.get(8)).unwrap_or_default(),
        max_slot_wal_keep_size: r.get(9),
        spill: SpillStats {
            spill_txns: r.get::<_, Option<i64>>(10).unwrap_or(0),
            spill_count: r.get::<_, Option<i64>>(11).unwrap_or(0),
            spill_bytes: r.get::<_, Option<i64>>(12).unwrap_or(0),
            stream_txns: r.get::<_, Option<i64>>(13).unwrap_or(0),
            stream_bytes: r.get::<_, Option<i64>>(14).unwrap_or(0),
            total_txns: r.get::<_, Option<i64>>(15).unwrap_or(0),
            total_bytes: r.get::<_, Option<i64>>(16).unwrap_or(0),
        },
        walsender_state: r.get(17),
    }))
}

/// Observes the server's WAL write rate between successive samples.
#[derive(Debug, Default)]
pub struct WalRate {
    last: Option<(Instant, Lsn)>,
    rate: Option<f64>,
}

impl WalRate {
    /// Records a sample of `pg_current_wal_lsn()` and returns the rate in bytes per second
    /// since the previous one (the last known rate when samples are too close).
    pub fn sample(&mut self, at: Instant, current: Lsn) -> Option<f64> {
        if let Some((t0, l0)) = self.last {
            let secs = at.duration_since(t0).as_secs_f64();
            if secs >= 0.5 {
                self.rate = Some(current.0.saturating_sub(l0.0) as f64 / secs);
                self.last = Some((at, current));
            }
        } else {
            self.last = Some((at, current));
        }
        self.rate
    }
}

/// The server's `wal_sender_timeout` in milliseconds (0 = disabled).
pub async fn wal_sender_timeout_ms(client: &Client) -> Result<u64, CdcError> {
    let row = client
        .query_one(
            "SELECT setting::bigint * CASE unit WHEN 's' THEN 1000 ELSE 1 END FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await?;
    let v: i64 = row.get(0);
    Ok(v.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_rate_and_time_to_invalidation() {
        let mut r = WalRate::default();
        let t0 = Instant::now();
        assert_eq!(r.sample(t0, Lsn(1000)), None);
        assert_eq!(
            r.sample(t0 + Duration::from_secs(2), Lsn(5000)),
            Some(2000.0)
        );
        // Too close to the previous sample: the last rate stands.
        assert_eq!(
            r.sample(t0 + Duration::from_millis(2100), Lsn(9000)),
            Some(2000.0)
        );
        let info = SlotInfo {
            name: "s".into(),
            plugin: None,
            active: true,
            active_pid: None,
            confirmed_flush: Some(Lsn(10)),
            restart_lsn: Some(Lsn(5)),
            wal_status: Some("reserved".into()),
            safe_wal_size: Some(10_000),
            max_slot_wal_keep_size: Some(20_000),
            current_wal: Lsn(110),
            spill: SpillStats::default(),
            walsender_state: None,
        };
        assert_eq!(info.lag_bytes(), Some(100));
        assert_eq!(info.retained_bytes(), Some(105));
        assert_eq!(
            info.time_to_invalidation(2000.0),
            Some(Duration::from_secs(5))
        );
        assert_eq!(info.time_to_invalidation(0.0), None);
    }
}
