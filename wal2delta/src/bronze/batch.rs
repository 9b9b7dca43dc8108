//! The micro-batch: events read since the last commit, per topic, with the offset range of
//! every partition they cover.
//!
//! Decoded Avro values are large (a tree of boxed values per event), so a topic's events
//! are turned into Arrow record batches every [`CHUNK`] events as they arrive, and the
//! values dropped. A micro-batch then holds its events as Arrow columns plus each event's
//! raw bytes (kept so that any event can still be quarantined as it arrived).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use apache_avro::types::Value;
use wal2delta_lake::bronze::{bronze_batch, merge_schemas, KafkaCoordinates, OffsetRange};
use wal2delta_lake::deltalake::arrow::array::RecordBatch;
use wal2delta_lake::deltalake::arrow::datatypes::Schema;
use wal2delta_quarantine::{QuarantineRecord, Stage};
use wal2delta_stream::avro::columns::{envelope_columns, key_column, out_of_range_column};
use wal2delta_stream::consumer::RawMessage;
use wal2delta_stream::decode::ReadSchema;
use wal2delta_stream::transactions::{transaction_columns, TransactionRecord};

/// Events converted to Arrow at a time.
pub const CHUNK: usize = 4_096;

/// What became of an event's payload.
pub enum Payload {
    /// Decoded, not yet converted to Arrow; with the decoded Kafka key (none for a
    /// TRUNCATE, which has no key).
    Decoded(Arc<ReadSchema>, Value, Option<(Arc<ReadSchema>, Value)>),
    /// A record of the transactions topic.
    Transaction(TransactionRecord),
    /// Cannot be stored: reason code and detail.
    Failed(&'static str, String),
    /// Converted: its row is in one of the topic's runs.
    Converted,
    /// A tombstone (a key with a null value, which capture sends after every delete so
    /// compacted topics can drop the key): not a change event. It becomes no row and no
    /// quarantine record; its offset is stored with the batch's others, so it is passed
    /// exactly once.
    Tombstone,
}

/// An event's value and key, decoded with their writer schemas.
pub struct DecodedEvent {
    pub schema: Arc<ReadSchema>,
    pub value: Value,
    pub key: Option<(Arc<ReadSchema>, Value)>,
}

/// One event read from Kafka.
pub struct BufferedEvent {
    pub coordinates: KafkaCoordinates,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub source_lsn: Option<i64>,
    /// `source.commit_lsn` and `ordinal` of a decoded change: a quarantined event keeps
    /// them so that Silver can count it once it is resolved.
    pub commit_lsn: Option<i64>,
    pub ordinal: Option<i64>,
    pub state: Payload,
}

/// `source.{name}` of a decoded envelope.
fn source_long(v: &Value, name: &str) -> Option<i64> {
    let Value::Record(fields) = v else {
        return None;
    };
    let (_, Value::Record(s)) = fields.iter().find(|(n, _)| n == "source")? else {
        return None;
    };
    match s.iter().find(|(n, _)| n == name).map(|(_, v)| v) {
        Some(Value::Union(_, v)) => match v.as_ref() {
            Value::Long(l) => Some(*l),
            _ => None,
        },
        _ => None,
    }
}

/// The envelope's `ordinal`.
fn ordinal(v: &Value) -> Option<i64> {
    let Value::Record(fields) = v else {
        return None;
    };
    match fields
        .iter()
        .find(|(n, _)| n == wal2delta_model::bronze::ORDINAL)
        .map(|(_, v)| v)
    {
        Some(Value::Long(l)) => Some(*l),
        _ => None,
    }
}

impl BufferedEvent {
    /// A record of the transactions topic (JSON; see `wal2delta_stream::transactions`).
    pub fn transaction(m: RawMessage) -> Self {
        let state = match m.payload.as_deref().map(TransactionRecord::parse) {
            Some(Some(r)) => Payload::Transaction(r),
            Some(None) => Payload::Failed(
                "not_transaction_record",
                "the message is not a transaction END or WATERMARK record".into(),
            ),
            None => Payload::Failed("empty_payload", "the message has no value".into()),
        };
        let source_lsn = match &state {
            Payload::Transaction(TransactionRecord::End(e)) => i64::try_from(e.commit_lsn).ok(),
            _ => None,
        };
        Self::read(m, state, source_lsn, None)
    }

    fn read(
        m: RawMessage,
        state: Payload,
        source_lsn: Option<i64>,
        position: Option<(Option<i64>, Option<i64>)>,
    ) -> Self {
        let (commit_lsn, ordinal) = position.unwrap_or_default();
        BufferedEvent {
            coordinates: KafkaCoordinates {
                partition: m.partition,
                offset: m.offset,
                timestamp_ms: m.timestamp_ms,
            },
            key: m.key,
            payload: m.payload,
            source_lsn,
            commit_lsn,
            ordinal,
            state,
        }
    }

    /// A tombstone of a table topic (see [`Payload::Tombstone`]).
    pub fn tombstone(m: RawMessage) -> Self {
        Self::read(m, Payload::Tombstone, None, None)
    }

    pub fn new(m: RawMessage, decoded: Result<DecodedEvent, (&'static str, String)>) -> Self {
        let (state, source_lsn, position) = match decoded {
            Ok(DecodedEvent { schema, value, key }) => {
                let lsn = source_long(&value, "lsn");
                let position = (source_long(&value, "commit_lsn"), ordinal(&value));
                (Payload::Decoded(schema, value, key), lsn, Some(position))
            }
            Err((code, detail)) => (Payload::Failed(code, detail), None, None),
        };
        Self::read(m, state, source_lsn, position)
    }

    /// The quarantine record of this event.
    pub fn quarantine(
        &self,
        topic: &str,
        table: &str,
        code: &str,
        detail: &str,
        at_us: i64,
    ) -> QuarantineRecord {
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
            source_lsn: self.source_lsn,
            commit_lsn: self.commit_lsn,
            ordinal: self.ordinal,
            key: self.key.clone(),
            raw: self.payload.clone(),
            quarantined_at_us: at_us,
            check: None,
        }
    }
}

/// Consecutive events of one topic and what they became.
struct Run {
    start: usize,
    end: usize,
    outcome: Result<RecordBatch, (&'static str, String)>,
}

/// Events of one topic.
pub struct TopicBuffer {
    topic: String,
    table: String,
    events: Vec<BufferedEvent>,
    runs: Vec<Run>,
    /// Events before this index are in `runs`.
    converted: usize,
    pub ranges: BTreeMap<i32, OffsetRange>,
}

/// What a topic's events become: Bronze record batches and quarantine records.
pub struct Prepared {
    pub batches: Vec<RecordBatch>,
    pub quarantined: Vec<QuarantineRecord>,
    pub payload_bytes: usize,
}

use wal2delta_model::clock::unix_us as now_us;

impl TopicBuffer {
    pub fn new(topic: &str, table: &str) -> Self {
        TopicBuffer {
            topic: topic.to_owned(),
            table: table.to_owned(),
            events: Vec::new(),
            runs: Vec::new(),
            converted: 0,
            ranges: BTreeMap::new(),
        }
    }

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
        if self.events.len() - self.converted >= CHUNK {
            self.convert();
        }
    }

    /// Turns the events not yet converted into runs: one record batch per stretch of events
    /// written with the same schema version, one quarantine run per event that failed.
    fn convert(&mut self) {
        let ingested_at = now_us();
        let mut i = self.converted;
        while i < self.events.len() {
            let (end, outcome) = match &self.events[i].state {
                Payload::Decoded(schema, _, _) => {
                    let schema = schema.clone();
                    let (end, key_schema) = self.run_end(i, &schema);
                    let outcome =
                        self.change_batch(i..end, &schema, key_schema.as_ref(), ingested_at);
                    (end, outcome)
                }
                Payload::Transaction(_) => {
                    let end = (i..self.events.len())
                        .find(|&j| !matches!(self.events[j].state, Payload::Transaction(_)))
                        .unwrap_or(self.events.len());
                    (end, self.transaction_batch(i..end, ingested_at))
                }
                Payload::Failed(code, detail) => {
                    self.runs.push(Run {
                        start: i,
                        end: i + 1,
                        outcome: Err((code, detail.clone())),
                    });
                    i += 1;
                    continue;
                }
                Payload::Converted | Payload::Tombstone => {
                    i += 1;
                    continue;
                }
            };
            for e in &mut self.events[i..end] {
                e.state = Payload::Converted;
            }
            self.runs.push(Run {
                start: i,
                end,
                outcome,
            });
            i = end;
        }
        self.converted = self.events.len();
    }

    /// Where the run starting at `start` ends: consecutive events with one value schema
    /// and one key schema (events without a key, i.e. TRUNCATEs, join any run); and the
    /// run's key schema.
    fn run_end(&self, start: usize, schema: &ReadSchema) -> (usize, Option<Arc<ReadSchema>>) {
        let mut key_schema: Option<Arc<ReadSchema>> = None;
        let mut j = start;
        while j < self.events.len() {
            let Payload::Decoded(s, _, key) = &self.events[j].state else {
                break;
            };
            if s.id != schema.id {
                break;
            }
            if let Some((ks, _)) = key {
                match &key_schema {
                    Some(current) if current.id != ks.id => break,
                    Some(_) => {}
                    None => key_schema = Some(ks.clone()),
                }
            }
            j += 1;
        }
        (j, key_schema)
    }

    /// The Bronze rows of a run of change events.
    fn change_batch(
        &self,
        run: std::ops::Range<usize>,
        schema: &ReadSchema,
        key_schema: Option<&Arc<ReadSchema>>,
        ingested_at: i64,
    ) -> Result<RecordBatch, (&'static str, String)> {
        let events = &self.events[run];
        let (values, keys): (Vec<&Value>, Vec<Option<&Value>>) = events
            .iter()
            .filter_map(|e| match &e.state {
                Payload::Decoded(_, v, k) => Some((v, k.as_ref().map(|(_, k)| k))),
                _ => None,
            })
            .unzip();
        let coordinates: Vec<KafkaCoordinates> = events.iter().map(|e| e.coordinates).collect();
        let unsupported = |e: &dyn std::fmt::Display| ("unsupported_schema", e.to_string());
        let cols = envelope_columns(&schema.parsed, schema.id, &values)
            .and_then(|mut cols| {
                if let Some(ks) = key_schema {
                    if let Some((field, array)) = key_column(&ks.parsed, &keys)? {
                        cols.fields.push(field);
                        cols.arrays.push(array);
                    }
                }
                let (field, array) = out_of_range_column(&values, &keys)?;
                cols.fields.push(field);
                cols.arrays.push(array);
                Ok(cols)
            })
            .map_err(|e| unsupported(&e))?;
        bronze_batch(
            &self.table,
            &self.topic,
            cols.fields,
            cols.arrays,
            &coordinates,
            ingested_at,
        )
        .map_err(|e| unsupported(&e))
    }

    /// The Bronze rows of a run of transaction records.
    fn transaction_batch(
        &self,
        run: std::ops::Range<usize>,
        ingested_at: i64,
    ) -> Result<RecordBatch, (&'static str, String)> {
        let events = &self.events[run];
        let records: Vec<&TransactionRecord> = events
            .iter()
            .filter_map(|e| match &e.state {
                Payload::Transaction(r) => Some(r),
                _ => None,
            })
            .collect();
        let (fields, arrays) = transaction_columns(&records);
        let coordinates: Vec<KafkaCoordinates> = events.iter().map(|e| e.coordinates).collect();
        bronze_batch(
            &self.table,
            &self.topic,
            fields,
            arrays,
            &coordinates,
            ingested_at,
        )
        .map_err(|e| ("unsupported_schema", e.to_string()))
    }

    /// The record batches whose schemas merge into `table_schema`, in order; every other
    /// event becomes a quarantine record.
    pub fn prepare(&mut self, table_schema: Option<&Schema>) -> Prepared {
        self.convert();
        let at = now_us();
        let mut batches = Vec::new();
        let mut quarantined = Vec::new();
        let mut current: Option<Schema> = table_schema.cloned();
        let (topic, table) = (&self.topic, &self.table);
        let quarantine = |run: &Run, code: &str, detail: &str, out: &mut Vec<QuarantineRecord>| {
            out.extend(
                self.events[run.start..run.end]
                    .iter()
                    .map(|e| e.quarantine(topic, table, code, detail, at)),
            );
        };
        for run in &self.runs {
            match &run.outcome {
                Err((code, detail)) => quarantine(run, code, detail, &mut quarantined),
                Ok(batch) => {
                    let merged = match &current {
                        None => Ok(batch.schema().as_ref().clone()),
                        Some(c) => merge_schemas(c, &batch.schema()),
                    };
                    match merged {
                        Ok(m) => {
                            current = Some(m);
                            batches.push(batch.clone());
                        }
                        Err(reason) => {
                            quarantine(run, "schema_conflict", &reason, &mut quarantined)
                        }
                    }
                }
            }
        }
        Prepared {
            batches,
            quarantined,
            payload_bytes: self
                .events
                .iter()
                .map(|e| e.payload.as_ref().map_or(0, Vec::len))
                .sum(),
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
    pub fn push(&mut self, topic: &str, table: &str, event: BufferedEvent) {
        self.events += 1;
        self.bytes +=
            event.payload.as_ref().map_or(0, Vec::len) + event.key.as_ref().map_or(0, Vec::len);
        self.started.get_or_insert_with(Instant::now);
        self.topics
            .entry(topic.to_owned())
            .or_insert_with(|| TopicBuffer::new(topic, table))
            .push(event);
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Drops the uncommitted events of `topic`; the partitions of it in the batch.
    pub fn drop_topic(&mut self, topic: &str) -> Vec<i32> {
        let Some(buf) = self.topics.remove(topic) else {
            return Vec::new();
        };
        self.events -= buf.events.len();
        self.bytes = self.bytes.saturating_sub(
            buf.events
                .iter()
                .map(|e| {
                    e.payload.as_ref().map_or(0, Vec::len) + e.key.as_ref().map_or(0, Vec::len)
                })
                .sum(),
        );
        if self.topics.is_empty() {
            *self = MicroBatch::default();
        }
        buf.ranges.keys().copied().collect()
    }

    pub fn take(&mut self) -> BTreeMap<String, TopicBuffer> {
        let topics = std::mem::take(&mut self.topics);
        *self = MicroBatch::default();
        topics
    }
}
