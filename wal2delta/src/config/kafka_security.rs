//! `[kafka.security]`: TLS and SASL to the brokers, for every client wal2delta makes.
//!
//! Managed Kafka services (MSK, Confluent Cloud, Aiven) take clients only over TLS and
//! with credentials. The password comes from the environment or a file, never from the
//! config file; it is set on the clients and shown nowhere (`KafkaConnection`'s `Debug`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use wal2delta_stream::connection::KafkaConnection;

use super::{invalid, secret, ConfigError};

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaProtocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl KafkaProtocol {
    fn name(self) -> &'static str {
        match self {
            KafkaProtocol::Plaintext => "plaintext",
            KafkaProtocol::Ssl => "ssl",
            KafkaProtocol::SaslPlaintext => "sasl_plaintext",
            KafkaProtocol::SaslSsl => "sasl_ssl",
        }
    }
    fn tls(self) -> bool {
        matches!(self, KafkaProtocol::Ssl | KafkaProtocol::SaslSsl)
    }
    fn sasl(self) -> bool {
        matches!(self, KafkaProtocol::SaslPlaintext | KafkaProtocol::SaslSsl)
    }
}

/// librdkafka's `sasl.mechanism` (the password-based ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// `[kafka.security]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSecurityConfig {
    /// `plaintext` (default), `ssl`, `sasl_plaintext` or `sasl_ssl`.
    #[serde(default)]
    pub protocol: KafkaProtocol,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` (with a `sasl_*` protocol).
    pub sasl_mechanism: Option<SaslMechanism>,
    pub username: Option<String>,
    /// The environment variable holding the SASL password (or `password_file`).
    pub password_env: Option<String>,
    /// A file whose first line is the SASL password.
    pub password_file: Option<PathBuf>,
    /// PEM file of the certificate authorities that signed the brokers' certificates;
    /// default: the system's.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for brokers that authenticate clients by TLS.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The environment variable or file holding the client key's passphrase.
    pub key_password_env: Option<String>,
    pub key_password_file: Option<PathBuf>,
    /// Check that the broker's certificate names the host connected to (default true).
    #[serde(default = "yes")]
    pub verify_hostname: bool,
}

fn yes() -> bool {
    true
}

impl Default for KafkaSecurityConfig {
    fn default() -> Self {
        KafkaSecurityConfig {
            protocol: KafkaProtocol::Plaintext,
            sasl_mechanism: None,
            username: None,
            password_env: None,
            password_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            key_password_env: None,
            key_password_file: None,
            verify_hostname: true,
        }
    }
}

impl KafkaSecurityConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let p = self.protocol;
        if p.sasl() {
            if self.sasl_mechanism.is_none() {
                return Err(invalid(
                    "kafka.security.sasl_mechanism",
                    "is needed with a sasl_* protocol: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
                ));
            }
            if self.username.as_deref().is_none_or(|u| u.is_empty()) {
                return Err(invalid(
                    "kafka.security.username",
                    "is needed with a sasl_* protocol",
                ));
            }
            if self.sasl_mechanism == Some(SaslMechanism::Plain) && !p.tls() {
                tracing::warn!(
                    "[kafka.security] sends the SASL PLAIN password unencrypted (protocol sasl_plaintext); use sasl_ssl outside a trusted network"
                );
            }
        } else {
            for (field, set) in [
                ("sasl_mechanism", self.sasl_mechanism.is_some()),
                ("username", self.username.is_some()),
                (
                    "password_env",
                    self.password_env.is_some() || self.password_file.is_some(),
                ),
            ] {
                if set {
                    return Err(invalid(
                        &format!("kafka.security.{field}"),
                        format!(
                            "is used only with protocol sasl_plaintext or sasl_ssl (protocol is {})",
                            p.name()
                        ),
                    ));
                }
            }
        }
        if !p.tls() {
            for (field, set) in [
                ("ca_file", self.ca_file.is_some()),
                ("cert_file", self.cert_file.is_some()),
                ("key_file", self.key_file.is_some()),
                ("verify_hostname", !self.verify_hostname),
            ] {
                if set {
                    return Err(invalid(
                        &format!("kafka.security.{field}"),
                        format!(
                            "is used only with protocol ssl or sasl_ssl (protocol is {})",
                            p.name()
                        ),
                    ));
                }
            }
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(invalid(
                "kafka.security.cert_file",
                "and key_file go together (the client certificate and its key)",
            ));
        }
        for (field, path) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if let Some(path) = path {
                readable(path, &format!("kafka.security.{field}"))?;
            }
        }
        self.connection("validate")?;
        Ok(())
    }

    /// The connection to `brokers`, the passwords read from their sources.
    pub fn connection(&self, brokers: &str) -> Result<KafkaConnection, ConfigError> {
        let p = self.protocol;
        let mut c = KafkaConnection::plain(brokers);
        if p == KafkaProtocol::Plaintext {
            return Ok(c);
        }
        c = c.with("security.protocol", p.name());
        if p.sasl() {
            let mechanism = self.sasl_mechanism.map(SaslMechanism::name).unwrap_or("");
            let password = secret::load_password(
                "kafka.security.password",
                self.password_env.as_deref(),
                self.password_file.as_deref(),
            )?
            .ok_or_else(|| {
                invalid(
                    "kafka.security.password_env",
                    "or password_file is needed with a sasl_* protocol",
                )
            })?;
            c = c
                .with("sasl.mechanism", mechanism)
                .with("sasl.username", self.username.clone().unwrap_or_default())
                .with_secret("sasl.password", password);
        }
        if p.tls() {
            let path = |p: &Path| p.display().to_string();
            if let Some(ca) = &self.ca_file {
                c = c.with("ssl.ca.location", path(ca));
            }
            if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
                c = c
                    .with("ssl.certificate.location", path(cert))
                    .with("ssl.key.location", path(key));
            }
            if let Some(pass) = secret::load_password(
                "kafka.security.key_password",
                self.key_password_env.as_deref(),
                self.key_password_file.as_deref(),
            )? {
                c = c.with_secret("ssl.key.password", pass);
            }
            c = c.with(
                "ssl.endpoint.identification.algorithm",
                if self.verify_hostname {
                    "https"
                } else {
                    "none"
                },
            );
        }
        Ok(c)
    }
}

fn readable(path: &Path, field: &str) -> Result<(), ConfigError> {
    std::fs::File::open(path)
        .map(|_| ())
        .map_err(|e| invalid(field, format!("cannot be read ({}): {e}", path.display())))
}

/// Connection properties belong to `[kafka.security]`, so that every client gets them: a
/// client property map (`[kafka.producer]`, `[bronze.consumer]`) must not set them.
pub(super) fn refuse_connection_properties<'a>(
    section: &str,
    keys: impl IntoIterator<Item = &'a String>,
) -> Result<(), ConfigError> {
    for k in keys {
        if k == "bootstrap.servers"
            || k.starts_with("security.")
            || k.starts_with("sasl.")
            || k.starts_with("ssl.")
        {
            return Err(invalid(
                &format!("{section}.\"{k}\""),
                "is a connection property: set it in [kafka.security] (or [kafka] brokers), which every client uses",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, ConfigError};

    fn load(security: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let text = format!(
            "[source]\ndsn = \"postgres://r@127.0.0.1:5432/app\"\n[kafka]\nbrokers = \"b:9093\"\n[kafka.security]\n{security}\n[schema_registry]\nurl = \"http://127.0.0.1:8081\"\n[lake]\nuri = \"file:///tmp/lake\"\n"
        );
        Config::from_sources(
            Path::new("t.toml"),
            &text,
            env.iter().map(|(a, b)| (a.to_string(), b.to_string())),
        )
    }

    #[test]
    fn sasl_ssl_sets_every_connection_property_and_hides_the_password() {
        let var = "WAL2DELTA_TEST_KAFKA_SECURITY_PW";
        std::env::set_var(var, "scram-secret-1");
        let c = load(
            &format!("protocol = \"sasl_ssl\"\nsasl_mechanism = \"SCRAM-SHA-256\"\nusername = \"u\"\npassword_env = \"{var}\"\nverify_hostname = false"),
            &[],
        )
        .unwrap();
        let conn = c.kafka.connection().unwrap();
        let cc = conn.client_config();
        for (k, v) in [
            ("bootstrap.servers", "b:9093"),
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", "u"),
            ("sasl.password", "scram-secret-1"),
            ("ssl.endpoint.identification.algorithm", "none"),
        ] {
            assert_eq!(cc.get(k), Some(v), "{k}");
        }
        assert!(!format!("{c:?}{conn:?}").contains("scram-secret-1"));
    }

    #[test]
    fn plaintext_is_the_default_and_adds_nothing() {
        let c = load("", &[]).unwrap();
        let cc = c.kafka.connection().unwrap().client_config();
        assert_eq!(cc.get("security.protocol"), None);
        assert_eq!(cc.get("bootstrap.servers"), Some("b:9093"));
    }

    #[test]
    fn mistakes_are_refused_naming_the_key() {
        for (security, env, field) in [
            ("protocol = \"sasl_ssl\"\nusername = \"u\"\npassword_env = \"X\"", vec![], "kafka.security.sasl_mechanism"),
            ("protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\npassword_env = \"X\"", vec![], "kafka.security.username"),
            ("protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nusername = \"u\"", vec![], "kafka.security.password_env"),
            ("protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nusername = \"u\"\npassword_env = \"WAL2DELTA_TEST_UNSET_VAR\"", vec![], "kafka.security.password_env"),
            ("protocol = \"ssl\"\nusername = \"u\"", vec![], "kafka.security.username"),
            ("protocol = \"sasl_plaintext\"\nsasl_mechanism = \"PLAIN\"\nusername = \"u\"\npassword_env = \"PATH\"\nca_file = \"/etc/hostname\"", vec![], "kafka.security.ca_file"),
            ("protocol = \"ssl\"\nca_file = \"/nonexistent/ca.pem\"", vec![], "kafka.security.ca_file"),
            ("protocol = \"ssl\"\ncert_file = \"/etc/hostname\"", vec![], "kafka.security.cert_file"),
            ("protocol = \"tls\"", vec![], "kafka.security.protocol"),
            ("", vec![("WAL2DELTA__KAFKA__PRODUCER__SASL_PASSWORD", "x")], "kafka.producer.\"sasl.password\""),
            ("", vec![("WAL2DELTA__BRONZE__CONSUMER__SECURITY_PROTOCOL", "ssl")], "bronze.consumer.\"security.protocol\""),
        ] {
            let err = load(security, &env).unwrap_err().to_string();
            assert!(err.contains(field), "{security:?} {env:?}: {err}");
        }
    }
}
