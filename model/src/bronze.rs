//! The names of a Bronze table's columns, defined once for the writer and the readers.
//!
//! `wal2delta_stream::avro::columns` writes the envelope columns (one per field of the
//! change envelope, same name), `wal2delta_lake::bronze::rows` appends the Kafka
//! coordinates and ingest columns, and Silver (`wal2delta_lake::silver`) reads them. The
//! names live here, in the one crate both `stream` and `lake` import, because neither
//! imports the other: `lake` does not depend on `stream` (Kafka, Avro) and must not start
//! to for a list of names. Only names: this crate has no Arrow, so the typed view of a
//! batch is Silver's (`wal2delta_lake::silver::rows`).

/// The change's Debezium `op` code ([`crate::ChangeOp::code`]), text.
pub const OP: &str = "op";
/// The row image before the change (updates and deletes under the replica identity), struct.
pub const BEFORE: &str = "before";
/// The row image after the change (creates, updates, snapshot reads), struct.
pub const AFTER: &str = "after";
/// The decoded Kafka key: the primary key, a struct typed like the row images. No column
/// for a table without a primary key.
pub const KEY: &str = "key";
/// The change's own WAL position, int64.
pub const LSN: &str = "lsn";
/// The commit LSN of the change's transaction, int64.
pub const COMMIT_LSN: &str = "commit_lsn";
/// The change's position in its transaction, int64.
pub const ORDINAL: &str = "ordinal";
/// The source transaction id, int64.
pub const TX_ID: &str = "tx_id";
/// The source commit time, timestamp (µs, UTC).
pub const COMMIT_TS: &str = "commit_ts";
/// Whether the row was read by a snapshot, boolean.
pub const SNAPSHOT: &str = "snapshot";
/// The columns whose value an update left unchanged (TOAST), list of text.
pub const UNCHANGED_TOAST_COLUMNS: &str = "unchanged_toast_columns";
/// The key that tokenized sensitive columns, text.
pub const TOKEN_KEY_ID: &str = "token_key_id";
/// When capture produced the event, timestamp (µs, UTC).
pub const EVENT_TS: &str = "event_ts";
/// The registry id the event was written with, int32.
pub const SCHEMA_ID: &str = "schema_id";
/// The originals of values the lake holds mapped (dates out of range), list of
/// `{column, value}`.
pub const OUT_OF_RANGE_VALUES: &str = "out_of_range_values";
/// The Kafka topic the event was read from, text.
pub const KAFKA_TOPIC: &str = "kafka_topic";
/// The Kafka partition (= Bronze partition of Silver's cursors), int32.
pub const KAFKA_PARTITION: &str = "kafka_partition";
/// The Kafka offset, int64.
pub const KAFKA_OFFSET: &str = "kafka_offset";
/// The Kafka record's timestamp, timestamp (µs, UTC).
pub const KAFKA_TIMESTAMP: &str = "kafka_timestamp";
/// When Bronze ingested the event, timestamp (µs, UTC).
pub const INGESTED_AT: &str = "ingested_at";
/// The partition column: the UTC date the rows were ingested.
pub const INGEST_DATE: &str = "ingest_date";

/// The Bronze columns Silver reads.
pub const SILVER_READS: &[&str] = &[
    OP,
    BEFORE,
    AFTER,
    KEY,
    COMMIT_LSN,
    ORDINAL,
    COMMIT_TS,
    UNCHANGED_TOAST_COLUMNS,
    KAFKA_TOPIC,
    KAFKA_PARTITION,
    KAFKA_OFFSET,
];
