//! The configuration file, its environment overrides and its validation.
//!
//! Loaded once at startup: TOML from `--config`, then every `WAL2DELTA__SECTION__KEY`
//! environment variable overrides `[section] key` (`WAL2DELTA__KAFKA__PRODUCER__LINGER_MS`
//! reaches the nested `[kafka.producer] "linger.ms"`), then [`Config::validate`] checks each
//! field. Unknown keys, in the file or the environment, are errors that name the key.

use std::path::{Path, PathBuf};

use serde::Deserialize;

mod bronze;
mod capture;
mod gold;
mod kafka;
mod kafka_security;
mod lake;
mod log;
mod metrics;
pub mod path;
mod rules;
mod schema_registry;
mod secret;
mod silver;
mod snapshot;
mod source;
mod tokenize;

pub use bronze::{Assignment, BronzeConfig};
pub use capture::CaptureConfig;
pub use gold::GoldConfig;
pub use kafka::KafkaConfig;
pub use kafka_security::{KafkaProtocol, KafkaSecurityConfig, SaslMechanism};
pub use lake::LakeConfig;
pub use log::{LogConfig, LogFormat};
pub use metrics::MetricsConfig;
pub use rules::{RulesConfig, RULE_COLUMNS};
pub use schema_registry::SchemaRegistryConfig;
pub use silver::{Policies, SilverConfig};
pub use snapshot::{SnapshotConfig, SnapshotMode};
pub use source::{check_column_names, ColumnFilter, OnSlotLost, SourceConfig};
pub use tokenize::TokenizeConfig;

const ENV_PREFIX: &str = "WAL2DELTA__";

/// A configuration problem, always naming the file, variable or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("Cannot read config file {path}: {source} (pass --config PATH or create wal2delta.toml; ops/wal2delta.example.toml is a complete example)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("Invalid environment override {var}: {message}")]
    Env { var: String, message: String },
    #[error("Invalid config: `{field}` {constraint}")]
    Invalid { field: String, constraint: String },
}

fn invalid(field: &str, constraint: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_owned(),
        constraint: constraint.into(),
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub source: SourceConfig,
    pub kafka: KafkaConfig,
    pub schema_registry: SchemaRegistryConfig,
    pub lake: LakeConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub capture: CaptureConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub tokenize: TokenizeConfig,
    #[serde(default)]
    pub snapshot: SnapshotConfig,
    #[serde(default)]
    pub bronze: BronzeConfig,
    #[serde(default)]
    pub silver: SilverConfig,
    #[serde(default)]
    pub gold: GoldConfig,
    #[serde(default)]
    pub rules: RulesConfig,
}

impl Config {
    /// Reads the file, applies the environment and validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_sources(path, &text, std::env::vars())
    }

    /// Builds a config from file text and environment variables (testable without I/O).
    pub fn from_sources(
        path: &Path,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let parse_err = |message: String| ConfigError::Parse {
            path: path.to_owned(),
            message,
        };
        let mut root: toml::Table = toml::from_str(text)
            .map_err(|e| parse_err(e.message().to_owned() + &location(text, e.span())))?;
        let mut overridden = Vec::new();
        for (var, value) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let path = env_path(&var, rest)?;
            let (key, parents) = path
                .split_last()
                .expect("env_path returns two or more parts");
            let mut table = &mut root;
            for (depth, part) in parents.iter().enumerate() {
                table = table
                    .entry(part.clone())
                    .or_insert_with(|| toml::Value::Table(Default::default()))
                    .as_table_mut()
                    .ok_or_else(|| ConfigError::Env {
                        var: var.clone(),
                        message: format!("[{}] is not a table", parents[..=depth].join(".")),
                    })?;
            }
            let value = if is_property_map(parents) {
                // Client and topic properties are strings (`"5"`, not 5).
                toml::Value::String(value.clone())
            } else {
                env_value(&value)
            };
            table.insert(key.clone(), value);
            overridden.push((parents.join("."), key.clone(), var.clone()));
        }
        let mut config: Config =
            toml::Value::Table(root)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    let at = error_key(&e);
                    let message = e.message().to_owned();
                    // An unknown key or a refused value that came from the environment is
                    // reported under its variable.
                    let from_env = overridden.iter().find(|(section, key, _)| {
                        let unknown = message.contains(&format!("unknown field `{key}`"))
                            && at.as_deref().is_none_or(|at| at == section);
                        unknown || at.as_deref() == Some(&format!("{section}.{key}"))
                    });
                    // The key names the field; serde's message names the allowed values
                    // (`unknown variant `both`, expected `direct` or `group``).
                    let message = match &at {
                        Some(at) => format!("`{at}`: {message}"),
                        None => message,
                    };
                    match from_env {
                        Some((_, _, var)) => ConfigError::Env {
                            var: var.clone(),
                            message,
                        },
                        None => parse_err(message),
                    }
                })?;
        config.validate()?;
        config.apply_source_name();
        config.validate()?;
        Ok(config)
    }

    /// `[source] name`: the lake's tables under `{uri}/{name}/`, and the topic prefix and
    /// Bronze's consumer group named after it unless set to something else.
    fn apply_source_name(&mut self) {
        let Some(name) = self.source.name.clone() else {
            return;
        };
        self.lake.namespace = Some(name.clone());
        if self.kafka.topic_prefix == kafka::KafkaConfig::default_topic_prefix() {
            self.kafka.topic_prefix = name.clone();
        }
        if self.bronze.group_id == bronze::BronzeConfig::default_group_id() {
            self.bronze.group_id = format!("{name}-bronze");
        }
    }

    /// What `wal2delta check-config` prints: the addresses and choices in effect, without
    /// the DSN (it may hold a password) or any secret.
    pub fn summary(&self, path: &Path) -> String {
        let k = &self.kafka;
        let gold = self
            .gold
            .models_dir
            .as_ref()
            .map_or("off".to_owned(), |d| d.display().to_string());
        let rules = match (&self.rules.file, &self.rules.table) {
            (Some(f), _) => format!("file {}", f.display()),
            (None, Some(t)) => format!("table {t}"),
            (None, None) => "off".to_owned(),
        };
        format!(
            "config OK: {}\nsource: {}slot {}, publication {}, tables {:?}{}\nkafka: {} ({:?}), topic prefix {}\nschema registry: {}\nlake: {}\nmetrics: {}\ngold models: {gold}\nrules: {rules}\n",
            path.display(),
            self.source
                .name
                .as_ref()
                .map_or(String::new(), |n| format!("name {n}, ")),
            self.source.slot,
            self.source.publication,
            self.source.tables,
            if self.source.exclude_tables.is_empty() {
                String::new()
            } else {
                format!(" less {:?}", self.source.exclude_tables)
            },
            k.brokers,
            k.security.protocol,
            k.topic_prefix,
            without_userinfo(&self.schema_registry.url),
            self.lake.summary(),
            self.metrics.listen,
        )
    }

    /// Checks every field once, so that a bad value fails at startup with its name. Each
    /// section checks its own fields; values that can only be one of a few words (such as
    /// `[snapshot] mode`) are enums, refused already while the file is read.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.source.validate()?;
        self.kafka.validate()?;
        self.schema_registry.validate()?;
        self.lake.validate()?;
        self.capture.validate()?;
        self.tokenize.validate()?;
        self.snapshot.validate()?;
        self.bronze.validate()?;
        self.silver.validate()?;
        self.gold.validate()?;
        self.rules
            .validate(&self.kafka, &self.silver, &self.tokenize)?;
        Ok(())
    }
}

/// `scheme://user:password@host/...` without `user:password@` (URLs may carry credentials).
fn without_userinfo(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(_)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

/// An environment value is read as a TOML value when it is one (numbers, booleans,
/// arrays such as `["public.*"]`), and as a plain string otherwise.
fn env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_owned())),
        Err(_) => toml::Value::String(raw.to_owned()),
    }
}

/// Maps of librdkafka client or topic properties, whose names are dotted (`linger.ms`). A
/// shell variable cannot hold a dot, so below these `_` stands for `.`:
/// `WAL2DELTA__KAFKA__PRODUCER__LINGER_MS` sets `[kafka.producer] "linger.ms"` (no
/// librdkafka or Kafka topic property has an underscore in its name).
const PROPERTY_MAPS: [&[&str]; 3] = [
    &["kafka", "producer"],
    &["kafka", "topic_config"],
    &["bronze", "consumer"],
];

fn is_property_map(parents: &[String]) -> bool {
    PROPERTY_MAPS
        .iter()
        .any(|m| m.len() == parents.len() && m.iter().zip(parents).all(|(a, b)| a == b))
}

/// The key path an override names: `KAFKA__SECURITY__PROTOCOL` is `kafka.security.protocol`
/// (lower case). At least a section and a key; no empty part.
fn env_path(var: &str, rest: &str) -> Result<Vec<String>, ConfigError> {
    let parts: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::Env {
            var: var.to_owned(),
            message: "expected WAL2DELTA__SECTION__KEY (or WAL2DELTA__SECTION__TABLE__KEY for a nested table such as [kafka.producer])".into(),
        });
    }
    let (key, parents) = parts.split_last().expect("two or more parts");
    if is_property_map(parents) {
        let mut parts = parents.to_vec();
        parts.push(key.replace('_', "."));
        return Ok(parts);
    }
    Ok(parts)
}

/// The dotted key (`bronze.assignment`) a deserialization error arose in. toml records it
/// but shows it only in the error's text, as a last line "in `bronze.assignment`" (errors
/// from a `toml::Value` have no span, which would replace that line by a source excerpt).
fn error_key(e: &toml::de::Error) -> Option<String> {
    let text = e.to_string();
    let key = text
        .lines()
        .last()?
        .strip_prefix("in `")?
        .strip_suffix('`')?;
    Some(key.to_owned())
}

fn location(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(r) => {
            let line = text[..r.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

#[cfg(test)]
pub(crate) mod scratch {
    /// A scratch file, removed when dropped (also when the test fails); unique per call,
    /// as the tests of one process run in parallel.
    pub(crate) struct Scratch(pub(crate) std::path::PathBuf);

    impl Scratch {
        pub(crate) fn new(name: &str, contents: &str) -> Scratch {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path =
                std::env::temp_dir().join(format!("wal2delta-{name}-{}-{n}", std::process::id()));
            std::fs::write(&path, contents).expect("scratch file");
            Scratch(path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[source]
dsn = "postgres://replicator@127.0.0.1:5432/app"
[kafka]
brokers = "127.0.0.1:9092"
[schema_registry]
url = "http://127.0.0.1:8081"
[lake]
uri = "file:///tmp/lake"
"#;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_sources(
            Path::new("t.toml"),
            text,
            env.iter().map(|(a, b)| (a.to_string(), b.to_string())),
        )
    }

    #[test]
    fn defaults_fill_the_rest() {
        let c = load(MINIMAL, &[]).unwrap();
        assert_eq!(c.source.slot, "wal2delta");
        assert_eq!(c.source.tables, vec!["public.*"]);
        assert_eq!(c.kafka.topic_prefix, "cdc");
        assert_eq!(c.kafka.dlq_topic(), "cdc.dlq");
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:9187");
    }

    #[test]
    fn a_source_name_namespaces_the_lake_the_topics_and_the_group() {
        let c = load(MINIMAL, &[]).unwrap();
        assert_eq!(c.lake.root(), "file:///tmp/lake");
        assert!(
            c.source.identity().ends_with("/wal2delta"),
            "{}",
            c.source.identity()
        );
        let c = load(MINIMAL, &[("WAL2DELTA__SOURCE__NAME", "orders_db")]).unwrap();
        assert_eq!(c.lake.root(), "file:///tmp/lake/orders_db");
        assert_eq!(c.kafka.topic_prefix, "orders_db");
        assert_eq!(c.kafka.positions_topic(), "orders_db.positions");
        assert_eq!(c.bronze.group_id, "orders_db-bronze");
        assert_eq!(c.source.identity(), "orders_db");
        // A prefix or group set explicitly stays as set.
        let c = load(
            MINIMAL,
            &[
                ("WAL2DELTA__SOURCE__NAME", "orders_db"),
                ("WAL2DELTA__KAFKA__TOPIC_PREFIX", "legacy"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.topic_prefix, "legacy");
        for bad in ["Orders DB", &"x".repeat(48)] {
            let err = load(MINIMAL, &[("WAL2DELTA__SOURCE__NAME", bad)]).unwrap_err();
            assert!(err.to_string().contains("source.name"), "{err}");
        }
    }

    #[test]
    fn environment_overrides_keys() {
        let c = load(
            MINIMAL,
            &[
                ("WAL2DELTA__KAFKA__BROKERS", "10.0.0.1:9092"),
                ("WAL2DELTA__SOURCE__TABLES", r#"["app.*", "public.t"]"#),
                ("WAL2DELTA__CAPTURE__MAX_IN_FLIGHT", "10"),
                ("UNRELATED", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.brokers, "10.0.0.1:9092");
        assert_eq!(c.source.tables, vec!["app.*", "public.t"]);
        assert_eq!(c.capture.max_in_flight, 10);
    }

    #[test]
    fn environment_overrides_reach_nested_tables() {
        let c = load(
            MINIMAL,
            &[
                ("WAL2DELTA__KAFKA__PRODUCER__LINGER_MS", "50"),
                ("WAL2DELTA__KAFKA__PRODUCER__COMPRESSION_TYPE", "lz4"),
                ("WAL2DELTA__KAFKA__TOPIC_CONFIG__MIN_INSYNC_REPLICAS", "2"),
                ("WAL2DELTA__BRONZE__CONSUMER__FETCH_MAX_BYTES", "1048576"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.producer["linger.ms"], "50");
        assert_eq!(c.kafka.producer["compression.type"], "lz4");
        assert_eq!(c.kafka.topic_config["min.insync.replicas"], "2");
        assert_eq!(c.bronze.consumer["fetch.max.bytes"], "1048576");
        // A fixed property is refused under the variable's own key.
        let err = load(MINIMAL, &[("WAL2DELTA__KAFKA__PRODUCER__ACKS", "1")]).unwrap_err();
        assert!(err.to_string().contains("kafka.producer.\"acks\""), "{err}");
        // A scalar cannot be descended into; an empty part is refused.
        let err = load(MINIMAL, &[("WAL2DELTA__KAFKA__BROKERS__X", "1")]).unwrap_err();
        assert!(
            err.to_string().contains("WAL2DELTA__KAFKA__BROKERS__X")
                && err.to_string().contains("[kafka.brokers] is not a table"),
            "{err}"
        );
        let err = load(MINIMAL, &[("WAL2DELTA__KAFKA____X", "1")]).unwrap_err();
        assert!(err.to_string().contains("WAL2DELTA__KAFKA____X"), "{err}");
        // An unknown nested key is named.
        let err = load(MINIMAL, &[("WAL2DELTA__SILVER__BOGUS__X", "1")]).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn the_metrics_address_is_parsed_once_and_a_bad_one_is_named() {
        let err = load(
            &format!("{MINIMAL}\n[metrics]\nlisten = \"localhost\"\n"),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("metrics.listen") && err.contains("127.0.0.1:9187"),
            "{err}"
        );
        let err = load(MINIMAL, &[("WAL2DELTA__METRICS__LISTEN", "9187")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("WAL2DELTA__METRICS__LISTEN"), "{err}");
        let c = load(MINIMAL, &[("WAL2DELTA__METRICS__LISTEN", "0.0.0.0:9300")]).unwrap();
        assert_eq!(c.metrics.local_address().to_string(), "127.0.0.1:9300");
        let c = load(MINIMAL, &[("WAL2DELTA__METRICS__LISTEN", "[::]:9300")]).unwrap();
        assert_eq!(c.metrics.local_address().to_string(), "[::1]:9300");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = load(
            &format!("{MINIMAL}\n[metrics]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n"),
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let err = load(MINIMAL, &[("WAL2DELTA__KAFKA__BROKERZ", "x")]).unwrap_err();
        assert!(err.to_string().contains("brokerz"), "{err}");
        let err = load(MINIMAL, &[("WAL2DELTA__NOSECTION", "x")]).unwrap_err();
        assert!(err.to_string().contains("WAL2DELTA__NOSECTION"), "{err}");
    }

    #[test]
    fn topic_settings_default_to_the_broker_and_refuse_the_cleanup_policy() {
        let c = load(MINIMAL, &[]).unwrap();
        let t = c.kafka.topic_settings();
        assert_eq!((t.replication_factor, t.config.len()), (-1, 0));
        let c = load(
            MINIMAL,
            &[
                ("WAL2DELTA__KAFKA__TOPIC_REPLICATION_FACTOR", "3"),
                (
                    "WAL2DELTA__KAFKA__TOPIC_CONFIG",
                    r#"{ "min.insync.replicas" = "2" }"#,
                ),
            ],
        )
        .unwrap();
        let t = c.kafka.topic_settings();
        assert_eq!(t.replication_factor, 3);
        assert_eq!(t.config["min.insync.replicas"], "2");
        for (var, value, field) in [
            (
                "WAL2DELTA__KAFKA__TOPIC_REPLICATION_FACTOR",
                "0",
                "kafka.topic_replication_factor",
            ),
            (
                "WAL2DELTA__KAFKA__TOPIC_CONFIG",
                r#"{ "cleanup.policy" = "compact" }"#,
                "cleanup.policy",
            ),
        ] {
            let err = load(MINIMAL, &[(var, value)]).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn invalid_values_name_the_field() {
        let err = load(&MINIMAL.replace("file:///tmp/lake", "/tmp/lake"), &[]).unwrap_err();
        assert!(err.to_string().contains("lake.uri"), "{err}");
        let err = load(MINIMAL, &[("WAL2DELTA__SOURCE__SLOT", "Bad-Slot")]).unwrap_err();
        assert!(err.to_string().contains("source.slot"), "{err}");
        let err = load(
            MINIMAL,
            &[("WAL2DELTA__SOURCE__DSN", "postgres://h:notaport/x")],
        )
        .unwrap_err();
        assert!(err.to_string().contains("source.dsn"), "{err}");
        let err = load(
            &MINIMAL.replace("[lake]", "[kafka.producer]\nacks = \"1\"\n[lake]"),
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("acks"), "{err}");
        let err = load(MINIMAL, &[("WAL2DELTA__LAKE__LOG_RETENTION_S", "0")]).unwrap_err();
        assert!(err.to_string().contains("lake.log_retention_s"), "{err}");
    }

    #[test]
    fn the_log_retention_is_the_tables_own_unless_set() {
        assert_eq!(load(MINIMAL, &[]).unwrap().lake.log_retention(), None);
        let c = load(MINIMAL, &[("WAL2DELTA__LAKE__LOG_RETENTION_S", "172800")]).unwrap();
        assert_eq!(
            c.lake.log_retention(),
            Some(std::time::Duration::from_secs(48 * 3600))
        );
    }

    #[test]
    fn tokenize_needs_a_key_from_outside_the_file() {
        let with =
            |extra: &str| format!("{MINIMAL}\n[tokenize]\ncolumns = [\"public.t.card\"]\n{extra}");
        let err = load(&with(""), &[]).unwrap_err();
        assert!(err.to_string().contains("key_env or key_file"), "{err}");
        let err = load(&with("key_env = \"W2D_TEST_UNSET_KEY\""), &[]).unwrap_err();
        assert!(err.to_string().contains("W2D_TEST_UNSET_KEY"), "{err}");
        let err = load(&with("key = \"inline\""), &[]).unwrap_err();
        assert!(err.to_string().contains("key"), "{err}");
        let key = scratch::Scratch::new("key", "short\n");
        let dir = &key.0;
        let err = load(
            &with(&format!("key_file = {:?}", dir.display().to_string())),
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("at least 16 bytes"), "{err}");
        std::fs::write(dir, "0123456789abcdef0123\n").unwrap();
        let c = load(
            &with(&format!("key_file = {:?}", dir.display().to_string())),
            &[],
        )
        .unwrap();
        assert_eq!(c.tokenize.load_key().unwrap(), b"0123456789abcdef0123");
    }

    #[test]
    fn a_key_or_password_file_that_never_ends_is_refused() {
        // Found by review for the config fuzz target: reading /dev/zero never ended.
        let text = format!(
            "{MINIMAL}\n[tokenize]\ncolumns = [\"public.t.card\"]\nkey_file = \"/dev/zero\"\n"
        );
        let err = load(&text, &[]).unwrap_err();
        assert!(err.to_string().contains("more than 65536 bytes"), "{err}");
        let c = load(MINIMAL, &[]).unwrap();
        let mut source = c.source.clone();
        source.password_file = Some("/dev/zero".into());
        let err = source.effective_dsn().unwrap_err();
        assert!(err.to_string().contains("source.password_file"), "{err}");
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../ops/wal2delta.example.toml");
        let c = load(text, &[]).unwrap();
        assert_eq!(c.source.slot, "wal2delta");
        assert_eq!(c.kafka.positions_topic(), "cdc.positions");
        assert!(c.capture.stream_in_progress);
    }

    #[test]
    fn bronze_settings_are_checked_by_name() {
        let c = load(MINIMAL, &[]).unwrap();
        assert_eq!(c.bronze.max_batch_events, 50_000);
        assert_eq!(c.bronze.max_batch_ms, 1_000);
        assert_eq!(c.bronze.assignment, Assignment::Direct);
        let err = load(
            &format!("{MINIMAL}\n[bronze]\nassignment = \"both\"\n"),
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("bronze.assignment"), "{err}");
        let err = load(&format!("{MINIMAL}\n[bronze]\nmax_batch_ms = 10\n"), &[]).unwrap_err();
        assert!(err.to_string().contains("bronze.max_batch_ms"), "{err}");
        let err = load(
            &format!("{MINIMAL}\n[bronze.consumer]\n\"enable.auto.commit\" = \"true\"\n"),
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("enable.auto.commit"), "{err}");
        let err = load(&MINIMAL.replace("file://", "s3://"), &[]).unwrap_err();
        assert!(err.to_string().contains("bucket"), "{err}");
        let err = load(&MINIMAL.replace("file://", "ftp://"), &[]).unwrap_err();
        assert!(err.to_string().contains("lake.uri"), "{err}");
        let lake = load(
            &MINIMAL.replace("file:///tmp/lake", "s3://bucket/lake"),
            &[
                (
                    "WAL2DELTA__LAKE__STORAGE_OPTIONS__AWS_ENDPOINT_URL",
                    "http://127.0.0.1:9000",
                ),
                ("WAL2DELTA__LAKE__SINGLE_WRITER", "true"),
                ("WAL2DELTA__LAKE__STORAGE_OPTIONS__AWS_ALLOW_HTTP", "true"),
            ],
        )
        .unwrap()
        .lake;
        assert_eq!(
            lake.storage_options
                .get("aws_endpoint_url")
                .map(String::as_str),
            Some("http://127.0.0.1:9000")
        );
        assert!(lake.single_writer);
        assert_eq!(
            lake.storage_options
                .get("aws_allow_http")
                .map(String::as_str),
            Some("true")
        );
    }

    #[test]
    fn word_settings_are_enums_that_name_the_field_and_the_words() {
        let c = load(MINIMAL, &[]).unwrap();
        assert_eq!(c.snapshot.mode, SnapshotMode::Initial);
        assert_eq!(c.source.on_slot_lost, OnSlotLost::Refuse);
        assert_eq!(c.log.format, LogFormat::Text);
        assert_eq!(c.bronze.assignment, Assignment::Direct);
        // The words users write are unchanged, in the file and in the environment.
        let c = load(
            &format!("{MINIMAL}\n[snapshot]\nmode = \"never\"\n[log]\nformat = \"json\"\n"),
            &[
                ("WAL2DELTA__SOURCE__ON_SLOT_LOST", "recreate"),
                ("WAL2DELTA__BRONZE__ASSIGNMENT", "group"),
            ],
        )
        .unwrap();
        assert_eq!(c.snapshot.mode, SnapshotMode::Never);
        assert_eq!(c.source.on_slot_lost, OnSlotLost::Recreate);
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.bronze.assignment, Assignment::Group);
        // Any other word is refused, naming the field and the words it takes.
        for (section, key, words) in [
            ("snapshot", "mode", "`initial` or `never`"),
            ("source", "on_slot_lost", "`refuse` or `recreate`"),
            ("log", "format", "`text` or `json`"),
            ("bronze", "assignment", "`direct` or `group`"),
        ] {
            let text = if section == "source" {
                MINIMAL.replace("[kafka]", &format!("{key} = \"Never\"\n[kafka]"))
            } else {
                format!("{MINIMAL}\n[{section}]\n{key} = \"Never\"\n")
            };
            let err = load(&text, &[]).unwrap_err().to_string();
            assert!(err.contains(&format!("`{section}.{key}`")), "{err}");
            assert!(err.contains(words), "{err}");
            assert!(err.contains("t.toml"), "{err}");
            let var = format!("WAL2DELTA__{}__{}", section, key).to_ascii_uppercase();
            let err = load(MINIMAL, &[(&var, "both")]).unwrap_err().to_string();
            assert!(err.contains(&var), "{err}");
            assert!(err.contains(&format!("`{section}.{key}`")), "{err}");
            assert!(err.contains(words), "{err}");
        }
    }

    #[test]
    fn missing_section_is_named() {
        let err = load("[source]\ndsn = \"postgres://u@h/d\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("kafka"), "{err}");
    }

    #[test]
    fn dsn_is_not_in_debug_output() {
        let c = load(&MINIMAL.replace("replicator@", "replicator:s3cret@"), &[]).unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn tls_settings_are_checked_at_startup_naming_the_field() {
        let with_dsn = |dsn: &str| MINIMAL.replace("postgres://replicator@127.0.0.1:5432/app", dsn);
        let err = load(
            &with_dsn("postgres://replicator:s3cret@h/app?sslmode=verify-full"),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("source.dsn") && err.contains("sslrootcert"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        let err = load(
            &with_dsn(
                "host=h user=u password=s3cret sslmode=verify-ca sslrootcert=/nonexistent/ca.pem",
            ),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("sslrootcert=/nonexistent/ca.pem cannot be read"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        let err = load(&with_dsn("postgres://u@h/app?sslmode=allow"), &[]).unwrap_err();
        assert!(err.to_string().contains("sslmode"), "{err}");
    }

    #[test]
    fn a_password_file_keeps_the_dsn_tls_parameters() {
        let password = scratch::Scratch::new("pw", "pa ss'word\n");
        let dir = &password.0;
        for dsn in [
            "postgres://replicator@127.0.0.1:5432/app?sslmode=require&options=-c%20x%3D1",
            "host=127.0.0.1 user=replicator dbname=app sslmode=require options='-c x=1'",
        ] {
            let c = load(
                &MINIMAL.replace("postgres://replicator@127.0.0.1:5432/app", dsn),
                &[],
            )
            .unwrap();
            let mut source = c.source.clone();
            source.password_file = Some(dir.clone());
            let params = wal2delta_cdc::replication::ConnectParams::from_dsn(
                &source.effective_dsn().unwrap(),
            )
            .unwrap();
            assert_eq!(
                params.password.as_deref(),
                Some(&b"pa ss'word"[..]),
                "{dsn}"
            );
            assert_eq!(
                params.tls.mode(),
                wal2delta_cdc::tls::SslMode::Require,
                "{dsn}"
            );
            assert_eq!(params.options.as_deref(), Some("-c x=1"), "{dsn}");
        }
    }
}
