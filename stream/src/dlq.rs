//! The dead-letter record for events capture cannot publish normally.
//!
//! Written as JSON (not Avro) so that a dead letter can always be written, even when the
//! schema registry is the thing refusing. Consumers and `wal2delta quarantine` read the
//! fields below; `raw` holds the row as PostgreSQL sent it.

use serde::Serialize;
pub use wal2delta_model::dead_letter::DeadLetterKind;

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Machine-readable reason kind (`undecodable_value`, `identity_without_key`,
    /// `schema_refused`, `encode_failed`, `message_too_large`).
    pub reason_kind: DeadLetterKind,
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
    /// `message_too_large` only: the detail below. The row itself is not in the letter (it
    /// would not fit either); it is still in the source, found by `key`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub too_large: Option<TooLarge>,
}

/// Why an event was too large to publish, without its values.
#[derive(Debug, Clone, Serialize)]
pub struct TooLarge {
    /// The event's key columns as PostgreSQL text (tokenized where configured); null
    /// for a table without key columns.
    pub key: Option<serde_json::Map<String, serde_json::Value>>,
    /// Every column of the row, in table order.
    pub columns: Vec<String>,
    /// Key plus value of the encoded event, in bytes.
    pub encoded_bytes: usize,
    /// The limit it exceeded (the producer's `message.max.bytes` or, when the broker
    /// refused it, the size the broker refused).
    pub limit_bytes: usize,
}

impl DeadLetter {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_letter_writes_each_kind_as_the_metric_labels_it() {
        for kind in [
            DeadLetterKind::UndecodableValue,
            DeadLetterKind::IdentityWithoutKey,
            DeadLetterKind::SchemaRefused,
            DeadLetterKind::EncodeFailed,
            DeadLetterKind::MessageTooLarge,
        ] {
            let letter = DeadLetter {
                reason_kind: kind,
                reason: String::new(),
                table: "s.t".into(),
                op: "c".into(),
                lsn: "0/1".into(),
                commit_lsn: "0/1".into(),
                ordinal: 0,
                xid: 1,
                commit_ts_us: 0,
                raw: String::new(),
                too_large: None,
            };
            let json: serde_json::Value = serde_json::from_slice(&letter.to_json()).unwrap();
            assert_eq!(json["reason_kind"], kind.as_str());
        }
    }
}
