//! Why a capture session ended, each reason classed for the supervisor.

use std::time::Duration;

use wal2delta_cdc::stream_buffer::StreamBufferError;
use wal2delta_cdc::CdcError;
use wal2delta_model::{ErrorClass, Lsn};
use wal2delta_stream::producer::{is_too_large, Delivery, KafkaError};
use wal2delta_stream::StreamError;

use crate::config::ConfigError;
use crate::supervisor::StageError;

#[derive(Debug, thiserror::Error)]
pub(super) enum SessionError {
    #[error(transparent)]
    Cdc(#[from] CdcError),
    /// The database was never reachable since the daemon started: a configuration
    /// problem, said once instead of retried forever.
    #[error("{0} (never reached since the start)")]
    NeverConnected(CdcError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Kafka reported that it could not store an event.
    #[error("Kafka did not acknowledge an event: {0}")]
    DeliveryFailed(#[source] KafkaError),
    /// Events were in flight and Kafka reported nothing for `[kafka] delivery_timeout_ms`.
    #[error("Kafka acknowledged nothing for {} ms while events were in flight ([kafka] delivery_timeout_ms)", .0.as_millis())]
    DeliveryTimeout(Duration),
    /// The producer's delivery reports stopped (the producer was dropped).
    #[error("the producer's delivery reports ended")]
    DeliveriesClosed,
    /// The broker refused a message the producer accepted: the broker's (or the topic's)
    /// `max.message.bytes` is below `[kafka] message_max_bytes`. The next session refuses
    /// events of this size itself, so they go to the DLQ instead of failing again.
    #[error("the broker refused a message of {bytes} bytes as too large: its max.message.bytes (or the topic's) is below [kafka] message_max_bytes; capture now sends events of this size to the DLQ (set message_max_bytes to the broker's limit, see docs/capture.md)")]
    BrokerTooLarge { bytes: usize },
    /// The disk-backed buffer of in-progress transactions failed.
    #[error(transparent)]
    StreamBuffer(#[from] StreamBufferError),
    /// `[source] exclude_columns` names a primary-key column: Silver could not place the
    /// table's rows without it.
    #[error("[source] exclude_columns names {column:?} of {table}, a primary-key column: it cannot be excluded")]
    ExcludedKey { table: String, column: String },
    #[error("cannot use [capture] spill_dir {dir}: {source}")]
    SpillDir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("slot {slot:?} is confirmed at {confirmed}, ahead of the last position wal2delta recorded in Kafka ({recorded}, topic {topic}): changes in between may never have reached Kafka (another consumer used the slot, the slot was advanced by hand, or Kafka lost data)")]
    SlotAhead {
        slot: String,
        confirmed: Lsn,
        recorded: Lsn,
        topic: String,
    },
    #[error("replication slot {slot:?} is invalidated (wal_status = lost): PostgreSQL removed WAL it needed, so changes were lost. Refusing to continue")]
    SlotLost { slot: String },
    #[error("replication slot {slot:?} is gone although wal2delta recorded positions for it (topic {topic}): it was dropped, and changes since may be lost. Refusing to re-create it silently")]
    SlotDropped { slot: String, topic: String },
    #[error("replication slot {slot:?} does not exist")]
    SlotMissing { slot: String },
    #[error("the initial snapshot was not imported within {} s", .0.as_secs())]
    SnapshotNotImported(Duration),
    /// A task of the session panicked or was cancelled (a bug).
    #[error("the {task} task failed: {source}")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl SessionError {
    /// The session error for a failed delivery report, `None` when it succeeded.
    pub(super) fn of_delivery(d: &Delivery) -> Option<SessionError> {
        let e = d.result.as_ref().err()?;
        Some(if is_too_large(e) {
            SessionError::BrokerTooLarge { bytes: d.bytes }
        } else {
            SessionError::DeliveryFailed(e.clone())
        })
    }

    pub(super) fn task(task: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| SessionError::Task { task, source }
    }
}

impl StageError for SessionError {
    fn class(&self) -> ErrorClass {
        match self {
            SessionError::Cdc(e) => e.class(),
            SessionError::Stream(e) => e.class(),
            SessionError::StreamBuffer(e) => match e.class() {
                ErrorClass::Transient => ErrorClass::Transient,
                // A stream the server sent that makes no sense: not retried blindly.
                _ => ErrorClass::Operator,
            },
            SessionError::DeliveryFailed(_)
            | SessionError::DeliveryTimeout(_)
            | SessionError::DeliveriesClosed
            | SessionError::BrokerTooLarge { .. } => ErrorClass::Transient,
            SessionError::NeverConnected(_)
            | SessionError::Config(_)
            | SessionError::SpillDir { .. }
            | SessionError::ExcludedKey { .. }
            | SessionError::SlotAhead { .. }
            | SessionError::SlotLost { .. }
            | SessionError::SlotDropped { .. }
            | SessionError::SlotMissing { .. }
            | SessionError::SnapshotNotImported(_)
            | SessionError::Task { .. } => ErrorClass::Operator,
        }
    }

    fn hint(&self) -> Option<String> {
        let recreate =
            "set [source] on_slot_lost = \"recreate\" to re-create it and re-snapshot every table";
        match self {
            SessionError::Cdc(e) | SessionError::NeverConnected(e) => e.hint().map(str::to_owned),
            SessionError::SlotAhead { .. } => Some("check, then start once with `wal2delta run --allow-slot-ahead` to accept the gap".into()),
            SessionError::SlotLost { .. } | SessionError::SlotDropped { .. } => Some(recreate.into()),
            SessionError::SlotMissing { .. } => Some("run `wal2delta setup` first".into()),
            SessionError::Stream(e) => e.hint().map(str::to_owned),
            SessionError::ExcludedKey { .. } => Some("remove the entry from [source] exclude_columns (tokenize the column instead, [tokenize] columns) and restart".into()),
            SessionError::SpillDir { .. } => Some("point [capture] spill_dir at a writable directory with room for the largest transactions".into()),
            _ => None,
        }
    }
}
