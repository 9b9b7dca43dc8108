//! The bronze stage: change topics → Bronze Delta tables, exactly once.
//!
//! Events are read by a consumer group positioned from the Bronze tables themselves
//! ([`offsets::LakeOffsets`]), gathered into micro-batches bounded by time, events and
//! bytes, and appended one commit per table, the commit carrying the last offset of every
//! partition it covers (`wal2delta_lake::bronze`). An event that cannot be decoded, or
//! whose schema cannot be merged into its table, goes to the quarantine table first, and
//! its offset is covered by the Bronze commit that follows, so the stream goes on.
//!
//! Progress held only in memory (read positions, buffered events) is disposable: after a
//! crash, a rebalance, or a commit found stale (another writer stored those offsets first),
//! partitions are re-read from the offsets the tables hold.

mod batch;
mod commit;
pub mod lag;
mod maintenance;
mod offsets;

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;
use wal2delta_lake::bronze::{Append, AppendOutcome, BronzeTable};
use wal2delta_lake::quarantine::QuarantineTable;
use wal2delta_lake::{Lake, LakeError};
use wal2delta_model::ErrorClass;
use wal2delta_quarantine::Stage as QuarantineStage;
use wal2delta_stream::consumer::{
    Assignment, ChangeConsumer, ConsumerEvent, ConsumerSettings, RawMessage,
};
use wal2delta_stream::decode::{DecodeError, EventDecoder};
use wal2delta_stream::topic::table_topic_pattern;
use wal2delta_stream::StreamError;

use crate::config::Config;
use crate::events::{BronzeTableFailed, InternalEvent};
use crate::metrics as m;
use crate::supervisor::{Next, OperatorErrors, StageError, Supervisor, TableNext, TableRetries};
use batch::{BufferedEvent, FramedEvent, MicroBatch, TopicBuffer};
use offsets::{BronzeTopics, LakeOffsets, TRANSACTIONS_TABLE};

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Lake(#[from] LakeError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The Kafka password cannot be read any more (its file or variable changed).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// librdkafka reported the consumer unusable (the reason is its error text).
    #[error("the Kafka consumer failed: {reason}")]
    ConsumerFailed { reason: String },
    #[error("the Kafka consumer's thread ended")]
    ConsumerEnded,
}

impl StageError for SessionError {
    fn class(&self) -> ErrorClass {
        match self {
            SessionError::Lake(e) => e.class(),
            SessionError::Stream(e) => e.class(),
            SessionError::Decode(e) => e.class(),
            SessionError::Config(_) => ErrorClass::Operator,
            SessionError::ConsumerFailed { .. } | SessionError::ConsumerEnded => {
                ErrorClass::Transient
            }
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            SessionError::Lake(e) => e.hint(),
            SessionError::Stream(e) => e.hint().map(str::to_owned),
            SessionError::Decode(e) => e.hint().map(str::to_owned),
            _ => None,
        }
    }
}

/// Runs the bronze stage until `shutdown` turns true, under its [`Supervisor`]: transient
/// failures start a new session (from the offsets the tables hold); operator errors stop
/// the stage with the reason.
pub async fn run(
    config: &Config,
    supervisor: Supervisor,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(lake) = supervisor
        .writable_lake(&config.lake, &mut shutdown)
        .await?
    else {
        return Ok(());
    };
    let maintenance = maintenance::spawn(config, lake.clone(), shutdown.clone());
    let result = loop {
        match session(config, &lake, &supervisor, &mut shutdown).await {
            Ok(()) => {
                supervisor.stopped();
                break Ok(());
            }
            Err(e) => match supervisor.failed(&e, &mut shutdown).await {
                Next::Retry => {}
                Next::Shutdown => break Ok(()),
                Next::Stop(e) => break Err(e),
            },
        }
    };
    if let Some(task) = maintenance {
        task.abort();
    }
    result
}

/// A partition this process owns.
struct Owned {
    /// Messages of other epochs are stale (read before a seek or reassignment).
    epoch: u64,
    /// The next offset expected; `None` until the first message after a start from the
    /// partition's beginning.
    next: Option<i64>,
    /// The offset after the last one committed to Bronze (for lag).
    committed_next: Option<i64>,
}

/// Waiting for a seek to take effect: no message epoch matches.
const AWAITING_SEEK: u64 = u64::MAX;

/// A writer holding no partitions (a group that gave it none): since when, and when the
/// topics were last checked for events it should be reading.
#[derive(Default)]
struct Idle {
    since: Option<std::time::Instant>,
    checked: Option<std::time::Instant>,
    /// Unread events at the last check.
    unread: Option<i64>,
}

/// How long a writer may hold no partitions before the topics are checked for unread
/// events (a group rebalance takes a few seconds), and how often they are checked then.
const IDLE_CHECK: Duration = Duration::from_secs(30);

/// Why one table's commit failed.
#[derive(Debug, thiserror::Error)]
enum TableFailure {
    #[error(transparent)]
    Lake(#[from] LakeError),
    /// The writer panicked (a bug in it, or a value it cannot handle); caught at the task
    /// boundary so the other tables and the session go on.
    #[error("the Delta writer panicked: {0}")]
    Panicked(String),
}

impl TableFailure {
    fn kind(&self) -> &'static str {
        match self {
            TableFailure::Lake(_) => "error",
            TableFailure::Panicked(_) => "panic",
        }
    }
}

impl StageError for TableFailure {
    fn class(&self) -> ErrorClass {
        match self {
            TableFailure::Lake(e) => e.class(),
            // The handle is reloaded and the table re-read, as after a storage error
            // (docs/bronze.md, "One table's failure").
            TableFailure::Panicked(_) => ErrorClass::Transient,
        }
    }
}

struct Session<'a> {
    lake: &'a Lake,
    /// Told of every commit (the stage's backoff then starts over) and of failing tables.
    supervisor: &'a Supervisor,
    /// Tables whose last commit failed, by topic: the topic's events are dropped while it
    /// is paused, then re-read from what the table holds. Other tables go on meanwhile.
    failing: TableRetries,
    idle: Idle,
    decoder: EventDecoder,
    consumer: ChangeConsumer,
    owned: HashMap<(String, i32), Owned>,
    batch: MicroBatch,
    tables: HashMap<String, BronzeTable>,
    quarantine: QuarantineTable,
    topics: BronzeTopics,
}

/// The text of a caught panic (`panic!` payloads are `&str` or `String`), cut short: it
/// comes from library code and goes to the log.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    text.chars().take(200).collect()
}

/// The topics Bronze stores.
pub fn bronze_topics(config: &Config) -> BronzeTopics {
    BronzeTopics {
        prefix: config.kafka.topic_prefix.clone(),
        transactions: config.kafka.transactions_topic(),
        source: Some(config.source.identity()),
    }
}

async fn session(
    config: &Config,
    lake: &Lake,
    supervisor: &Supervisor,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), SessionError> {
    let b = &config.bronze;
    let topics = bronze_topics(config);
    // Another source's lake is refused at start, before anything is consumed.
    if let Some(source) = &topics.source {
        lake.claim_source(source).await?;
    }
    let assignment = if b.assignment == crate::config::Assignment::Group {
        Assignment::Group
    } else {
        let t = topics.clone();
        Assignment::Direct {
            wanted: std::sync::Arc::new(move |topic: &str| t.table_name(topic).is_some()),
        }
    };
    let kafka = config.kafka.connection()?;
    kafka.check_async().await?;
    let registry = config.schema_registry.connection()?;
    if registry.is_secured() {
        registry.check().await?;
    }
    let settings = ConsumerSettings {
        connection: kafka,
        group_id: b.group_id.clone(),
        assignment,
        subscription: vec![
            table_topic_pattern(&topics.prefix),
            topics.transactions.clone(),
        ],
        metadata_refresh: Duration::from_millis(b.topic_refresh_ms),
        extra: b.consumer.clone(),
    };
    let offsets = LakeOffsets::new(
        lake.clone(),
        topics.clone(),
        tokio::runtime::Handle::current(),
    );
    // Enough queued messages to keep the stage busy while a commit runs; more would only
    // hold memory.
    let capacity = b.max_batch_events.clamp(1_000, 10_000);
    let consumer = ChangeConsumer::start(settings, offsets, capacity)?;
    supervisor.started();
    let mut s = Session {
        lake,
        supervisor,
        // An operator error of a commit is about the lake every table writes (its URI).
        failing: TableRetries::new(OperatorErrors::StopTheStage),
        decoder: EventDecoder::new(&registry)?,
        consumer,
        owned: HashMap::new(),
        batch: MicroBatch::default(),
        tables: HashMap::new(),
        quarantine: QuarantineTable::new(lake.quarantine_records()),
        topics,
        idle: Idle::default(),
    };
    metrics::gauge!(m::BRONZE_PARTITIONS).set(0.0);
    tracing::info!(assignment = %b.assignment, group = %b.group_id, "bronze stage started");
    let mut lag_tick = tokio::time::interval(Duration::from_secs(5));
    let max_wait = Duration::from_millis(b.max_batch_ms);
    loop {
        let deadline = s
            .batch
            .started
            .map(|t| tokio::time::Instant::from_std(t + max_wait));
        let resume = s.next_resume();
        tokio::select! {
            _ = shutdown.changed() => {
                // Commit what was read so a clean stop leaves nothing to re-read.
                s.flush().await?;
                s.consumer.shutdown();
                tracing::info!("bronze stage stopped");
                return Ok(());
            }
            event = s.consumer.next() => match event {
                None => return Err(SessionError::ConsumerEnded),
                Some(e) => s.on_event(e).await?,
            },
            _ = async { if let Some(d) = deadline { tokio::time::sleep_until(d).await } }, if deadline.is_some() => {
                s.flush().await?;
            }
            _ = lag_tick.tick() => {
                s.report_lag();
                s.check_idle(config).await;
            }
            _ = async { if let Some(r) = resume { tokio::time::sleep_until(r).await } }, if resume.is_some() => {
                s.resume_due();
            }
        }
        if s.batch.events >= b.max_batch_events || s.batch.bytes >= b.max_batch_bytes {
            s.flush().await?;
        }
    }
}

impl Session<'_> {
    async fn on_event(&mut self, event: ConsumerEvent) -> Result<(), SessionError> {
        match event {
            ConsumerEvent::Assigned(starts) => {
                for st in starts {
                    tracing::info!(topic = %st.topic, partition = st.partition, next = ?st.next, "partition assigned");
                    self.owned.insert(
                        (st.topic, st.partition),
                        Owned {
                            epoch: st.epoch,
                            next: st.next,
                            committed_next: st.next,
                        },
                    );
                }
            }
            ConsumerEvent::Revoked(parts) => {
                for (topic, partition) in &parts {
                    self.owned.remove(&(topic.clone(), *partition));
                    metrics::gauge!(m::BRONZE_CONSUMER_LAG, "topic" => topic.clone(), "partition" => partition.to_string()).set(0.0);
                }
                // The uncommitted events of an affected topic are dropped; partitions of it
                // this process keeps are re-read from what the table holds.
                let topics: std::collections::BTreeSet<&String> =
                    parts.iter().map(|(t, _)| t).collect();
                for topic in topics {
                    for p in self.batch.drop_topic(topic) {
                        let next = self
                            .owned
                            .get(&(topic.clone(), p))
                            .and_then(|o| o.committed_next);
                        self.reseek(topic, p, next);
                    }
                }
            }
            ConsumerEvent::Seeked(st) => {
                if let Some(o) = self.owned.get_mut(&(st.topic, st.partition)) {
                    o.epoch = st.epoch;
                    o.next = st.next;
                }
            }
            ConsumerEvent::Message(msg) => self.on_message(msg).await?,
            ConsumerEvent::Failed(reason) => return Err(SessionError::ConsumerFailed { reason }),
        }
        Ok(())
    }

    async fn on_message(&mut self, msg: RawMessage) -> Result<(), SessionError> {
        if self.failing.paused(&msg.topic) {
            return Ok(()); // its table is paused; re-read from the table when it resumes
        }
        let Some(owned) = self.owned.get_mut(&(msg.topic.clone(), msg.partition)) else {
            return Ok(()); // revoked meanwhile
        };
        if msg.epoch != owned.epoch {
            return Ok(()); // read before a seek or reassignment
        }
        if let Some(next) = owned.next {
            if msg.offset < next {
                return Ok(()); // already stored
            }
            if msg.offset > next {
                metrics::counter!(m::BRONZE_OFFSET_GAPS).increment(1);
                tracing::warn!(topic = %msg.topic, partition = msg.partition, expected = next, got = msg.offset, "offsets skipped: the broker no longer holds them (retention) or they were never written");
            }
        }
        owned.next = Some(msg.offset + 1);
        let topic = msg.topic.clone();
        if topic == self.topics.transactions {
            let table = TRANSACTIONS_TABLE;
            self.batch
                .push(&topic, table, BufferedEvent::transaction(msg));
            return Ok(());
        }
        if msg.payload.is_none() && msg.key.is_some() {
            // A tombstone: skipped, its offset stored with the batch (no row, no
            // quarantine record).
            let Some(table) = self.topics.table_name(&topic) else {
                return Ok(());
            };
            metrics::counter!(m::BRONZE_TOMBSTONES, "table" => table.clone()).increment(1);
            self.batch
                .push(&topic, &table, BufferedEvent::tombstone(msg));
            return Ok(());
        }
        // Only the schemas are looked up here; the bytes are read into columns in chunks
        // (`batch`).
        let framed = match &msg.payload {
            None => Err(("empty_payload", "the message has no value".to_owned())),
            Some(p) => match self.decoder.resolve(p).await {
                Ok(schema) => match &msg.key {
                    None => Ok(FramedEvent { schema, key: None }),
                    Some(k) => match self.decoder.resolve(k).await {
                        Ok(key) => Ok(FramedEvent {
                            schema,
                            key: Some(key),
                        }),
                        Err(e) if e.class() != ErrorClass::Record => return Err(e.into()),
                        Err(e) => Err((e.reason_code(), format!("key: {e}"))),
                    },
                },
                // An unreachable registry is retried; refused credentials stop the stage
                // (no event is at fault, so none is quarantined for it).
                Err(e) if e.class() != ErrorClass::Record => return Err(e.into()),
                Err(e) => Err((e.reason_code(), e.to_string())),
            },
        };
        let Some(table) = self.topics.table_name(&topic) else {
            return Ok(()); // not a table topic; the subscription pattern excludes these
        };
        self.batch
            .push(&topic, &table, BufferedEvent::new(msg, framed));
        Ok(())
    }

    /// One table's commit failed: unless the failure needs an operator, its topic pauses
    /// (events dropped, so nothing of it is buffered) with a backoff of its own, and is then
    /// re-read from the offsets the table holds. The other tables go on.
    // The error ends the session once, on a path that is not hot: boxing it buys nothing.
    #[allow(clippy::result_large_err)]
    fn table_failed(
        &mut self,
        topic: &str,
        table: &str,
        failure: TableFailure,
    ) -> Result<(), SessionError> {
        let pause = match self.failing.failed(self.supervisor, topic, table, &failure) {
            TableNext::RetryIn(pause) => pause,
            TableNext::StopTheStage => {
                return Err(match failure {
                    TableFailure::Lake(e) => SessionError::Lake(e),
                    TableFailure::Panicked(reason) => {
                        unreachable!("a panic is retried: {reason}")
                    }
                })
            }
        };
        BronzeTableFailed {
            table,
            kind: failure.kind(),
            error: &failure,
            retry_in: pause,
        }
        .emit();
        // Messages already queued are of the old epoch once the table resumes (it re-seeks).
        for ((t, _), o) in self.owned.iter_mut() {
            if t == topic {
                o.epoch = AWAITING_SEEK;
            }
        }
        Ok(())
    }

    /// A writer that holds no partitions while the topics hold events no Bronze table has
    /// is stuck (a consumer group that gave it none, e.g. a broker keeping a killed member
    /// in the group): say so in a warning and in `wal2delta_bronze_unowned_events`.
    async fn check_idle(&mut self, config: &Config) {
        metrics::gauge!(m::BRONZE_PARTITIONS).set(self.owned.len() as f64);
        if !self.owned.is_empty() {
            if self.idle.since.is_some() {
                metrics::gauge!(m::BRONZE_UNOWNED_EVENTS).set(0.0);
            }
            self.idle = Idle::default();
            return;
        }
        let since = *self.idle.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < IDLE_CHECK
            || self.idle.checked.is_some_and(|c| c.elapsed() < IDLE_CHECK)
        {
            return;
        }
        self.idle.checked = Some(std::time::Instant::now());
        match lag::lag(config).await {
            Ok(tables) => {
                let unread: i64 = tables.iter().map(|t| t.lag_events).sum();
                metrics::gauge!(m::BRONZE_UNOWNED_EVENTS).set(unread as f64);
                // Unread events that no other writer drains either (a writer idle beside
                // busy group members is fine).
                let stuck = unread > 0 && self.idle.unread.is_some_and(|before| unread >= before);
                self.idle.unread = Some(unread);
                if stuck {
                    tracing::warn!(
                        unread,
                        idle_s = since.elapsed().as_secs(),
                        assignment = %config.bronze.assignment,
                        group = %config.bronze.group_id,
                        "this bronze writer holds no partitions while events wait in Kafka: another member of the consumer group holds them, or the broker kept a dead member in the group (docs/bronze.md; assignment = \"direct\" does not depend on the group)"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot check the topics for unread events"),
        }
    }

    /// When the next paused table resumes.
    fn next_resume(&self) -> Option<tokio::time::Instant> {
        self.failing.next_resume()
    }

    /// Resumes the paused tables whose pause is over: their partitions are re-read from
    /// the offsets the tables hold.
    fn resume_due(&mut self) {
        for topic in self.failing.resume_due() {
            let parts: Vec<(i32, Option<i64>)> = self
                .owned
                .iter()
                .filter(|((t, _), _)| *t == topic)
                .map(|((_, p), o)| (*p, o.committed_next))
                .collect();
            for (p, next) in parts {
                self.reseek(&topic, p, next);
            }
        }
    }

    /// Re-reads a partition from `next` (its beginning when `None`).
    fn reseek(&mut self, topic: &str, partition: i32, next: Option<i64>) {
        if let Some(o) = self.owned.get_mut(&(topic.to_owned(), partition)) {
            o.epoch = AWAITING_SEEK;
            o.next = next;
            o.committed_next = next;
            self.consumer.seek(topic, partition, next);
        }
    }

    fn report_lag(&self) {
        for ((topic, partition), o) in &self.owned {
            if let Some(high) = self.consumer.high_watermark(topic, *partition) {
                let lag = (high - o.committed_next.unwrap_or(0)).max(0);
                metrics::gauge!(m::BRONZE_CONSUMER_LAG, "topic" => topic.clone(), "partition" => partition.to_string())
                    .set(lag as f64);
            }
        }
    }
}
