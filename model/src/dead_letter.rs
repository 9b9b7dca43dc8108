//! Why capture sent a change to the DLQ topic: the dead letter's `reason_kind` and the
//! `reason` label of `wal2delta_capture_dlq_events_total` (docs/capture.md, "Dead
//! letters"). One closed set, so a consumer can match on it and a new kind is a
//! deliberate change.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterKind {
    /// A value of the row could not be represented.
    UndecodableValue,
    /// An UPDATE or DELETE of a table whose replica identity gives no key.
    IdentityWithoutKey,
    /// The schema registry refused the table's schema.
    SchemaRefused,
    /// The event could not be encoded under its schema.
    EncodeFailed,
    /// The encoded event is larger than the producer or the broker accepts.
    MessageTooLarge,
}

impl DeadLetterKind {
    /// The kind as the letter and the metric write it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::UndecodableValue => "undecodable_value",
            DeadLetterKind::IdentityWithoutKey => "identity_without_key",
            DeadLetterKind::SchemaRefused => "schema_refused",
            DeadLetterKind::EncodeFailed => "encode_failed",
            DeadLetterKind::MessageTooLarge => "message_too_large",
        }
    }
}

impl std::fmt::Display for DeadLetterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
