//! How every Kafka client wal2delta makes reaches the brokers: their addresses and the
//! TLS and SASL properties of the connection.
//!
//! Every producer, consumer and admin client starts from one [`KafkaConnection`]
//! ([`KafkaConnection::client_config`]), so a setting cannot reach capture and miss Bronze,
//! the position log or `status`.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientConfig;

use crate::StreamError;

/// The brokers and how to connect to them.
///
/// Secret properties (`sasl.password`, `ssl.key.password`) are kept apart from the others
/// so that `Debug` (and so every settings struct that holds a connection) never shows them.
#[derive(Clone, Default)]
pub struct KafkaConnection {
    brokers: String,
    properties: Vec<(String, String)>,
    secrets: Vec<(String, String)>,
}

impl KafkaConnection {
    /// Plain-text connections to `brokers` (`host:port[,host:port]`).
    pub fn plain(brokers: impl Into<String>) -> Self {
        KafkaConnection {
            brokers: brokers.into(),
            ..Default::default()
        }
    }

    /// Adds a librdkafka connection property (`security.protocol`, `ssl.ca.location`, ...).
    pub fn with(mut self, key: &str, value: impl Into<String>) -> Self {
        self.properties.push((key.to_owned(), value.into()));
        self
    }

    /// Adds a property whose value is a secret: set on clients, never shown.
    pub fn with_secret(mut self, key: &str, value: impl Into<String>) -> Self {
        self.secrets.push((key.to_owned(), value.into()));
        self
    }

    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// A librdkafka configuration with the brokers and the connection properties set; each
    /// client adds its own settings on top.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (k, v) in self.properties.iter().chain(&self.secrets) {
            config.set(k, v);
        }
        config
    }
}

impl KafkaConnection {
    /// Asks the brokers for their metadata once. Credentials the brokers refuse and a
    /// broker certificate that does not verify are [`StreamError::Refused`] (an operator
    /// must fix `[kafka.security]`; librdkafka itself would retry them for ever, and every
    /// produce would only time out); brokers that do not answer are a transient
    /// [`StreamError::Kafka`].
    pub fn check(&self, timeout: Duration) -> Result<(), StreamError> {
        let consumer: BaseConsumer<RefusalWatch> = self
            .client_config()
            .set("group.id", crate::reader_group("wal2delta-check"))
            .create_with_context(RefusalWatch::default())?;
        let result = consumer.fetch_metadata(None, timeout);
        if result.is_err() {
            // librdkafka reports the refusal through the error callback, which runs only
            // while the client is polled.
            for _ in 0..10 {
                let _ = consumer.poll(Duration::from_millis(100));
                if consumer.context().has_refusal() {
                    break;
                }
            }
        }
        let refused = consumer
            .context()
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((what, reason)) = refused {
            return Err(StreamError::Refused { what, reason });
        }
        result.map(|_| ()).map_err(StreamError::from)
    }

    /// [`Self::check`] on a blocking thread (librdkafka's metadata call blocks), at the
    /// start of every capture and Bronze session.
    pub async fn check_async(&self) -> Result<(), StreamError> {
        let c = self.clone();
        tokio::task::spawn_blocking(move || c.check(CHECK_TIMEOUT))
            .await
            .unwrap_or(Err(StreamError::Kafka(KafkaError::Canceled)))
    }
}

/// How long a session's first metadata request may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Records the first refusal librdkafka reports through the client's error callback.
#[derive(Default)]
struct RefusalWatch {
    refused: Mutex<Option<(&'static str, String)>>,
}

impl RefusalWatch {
    fn has_refusal(&self) -> bool {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

impl ClientContext for RefusalWatch {
    fn error(&self, error: KafkaError, reason: &str) {
        let what = match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Authentication) => "Kafka authentication",
            Some(RDKafkaErrorCode::SSL) => "Kafka TLS",
            _ => {
                tracing::warn!(error = %error, reason, "Kafka client error");
                return;
            }
        };
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.get_or_insert_with(|| (what, reason.to_owned()));
    }
}

impl ConsumerContext for RefusalWatch {}

impl fmt::Debug for KafkaConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("KafkaConnection");
        d.field("brokers", &self.brokers);
        for (k, v) in &self.properties {
            d.field(k, v);
        }
        for (k, _) in &self.secrets {
            d.field(k, &"<redacted>");
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_reach_the_client_but_never_debug() {
        let c = KafkaConnection::plain("b:9092")
            .with("security.protocol", "sasl_ssl")
            .with_secret("sasl.password", "hunter2-secret");
        let config = c.client_config();
        assert_eq!(config.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(config.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(config.get("sasl.password"), Some("hunter2-secret"));
        let shown = format!("{c:?}");
        assert!(shown.contains("sasl_ssl") && shown.contains("sasl.password"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
