//! The dead-letter record for events capture cannot publish normally.
//!
//! Written as JSON (not Avro) so that a dead letter can always be written, even when the
//! schema registry is the thing refusing. Consumers and `wal2delta quarantine` read the
//! fields below; `raw` holds the row as PostgreSQL sent it.

use serde::Serialize;

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Machine-readable reason kind: `undecodable_value`, `encode_failed`, `schema_refused`.
    pub reason_kind: String,
    /// Human-readable reason (never contains a row value).
    pub reason: String,
    pub table: String,
    pub op: String,
    /// The change's own LSN and its transaction's commit LSN, in PostgreSQL's form.
    pub lsn: String,
    pub commit_lsn: String,
    pub ordinal: u64,
    pub xid: u32,
    pub commit_ts_us: i64,
    /// The row's raw text as received (may be sensitive: the DLQ topic must be protected
    /// like the source).
    pub raw: String,
}

impl DeadLetter {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}
