//! The micro-batch: events read since the last commit, per topic, with the offset range of
//! every partition they cover.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use apache_avro::types::Value;
use wal2delta_lake::bronze::{bronze_batch, merge_schemas, KafkaCoordinates, OffsetRange};
use wal2delta_lake::deltalake::arrow::array::RecordBatch;
use wal2delta_lake::deltalake::arrow::datatypes::Schema;
use wal2delta_quarantine::{QuarantineRecord, Stage};
use wal2delta_stream::avro::columns::envelope_columns;
use wal2delta_stream::consumer::RawMessage;
use wal2delta_stream::decode::AvroSchema;

/// One event read from Kafka: decoded, or with the reason it could not be.
pub struct BufferedEvent {
    pub coordinates: KafkaCoordinates,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub decoded: Result<(Arc<AvroSchema>, Value), (&'static str, String)>,
}

impl BufferedEvent {
    pub fn new(
        m: RawMessage,
        decoded: Result<(Arc<AvroSchema>, Value), (&'static str, String)>,
    ) -> Self {
        BufferedEvent {
            coordinates: KafkaCoordinates {
                partition: m.partition,
                offset: m.offset,
                timestamp_ms: m.timestamp_ms,
            },
            key: m.key,
            payload: m.payload,
            decoded,
        }
    }

    fn source_lsn(&self) -> Option<i64> {
        let Ok((_, Value::Record(fields))) = &self.decoded else {
            return None;
        };
        let source = fields.iter().find(|(n, _)| n == "source")?;
        let Value::Record(s) = &source.1 else { return None };
        match s.iter().find(|(n, _)| n == "lsn").map(|(_, v)| v) {
            Some(Value::Union(_, v)) => match v.as_ref() {
                Value::Long(l) => Some(*l),
                _ => None,
            },
            _ => None,
        }
    }

    /// The quarantine record of this event.
    pub fn quarantine(&self, topic: &str, table: &str, code: &str, detail: &str, at_us: i64) -> QuarantineRecord {
        let c = self.coordinates;
        QuarantineRecord {
            id: QuarantineRecord::event_id(Stage::Bronze, topic, c.partition, c.offset),
            stage: Stage::Bronze,
            reason_code: code.to_owned(),
            detail: detail.to_owned(),
            table: Some(table.to_owned()),
            topic: Some(topic.to_owned()),
            partition: Some(c.partition),
            offset: Some(c.offset),
            source_lsn: self.source_lsn(),
            key: self.key.clone(),
            raw: self.payload.clone(),
            quarantined_at_us: at_us,
        }
    }
}

/// Events of one topic.
#[derive(Default)]
pub struct TopicBuffer {
    pub events: Vec<BufferedEvent>,
    pub ranges: BTreeMap<i32, OffsetRange>,
}

/// What a topic's events become: Bronze record batches and quarantine records.
pub struct Prepared {
    pub batches: Vec<RecordBatch>,
    pub quarantined: Vec<QuarantineRecord>,
    pub payload_bytes: usize,
}

impl TopicBuffer {
    fn push(&mut self, event: BufferedEvent) {
        let c = event.coordinates;
        self.ranges
            .entry(c.partition)
            .and_modify(|r| r.last = c.offset)
            .or_insert(OffsetRange {
                first: c.offset,
                last: c.offset,
            });
        self.events.push(event);
    }

    /// Drops the events of `partition` (it was revoked before they were committed).
    pub fn drop_partition(&mut self, partition: i32) {
        self.events.retain(|e| e.coordinates.partition != partition);
        self.ranges.remove(&partition);
    }

    /// Builds record batches (one per run of events with the same schema version) whose
    /// schemas merge into `table_schema`; every other event becomes a quarantine record.
    pub fn prepare(
        &self,
        topic: &str,
        table: &str,
        table_schema: Option<&Schema>,
        ingested_at_us: i64,
    ) -> Prepared {
        let mut batches = Vec::new();
        let mut quarantined = Vec::new();
        let mut current: Option<Schema> = table_schema.cloned();
        let mut i = 0;
        let events = &self.events;
        let payload_bytes = events
            .iter()
            .map(|e| e.payload.as_ref().map_or(0, Vec::len))
            .sum();
        while i < events.len() {
            let (schema, _) = match &events[i].decoded {
                Ok(d) => d,
                Err((code, detail)) => {
                    quarantined.push(events[i].quarantine(topic, table, code, detail, ingested_at_us));
                    i += 1;
                    continue;
                }
            };
            // The run of decoded events written with the same schema id.
            let mut j = i;
            while j < events.len()
                && matches!(&events[j].decoded, Ok((s, _)) if s.id == schema.id)
            {
                j += 1;
            }
            let run = &events[i..j];
            let quarantine_run = |code: &str, detail: &str, out: &mut Vec<QuarantineRecord>| {
                out.extend(run.iter().map(|e| e.quarantine(topic, table, code, detail, ingested_at_us)));
            };
            let values: Vec<&Value> = run
                .iter()
                .filter_map(|e| e.decoded.as_ref().ok().map(|(_, v)| v))
                .collect();
            let coordinates: Vec<KafkaCoordinates> = run.iter().map(|e| e.coordinates).collect();
            match envelope_columns(&schema.parsed, schema.id, &values) {
                Err(e) => quarantine_run("unsupported_schema", &e.to_string(), &mut quarantined),
                Ok(cols) => match bronze_batch(table, topic, cols.fields, cols.arrays, &coordinates, ingested_at_us) {
                    Err(e) => quarantine_run("unsupported_schema", &e.to_string(), &mut quarantined),
                    Ok(batch) => {
                        let merged = match &current {
                            None => Ok(batch.schema().as_ref().clone()),
                            Some(c) => merge_schemas(c, &batch.schema()),
                        };
                        match merged {
                            Ok(m) => {
                                current = Some(m);
                                batches.push(batch);
                            }
                            Err(reason) => quarantine_run("schema_conflict", &reason, &mut quarantined),
                        }
                    }
                },
            }
            i = j;
        }
        Prepared {
            batches,
            quarantined,
            payload_bytes,
        }
    }
}

/// Events read since the last commit.
#[derive(Default)]
pub struct MicroBatch {
    pub topics: BTreeMap<String, TopicBuffer>,
    pub events: usize,
    pub bytes: usize,
    pub started: Option<Instant>,
}

impl MicroBatch {
    pub fn push(&mut self, topic: &str, event: BufferedEvent) {
        self.events += 1;
        self.bytes += event.payload.as_ref().map_or(0, Vec::len) + event.key.as_ref().map_or(0, Vec::len);
        self.started.get_or_insert_with(Instant::now);
        self.topics.entry(topic.to_owned()).or_default().push(event);
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Drops the uncommitted events of a revoked partition.
    pub fn drop_partition(&mut self, topic: &str, partition: i32) {
        if let Some(buf) = self.topics.get_mut(topic) {
            let before = buf.events.len();
            buf.drop_partition(partition);
            self.events -= before - buf.events.len();
            if buf.events.is_empty() {
                self.topics.remove(topic);
            }
        }
        if self.topics.is_empty() {
            *self = MicroBatch::default();
        }
    }

    pub fn take(&mut self) -> BTreeMap<String, TopicBuffer> {
        let topics = std::mem::take(&mut self.topics);
        *self = MicroBatch::default();
        topics
    }
}
