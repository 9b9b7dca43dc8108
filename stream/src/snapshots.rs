//! Snapshot progress, kept in a compacted Kafka topic (`{prefix}.snapshots`, key
//! `{slot}/{schema}.{table}`) next to the events it describes.
//!
//! A progress record is written only after Kafka acknowledged every event of the chunk it
//! reports, so after a crash the snapshot resumes after the last chunk known to be in
//! Kafka: chunks are never lost, at worst one is read twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::StreamError;

/// Where one table's snapshot stands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotProgress {
    /// `schema.table`.
    pub table: String,
    /// `running` or `done`.
    pub state: String,
    /// Key (as PostgreSQL text) of the last row of the last chunk in Kafka; `None` before
    /// the first chunk, and in the topic for tables with tokenized columns (see
    /// `last_key_sealed`).
    pub last_key: Option<Vec<String>>,
    /// For tables with tokenized columns: `last_key` encrypted under a key derived from
    /// the tokenization secret, so the snapshots topic never holds a raw key value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_key_sealed: Option<String>,
    pub rows_done: u64,
    /// The planner's estimate when the snapshot started.
    pub rows_estimate: u64,
    /// Unix milliseconds of the last update.
    pub ts_ms: i64,
    /// For a re-snapshot after the slot was re-created (`on_slot_lost = "recreate"`): the
    /// position (commit LSN) its rows start at. When the table's snapshot is done, capture
    /// sends a snapshot-end event (`op` = `s`) at this position to every partition, and
    /// Silver deletes the rows the re-snapshot did not read again. `None` for a first
    /// snapshot and for tables added later: nothing is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resnapshot_from: Option<u64>,
    /// For a re-snapshot of part of a table (`wal2delta snapshot --table T --where SQL`):
    /// the SQL condition on the table's rows. Only matching rows are read again; no
    /// snapshot end is sent, so nothing is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

impl SnapshotProgress {
    pub fn is_done(&self) -> bool {
        self.state == "done"
    }

    pub fn key(slot: &str, table: &str) -> String {
        format!("{slot}/{table}")
    }

    /// The record as written to the topic, with the state format
    /// ([`crate::state_format`]).
    pub fn to_json(&self) -> Vec<u8> {
        crate::state_format::to_json(self)
    }
}

/// The latest progress of every table of `slot`, by `schema.table`.
pub fn load(
    connection: &crate::connection::KafkaConnection,
    topic: &str,
    slot: &str,
) -> Result<HashMap<String, SnapshotProgress>, StreamError> {
    let consumer: BaseConsumer = connection
        .client_config()
        // A group of its own for every read: the consumer only assigns partitions, and a
        // reused group id can make a broker hand a second reader nothing.
        .set(
            "group.id",
            crate::reader_group(&format!("wal2delta-snapshots-{slot}")),
        )
        .set("enable.auto.commit", "false")
        .create()?;
    let mut out = HashMap::new();
    let (low, high) = match consumer.fetch_watermarks(topic, 0, crate::KAFKA_REQUEST_TIMEOUT) {
        Ok(w) => w,
        // No topic yet: nothing recorded.
        Err(_) => return Ok(out),
    };
    if high <= low {
        return Ok(out);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(low))?;
    consumer.assign(&tpl)?;
    let prefix = format!("{slot}/");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let key = m
                    .key()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .unwrap_or("");
                if key.starts_with(&prefix) {
                    let progress = match m.payload() {
                        Some(p) => crate::state_format::from_json::<SnapshotProgress>(topic, p)?,
                        None => None,
                    };
                    if let Some(p) = progress {
                        out.insert(p.table.clone(), p);
                    }
                }
                if m.offset() + 1 >= high {
                    return Ok(out);
                }
            }
            Some(Err(e)) => return Err(StreamError::Kafka(e)),
            None if Instant::now() > deadline => {
                return Err(StreamError::Topic {
                    topic: topic.to_owned(),
                    reason: format!(
                        "could not read snapshot progress up to offset {high} within 60 s"
                    ),
                })
            }
            None => {}
        }
    }
}

/// Writes `progress` as the table's latest snapshot progress of `slot` and waits until
/// Kafka acknowledged it (`wal2delta snapshot --table` requesting a re-snapshot).
pub async fn write(
    connection: &crate::connection::KafkaConnection,
    topic: &str,
    slot: &str,
    progress: &SnapshotProgress,
) -> Result<(), StreamError> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = connection
        .client_config()
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "30000")
        .create()?;
    let key = SnapshotProgress::key(slot, &progress.table);
    let payload = progress.to_json();
    producer
        .send(
            FutureRecord::to(topic)
                .partition(0)
                .key(&key)
                .payload(&payload),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| StreamError::Kafka(e))?;
    Ok(())
}
