//! `[kafka]`: the broker, the topics wal2delta writes and the producer.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::kafka_security::{refuse_connection_properties, KafkaSecurityConfig};
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
    /// Replicas of every topic wal2delta creates. Default -1: the broker's
    /// `default.replication.factor` (3 on managed services; 1 on a single local broker).
    /// Existing topics are left as they are.
    #[serde(default = "KafkaConfig::default_replication_factor")]
    pub topic_replication_factor: i32,
    /// Topic-level configs set on every topic wal2delta creates (`retention.ms`,
    /// `min.insync.replicas`, `max.message.bytes`, ...). `cleanup.policy` is refused: the
    /// position and snapshot logs must be compacted and the event topics must not be.
    #[serde(default)]
    pub topic_config: BTreeMap<String, String>,
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
    /// TLS and SASL to the brokers (`[kafka.security]`), for every client.
    #[serde(default)]
    pub security: KafkaSecurityConfig,
    /// How a bounded `numeric(p,s)` (p <= 38) travels: `precise` (an Avro `decimal`, as
    /// Debezium's default) or `string` (PostgreSQL's exact text, as releases before it
    /// wrote every numeric). docs/types.md, "numeric".
    #[serde(default)]
    pub decimal_handling: DecimalHandling,
}

/// `[kafka] decimal_handling`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecimalHandling {
    /// An Avro `decimal` (bytes, precision and scale in the schema).
    #[default]
    Precise,
    /// PostgreSQL's exact text in a `string`.
    String,
}

impl From<DecimalHandling> for wal2delta_stream::avro::decimal::Decimals {
    fn from(d: DecimalHandling) -> Self {
        match d {
            DecimalHandling::Precise => Self::Precise,
            DecimalHandling::String => Self::String,
        }
    }
}

impl KafkaConfig {
    pub(super) fn default_topic_prefix() -> String {
        "cdc".into()
    }
    fn default_partitions() -> i32 {
        1
    }
    fn default_replication_factor() -> i32 {
        -1
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
        if self.topic_replication_factor != -1
            && !(1..=100).contains(&self.topic_replication_factor)
        {
            return Err(invalid(
                "kafka.topic_replication_factor",
                "must be -1 (the broker's default.replication.factor) or between 1 and 100",
            ));
        }
        if self.topic_config.contains_key("cleanup.policy") {
            return Err(invalid(
                "kafka.topic_config.\"cleanup.policy\"",
                "is wal2delta's own: the position and snapshot logs are compacted, the event topics keep every event until Bronze stored it",
            ));
        }
        if let Some(k) = self.topic_config.keys().find(|k| k.trim().is_empty()) {
            return Err(invalid(
                &format!("kafka.topic_config.\"{k}\""),
                "a topic config name must not be empty",
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
        refuse_connection_properties("kafka.producer", self.producer.keys())?;
        self.security.validate()?;
        Ok(())
    }

    /// The brokers and how every client reaches them (TLS, SASL; the password read from
    /// its source).
    pub fn connection(&self) -> Result<wal2delta_stream::connection::KafkaConnection, ConfigError> {
        self.security.connection(&self.brokers)
    }

    /// How wal2delta creates its topics.
    pub fn topic_settings(&self) -> wal2delta_stream::producer::TopicSettings {
        wal2delta_stream::producer::TopicSettings {
            partitions: self.topic_partitions,
            replication_factor: self.topic_replication_factor,
            config: self.topic_config.clone(),
        }
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
