//! The change-topic consumer of the bronze stage: positions come from the lake, never from
//! Kafka's committed offsets.
//!
//! A dedicated thread polls an rdkafka `BaseConsumer` in a consumer group. When the group
//! assigns partitions, the rebalance callback asks [`StartOffsets`] (the Bronze tables'
//! `txn` actions) where each partition continues and assigns it *at that offset*, so no
//! message is read from anywhere else. Offsets are never committed to Kafka
//! (`enable.auto.commit=false`): the Delta commit is the only record of progress.
//!
//! With [`Assignment::Direct`] there is no group at all: the consumer thread lists the
//! topics every `metadata_refresh`, and assigns every partition of every matching topic
//! it does not hold yet, at the offset the lake gives. Nothing then depends on the broker's
//! group bookkeeping (a broker that keeps a SIGKILLed member in the group can leave a
//! restarted group member with no partitions).
//!
//! Partitions are read fairly: each assigned partition gets a librdkafka queue of its own,
//! read round-robin a bounded number of messages at a time, so one table's deep backlog
//! does not hold back the events of the others (see `Fairness`).
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

use rdkafka::consumer::base_consumer::PartitionQueue;
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

/// Which topics a directly assigned consumer reads.
pub type TopicFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How partitions are given to the consumer.
#[derive(Clone)]
pub enum Assignment {
    /// A consumer group shares them between processes (`subscription`).
    Group,
    /// This process reads every partition of every topic `wanted` accepts (new topics
    /// are found every `metadata_refresh`); no group is joined.
    Direct { wanted: TopicFilter },
}

impl std::fmt::Debug for Assignment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Assignment::Group => "Group",
            Assignment::Direct { .. } => "Direct",
        })
    }
}

/// Consumer settings.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// The brokers and how to reach them.
    pub connection: crate::connection::KafkaConnection,
    pub group_id: String,
    pub assignment: Assignment,
    /// A librdkafka subscription pattern (starts with `^`) or plain topic names (group
    /// assignment only).
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
    /// Partitions assigned since the poll loop last gave them queues of their own (see
    /// [`Fairness`]).
    splits: Mutex<PendingSplits>,
}

/// Assignments the poll loop has not yet turned into partition queues.
#[derive(Default)]
struct PendingSplits {
    /// A full `assign` or `unassign` ran: librdkafka forwards every partition to the
    /// consumer queue again, so every partition queue held so far is void.
    reset: bool,
    assigned: Vec<(String, i32)>,
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
    fn pending(&self) -> std::sync::MutexGuard<'_, PendingSplits> {
        self.splits.lock().unwrap_or_else(|p| p.into_inner())
    }

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
        {
            let mut pending = self.pending();
            pending.reset = true;
            pending.assigned = starts
                .iter()
                .map(|s| (s.topic.clone(), s.partition))
                .collect();
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
                {
                    let mut pending = self.pending();
                    pending.reset = true;
                    pending.assigned.clear();
                }
                tracing::info!(partitions = parts.len(), "partitions revoked");
                let _ = self.events.blocking_send(ConsumerEvent::Revoked(parts));
            }
            other => {
                tracing::warn!(error = ?other, "rebalance error");
                if let Err(e) = consumer.unassign() {
                    tracing::warn!(error = %e, "unassign failed");
                }
                let mut pending = self.pending();
                pending.reset = true;
                pending.assigned.clear();
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
            splits: Mutex::default(),
        };
        let mut config = settings.connection.client_config();
        // Defaults the operator may override: a killed member's partitions move to the
        // others after 10 s instead of librdkafka's 45 s.
        config
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000");
        for (k, v) in &settings.extra {
            config.set(k, v);
        }
        config
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
        let consumer: Arc<BaseConsumer<GroupContext>> =
            Arc::new(config.create_with_context(context)?);
        let direct = match &settings.assignment {
            Assignment::Group => {
                let topics: Vec<&str> = settings.subscription.iter().map(String::as_str).collect();
                consumer.subscribe(&topics)?;
                None
            }
            Assignment::Direct { wanted } => Some(Direct {
                wanted: wanted.clone(),
                every: settings.metadata_refresh,
                held: Default::default(),
                next: std::time::Instant::now(),
            }),
        };
        let (cmd_tx, cmd_rx) = std_mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bronze-consumer".into())
            .spawn(move || poll_loop(consumer, tx, cmd_rx, epochs, thread_stop, direct))
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

/// Direct assignment state of the consumer thread.
struct Direct {
    wanted: TopicFilter,
    every: Duration,
    /// Partitions assigned so far.
    held: std::collections::HashSet<(String, i32)>,
    /// When the topics are listed next.
    next: std::time::Instant,
}

impl Direct {
    /// Assigns every partition of the wanted topics not held yet, at the offsets the lake
    /// gives. A failed topic listing is retried at the next refresh; a lake or assignment
    /// failure ends the consumer (`Failed`), as in a group.
    fn discover(
        &mut self,
        consumer: &BaseConsumer<GroupContext>,
        events: &mpsc::Sender<ConsumerEvent>,
    ) -> Result<(), ()> {
        if std::time::Instant::now() < self.next {
            return Ok(());
        }
        self.next = std::time::Instant::now() + self.every;
        let metadata = match consumer.fetch_metadata(None, crate::KAFKA_REQUEST_TIMEOUT) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the topics; retrying at the next refresh");
                return Ok(());
            }
        };
        let mut new: Vec<(String, i32)> = Vec::new();
        for t in metadata.topics() {
            if t.error().is_some() || !(self.wanted)(t.name()) {
                continue;
            }
            for p in t.partitions() {
                let key = (t.name().to_owned(), p.id());
                if !self.held.contains(&key) {
                    new.push(key);
                }
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        let context = consumer.context();
        let fail = |reason: String| {
            let _ = events.blocking_send(ConsumerEvent::Failed(reason));
            Err(())
        };
        let next = match context.start_offsets(&new) {
            Ok(n) => n,
            Err(e) => return fail(e),
        };
        let mut tpl = TopicPartitionList::new();
        let mut starts = Vec::with_capacity(new.len());
        for ((topic, partition), next) in new.into_iter().zip(next) {
            let offset = next.map_or(Offset::Beginning, Offset::Offset);
            if let Err(e) = tpl.add_partition_offset(&topic, partition, offset) {
                return fail(format!("cannot position {topic}/{partition}: {e}"));
            }
            starts.push((topic, partition, next));
        }
        if let Err(e) = consumer.incremental_assign(&tpl) {
            return fail(format!("cannot assign partitions: {e}"));
        }
        // An incremental assignment leaves the other partitions' queues as they are.
        context
            .pending()
            .assigned
            .extend(starts.iter().map(|(t, p, _)| (t.clone(), *p)));
        let starts: Vec<PartitionStart> = starts
            .into_iter()
            .map(|(topic, partition, next)| {
                self.held.insert((topic.clone(), partition));
                PartitionStart {
                    epoch: context.next_epoch(&topic, partition),
                    topic,
                    partition,
                    next,
                }
            })
            .collect();
        tracing::info!(
            partitions = starts.len(),
            held = self.held.len(),
            "partitions assigned directly (no consumer group); positions read from the lake"
        );
        if events
            .blocking_send(ConsumerEvent::Assigned(starts))
            .is_err()
        {
            return Err(());
        }
        Ok(())
    }
}

/// Messages one partition's queue yields per round of the poll loop.
const PARTITION_QUOTA: usize = 200;
/// Messages the consumer queue yields per round before the partition queues get their turn.
const CONSUMER_QUEUE_QUOTA: usize = 2_000;

/// Events and messages waiting in the consumer queue (librdkafka's, not the channel).
fn consumer_queue_len(consumer: &BaseConsumer<GroupContext>) -> usize {
    use rdkafka::bindings as rdsys;
    // SAFETY: the handle is the consumer's own and alive for the call; the queue reference
    // `rd_kafka_queue_get_consumer` returns is released right after its length is read.
    unsafe {
        let q = rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr());
        if q.is_null() {
            return 0;
        }
        let n = rdsys::rd_kafka_queue_length(q);
        rdsys::rd_kafka_queue_destroy(q);
        n
    }
}

/// Reads partitions fairly (docs/bronze.md, "Fairness between tables").
///
/// librdkafka prefetches up to `queued.min.messages` per partition into one consumer
/// queue, in the order the fetch responses arrive. Read from that queue alone, an event of
/// a quiet table that arrives while another table has a deep backlog waits behind
/// everything prefetched of that backlog (hundreds of thousands of messages), so the quiet
/// table's Bronze commits stop for as long as the backlog takes. Instead, every assigned
/// partition gets a queue of its own (`split_partition_queue`), and each round takes at
/// most [`PARTITION_QUOTA`] messages from each, so what reaches the stage is interleaved
/// and a quiet partition's next message waits behind at most one quota of every other
/// partition.
///
/// Order within a partition: after an assignment, messages fetched before its queue was
/// split are in the consumer queue, and they are older than anything in its own queue.
/// So the partition queues are read only in a round that found the consumer queue empty
/// and split nothing new.
struct Fairness {
    queues: Vec<((String, i32), PartitionQueue<GroupContext>)>,
    turn: usize,
}

impl Fairness {
    /// One turn over the partition queues, at most [`PARTITION_QUOTA`] messages each,
    /// starting one queue further each turn. The events delivered; `None` once the stage
    /// went away.
    fn poll_round<F>(&mut self, to_event: &F, events: &mpsc::Sender<ConsumerEvent>) -> Option<usize>
    where
        F: Fn(KafkaResult<rdkafka::message::BorrowedMessage<'_>>) -> Option<ConsumerEvent>,
    {
        let n = self.queues.len();
        if n == 0 {
            return Some(0);
        }
        let mut delivered = 0;
        for i in 0..n {
            let (_, q) = &self.queues[(self.turn + i) % n];
            for _ in 0..PARTITION_QUOTA {
                let Some(r) = q.poll(Duration::ZERO) else {
                    break;
                };
                if let Some(event) = to_event(r) {
                    delivered += 1;
                    events.blocking_send(event).ok()?;
                }
            }
        }
        self.turn = (self.turn + 1) % n;
        Some(delivered)
    }

    /// Gives newly assigned partitions queues of their own; true when anything changed.
    fn split_pending(&mut self, consumer: &Arc<BaseConsumer<GroupContext>>) -> bool {
        let (reset, assigned) = {
            let mut pending = consumer.context().pending();
            let reset = std::mem::take(&mut pending.reset);
            (reset, std::mem::take(&mut pending.assigned))
        };
        if reset {
            self.queues.clear();
        }
        for (topic, partition) in &assigned {
            self.queues
                .retain(|((t, p), _)| !(t == topic && p == partition));
            match consumer.split_partition_queue(topic, *partition) {
                Some(q) => self.queues.push(((topic.clone(), *partition), q)),
                // It stays on the consumer queue: read, only not in turn.
                None => {
                    tracing::debug!(%topic, partition, "no queue of its own for this partition")
                }
            }
        }
        reset || !assigned.is_empty()
    }
}

/// The stage went away (its receiver is dropped): the poll loop ends.
struct Closed;

/// Performs the seeks the stage asked for, each answered with `Seeked` (with the
/// partition's new epoch) or `Failed`.
fn apply_seeks(
    consumer: &BaseConsumer<GroupContext>,
    commands: &std_mpsc::Receiver<Command>,
    events: &mpsc::Sender<ConsumerEvent>,
) -> Result<(), Closed> {
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
            crate::KAFKA_REQUEST_TIMEOUT,
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
        events.blocking_send(event).map_err(|_| Closed)?;
    }
    Ok(())
}

fn poll_loop(
    consumer: Arc<BaseConsumer<GroupContext>>,
    events: mpsc::Sender<ConsumerEvent>,
    commands: std_mpsc::Receiver<Command>,
    epochs: Epochs,
    stop: Arc<AtomicBool>,
    mut direct: Option<Direct>,
) {
    let epoch_of = |topic: &str, partition: i32| {
        epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    };
    // One polled result as the event the stage gets; `None` for errors librdkafka retries.
    let to_event = |r: KafkaResult<rdkafka::message::BorrowedMessage<'_>>| match r {
        Ok(m) => Some(ConsumerEvent::Message(RawMessage {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            epoch: epoch_of(m.topic(), m.partition()),
            timestamp_ms: m.timestamp().to_millis(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
        })),
        Err(e) => {
            // Partition EOF and transient broker errors are reported by librdkafka and
            // retried by it; only fatal errors end the consumer.
            if matches!(
                e.rdkafka_error_code(),
                Some(rdkafka::types::RDKafkaErrorCode::Fatal)
            ) {
                Some(ConsumerEvent::Failed(format!(
                    "fatal Kafka consumer error: {e}"
                )))
            } else {
                tracing::debug!(error = %e, "consumer error (librdkafka retries)");
                None
            }
        }
    };
    let mut fair = Fairness {
        queues: Vec::new(),
        turn: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        if let Some(d) = direct.as_mut() {
            if d.discover(&consumer, &events).is_err() {
                return;
            }
        }
        if apply_seeks(&consumer, &commands, &events).is_err() {
            return;
        }
        // The consumer queue first: it serves the callbacks (rebalances, statistics) and
        // holds the messages of partitions without a queue of their own yet.
        let mut delivered = 0usize;
        let mut consumer_queue_empty = false;
        for _ in 0..CONSUMER_QUEUE_QUOTA {
            if consumer_queue_len(&consumer) == 0 {
                consumer_queue_empty = true;
                break;
            }
            if let Some(event) = consumer.poll(Duration::ZERO).and_then(&to_event) {
                delivered += 1;
                if events.blocking_send(event).is_err() {
                    return;
                }
            }
        }
        if fair.split_pending(&consumer) {
            // Older messages of a just split partition may still be in the consumer queue.
            consumer_queue_empty = false;
        }
        if consumer_queue_empty {
            match fair.poll_round(&to_event, &events) {
                Some(n) => delivered += n,
                None => return,
            }
        }
        if delivered == 0 {
            // Nothing waiting: block briefly on the consumer queue (callbacks, and messages
            // of partitions not split); the partition queues are looked at again after it.
            let wait = if fair.queues.is_empty() { 100 } else { 20 };
            if let Some(event) = consumer
                .poll(Duration::from_millis(wait))
                .and_then(&to_event)
            {
                if events.blocking_send(event).is_err() {
                    return;
                }
            }
        }
    }
}

/// The high watermark of every partition of `topics` (for `status`).
pub fn high_watermarks(
    connection: &crate::connection::KafkaConnection,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<(String, i32, i64)>, StreamError> {
    let consumer: BaseConsumer = connection
        .client_config()
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
    connection: &crate::connection::KafkaConnection,
    is_wanted: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Result<Vec<String>, StreamError> {
    let consumer: BaseConsumer = connection
        .client_config()
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
