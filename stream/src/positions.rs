//! The position log: the last slot position wal2delta confirmed, kept in Kafka.
//!
//! Before capture tells PostgreSQL it may release WAL up to an LSN, it writes that LSN to
//! a compacted topic (`{prefix}.positions`, key = slot name) and waits for Kafka's
//! acknowledgement. So the log is always at or ahead of the slot. On start, a slot whose
//! confirmed position is *ahead* of the log means something other than this capture moved
//! it (another consumer, `pg_replication_slot_advance`, a Kafka cluster restored from an
//! older backup): changes in between may never have reached Kafka, and capture refuses to
//! start unless told otherwise.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use wal2delta_model::Lsn;

use crate::StreamError;

/// One record of the position log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PositionRecord {
    pub slot: String,
    /// The LSN capture was about to confirm, in PostgreSQL's `X/Y` form.
    pub lsn: String,
    /// Unix milliseconds when it was written.
    pub ts_ms: i64,
    /// The source that wrote it (`[source] name`, else `{database}/{slot}`); absent in
    /// records of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl PositionRecord {
    pub fn new(slot: &str, source: &str, lsn: Lsn, ts_ms: i64) -> Self {
        PositionRecord {
            slot: slot.to_owned(),
            lsn: lsn.to_string(),
            ts_ms,
            source: Some(source.to_owned()),
        }
    }

    /// The record as written to the topic, with the state format
    /// ([`crate::state_format`]).
    pub fn to_json(&self) -> Vec<u8> {
        crate::state_format::to_json(self)
    }
}

/// How many records from the end of the log are searched for the slot's last position.
const TAIL: i64 = 10_000;

/// The last position recorded for `slot`, or `None` when the log has none (first start).
/// A record another source wrote (its `source` is not `source`) means two sources share
/// the topics: refused with [`StreamError::SourceConflict`].
pub fn last_position(
    connection: &crate::connection::KafkaConnection,
    topic: &str,
    slot: &str,
    source: &str,
) -> Result<Option<Lsn>, StreamError> {
    let consumer: BaseConsumer = connection
        .client_config()
        // A group of its own for every read: the consumer only assigns partitions, and a
        // reused group id can make a broker hand a second reader nothing.
        .set(
            "group.id",
            crate::reader_group(&format!("wal2delta-positions-{slot}")),
        )
        .set("enable.auto.commit", "false")
        .create()?;
    let (low, high) = consumer.fetch_watermarks(topic, 0, crate::KAFKA_REQUEST_TIMEOUT)?;
    if high <= low {
        return Ok(None);
    }
    let start = (high - TAIL).max(low);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(start))?;
    consumer.assign(&tpl)?;
    let mut last = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let rec = match m.payload() {
                    Some(p) => crate::state_format::from_json::<PositionRecord>(topic, p)?,
                    None => None,
                };
                if let Some(rec) = rec {
                    if let Some(other) = rec.source.as_deref().filter(|o| *o != source) {
                        return Err(StreamError::SourceConflict {
                            topic: topic.to_owned(),
                            found: other.to_owned(),
                            found_slot: rec.slot,
                            ours: source.to_owned(),
                        });
                    }
                    if m.key() == Some(slot.as_bytes()) {
                        if let Ok(lsn) = rec.lsn.parse::<Lsn>() {
                            last = Some(lsn);
                        }
                    }
                }
                if m.offset() + 1 >= high {
                    return Ok(last);
                }
            }
            Some(Err(e)) => return Err(StreamError::Kafka(e)),
            None if Instant::now() > deadline => {
                return Err(StreamError::Topic {
                    topic: topic.to_owned(),
                    reason: format!(
                        "could not read the position log up to offset {high} within 30 s"
                    ),
                })
            }
            None => {}
        }
    }
}
