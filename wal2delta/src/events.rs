//! Internal events: one struct per notable occurrence, whose [`InternalEvent::emit`] writes
//! its log line and updates its metrics together, so a log line and the metric an alert
//! watches cannot drift apart (the pattern of vector's `internal_events`). The metric names
//! are in [`crate::metrics`]; their labels are written here, once per event.
//!
//! Covered: stage state and failures, one table's failures (Bronze, Silver, Gold),
//! quarantined records and dead letters. Per-batch throughput counters stay beside the
//! work they count.

use std::fmt::Display;
use std::time::Duration;

use wal2delta_model::dead_letter::DeadLetterKind;
use wal2delta_model::{ErrorClass, Lsn, TableName};

use crate::metrics as m;

/// Something that happened, told to the log and the metrics at once.
pub trait InternalEvent {
    fn emit(self);
}

/// The `class` label of an error class.
pub fn class_label(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Transient => "transient",
        ErrorClass::Record => "record",
        ErrorClass::Operator => "operator",
    }
}

const CLASSES: [ErrorClass; 3] = [
    ErrorClass::Transient,
    ErrorClass::Record,
    ErrorClass::Operator,
];

// --- stages -------------------------------------------------------------------------------

/// A stage is supervised: its failure counters exist from the start, at 0 (Prometheus's
/// `increase()` sees no rise in a series whose first sample is already 1, so an alert on
/// the first failure needs the 0 before it).
pub struct StageSupervised {
    pub stage: &'static str,
}

impl InternalEvent for StageSupervised {
    fn emit(self) {
        let stage = self.stage;
        metrics::counter!(m::STAGE_RESTARTS, "stage" => stage).increment(0);
        for class in CLASSES {
            metrics::counter!(m::STAGE_FAILURES, "stage" => stage, "class" => class_label(class))
                .increment(0);
        }
    }
}

/// A stage's status changed (state, failing tables): its gauges follow. Logged by the
/// events that change it.
pub struct StageStatusChanged {
    pub stage: &'static str,
    pub up: bool,
    pub failed: bool,
    pub failing_tables: usize,
}

impl InternalEvent for StageStatusChanged {
    fn emit(self) {
        let stage = self.stage;
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        metrics::gauge!(m::STAGE_UP, "stage" => stage).set(flag(self.up));
        metrics::gauge!(m::STAGE_FAILED, "stage" => stage).set(flag(self.failed));
        metrics::gauge!(m::STAGE_FAILING_TABLES, "stage" => stage).set(self.failing_tables as f64);
    }
}

/// A stage's session (or round) ended with an error; the policy's answer follows as
/// [`StageRetrying`] or [`StageStopped`].
pub struct StageSessionFailed {
    pub stage: &'static str,
    pub class: ErrorClass,
}

impl InternalEvent for StageSessionFailed {
    fn emit(self) {
        metrics::counter!(m::STAGE_FAILURES, "stage" => self.stage, "class" => class_label(self.class))
            .increment(1);
    }
}

/// A stage waits, then starts a new session.
pub struct StageRetrying<'a> {
    pub stage: &'static str,
    pub error: &'a str,
    pub wait: Duration,
    /// How the new session goes on.
    pub resumes: &'static str,
}

impl InternalEvent for StageRetrying<'_> {
    fn emit(self) {
        let stage = self.stage;
        metrics::counter!(m::STAGE_RESTARTS, "stage" => stage).increment(1);
        tracing::warn!(stage, error = %self.error, retry_in_ms = self.wait.as_millis() as u64, "{stage} session ended; {}", self.resumes);
    }
}

/// A stage stopped for an error that needs an operator (the error is returned and
/// logged by the daemon; `wal2delta_stage_failed` is set with the status).
pub struct StageStopped<'a> {
    pub stage: &'static str,
    pub class: &'static str,
    /// The error with its hint.
    pub error: &'a str,
}

impl InternalEvent for StageStopped<'_> {
    fn emit(self) {
        let stage = self.stage;
        tracing::debug!(stage, class = self.class, error = %self.error, "{stage} stage stopped");
    }
}

// --- one table's failures -----------------------------------------------------------------

/// One Bronze table's commit failed; its topic pauses for `retry_in`.
pub struct BronzeTableFailed<'a> {
    pub table: &'a str,
    /// `error` or `panic`.
    pub kind: &'static str,
    pub error: &'a dyn Display,
    pub retry_in: Duration,
}

impl InternalEvent for BronzeTableFailed<'_> {
    fn emit(self) {
        metrics::counter!(m::BRONZE_TABLE_FAILURES, "table" => self.table.to_owned(), "kind" => self.kind)
            .increment(1);
        tracing::error!(table = %self.table, error = %self.error, retry_in_ms = self.retry_in.as_millis() as u64, "Bronze commit of this table failed; the other tables go on, this one is re-read from its stored offsets after the pause");
    }
}

/// Silver holds a table: its error counters exist from the start, at 0.
pub struct SilverTableHeld<'a> {
    pub table: &'a str,
}

impl InternalEvent for SilverTableHeld<'_> {
    fn emit(self) {
        for class in CLASSES {
            metrics::counter!(m::SILVER_ERRORS, "table" => self.table.to_owned(), "class" => class_label(class))
                .increment(0);
        }
    }
}

/// A Silver table could not be opened or its round failed; it waits `retry_in`.
pub struct SilverTableFailed<'a> {
    pub table: &'a str,
    /// The `class` label: the error's class for a round; `operator` for a table that
    /// cannot be opened (under its policy).
    pub class: &'static str,
    pub error: &'a wal2delta_lake::LakeError,
    pub retry_in: Duration,
}

impl InternalEvent for SilverTableFailed<'_> {
    fn emit(self) {
        use crate::supervisor::StageError;
        metrics::counter!(m::SILVER_ERRORS, "table" => self.table.to_owned(), "class" => self.class)
            .increment(1);
        let (table, error) = (self.table, self.error);
        let retry_in_ms = self.retry_in.as_millis() as u64;
        if error.class() == ErrorClass::Operator {
            let hint = StageError::hint(error)
                .map(|h| format!(" (hint: {h})"))
                .unwrap_or_default();
            tracing::error!(table = %table, error = %format!("{error}{hint}"), retry_in_ms, "the Silver table cannot be worked on until an operator fixes this; the other tables go on");
        } else {
            tracing::warn!(table = %table, error = %error, retry_in_ms, "silver round of the table failed; the other tables go on, this one is retried after a pause");
        }
    }
}

/// Gold runs a model: its failure counter exists from the start, at 0.
pub struct GoldModelLoaded<'a> {
    pub model: &'a str,
}

impl InternalEvent for GoldModelLoaded<'_> {
    fn emit(self) {
        metrics::counter!(m::GOLD_FAILURES, "model" => self.model.to_owned()).increment(0);
    }
}

/// A Gold model's refresh failed; it waits `retry_in`, the models that read it wait too.
pub struct GoldModelFailed<'a> {
    pub model: &'a str,
    pub error: &'a dyn Display,
    pub retry_in: Duration,
}

impl InternalEvent for GoldModelFailed<'_> {
    fn emit(self) {
        metrics::counter!(m::GOLD_FAILURES, "model" => self.model.to_owned()).increment(1);
        tracing::warn!(model = %self.model, error = %self.error, retry_in_ms = self.retry_in.as_millis() as u64, "gold model refresh failed; the models that read it wait, the others go on");
    }
}

// --- quarantine ---------------------------------------------------------------------------

/// Bronze appended events it could not store as rows to the quarantine table.
pub struct BronzeEventsQuarantined<'a> {
    pub reason: &'a str,
    pub events: u64,
}

impl InternalEvent for BronzeEventsQuarantined<'_> {
    fn emit(self) {
        tracing::warn!(reason = %self.reason, events = self.events, "events quarantined");
        metrics::counter!(m::QUARANTINED, "stage" => "bronze", "reason" => self.reason.to_owned())
            .increment(self.events);
    }
}

/// Rows of a Silver round failed a quality check and went to quarantine.
pub struct SilverRowsQuarantined<'a> {
    pub table: &'a str,
    pub rows: u64,
}

impl InternalEvent for SilverRowsQuarantined<'_> {
    fn emit(self) {
        metrics::counter!(m::QUARANTINED, "stage" => "silver", "reason" => wal2delta_lake::silver::CHECK_FAILED)
            .increment(self.rows);
        tracing::warn!(table = %self.table, rows = self.rows, "rows failed quality checks and went to quarantine");
    }
}

/// Rows a rule could not be evaluated on went to quarantine (logged with the round's
/// report).
pub struct RuleRowsQuarantined<'a> {
    pub rule: &'a str,
    pub rows: u64,
}

impl InternalEvent for RuleRowsQuarantined<'_> {
    fn emit(self) {
        metrics::counter!(m::RULES_ERRORS, "rule" => self.rule.to_owned()).increment(self.rows);
        metrics::counter!(m::QUARANTINED, "stage" => "silver", "reason" => wal2delta_lake::rules::RULE_FAILED)
            .increment(self.rows);
    }
}

/// The quarantine records of a stage that no resolution names yet.
pub struct QuarantineOpenCounted {
    pub stage: &'static str,
    pub open: u64,
}

impl InternalEvent for QuarantineOpenCounted {
    fn emit(self) {
        metrics::gauge!(m::QUARANTINE_OPEN, "stage" => self.stage).set(self.open as f64);
    }
}

// --- the captured tables ------------------------------------------------------------------

/// Capture added a table created after `setup` to the publication.
pub struct TableAddedToPublication<'a> {
    pub table: &'a TableName,
    pub publication: &'a str,
}

impl InternalEvent for TableAddedToPublication<'_> {
    fn emit(self) {
        tracing::info!(table = %self.table, publication = self.publication, "a new table matches [source] tables: added to the publication; its rows are snapshotted and its changes streamed");
        metrics::counter!(m::CAPTURE_TABLES_ADDED).increment(1);
    }
}

/// A table matching `[source] tables` could not be added to the publication (told once
/// per table and process; tried again at every look, and counted by
/// `wal2delta_capture_tables_not_added` at each).
pub struct TableNotAddedToPublication<'a> {
    pub table: &'a TableName,
    pub reason: &'a str,
}

impl InternalEvent for TableNotAddedToPublication<'_> {
    fn emit(self) {
        tracing::warn!(table = %self.table, reason = self.reason, "a table matching [source] tables is not captured: it could not be added to the publication");
    }
}

/// A table in the publication no longer matches `[source] tables` (or now matches
/// `[source] exclude_tables`): capture removed it, as `setup` would.
pub struct TableRemovedFromPublication<'a> {
    pub table: &'a TableName,
    pub publication: &'a str,
}

impl InternalEvent for TableRemovedFromPublication<'_> {
    fn emit(self) {
        tracing::info!(table = %self.table, publication = self.publication, "a table no longer matches [source] tables (or matches exclude_tables): removed from the publication; its changes are no longer captured, its lake tables stay");
    }
}

/// A table that no longer matches could not be removed from the publication (told once
/// per table and process; tried again at every look).
pub struct TableNotRemovedFromPublication<'a> {
    pub table: &'a TableName,
    pub reason: &'a str,
}

impl InternalEvent for TableNotRemovedFromPublication<'_> {
    fn emit(self) {
        tracing::warn!(table = %self.table, reason = self.reason, "a table no longer matching [source] tables is still captured: it could not be removed from the publication");
    }
}

/// A table left the publication while capture ran (dropped, or removed by hand).
pub struct TableLeftPublication<'a> {
    pub table: &'a TableName,
}

impl InternalEvent for TableLeftPublication<'_> {
    fn emit(self) {
        tracing::info!(table = %self.table, "table left the publication (dropped or removed): no longer captured; its lake tables stay");
        metrics::counter!(m::CAPTURE_TABLES_REMOVED).increment(1);
    }
}

// --- dead letters -------------------------------------------------------------------------

/// Why capture sent a change to the DLQ, with what its log line says (never a row value).
pub enum DeadLetterCause<'a> {
    /// The registry refused the table's schema.
    SchemaRefused { lsn: Lsn, reason: &'a str },
    /// The change could not be encoded (the reason stays in the letter: an Avro error may
    /// quote the value).
    EncodeFailed { lsn: Lsn },
    /// The encoded event is over the Kafka message size.
    TooLarge {
        lsn: Lsn,
        bytes: usize,
        limit: usize,
    },
    /// The decoder could not represent a value of the row (`kind` is the letter's).
    Undecodable {
        lsn: Lsn,
        kind: DeadLetterKind,
        reason: &'a str,
    },
    /// A snapshot row could not be decoded.
    SnapshotUndecodable { reason: &'a str },
}

impl DeadLetterCause<'_> {
    /// The letter's `reason_kind`, the metric's `reason`.
    pub fn kind(&self) -> DeadLetterKind {
        match self {
            DeadLetterCause::SchemaRefused { .. } => DeadLetterKind::SchemaRefused,
            DeadLetterCause::EncodeFailed { .. } => DeadLetterKind::EncodeFailed,
            DeadLetterCause::TooLarge { .. } => DeadLetterKind::MessageTooLarge,
            DeadLetterCause::Undecodable { kind, .. } => *kind,
            DeadLetterCause::SnapshotUndecodable { .. } => DeadLetterKind::UndecodableValue,
        }
    }
}

/// Capture sent a change to the DLQ topic instead of its table's topic.
pub struct DeadLettered<'a> {
    pub table: &'a TableName,
    pub cause: DeadLetterCause<'a>,
}

impl InternalEvent for DeadLettered<'_> {
    fn emit(self) {
        let table = self.table;
        let kind = self.cause.kind().as_str();
        match self.cause {
            DeadLetterCause::SchemaRefused { lsn, reason } => {
                tracing::warn!(table = %table, lsn = %lsn, kind = "schema_refused", reason = %reason, "row sent to the DLQ")
            }
            DeadLetterCause::EncodeFailed { lsn } => {
                tracing::warn!(table = %table, lsn = %lsn, kind = "encode_failed", "row sent to the DLQ (the reason is in the dead letter)")
            }
            DeadLetterCause::TooLarge { lsn, bytes, limit } => {
                tracing::warn!(table = %table, lsn = %lsn, bytes, limit, "event over the Kafka message size sent to the DLQ")
            }
            DeadLetterCause::Undecodable { lsn, kind, reason } => {
                tracing::warn!(table = %table, lsn = %lsn, kind = %kind, reason = %reason, "row sent to the DLQ")
            }
            DeadLetterCause::SnapshotUndecodable { reason } => {
                tracing::warn!(table = %table, reason = %reason, "undecodable snapshot row sent to the DLQ")
            }
        }
        metrics::counter!(m::CAPTURE_DLQ_EVENTS, "table" => table.to_string(), "reason" => kind)
            .increment(1);
    }
}
