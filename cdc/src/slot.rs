//! The replication slot as PostgreSQL reports it.

use tokio_postgres::Client;
use wal2delta_model::Lsn;

use crate::CdcError;

/// A row of `pg_replication_slots` with the derived lag figures.
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
    pub safe_wal_size: Option<i64>,
    pub current_wal: Lsn,
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
}

fn lsn(s: Option<String>) -> Option<Lsn> {
    s.and_then(|s| s.parse().ok())
}

/// Reads the slot, or `None` when it does not exist.
pub async fn slot_info(client: &Client, slot: &str) -> Result<Option<SlotInfo>, CdcError> {
    let row = client
        .query_opt(
            "SELECT s.slot_name::text, s.plugin::text, s.active, s.active_pid, s.confirmed_flush_lsn::text, \
                    s.restart_lsn::text, s.wal_status, s.safe_wal_size, pg_current_wal_lsn()::text \
             FROM pg_replication_slots s WHERE s.slot_name = $1",
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
    }))
}

/// The server's `wal_sender_timeout` in milliseconds (0 = disabled).
pub async fn wal_sender_timeout_ms(client: &Client) -> Result<u64, CdcError> {
    let row = client.query_one("SELECT setting::bigint * CASE unit WHEN 's' THEN 1000 ELSE 1 END FROM pg_settings WHERE name = 'wal_sender_timeout'", &[]).await?;
    let v: i64 = row.get(0);
    Ok(v.max(0) as u64)
}
