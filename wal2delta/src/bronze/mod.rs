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
mod maintenance;
mod offsets;
pub mod status;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::anyhow;
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
use crate::metrics as m;
use batch::{BufferedEvent, DecodedEvent, MicroBatch, TopicBuffer};
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
    #[error("the consumer stopped: {0}")]
    Consumer(String),
}

impl SessionError {
    fn class(&self) -> ErrorClass {
        match self {
            SessionError::Lake(e) => e.class(),
            SessionError::Stream(e) => e.class(),
            SessionError::Decode(e) => e.class(),
            SessionError::Consumer(_) => ErrorClass::Transient,
        }
    }
}

/// Runs the bronze stage until `shutdown` turns true. Transient failures restart the
/// session (from the offsets the tables hold) with backoff.
pub async fn run(config: &Config, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let lake = Lake::new(&config.lake.uri).map_err(|e| anyhow!("{e} ([lake] uri)"))?;
    let maintenance = maintenance::spawn(config, lake.clone(), shutdown.clone());
    const FIRST_BACKOFF: Duration = Duration::from_millis(500);
    let mut backoff = FIRST_BACKOFF;
    let result = loop {
        let mut committed = false;
        match session(config, &lake, &mut shutdown, &mut committed).await {
            Ok(()) => break Ok(()),
            Err(e) if e.class() == ErrorClass::Transient => {
                // A session that stored something was healthy: its end is a new failure,
                // not the next of a series.
                if committed {
                    backoff = FIRST_BACKOFF;
                }
                metrics::counter!(m::BRONZE_RESTARTS).increment(1);
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "bronze session ended; restarting from the offsets stored in the Bronze tables");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => break Ok(()),
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(e) => break Err(anyhow!("bronze stage: {e}")),
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

/// A table whose last commit failed: its topic's events are dropped until `until`, then
/// re-read from what the table holds. Other tables go on meanwhile.
struct Failing {
    delay: Duration,
    /// `Some` while paused; `None` once resumed and not yet committed again.
    until: Option<tokio::time::Instant>,
}

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

/// The first and the largest pause of a failing table.
const TABLE_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));

struct Session<'a> {
    lake: &'a Lake,
    /// Set once anything is committed (the stage's restart backoff then starts over).
    committed: &'a mut bool,
    failing: HashMap<String, Failing>,
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
    }
}

async fn session(
    config: &Config,
    lake: &Lake,
    shutdown: &mut watch::Receiver<bool>,
    committed: &mut bool,
) -> Result<(), SessionError> {
    let b = &config.bronze;
    let topics = bronze_topics(config);
    let assignment = if b.assignment == crate::config::Assignment::Group {
        Assignment::Group
    } else {
        let t = topics.clone();
        Assignment::Direct {
            wanted: std::sync::Arc::new(move |topic: &str| t.table_name(topic).is_some()),
        }
    };
    let settings = ConsumerSettings {
        brokers: config.kafka.brokers.clone(),
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
    let mut s = Session {
        lake,
        committed,
        failing: HashMap::new(),
        decoder: EventDecoder::new(&config.schema_registry.url)?,
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
                None => return Err(SessionError::Consumer("the consumer thread ended".into())),
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
            ConsumerEvent::Failed(reason) => return Err(SessionError::Consumer(reason)),
        }
        Ok(())
    }

    async fn on_message(&mut self, msg: RawMessage) -> Result<(), SessionError> {
        if self
            .failing
            .get(&msg.topic)
            .is_some_and(|f| f.until.is_some())
        {
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
        let decoded = match &msg.payload {
            None => Err(("empty_payload", "the message has no value".to_owned())),
            Some(p) => match self.decoder.decode(p).await {
                Ok(d) => match &msg.key {
                    None => Ok(DecodedEvent {
                        schema: d.schema,
                        value: d.value,
                        key: None,
                    }),
                    Some(k) => match self.decoder.decode(k).await {
                        Ok(key) => Ok(DecodedEvent {
                            schema: d.schema,
                            value: d.value,
                            key: Some((key.schema, key.value)),
                        }),
                        Err(e) if e.class() == ErrorClass::Transient => return Err(e.into()),
                        Err(e) => Err((e.reason_code(), format!("key: {e}"))),
                    },
                },
                Err(e) if e.class() == ErrorClass::Transient => return Err(e.into()),
                Err(e) => Err((e.reason_code(), e.to_string())),
            },
        };
        let Some(table) = self.topics.table_name(&topic) else {
            return Ok(()); // not a table topic; the subscription pattern excludes these
        };
        self.batch
            .push(&topic, &table, BufferedEvent::new(msg, decoded));
        Ok(())
    }

    /// Commits the micro-batch: quarantine records first, then one Bronze commit per table
    /// (tables in parallel).
    async fn flush(&mut self) -> Result<(), SessionError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let events = self.batch.events;
        let topics = self.batch.take();

        // Prepare each topic against its table's current schema.
        let mut work: Vec<(String, TopicBuffer, BronzeTable, batch::Prepared)> = Vec::new();
        let mut quarantined = Vec::new();
        for (topic, mut buf) in topics {
            let mut table = match self.tables.remove(&topic) {
                Some(t) => t,
                None => match LakeOffsets::table_for(self.lake, &self.topics, &topic) {
                    Some(t) => t,
                    None => continue, // not a table topic; the subscription excludes these
                },
            };
            if let Err(e) = table.refresh().await {
                let name = table.name().to_owned();
                self.tables.insert(topic.clone(), table);
                self.table_failed(&topic, &name, e.into())?;
                continue;
            }
            let schema = table.arrow_schema();
            let prepared = buf.prepare(schema.as_deref());
            quarantined.extend(prepared.quarantined.iter().cloned());
            work.push((topic, buf, table, prepared));
        }
        if !quarantined.is_empty() {
            let mut by_reason: HashMap<String, u64> = HashMap::new();
            for r in &quarantined {
                *by_reason.entry(r.reason_code.clone()).or_default() += 1;
            }
            let stored = self
                .quarantine
                .append(QuarantineStage::Bronze, quarantined)
                .await?;
            for (reason, n) in by_reason {
                tracing::warn!(reason = %reason, events = n, "events quarantined");
                metrics::counter!(m::QUARANTINED, "stage" => "bronze", "reason" => reason)
                    .increment(n);
            }
            tracing::debug!(stored, "quarantine records appended");
        }

        // Each table commits in a task of its own: a panic in the writer (deltalake-core
        // panics on some values it cannot describe in file statistics) ends that task only,
        // and becomes that table's failure.
        let appends: Vec<_> = work
            .into_iter()
            .map(|(topic, buf, mut table, prepared)| {
                let name = table.name().to_owned();
                let append = Append {
                    topic: topic.clone(),
                    batches: prepared.batches,
                    ranges: buf.ranges.clone(),
                };
                let bytes = prepared.payload_bytes;
                let task = tokio::spawn(async move {
                    let rows: usize = append.batches.iter().map(|b| b.num_rows()).sum();
                    let conflicts_before = table.conflicts();
                    let outcome = table.append(append).await;
                    let conflicts = table.conflicts() - conflicts_before;
                    (table, rows, conflicts, outcome)
                });
                (topic, buf, name, bytes, task)
            })
            .collect();
        for (topic, buf, name, bytes, task) in appends {
            let (table, rows, conflicts, outcome) = match task.await {
                Ok(done) => done,
                Err(e) => {
                    let reason = match e.try_into_panic() {
                        Ok(p) => panic_message(p.as_ref()),
                        Err(e) => e.to_string(),
                    };
                    // The handle went down with the task; a new one reloads the table.
                    if let Some(t) = LakeOffsets::table_for(self.lake, &self.topics, &topic) {
                        self.tables.insert(topic.clone(), t);
                    }
                    self.table_failed(&topic, &name, TableFailure::Panicked(reason))?;
                    continue;
                }
            };
            self.tables.insert(topic.clone(), table);
            if conflicts > 0 {
                metrics::counter!(m::BRONZE_COMMIT_CONFLICTS, "table" => name.clone())
                    .increment(conflicts);
            }
            match outcome {
                Ok(AppendOutcome::Committed {
                    version,
                    schema_changed,
                    ..
                }) => {
                    *self.committed = true;
                    if self.failing.remove(&topic).is_some() {
                        tracing::info!(table = %name, "Bronze table committing again");
                    }
                    metrics::counter!(m::BRONZE_ROWS, "table" => name.clone())
                        .increment(rows as u64);
                    metrics::counter!(m::BRONZE_BYTES, "table" => name.clone())
                        .increment(bytes as u64);
                    metrics::counter!(m::BRONZE_COMMITS, "table" => name.clone()).increment(1);
                    if version == 0 {
                        tracing::info!(table = %name, "Bronze table created");
                    } else if schema_changed {
                        tracing::info!(table = %name, version, "Bronze table schema evolved (columns added)");
                    }
                    for (p, r) in &buf.ranges {
                        if let Some(o) = self.owned.get_mut(&(topic.clone(), *p)) {
                            o.committed_next = Some(r.last + 1);
                        }
                    }
                    tracing::debug!(table = %name, version, rows, "Bronze commit");
                }
                Ok(AppendOutcome::NoTable) => {
                    // Every event was quarantined and the table does not exist yet: the
                    // quarantine table's own offsets keep them from being stored twice.
                }
                Ok(AppendOutcome::Stale { stored }) => {
                    metrics::counter!(m::BRONZE_COMMIT_CONFLICTS, "table" => name.clone())
                        .increment(1);
                    tracing::info!(table = %name, "another writer stored these offsets first; re-reading from the table's offsets");
                    for p in buf.ranges.keys() {
                        let next = stored.get(p).copied().flatten().map(|s| s + 1);
                        self.reseek(&topic, *p, next);
                    }
                }
                Err(LakeError::SchemaConflict { reason, .. }) => {
                    // The table changed under us (another writer evolved it): re-read and
                    // prepare against the new schema.
                    tracing::info!(table = %name, reason = %reason, "table schema changed during the commit; re-reading");
                    let stored = match self.tables.get_mut(&topic) {
                        Some(t) => {
                            t.stored_offsets(
                                &topic,
                                &buf.ranges.keys().copied().collect::<Vec<_>>(),
                            )
                            .await
                        }
                        None => Ok(Default::default()),
                    };
                    match stored {
                        Ok(stored) => {
                            for p in buf.ranges.keys() {
                                self.reseek(
                                    &topic,
                                    *p,
                                    stored.get(p).copied().flatten().map(|s| s + 1),
                                );
                            }
                        }
                        Err(e) => self.table_failed(&topic, &name, e.into())?,
                    }
                }
                Err(e) => self.table_failed(&topic, &name, e.into())?,
            }
        }
        metrics::histogram!(m::BRONZE_BATCH_SECONDS).record(started.elapsed().as_secs_f64());
        tracing::debug!(
            events,
            ms = started.elapsed().as_millis() as u64,
            "micro-batch committed"
        );
        self.report_lag();
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
        let failure = match failure {
            TableFailure::Lake(e) if e.class() == ErrorClass::Operator => {
                return Err(SessionError::Lake(e))
            }
            other => other,
        };
        metrics::counter!(m::BRONZE_TABLE_FAILURES, "table" => table.to_owned(), "kind" => failure.kind())
            .increment(1);
        let f = self.failing.entry(topic.to_owned()).or_insert(Failing {
            delay: TABLE_BACKOFF.0 / 2,
            until: None,
        });
        f.delay = (f.delay * 2).min(TABLE_BACKOFF.1);
        f.until = Some(tokio::time::Instant::now() + f.delay);
        tracing::error!(table = %table, error = %failure, retry_in_ms = f.delay.as_millis() as u64, "Bronze commit of this table failed; the other tables go on, this one is re-read from its stored offsets after the pause");
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
        match status::lag(config).await {
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
        self.failing.values().filter_map(|f| f.until).min()
    }

    /// Resumes the paused tables whose pause is over: their partitions are re-read from
    /// the offsets the tables hold.
    fn resume_due(&mut self) {
        let now = tokio::time::Instant::now();
        let due: Vec<String> = self
            .failing
            .iter_mut()
            .filter(|(_, f)| f.until.is_some_and(|u| u <= now))
            .map(|(t, f)| {
                f.until = None;
                t.clone()
            })
            .collect();
        for topic in due {
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
