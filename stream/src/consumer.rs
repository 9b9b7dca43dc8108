//! The change-topic consumer of the bronze stage: positions come from the lake, never from
//! Kafka's committed offsets.
//!
//! A dedicated thread polls an rdkafka `BaseConsumer` in a consumer group. When the group
//! assigns partitions, the rebalance callback asks [`StartOffsets`] (the Bronze tables'
//! `txn` actions) where each partition continues and assigns it *at that offset*, so no
//! message is read from anywhere else. Offsets are never committed to Kafka
//! (`enable.auto.commit=false`): the Delta commit is the only record of progress.
//!
//! Every assignment and every [`ChangeConsumer::seek`] of a partition starts a new *epoch*
//! of it; each message carries the epoch it was read in, so the stage can drop messages of
//! an earlier epoch still queued in the channel after a seek or a rebalance.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tokio::sync::mpsc;

use crate::StreamError;

/// Where each partition continues: the offset after the last one already stored, or `None`
/// when nothing of it is stored yet (it is then read from the beginning).
pub trait StartOffsets: Send + Sync + 'static {
    /// Called on the consumer thread, never inside the async runtime.
    fn next_offsets(&self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>, String>;
}

/// Consumer settings.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub brokers: String,
    pub group_id: String,
    /// A librdkafka subscription pattern (starts with `^`) or plain topic names.
    pub subscription: Vec<String>,
    /// How often new topics matching the pattern are discovered.
    pub metadata_refresh: Duration,
    /// Extra librdkafka properties.
    pub extra: BTreeMap<String, String>,
}

/// A partition the consumer now owns, and where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStart {
    pub topic: String,
    pub partition: i32,
    pub epoch: u64,
    /// The first offset that will be delivered (`None`: the partition's beginning).
    pub next: Option<i64>,
}

/// One message as read (payload copied out of librdkafka's buffer).
#[derive(Debug, Clone)]
pub struct RawMessage {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub epoch: u64,
    /// The message's Kafka timestamp, milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
}

/// What the consumer thread reports, in order.
#[derive(Debug)]
pub enum ConsumerEvent {
    Assigned(Vec<PartitionStart>),
    Revoked(Vec<(String, i32)>),
    /// A [`ChangeConsumer::seek`] took effect: messages of `start.epoch` follow.
    Seeked(PartitionStart),
    Message(RawMessage),
    /// The consumer cannot go on (start offsets unreadable, seek refused, fatal Kafka error).
    Failed(String),
}

enum Command {
    Seek {
        topic: String,
        partition: i32,
        offset: Option<i64>,
    },
}

type Epochs = Arc<Mutex<HashMap<(String, i32), u64>>>;
type Watermarks = Arc<Mutex<HashMap<(String, i32), i64>>>;

struct GroupContext {
    offsets: Arc<dyn StartOffsets>,
    events: mpsc::Sender<ConsumerEvent>,
    epochs: Epochs,
    high_watermarks: Watermarks,
}

impl ClientContext for GroupContext {
    /// librdkafka's statistics carry each assigned partition's high watermark, which the
    /// stage turns into consumer lag (committed offsets, which librdkafka's own lag uses,
    /// are never written).
    fn stats(&self, statistics: rdkafka::Statistics) {
        let mut marks = self
            .high_watermarks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (topic, t) in statistics.topics {
            for (partition, p) in t.partitions {
                if partition >= 0 && p.hi_offset >= 0 {
                    marks.insert((topic.clone(), partition), p.hi_offset);
                }
            }
        }
    }
}

impl GroupContext {
    fn next_epoch(&self, topic: &str, partition: i32) -> u64 {
        let mut epochs = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        let e = epochs.entry((topic.to_owned(), partition)).or_insert(0);
        *e += 1;
        *e
    }

    /// Start offsets with retries: a lake that is briefly unreachable must not fail the
    /// assignment, but one that stays unreachable must not hang the group either.
    fn start_offsets(&self, parts: &[(String, i32)]) -> Result<Vec<Option<i64>>, String> {
        let mut delay = Duration::from_millis(200);
        let mut last = String::new();
        for _ in 0..6 {
            match self.offsets.next_offsets(parts) {
                Ok(v) if v.len() == parts.len() => return Ok(v),
                Ok(v) => {
                    return Err(format!(
                        "start offsets: {} answers for {} partitions",
                        v.len(),
                        parts.len()
                    ))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read start offsets from the lake; retrying");
                    last = e;
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        Err(format!("cannot read start offsets from the lake: {last}"))
    }

    fn on_assign(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let parts: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        let next = match self.start_offsets(&parts) {
            Ok(n) => n,
            Err(e) => {
                // Complete the rebalance so librdkafka's group state stays sane (closing a
                // consumer mid-rebalance can hang), but report no `Assigned`: the stage
                // drops messages of partitions it does not own, stops on `Failed` and starts
                // a new consumer.
                if let Err(err) = consumer.assign(tpl) {
                    tracing::warn!(error = %err, "assign after a failed offset lookup failed");
                }
                let _ = self.events.blocking_send(ConsumerEvent::Failed(e));
                return;
            }
        };
        let mut starts = Vec::with_capacity(parts.len());
        for ((topic, partition), next) in parts.into_iter().zip(next) {
            let offset = next.map_or(Offset::Beginning, Offset::Offset);
            if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                let _ = self.events.blocking_send(ConsumerEvent::Failed(format!(
                    "cannot position {topic}/{partition}: {e}"
                )));
                return;
            }
            let epoch = self.next_epoch(&topic, partition);
            starts.push(PartitionStart {
                topic,
                partition,
                epoch,
                next,
            });
        }
        if let Err(e) = consumer.assign(tpl) {
            let _ = self.events.blocking_send(ConsumerEvent::Failed(format!(
                "cannot assign partitions: {e}"
            )));
            return;
        }
        tracing::info!(
            partitions = starts.len(),
            "partitions assigned; positions read from the lake"
        );
        let _ = self.events.blocking_send(ConsumerEvent::Assigned(starts));
    }
}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.on_assign(consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let parts: Vec<(String, i32)> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition()))
                    .collect();
                if let Err(e) = consumer.unassign() {
                    tracing::warn!(error = %e, "unassign failed");
                }
                tracing::info!(partitions = parts.len(), "partitions revoked");
                let _ = self.events.blocking_send(ConsumerEvent::Revoked(parts));
            }
            other => {
                tracing::warn!(error = ?other, "rebalance error");
                if let Err(e) = consumer.unassign() {
                    tracing::warn!(error = %e, "unassign failed");
                }
            }
        }
    }

    fn commit_callback(&self, _result: KafkaResult<()>, _offsets: &TopicPartitionList) {}
}

/// Handle of the consumer thread.
pub struct ChangeConsumer {
    events: mpsc::Receiver<ConsumerEvent>,
    high_watermarks: Watermarks,
    commands: std_mpsc::Sender<Command>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ChangeConsumer {
    /// Joins the group and starts reading. `capacity` bounds the messages queued between
    /// the consumer thread and the stage.
    pub fn start(
        settings: ConsumerSettings,
        offsets: Arc<dyn StartOffsets>,
        capacity: usize,
    ) -> Result<Self, StreamError> {
        let (tx, rx) = mpsc::channel(capacity.max(16));
        let epochs: Epochs = Arc::default();
        let high_watermarks: Watermarks = Arc::default();
        let context = GroupContext {
            offsets,
            events: tx.clone(),
            epochs: epochs.clone(),
            high_watermarks: high_watermarks.clone(),
        };
        let mut config = ClientConfig::new();
        // Defaults the operator may override: a killed member's partitions move to the
        // others after 10 s instead of librdkafka's 45 s.
        config
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000");
        for (k, v) in &settings.extra {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("allow.auto.create.topics", "false")
            .set("partition.assignment.strategy", "range,roundrobin")
            .set("statistics.interval.ms", "5000")
            .set(
                "topic.metadata.refresh.interval.ms",
                settings.metadata_refresh.as_millis().to_string(),
            );
        let consumer: BaseConsumer<GroupContext> = config.create_with_context(context)?;
        let topics: Vec<&str> = settings.subscription.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let (cmd_tx, cmd_rx) = std_mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bronze-consumer".into())
            .spawn(move || poll_loop(consumer, tx, cmd_rx, epochs, thread_stop))
            .map_err(|e| StreamError::Topic {
                topic: settings.subscription.join(","),
                reason: format!("cannot start the consumer thread: {e}"),
            })?;
        Ok(ChangeConsumer {
            events: rx,
            high_watermarks,
            commands: cmd_tx,
            stop,
            thread: Some(thread),
        })
    }

    /// The next event; `None` once the consumer thread has ended.
    pub async fn next(&mut self) -> Option<ConsumerEvent> {
        self.events.recv().await
    }

    /// The last high watermark librdkafka reported for a partition (every 5 s).
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.high_watermarks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(topic.to_owned(), partition))
            .copied()
    }

    /// Re-reads `topic/partition` from `offset` (`None`: its beginning); a
    /// [`ConsumerEvent::Seeked`] follows.
    pub fn seek(&self, topic: &str, partition: i32, offset: Option<i64>) {
        let _ = self.commands.send(Command::Seek {
            topic: topic.to_owned(),
            partition,
            offset,
        });
    }

    /// Leaves the group and ends the thread.
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Unblock a thread waiting for channel space.
        self.events.close();
        while self.events.try_recv().is_ok() {}
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ChangeConsumer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn poll_loop(
    consumer: BaseConsumer<GroupContext>,
    events: mpsc::Sender<ConsumerEvent>,
    commands: std_mpsc::Receiver<Command>,
    epochs: Epochs,
    stop: Arc<AtomicBool>,
) {
    let epoch_of = |topic: &str, partition: i32| {
        epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    };
    while !stop.load(Ordering::Relaxed) {
        while let Ok(Command::Seek {
            topic,
            partition,
            offset,
        }) = commands.try_recv()
        {
            let event = match consumer.seek(
                &topic,
                partition,
                offset.map_or(Offset::Beginning, Offset::Offset),
                Duration::from_secs(10),
            ) {
                Ok(()) => {
                    let epoch = consumer.context().next_epoch(&topic, partition);
                    ConsumerEvent::Seeked(PartitionStart {
                        topic,
                        partition,
                        epoch,
                        next: offset,
                    })
                }
                Err(e) => ConsumerEvent::Failed(format!(
                    "cannot seek {topic}/{partition} to {offset:?}: {e}"
                )),
            };
            if events.blocking_send(event).is_err() {
                return;
            }
        }
        let event = match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(Ok(m)) => ConsumerEvent::Message(RawMessage {
                topic: m.topic().to_owned(),
                partition: m.partition(),
                offset: m.offset(),
                epoch: epoch_of(m.topic(), m.partition()),
                timestamp_ms: m.timestamp().to_millis(),
                key: m.key().map(<[u8]>::to_vec),
                payload: m.payload().map(<[u8]>::to_vec),
            }),
            Some(Err(e)) => {
                // Partition EOF and transient broker errors are reported by librdkafka and
                // retried by it; only fatal errors end the consumer.
                if matches!(
                    e.rdkafka_error_code(),
                    Some(rdkafka::types::RDKafkaErrorCode::Fatal)
                ) {
                    ConsumerEvent::Failed(format!("fatal Kafka consumer error: {e}"))
                } else {
                    tracing::debug!(error = %e, "consumer error (librdkafka retries)");
                    continue;
                }
            }
        };
        if events.blocking_send(event).is_err() {
            return;
        }
    }
}

/// The high watermark of every partition of `topics` (for `status`).
pub fn high_watermarks(
    brokers: &str,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<(String, i32, i64)>, StreamError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", crate::reader_group("wal2delta-status"))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut out = Vec::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        for t in metadata.topics() {
            for p in t.partitions() {
                let (_, high) = consumer.fetch_watermarks(topic, p.id(), timeout)?;
                out.push((topic.clone(), p.id(), high));
            }
        }
    }
    Ok(out)
}

/// Every topic whose name matches `is_wanted`.
pub fn list_topics(
    brokers: &str,
    is_wanted: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Result<Vec<String>, StreamError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", crate::reader_group("wal2delta-status"))
        .create()?;
    let metadata = consumer.fetch_metadata(None, timeout)?;
    let mut topics: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|n| is_wanted(n))
        .collect();
    topics.sort();
    Ok(topics)
}
