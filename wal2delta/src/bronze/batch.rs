//! The micro-batch: events read since the last commit, per topic, with the offset range of
//! every partition they cover.
//!
//! A topic's events are read from their Avro bytes straight into Arrow columns
//! (`wal2delta_stream::avro::columnar`) every [`CHUNK`] events as they arrive. A
//! micro-batch holds its events as Arrow record batches plus each event's raw bytes (kept
//! so that any event can still be quarantined as it arrived).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use wal2delta_lake::bronze::{bronze_batch, merge_schemas, KafkaCoordinates, OffsetRange};
use wal2delta_lake::deltalake::arrow::array::RecordBatch;
use wal2delta_lake::deltalake::arrow::datatypes::Schema;
use wal2delta_quarantine::{QuarantineRecord, Stage};
use wal2delta_stream::avro::columnar::{EnvelopeReader, EventPosition, ReadError};
use wal2delta_stream::consumer::RawMessage;
use wal2delta_stream::decode::ReadSchema;
use wal2delta_stream::transactions::{transaction_columns, TransactionRecord};

/// Events read into Arrow columns at a time.
pub const CHUNK: usize = 4_096;

/// What became of an event's payload.
pub enum Payload {
    /// A change whose value schema, and key schema (none for a TRUNCATE, which has no
    /// key), the registry knows; not yet read into Arrow.
    Framed(Arc<ReadSchema>, Option<Arc<ReadSchema>>),
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

/// The writer schemas of an event's value and key.
pub struct FramedEvent {
    pub schema: Arc<ReadSchema>,
    pub key: Option<Arc<ReadSchema>>,
}

/// One event read from Kafka.
pub struct BufferedEvent {
    pub coordinates: KafkaCoordinates,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub source_lsn: Option<i64>,
    /// `source.commit_lsn` and `ordinal` of a change read into columns (or, when that
    /// failed, decoded on the side): a quarantined event keeps them so that Silver can
    /// count it once it is resolved.
    pub commit_lsn: Option<i64>,
    pub ordinal: Option<i64>,
    pub state: Payload,
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

    /// A change event; its position in the transaction is known once it is read.
    pub fn new(m: RawMessage, framed: Result<FramedEvent, (&'static str, String)>) -> Self {
        let state = match framed {
            Ok(FramedEvent { schema, key }) => Payload::Framed(schema, key),
            Err((code, detail)) => Payload::Failed(code, detail),
        };
        Self::read(m, state, None, None)
    }

    /// The Avro datums of the value and key (after the Confluent frame the schema was
    /// resolved from).
    fn datums(&self) -> (&[u8], Option<&[u8]>) {
        fn datum(b: &[u8]) -> &[u8] {
            wal2delta_stream::registry::unframe(b).map_or(&[][..], |(_, d)| d)
        }
        (
            self.payload.as_deref().map_or(&[][..], datum),
            self.key.as_deref().map(datum),
        )
    }

    fn set_position(&mut self, p: EventPosition) {
        self.source_lsn = p.lsn;
        self.commit_lsn = p.commit_lsn;
        self.ordinal = p.ordinal;
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
                Payload::Framed(schema, _) => {
                    let schema = schema.clone();
                    let (end, key_schema) = self.run_end(i, &schema);
                    self.read_changes(i..end, &schema, key_schema.as_deref(), ingested_at);
                    i = end;
                    continue;
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
            let Payload::Framed(s, key) = &self.events[j].state else {
                break;
            };
            if s.id != schema.id {
                break;
            }
            if let Some(ks) = key {
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

    /// Reads a run of change events (one value schema, one key schema) into runs of
    /// Bronze rows. An event that cannot be read becomes a run of its own that is
    /// quarantined, and the events around it go on; if the schema itself cannot be read
    /// into columns, the whole run is quarantined.
    fn read_changes(
        &mut self,
        run: std::ops::Range<usize>,
        schema: &ReadSchema,
        key_schema: Option<&ReadSchema>,
        ingested_at: i64,
    ) {
        let plans = schema.envelope_plan().and_then(|value| {
            let key = key_schema.map(ReadSchema::key_plan).transpose()?;
            Ok((value, key))
        });
        let (value_plan, key_plan) = match plans {
            Ok(p) => p,
            Err(e) => {
                for ev in &mut self.events[run.clone()] {
                    let (datum, _) = ev.datums();
                    let p = schema.position_of(datum);
                    ev.set_position(p);
                    ev.state = Payload::Converted;
                }
                self.runs.push(Run {
                    start: run.start,
                    end: run.end,
                    outcome: Err(("unsupported_schema", e.to_string())),
                });
                return;
            }
        };
        let mut reader = EnvelopeReader::new(value_plan, key_plan);
        let mut start = run.start;
        let mut j = run.start;
        while j < run.end {
            let ev = &self.events[j];
            let (value, key) = ev.datums();
            match reader.read_event(value, key) {
                Ok(p) => {
                    self.events[j].set_position(p);
                    self.events[j].state = Payload::Converted;
                    j += 1;
                }
                // The columns are full: the rows so far become a batch and the event is
                // read again into fresh ones.
                Err(ReadError::Full) if reader.rows() > 0 => {
                    self.push_rows(&mut reader, start..j, ingested_at);
                    start = j;
                }
                Err(e) => {
                    let p = schema.position_of(value);
                    self.push_rows(&mut reader, start..j, ingested_at);
                    let detail = format!("schema id {}: {e}", schema.id);
                    let ev = &mut self.events[j];
                    ev.set_position(p);
                    ev.state = Payload::Converted;
                    self.runs.push(Run {
                        start: j,
                        end: j + 1,
                        outcome: Err((e.reason_code(), detail)),
                    });
                    j += 1;
                    start = j;
                }
            }
        }
        self.push_rows(&mut reader, start..run.end, ingested_at);
    }

    /// The rows `reader` holds, events `rows` of the buffer, as a run (none if empty).
    fn push_rows(
        &mut self,
        reader: &mut EnvelopeReader,
        rows: std::ops::Range<usize>,
        ingested_at: i64,
    ) {
        if rows.is_empty() {
            return;
        }
        let coordinates: Vec<KafkaCoordinates> = self.events[rows.clone()]
            .iter()
            .map(|e| e.coordinates)
            .collect();
        let unsupported = |e: &dyn std::fmt::Display| ("unsupported_schema", e.to_string());
        let outcome = reader
            .finish()
            .map_err(|e| unsupported(&e))
            .and_then(|cols| {
                bronze_batch(
                    &self.table,
                    &self.topic,
                    cols.fields,
                    cols.arrays,
                    &coordinates,
                    ingested_at,
                )
                .map_err(|e| unsupported(&e))
            });
        self.runs.push(Run {
            start: rows.start,
            end: rows.end,
            outcome,
        });
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
