//! `[kafka]`: the broker, the topics wal2delta writes and the producer.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[kafka]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    pub brokers: String,
    #[serde(default = "KafkaConfig::default_topic_prefix")]
    pub topic_prefix: String,
    /// Partitions of topics wal2delta creates. Keys (primary keys) keep per-row order.
    #[serde(default = "KafkaConfig::default_partitions")]
    pub topic_partitions: i32,
    /// Dead-letter topic for events capture cannot encode; default `{topic_prefix}.dlq`.
    #[serde(default)]
    pub dlq_topic: Option<String>,
    /// Compacted topic recording the slot position capture confirmed (checked at start);
    /// default `{topic_prefix}.positions`.
    #[serde(default)]
    pub positions_topic: Option<String>,
    /// Compacted topic recording snapshot progress; default `{topic_prefix}.snapshots`.
    #[serde(default)]
    pub snapshots_topic: Option<String>,
    /// Topic of transaction END records (per-table event counts of every source
    /// transaction); default `{topic_prefix}.transactions`.
    #[serde(default)]
    pub transactions_topic: Option<String>,
    /// How long one produce may wait for the broker before capture restarts from the
    /// slot's confirmed position (nothing is acknowledged meanwhile).
    #[serde(default = "KafkaConfig::default_delivery_timeout_ms")]
    pub delivery_timeout_ms: u64,
    /// The largest message capture sends (librdkafka's `message.max.bytes`; its default).
    /// An event larger than this goes to the DLQ with its key and sizes instead of
    /// stopping the stream. Raising it needs the broker's and topics' `max.message.bytes`
    /// and consumers' fetch sizes raised too (docs/capture.md).
    #[serde(default = "KafkaConfig::default_message_max_bytes")]
    pub message_max_bytes: usize,
    /// Extra librdkafka producer properties (`linger.ms`, `compression.type`, ...).
    /// `acks`, `enable.idempotence` and `bootstrap.servers` are fixed and refused here.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
}

impl KafkaConfig {
    fn default_topic_prefix() -> String {
        "cdc".into()
    }
    fn default_partitions() -> i32 {
        1
    }
    fn default_delivery_timeout_ms() -> u64 {
        30_000
    }
    fn default_message_max_bytes() -> usize {
        wal2delta_stream::producer::DEFAULT_MESSAGE_MAX_BYTES
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.brokers.trim().is_empty() {
            return Err(invalid(
                "kafka.brokers",
                "must not be empty (host:port[,host:port])",
            ));
        }
        if self.topic_prefix.is_empty()
            || !self
                .topic_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "kafka.topic_prefix",
                "must be non-empty and use only a-z, A-Z, 0-9, '.', '_' and '-'",
            ));
        }
        if self.topic_prefix.len() > wal2delta_model::names::MAX_TOPIC_PREFIX {
            // Table topics are `{prefix}.{schema}.{table}` with parts of up to
            // MAX_IDENT_PART characters; Kafka refuses topic names over 249.
            return Err(invalid(
                "kafka.topic_prefix",
                format!(
                    "must be at most {} characters, so that every table topic fits Kafka's 249",
                    wal2delta_model::names::MAX_TOPIC_PREFIX
                ),
            ));
        }
        if !(1..=10_000).contains(&self.topic_partitions) {
            return Err(invalid(
                "kafka.topic_partitions",
                "must be between 1 and 10000",
            ));
        }
        if self.delivery_timeout_ms < 1_000 {
            return Err(invalid(
                "kafka.delivery_timeout_ms",
                "must be at least 1000",
            ));
        }
        if !(1_000..=1_000_000_000).contains(&self.message_max_bytes) {
            return Err(invalid(
                "kafka.message_max_bytes",
                "must be between 1000 and 1000000000 (librdkafka's range for message.max.bytes)",
            ));
        }
        if self.producer.contains_key("message.max.bytes") {
            return Err(invalid(
                "kafka.producer.\"message.max.bytes\"",
                "is set by [kafka] message_max_bytes (capture checks events against it)",
            ));
        }
        for fixed in [
            "acks",
            "enable.idempotence",
            "bootstrap.servers",
            "max.in.flight.requests.per.connection",
        ] {
            if self.producer.contains_key(fixed) {
                return Err(invalid(
                    &format!("kafka.producer.\"{fixed}\""),
                    "is fixed by wal2delta (acks=all, idempotent) and cannot be set",
                ));
            }
        }
        Ok(())
    }

    /// The compacted topic holding snapshot progress.
    pub fn snapshots_topic(&self) -> String {
        self.snapshots_topic
            .clone()
            .unwrap_or_else(|| format!("{}.snapshots", self.topic_prefix))
    }

    /// The compacted topic holding the last slot position capture confirmed.
    pub fn positions_topic(&self) -> String {
        self.positions_topic
            .clone()
            .unwrap_or_else(|| format!("{}.positions", self.topic_prefix))
    }

    /// The topic of transaction END records.
    pub fn transactions_topic(&self) -> String {
        self.transactions_topic
            .clone()
            .unwrap_or_else(|| format!("{}.transactions", self.topic_prefix))
    }

    pub fn dlq_topic(&self) -> String {
        self.dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.topic_prefix))
    }
}
