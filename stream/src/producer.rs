//! The Kafka producer with ordered acknowledgements.
//!
//! Idempotent (`enable.idempotence=true`, `acks=all`): the broker de-duplicates retries
//! and keeps per-partition order. Every message carries a [`DeliveryTag`]; librdkafka's
//! delivery callback reports it, success or failure, on a channel that the capture loop
//! feeds into its [`crate::transaction_acks::AckTracker`]. Nothing is acknowledged to PostgreSQL from here.
//!
//! **No gaps.** Consumers read the transactions topic as a gapless sequence: an END or
//! WATERMARK record at LSN `x` tells Silver that every transaction below `x` has its END
//! earlier in the partition, so Silver moves past them. If one END failed and a later
//! END or WATERMARK of the same producer were still delivered, Silver would pass the
//! failed transaction and later drop its re-published events as copies. An idempotent
//! librdkafka producer creates such gaps on its own in two ways, and both are closed here:
//!
//! - A batch that fails permanently makes librdkafka bump the producer epoch and carry on
//!   with the next messages. `enable.gapless.guarantee=true` turns that into a fatal
//!   error instead (the producer stops; every later send and delivery fails). Capture
//!   then ends the session: the producer is dropped, which purges what it still held,
//!   and the next session re-reads everything unacknowledged from the slot.
//! - A message that times out (`message.timeout.ms`) while queued is skipped the same
//!   way, and the gapless guarantee does not cover timeouts (librdkafka's documentation
//!   says so). So librdkafka never times a message out here (`message.timeout.ms=0`);
//!   capture enforces `[kafka] delivery_timeout_ms` itself, by ending the session when
//!   Kafka acknowledges nothing for that long, and dropping the producer then purges
//!   every queued message at once. Messages already on the wire were written in order or
//!   not at all (the broker refuses an idempotent producer's out-of-sequence batch), so
//!   what reaches a partition is always a prefix of what was sent to it.
//!
//! **Batching.** `linger.ms=100`: librdkafka waits up to 100 ms to fill a batch. Fewer,
//! larger produce requests cost the daemon (and the broker) less per event: on
//! `ops/bench capture` (1,000-row transactions, 3 runs each) the daemon's CPU went from
//! 29.0 µs per event at 5 ms to 25.9 at 20 ms and 21.6 at 50 ms, and the rate rose by a
//! quarter; lz4 compression cost 5 µs per event more than it saved. The slot is
//! acknowledged after Kafka confirms, so the price is at most 100 ms more before an event
//! is in Kafka and its LSN confirmed, small beside Bronze's batching
//! (`docs/benchmarks.md`). `[kafka.producer] "linger.ms"` overrides it; the documented
//! low-latency setting keeps 50.
//!
//! **Why 100 and not 50: the broker thread spins while a backlog drains.** librdkafka's
//! idempotent producer keeps one produce request in flight per partition (librdkafka 2.12
//! counts the partition's in-flight *messages* against its limit of 5 *requests*). While
//! that request waits for the broker, the batch queued behind it may grow older than
//! `linger.ms`; the broker thread's next wake-up is then "now" and it polls in a loop
//! until the response arrives. `[capture] max_in_flight` bounds how long the queue
//! waits; a linger longer than that wait removes the spin. With the default 10,000 in
//! flight, on `ops/bench capture` (same hour, 3 runs each): 8.4 µs per event at 50 ms,
//! 4.8 at 100 and 4.4 at 200, at the same rate. At a steady rate below capacity there is
//! no backlog and no spin, and a longer linger only holds events that much longer when
//! batches do not fill (Bronze p99 +0.9 s at 1,000 ms), so 100 and not more.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
/// The error of a delivery report.
pub use rdkafka::error::KafkaError;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use tokio::sync::mpsc;

use crate::transaction_acks::DeliveryTag;
use crate::StreamError;

/// The outcome of one message.
#[derive(Debug)]
pub struct Delivery {
    pub tag: DeliveryTag,
    pub result: Result<(), KafkaError>,
    /// Key plus value bytes of the message, so a broker-side "message too large" can say
    /// how large it was.
    pub bytes: usize,
}

/// librdkafka's default `message.max.bytes`: the largest message the producer accepts.
pub const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// What librdkafka adds to key plus value when it checks a message against
/// `message.max.bytes` (a v2 record's varint lengths, attributes, timestamp and offset
/// deltas; headers are counted apart, [`headers_bytes`]). Rounded up, so that a message passing the check below is
/// never refused by librdkafka's own check.
pub const RECORD_OVERHEAD_BYTES: usize = 64;

/// What Kafka headers add to a message's size as librdkafka counts it against
/// `message.max.bytes` (names and values; their varint lengths are within
/// [`RECORD_OVERHEAD_BYTES`] plus [`HEADER_OVERHEAD_BYTES`] each).
pub fn headers_bytes(headers: &[(&str, &[u8])]) -> usize {
    headers
        .iter()
        .map(|(k, v)| k.len() + v.len() + HEADER_OVERHEAD_BYTES)
        .sum()
}

/// What one header adds besides its name and value (varint lengths), rounded up.
pub const HEADER_OVERHEAD_BYTES: usize = 16;

/// Whether a delivery failed because a message was too large for the producer or the
/// broker (`MSG_SIZE_TOO_LARGE`, local or from the broker).
pub fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge)
    )
}

struct AckContext {
    deliveries: mpsc::UnboundedSender<Delivery>,
}

impl ClientContext for AckContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // A fatal error (e.g. the gapless guarantee) stops the producer for good: capture
        // notices the failed sends and deliveries and starts a new session and producer.
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            tracing::error!(error = %error, reason, "Kafka producer stopped by a fatal error; capture restarts from the slot's confirmed position");
        } else {
            tracing::warn!(error = %error, reason, "Kafka client error");
        }
    }
}

impl ProducerContext for AckContext {
    type DeliveryOpaque = Box<DeliveryTag>;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: Self::DeliveryOpaque) {
        let (result, bytes) = match result {
            Ok(m) => (Ok(()), m.key_len() + m.payload_len()),
            Err((e, m)) => (Err(e.clone()), m.key_len() + m.payload_len()),
        };
        // The receiver is gone only when capture is shutting down.
        let _ = self.deliveries.send(Delivery {
            tag: *tag,
            result,
            bytes,
        });
    }
}

/// Producer settings.
#[derive(Debug, Clone)]
pub struct ProducerSettings {
    /// The brokers and how to reach them.
    pub connection: crate::connection::KafkaConnection,
    /// How long capture lets Kafka acknowledge nothing before it ends the session (it is
    /// enforced by capture, not by librdkafka: see the module docs).
    pub delivery_timeout: Duration,
    /// How the topics it creates are made.
    pub topics: TopicSettings,
    /// The producer's `message.max.bytes`: larger messages are refused before sending
    /// ([`EventProducer::fits`]) and go to the DLQ instead.
    pub message_max_bytes: usize,
    /// Extra librdkafka properties.
    pub extra: BTreeMap<String, String>,
}

/// The producer's librdkafka configuration (see the module docs for why each fixed
/// setting is what it is).
fn client_config(settings: &ProducerSettings) -> ClientConfig {
    let mut config = settings.connection.client_config();
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("enable.gapless.guarantee", "true")
        // Never time a message out inside librdkafka (that would skip it and send the
        // next ones); capture enforces `delivery_timeout` itself.
        .set("message.timeout.ms", "0")
        .set("message.max.bytes", settings.message_max_bytes.to_string())
        .set("linger.ms", "100")
        .set("queue.buffering.max.messages", "200000")
        .set("client.id", "wal2delta-capture");
    for (k, v) in &settings.extra {
        config.set(k, v);
    }
    config
}

/// Sends change events and reports each delivery.
pub struct EventProducer {
    producer: ThreadedProducer<AckContext>,
    admin: AdminClient<DefaultClientContext>,
    settings: ProducerSettings,
    known_topics: HashSet<String>,
    partitions: HashMap<String, i32>,
}

impl EventProducer {
    /// Creates the producer; deliveries arrive on the returned receiver.
    pub fn new(
        settings: ProducerSettings,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), StreamError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let config = client_config(&settings);
        let producer: ThreadedProducer<AckContext> =
            config.create_with_context(AckContext { deliveries: tx })?;
        let admin: AdminClient<DefaultClientContext> =
            settings.connection.client_config().create()?;
        Ok((
            EventProducer {
                producer,
                admin,
                settings,
                known_topics: HashSet::new(),
                partitions: HashMap::new(),
            },
            rx,
        ))
    }

    /// Creates the topic if it does not exist yet (once per process and topic).
    pub async fn ensure_topic(&mut self, topic: &str) -> Result<(), StreamError> {
        let partitions = self.settings.topics.partitions;
        self.create_topic(topic, partitions, false).await
    }

    /// Creates a single-partition compacted topic if missing (the position log).
    pub async fn ensure_compacted_topic(&mut self, topic: &str) -> Result<(), StreamError> {
        self.create_topic(topic, 1, true).await
    }

    async fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        compacted: bool,
    ) -> Result<(), StreamError> {
        if self.known_topics.contains(topic) {
            return Ok(());
        }
        create_topic(
            &self.admin,
            &self.settings.topics,
            topic,
            partitions,
            compacted,
        )
        .await?;
        self.known_topics.insert(topic.to_owned());
        Ok(())
    }

    /// The topic's partition count, from broker metadata (cached).
    pub fn partition_count(&mut self, topic: &str) -> Result<i32, StreamError> {
        if let Some(n) = self.partitions.get(topic) {
            return Ok(*n);
        }
        let md = self
            .producer
            .client()
            .fetch_metadata(Some(topic), crate::KAFKA_REQUEST_TIMEOUT)?;
        let n = md
            .topics()
            .first()
            .map(|t| t.partitions().len() as i32)
            .unwrap_or(0)
            .max(1);
        self.partitions.insert(topic.to_owned(), n);
        Ok(n)
    }

    /// The largest key plus value this producer sends (its `message.max.bytes` less the
    /// record overhead).
    pub fn max_payload_bytes(&self) -> usize {
        self.settings
            .message_max_bytes
            .saturating_sub(RECORD_OVERHEAD_BYTES)
    }

    /// Whether a message of `bytes` (key plus value) fits under the producer's limit.
    pub fn fits(&self, bytes: usize) -> bool {
        bytes <= self.max_payload_bytes()
    }

    /// Queues one message. Waits (without blocking the runtime) while librdkafka's queue
    /// is full. The delivery is reported later with `tag`.
    pub async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        payload: &[u8],
        tag: DeliveryTag,
    ) -> Result<(), StreamError> {
        self.send_record(topic, partition, key, Some(payload), &[], tag)
            .await
    }

    /// Queues a tombstone: `key` with a null value, which tells a compacted topic (and
    /// key-based consumers) that the key is gone.
    pub async fn send_tombstone(
        &self,
        topic: &str,
        key: &[u8],
        tag: DeliveryTag,
    ) -> Result<(), StreamError> {
        self.send_record(topic, None, Some(key), None, &[], tag)
            .await
    }

    /// Queues one message with Kafka headers (`payload` `None`: a null value). See
    /// [`Self::send`].
    pub async fn send_record(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: &[(&str, &[u8])],
        tag: DeliveryTag,
    ) -> Result<(), StreamError> {
        let mut record: BaseRecord<'_, [u8], [u8], Box<DeliveryTag>> =
            BaseRecord::with_opaque_to(topic, Box::new(tag));
        if let Some(p) = payload {
            record = record.payload(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if !headers.is_empty() {
            let mut h = OwnedHeaders::new_with_capacity(headers.len());
            for (name, value) in headers {
                h = h.insert(Header {
                    key: name,
                    value: Some(*value),
                });
            }
            record = record.headers(h);
        }
        let started = std::time::Instant::now();
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                // A queue that stays full means nothing is being delivered; librdkafka never
                // times messages out here (see the module docs), so give up after the
                // delivery timeout and let capture start a new session.
                Err((e @ KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if started.elapsed() >= self.settings.delivery_timeout =>
                {
                    return Err(StreamError::Kafka(e))
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) if is_too_large(&e) => {
                    return Err(StreamError::TooLarge {
                        topic: topic.to_owned(),
                        bytes: payload.map_or(0, <[u8]>::len)
                            + key.map_or(0, <[u8]>::len)
                            + headers_bytes(headers),
                        limit: self.settings.message_max_bytes,
                    })
                }
                Err((e, _)) => return Err(StreamError::Kafka(e)),
            }
        }
    }

    /// Waits up to `timeout` for every queued message to be delivered or failed.
    pub fn flush(&self, timeout: Duration) {
        let _ = self.producer.flush(timeout);
    }
}

/// How wal2delta creates the topics it writes (`[kafka] topic_partitions`,
/// `topic_replication_factor`, `topic_config`). Topics that exist already are left as
/// they are.
#[derive(Debug, Clone)]
pub struct TopicSettings {
    /// Partitions of table and output topics (the position and snapshot logs have one).
    pub partitions: i32,
    /// Replicas of every topic; -1 leaves it to the broker's `default.replication.factor`.
    pub replication_factor: i32,
    /// Topic-level configs (`retention.ms`, `min.insync.replicas`, ...) set on every topic
    /// created; `cleanup.policy` is wal2delta's own (compact for the logs, delete else).
    pub config: BTreeMap<String, String>,
}

impl Default for TopicSettings {
    fn default() -> Self {
        TopicSettings {
            partitions: 1,
            replication_factor: 1,
            config: BTreeMap::new(),
        }
    }
}

/// Creates `topic` with `partitions` partitions (compacted or not) unless it exists.
pub(crate) async fn create_topic(
    admin: &AdminClient<DefaultClientContext>,
    settings: &TopicSettings,
    topic: &str,
    partitions: i32,
    compacted: bool,
) -> Result<(), StreamError> {
    let mut new = NewTopic::new(
        topic,
        partitions,
        TopicReplication::Fixed(settings.replication_factor),
    );
    for (k, v) in &settings.config {
        new = new.set(k, v);
    }
    if compacted {
        new = new.set("cleanup.policy", "compact");
    }
    // Both bounded: without a request timeout librdkafka waits for an unreachable broker
    // as long as its socket timeout (60 s), during which the caller (capture's session
    // loop) cannot see a shutdown request. A timeout is a transient failure: the session
    // restarts, and its supervisor waits on shutdown between attempts.
    let opts = AdminOptions::new()
        .operation_timeout(Some(crate::KAFKA_REQUEST_TIMEOUT))
        .request_timeout(Some(Duration::from_secs(15)));
    let results = admin.create_topics([&new], &opts).await?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => {
                return Err(StreamError::Topic {
                    topic: t,
                    reason: code.to_string(),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ProducerSettings {
        ProducerSettings {
            connection: crate::connection::KafkaConnection::plain("127.0.0.1:1"),
            delivery_timeout: Duration::from_secs(10),
            topics: TopicSettings::default(),
            message_max_bytes: DEFAULT_MESSAGE_MAX_BYTES,
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn the_producer_never_leaves_gaps() {
        let c = client_config(&settings());
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("enable.gapless.guarantee"), Some("true"));
        assert_eq!(c.get("acks"), Some("all"));
        // Timeouts are not covered by the gapless guarantee: librdkafka never times out.
        assert_eq!(c.get("message.timeout.ms"), Some("0"));
        assert_eq!(c.get("message.max.bytes"), Some("1000000"));
        // librdkafka accepts the combination (no broker is contacted to create it).
        let (p, _rx) = EventProducer::new(settings()).expect("valid producer config");
        assert!(p.fits(DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD_BYTES));
        assert!(!p.fits(DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD_BYTES + 1));
    }
}
