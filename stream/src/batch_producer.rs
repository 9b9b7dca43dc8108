//! A producer that sends a batch of messages and returns once Kafka acknowledged every one
//! of them (or one failed): for outputs whose caller commits something only after the
//! whole batch is durable in Kafka (the rules stage's topics, docs/rules.md).
//!
//! Idempotent (`enable.idempotence=true`, `acks=all`), like the capture producer
//! ([`crate::producer`]), so the broker de-duplicates librdkafka's own retries and keeps
//! per-partition order. Unlike capture's, a message that librdkafka cannot deliver within
//! the delivery timeout fails its batch: the caller does not commit and sends the whole
//! batch again later (at-least-once; a consumer may then see a message of the batch again
//! after later messages of the same batch).

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::producer::{create_topic, is_too_large, TopicSettings, RECORD_OVERHEAD_BYTES};
use crate::StreamError;

/// Settings of an [`AckedProducer`].
#[derive(Debug, Clone)]
pub struct AckedSettings {
    /// The brokers and how to reach them.
    pub connection: crate::connection::KafkaConnection,
    /// How long one message may wait for its acknowledgement (librdkafka's
    /// `message.timeout.ms`).
    pub delivery_timeout: Duration,
    /// How the topics it creates are made.
    pub topics: TopicSettings,
    /// The producer's `message.max.bytes`.
    pub message_max_bytes: usize,
    /// Extra librdkafka properties (`[kafka] producer`).
    pub extra: BTreeMap<String, String>,
    /// The producer's `client.id`.
    pub client_id: String,
}

/// One message of a batch.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub topic: String,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

/// Sends batches and waits for every acknowledgement.
pub struct AckedProducer {
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    settings: AckedSettings,
    known_topics: Mutex<HashSet<String>>,
}

fn client_config(s: &AckedSettings) -> ClientConfig {
    let mut config = s.connection.client_config();
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set(
            "message.timeout.ms",
            s.delivery_timeout.as_millis().to_string(),
        )
        .set("message.max.bytes", s.message_max_bytes.to_string())
        .set("linger.ms", "5")
        .set("client.id", &s.client_id);
    for (k, v) in &s.extra {
        config.set(k, v);
    }
    config
}

impl AckedProducer {
    pub fn new(settings: AckedSettings) -> Result<Self, StreamError> {
        let producer: FutureProducer = client_config(&settings).create()?;
        let admin: AdminClient<DefaultClientContext> =
            settings.connection.client_config().create()?;
        Ok(AckedProducer {
            producer,
            admin,
            settings,
            known_topics: Mutex::new(HashSet::new()),
        })
    }

    /// Creates the topic if it does not exist yet (once per process and topic).
    pub async fn ensure_topic(&self, topic: &str) -> Result<(), StreamError> {
        let known = |t: &str| {
            self.known_topics
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(t)
        };
        if known(topic) {
            return Ok(());
        }
        let topics = &self.settings.topics;
        create_topic(&self.admin, topics, topic, topics.partitions, false).await?;
        self.known_topics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(topic.to_owned());
        Ok(())
    }

    /// Whether a message of `bytes` (key plus value) fits under the producer's
    /// `message.max.bytes`.
    pub fn fits(&self, bytes: usize) -> bool {
        bytes
            <= self
                .settings
                .message_max_bytes
                .saturating_sub(RECORD_OVERHEAD_BYTES)
    }

    /// Sends `messages` in order and waits until Kafka acknowledged every one; the first
    /// failure is the error (the others are still waited for, so nothing of the batch is
    /// in flight when this returns).
    pub async fn send_all(&self, messages: &[Outgoing]) -> Result<(), StreamError> {
        let mut pending = Vec::with_capacity(messages.len());
        let mut first_error = None;
        for m in messages {
            let mut record = FutureRecord::to(&m.topic)
                .key(m.key.as_slice())
                .payload(m.payload.as_slice());
            let started = std::time::Instant::now();
            let queued = loop {
                match self.producer.send_result(record) {
                    Ok(f) => break Ok(f),
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if started.elapsed() < self.settings.delivery_timeout =>
                    {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => break Err(self.error(m, e)),
                }
            };
            match queued {
                Ok(f) => pending.push((m, f)),
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            }
        }
        for (m, f) in pending {
            let result = match f.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(self.error(m, e)),
                Err(_) => Err(StreamError::Kafka(KafkaError::Canceled)),
            };
            if let (Err(e), None) = (result, &first_error) {
                first_error = Some(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn error(&self, m: &Outgoing, e: KafkaError) -> StreamError {
        if is_too_large(&e) {
            StreamError::TooLarge {
                topic: m.topic.clone(),
                bytes: m.key.len() + m.payload.len(),
                limit: self.settings.message_max_bytes,
            }
        } else {
            StreamError::Kafka(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_producer_is_idempotent_and_waits_for_all_replicas() {
        let s = AckedSettings {
            connection: crate::connection::KafkaConnection::plain("127.0.0.1:1"),
            delivery_timeout: Duration::from_secs(10),
            topics: TopicSettings::default(),
            message_max_bytes: 1_000_000,
            extra: BTreeMap::new(),
            client_id: "test".into(),
        };
        let c = client_config(&s);
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("acks"), Some("all"));
        assert_eq!(c.get("message.timeout.ms"), Some("10000"));
        let p = AckedProducer::new(s).expect("valid producer config");
        assert!(p.fits(1_000_000 - RECORD_OVERHEAD_BYTES));
        assert!(!p.fits(1_000_000 - RECORD_OVERHEAD_BYTES + 1));
    }
}
