//! The quarantine record every stage uses, and its Arrow form.
//!
//! A record is quarantined when one event or row cannot go on (undecodable bytes, a schema
//! Bronze cannot merge, a failed quality check) and the stream must not stop for it. The
//! record keeps everything needed to understand and re-drive it: the stage, a
//! machine-readable reason code, a human-readable detail (never a row value), where it was
//! read (topic, partition, offset) and the raw bytes as they arrived. The table lives at
//! `quarantine/records` in the lake (written by `wal2delta-lake`); it holds raw payloads and
//! must be protected like the source.

mod record;

pub use record::{QuarantineRecord, RecordsError, Stage};
