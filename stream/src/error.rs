//! Errors of the Kafka / schema-registry side, each classified.

use wal2delta_model::ErrorClass;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("Cannot build the Avro schema of {table}: {reason}")]
    Schema { table: String, reason: String },
    #[error("Cannot encode a change of {table}: {reason}")]
    Encode { table: String, reason: String },
    #[error("The schema registry refused the schema of subject {subject}: {reason}")]
    RegistryRefused { subject: String, reason: String },
    #[error("The schema registry is unavailable: {reason}")]
    RegistryUnavailable { reason: String },
    #[error("Kafka error: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// One message over the producer's `message.max.bytes` (or the broker's limit):
    /// that event goes to the DLQ, the stream goes on.
    #[error("A message of {bytes} bytes for topic {topic} is over the limit of {limit} bytes")]
    TooLarge {
        topic: String,
        bytes: usize,
        limit: usize,
    },
    #[error("Cannot create topic {topic}: {reason}")]
    Topic { topic: String, reason: String },
    /// The brokers or the registry refused the credentials, or wal2delta refused their
    /// certificate: retrying cannot help, an operator must fix `[kafka.security]` or
    /// `[schema_registry]`.
    #[error("Connection refused ({what}): {reason}")]
    Refused { what: &'static str, reason: String },
    /// A state topic holds a record a newer release wrote (`wal2delta_model::format`).
    #[error("{topic} holds a record of state format {found}; this binary reads format {ours} and earlier")]
    StateFormat {
        topic: String,
        found: u32,
        ours: u32,
    },
    /// Another source records its positions in this source's position log: the two
    /// share their topics (docs/operations.md, "Several databases, one lake").
    #[error("{topic} holds positions of source {found:?} (slot {found_slot}), and this daemon is source {ours:?}: two sources share one topic prefix")]
    SourceConflict {
        topic: String,
        found: String,
        found_slot: String,
        ours: String,
    },
}

impl StreamError {
    pub fn class(&self) -> ErrorClass {
        match self {
            StreamError::Schema { .. }
            | StreamError::Encode { .. }
            | StreamError::RegistryRefused { .. }
            | StreamError::TooLarge { .. } => ErrorClass::Record,
            StreamError::RegistryUnavailable { .. } | StreamError::Kafka(_) => {
                ErrorClass::Transient
            }
            StreamError::Topic { .. } => ErrorClass::Transient,
            StreamError::Refused { .. }
            | StreamError::StateFormat { .. }
            | StreamError::SourceConflict { .. } => ErrorClass::Operator,
        }
    }

    /// What an operator should do, for errors that need one.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            StreamError::Refused { what: "Kafka authentication", .. } => Some("check [kafka.security] username, sasl_mechanism and the password its password_env or password_file names"),
            StreamError::Refused { what: "Kafka TLS", .. } => Some("check [kafka.security] protocol and ca_file (the authority that signed the brokers' certificates) and that the broker address matches its certificate"),
            StreamError::Refused { what: "registry authentication", .. } => Some("check [schema_registry] username and the password its password_env or password_file names"),
            StreamError::SourceConflict { .. } => Some("give each source database its own [source] name (its topic prefix, consumer group and lake directory follow it) or its own [kafka] topic_prefix and [lake] uri"),
            StreamError::StateFormat { .. } => Some("a newer release of wal2delta wrote it: run that release (or newer); this one would misread its state (docs/upgrading.md)"),
            StreamError::Refused { .. } => Some("check [schema_registry] url and ca_file (the authority that signed the registry's certificate) and that the URL's host matches its certificate"),
            _ => None,
        }
    }
}
