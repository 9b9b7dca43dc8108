//! The configuration file, its environment overrides and its validation.
//!
//! Loaded once at startup: TOML from `--config`, then every `WAL2DELTA__SECTION__KEY`
//! environment variable overrides `[section] key`, then [`Config::validate`] checks each
//! field. Unknown keys, in the file or the environment, are errors that name the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod gold;
pub mod path;
mod rules;
mod silver;

pub use gold::GoldConfig;
pub use rules::RulesConfig;
pub use silver::{Policies, SilverConfig};
use wal2delta_model::TableName;

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

/// `[bronze]`: the Kafka → Bronze stage. Offsets live in the Bronze tables' Delta commits;
/// the consumer group only shares partitions between bronze processes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BronzeConfig {
    /// Consumer group shared by every `wal2delta run --stage bronze` process (used with
    /// `assignment = "group"`).
    #[serde(default = "BronzeConfig::default_group_id")]
    pub group_id: String,
    /// How this process gets its partitions. `direct` (the default): it reads every
    /// partition of every table topic itself, with no consumer group, so a restart after a
    /// crash never waits for the broker to forget the old member (tansu never does). Use
    /// `group` when several bronze processes share the topics through `group_id`.
    #[serde(default = "BronzeConfig::default_assignment")]
    pub assignment: String,
    /// A micro-batch is committed after this long, or when it reaches
    /// `max_batch_events` events or `max_batch_bytes` bytes of payload, whichever is first.
    #[serde(default = "BronzeConfig::default_max_batch_ms")]
    pub max_batch_ms: u64,
    #[serde(default = "BronzeConfig::default_max_batch_events")]
    pub max_batch_events: usize,
    #[serde(default = "BronzeConfig::default_max_batch_bytes")]
    pub max_batch_bytes: usize,
    /// How often new table topics are discovered, in milliseconds.
    #[serde(default = "BronzeConfig::default_topic_refresh_ms")]
    pub topic_refresh_ms: u64,
    /// Seconds between compaction + checkpoint passes over the Bronze tables; 0 disables.
    #[serde(default = "BronzeConfig::default_maintenance_interval_s")]
    pub maintenance_interval_s: u64,
    /// Target size of the files compaction writes.
    #[serde(default = "BronzeConfig::default_target_file_bytes")]
    pub target_file_bytes: u64,
    /// Extra librdkafka consumer properties. `group.id`, `bootstrap.servers`, the
    /// offset-commit settings and the (eager) assignment strategy are fixed and refused here.
    #[serde(default)]
    pub consumer: BTreeMap<String, String>,
}

impl BronzeConfig {
    fn default_group_id() -> String {
        "wal2delta-bronze".into()
    }
    fn default_assignment() -> String {
        "direct".into()
    }
    fn default_max_batch_ms() -> u64 {
        5_000
    }
    fn default_max_batch_events() -> usize {
        50_000
    }
    /// 64 MiB.
    fn default_max_batch_bytes() -> usize {
        64 << 20
    }
    fn default_topic_refresh_ms() -> u64 {
        10_000
    }
    fn default_maintenance_interval_s() -> u64 {
        3_600
    }
    /// 128 MiB.
    fn default_target_file_bytes() -> u64 {
        128 << 20
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.group_id.trim().is_empty() {
            return Err(invalid("bronze.group_id", "must not be empty"));
        }
        if !matches!(self.assignment.as_str(), "direct" | "group") {
            return Err(invalid(
                "bronze.assignment",
                "must be \"direct\" (one bronze process reads every partition) or \"group\" (processes share them through group_id)",
            ));
        }
        if !(50..=600_000).contains(&self.max_batch_ms) {
            return Err(invalid(
                "bronze.max_batch_ms",
                "must be between 50 and 600000",
            ));
        }
        if self.max_batch_events == 0 {
            return Err(invalid("bronze.max_batch_events", "must be greater than 0"));
        }
        if self.max_batch_bytes < 1024 {
            return Err(invalid("bronze.max_batch_bytes", "must be at least 1024"));
        }
        if !(100..=3_600_000).contains(&self.topic_refresh_ms) {
            return Err(invalid(
                "bronze.topic_refresh_ms",
                "must be between 100 and 3600000",
            ));
        }
        if self.target_file_bytes < (1 << 20) {
            return Err(invalid(
                "bronze.target_file_bytes",
                "must be at least 1048576 (1 MiB)",
            ));
        }
        for fixed in [
            "group.id",
            "bootstrap.servers",
            "enable.auto.commit",
            "enable.auto.offset.store",
            "auto.offset.reset",
            "partition.assignment.strategy",
        ] {
            if self.consumer.contains_key(fixed) {
                return Err(invalid(
                    &format!("bronze.consumer.\"{fixed}\""),
                    "is fixed by wal2delta (offsets live in the Bronze tables) and cannot be set",
                ));
            }
        }
        Ok(())
    }
}

impl Default for BronzeConfig {
    fn default() -> Self {
        BronzeConfig {
            group_id: Self::default_group_id(),
            assignment: Self::default_assignment(),
            max_batch_ms: Self::default_max_batch_ms(),
            max_batch_events: Self::default_max_batch_events(),
            max_batch_bytes: Self::default_max_batch_bytes(),
            topic_refresh_ms: Self::default_topic_refresh_ms(),
            maintenance_interval_s: Self::default_maintenance_interval_s(),
            target_file_bytes: Self::default_target_file_bytes(),
            consumer: BTreeMap::new(),
        }
    }
}

/// `[snapshot]`: reading the rows tables already hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    /// `initial`: snapshot every captured table once (at the first start, from the slot's
    /// exported snapshot; tables added later when they appear). `never`: stream only.
    #[serde(default = "SnapshotConfig::default_mode")]
    pub mode: String,
    /// Rows per chunk; progress is recorded per chunk.
    #[serde(default = "SnapshotConfig::default_chunk_rows")]
    pub chunk_rows: usize,
    /// The snapshot pauses while the slot retains more WAL than this.
    #[serde(default = "SnapshotConfig::default_max_retained_wal_bytes")]
    pub max_retained_wal_bytes: u64,
}

impl SnapshotConfig {
    fn default_mode() -> String {
        "initial".into()
    }
    fn default_chunk_rows() -> usize {
        10_000
    }
    /// 1 GiB.
    fn default_max_retained_wal_bytes() -> u64 {
        1 << 30
    }
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            mode: Self::default_mode(),
            chunk_rows: Self::default_chunk_rows(),
            max_retained_wal_bytes: Self::default_max_retained_wal_bytes(),
        }
    }
}

/// `[tokenize]`: sensitive columns replaced by keyed deterministic tokens before any
/// event leaves capture. The key is read from `key_env` or `key_file`, never from here.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeConfig {
    /// `schema.table.column`, with `:last4` to keep the last four characters.
    #[serde(default)]
    pub columns: Vec<String>,
    /// Environment variable holding the key (at least 16 bytes).
    #[serde(default)]
    pub key_env: Option<String>,
    /// File holding the key (at least 16 bytes; one trailing newline is ignored).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Identifier of the key, written in every tokenized event; change it when the key
    /// rotates.
    #[serde(default = "TokenizeConfig::default_key_id")]
    pub key_id: String,
}

impl TokenizeConfig {
    fn default_key_id() -> String {
        "k1".into()
    }

    /// Reads the key from the environment or the file.
    pub fn load_key(&self) -> Result<Vec<u8>, ConfigError> {
        load_key(
            "tokenize",
            self.key_env.as_deref(),
            self.key_file.as_deref(),
        )
    }

    /// An entry's table, column and whether it keeps the last four characters; `None`
    /// when it is not `schema.table.column[:last4]` (parts as in [`path`]).
    pub fn entry(&self, spec: &str) -> Option<(TableName, String, bool)> {
        let (p, keep_last) = match spec.strip_suffix(":last4") {
            Some(p) => (p, true),
            None => (spec, false),
        };
        let mut parts = path::parse(p, 3)?;
        let column = parts.pop()?;
        Some((TableName::new(&parts[0], &parts[1]), column, keep_last))
    }

    /// Refuses an entry naming a table or column the source does not publish (`catalog`:
    /// the published tables with their columns): such an entry would tokenize nothing and
    /// raw values would leave capture.
    pub fn check_names(
        &self,
        catalog: &BTreeMap<TableName, Vec<String>>,
    ) -> Result<(), ConfigError> {
        for spec in &self.columns {
            let Some((table, column, _)) = self.entry(spec) else {
                continue; // validate() refused it already
            };
            let Some(columns) = catalog.get(&table) else {
                return Err(invalid(
                    "tokenize.columns",
                    format!("entry {spec:?} names the table {}, which is not among the published tables (a table that does not exist yet is an error too: create it and run `wal2delta setup` first)", table.quoted()),
                ));
            };
            if !columns.contains(&column) {
                return Err(invalid(
                    "tokenize.columns",
                    format!(
                        "entry {spec:?} names the column {}, which the table {} does not have",
                        wal2delta_model::table::quote_ident(&column),
                        table.quoted()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.columns.is_empty() {
            return Ok(());
        }
        for c in &self.columns {
            if self.entry(c).is_none() {
                return Err(invalid(
                    "tokenize.columns",
                    format!("entry {c:?} must look like schema.table.column[:last4]"),
                ));
            }
        }
        if self.key_id.is_empty()
            || !self
                .key_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "tokenize.key_id",
                "must be non-empty and use only letters, digits, '.', '_' and '-'",
            ));
        }
        self.load_key().map(|_| ())
    }
}

/// Reads a secret key from the environment variable `{section}.key_env` names or the file
/// `{section}.key_file` names (exactly one; at least 16 bytes; one trailing newline of a
/// file is ignored). Keys never live in the config file itself.
pub(crate) fn load_key(
    section: &str,
    env: Option<&str>,
    file: Option<&Path>,
) -> Result<Vec<u8>, ConfigError> {
    const MIN_KEY_BYTES: usize = 16;
    let (field, key) = match (env, file) {
        (Some(var), None) => {
            let field = format!("{section}.key_env");
            let key = std::env::var(var)
                .map_err(|_| invalid(&field, format!("names {var:?}, which is not set")))?
                .into_bytes();
            (field, key)
        }
        (None, Some(path)) => {
            let field = format!("{section}.key_file");
            let mut bytes = read_small_file(path, &field)?;
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            (field, bytes)
        }
        _ => {
            return Err(invalid(
                section,
                "needs exactly one of key_env or key_file when columns are listed",
            ))
        }
    };
    if key.len() < MIN_KEY_BYTES {
        return Err(invalid(
            &field,
            format!("key must be at least {MIN_KEY_BYTES} bytes"),
        ));
    }
    Ok(key)
}

/// The most a key or password file may hold. Keys and passwords are short; the bound
/// keeps a config naming the wrong file (a log, a device such as `/dev/zero`) from
/// reading without end.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Reads a key or password file of at most [`MAX_SECRET_FILE_BYTES`] bytes.
fn read_small_file(path: &Path, field: &str) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    let cannot =
        |e: std::io::Error| invalid(field, format!("cannot be read ({}): {e}", path.display()));
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(invalid(
            field,
            format!(
                "names {}, which holds more than {MAX_SECRET_FILE_BYTES} bytes: name the file that holds only the secret",
                path.display()
            ),
        ));
    }
    Ok(bytes)
}

/// `[source]`: the PostgreSQL database to capture.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// libpq-style DSN of a role with the REPLICATION attribute. May carry the password;
    /// it is never logged.
    pub dsn: String,
    /// A file whose first line is the password, used when the DSN has none.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    #[serde(default = "SourceConfig::default_slot")]
    pub slot: String,
    #[serde(default = "SourceConfig::default_publication")]
    pub publication: String,
    /// `schema.table` patterns; `*` matches any run of characters.
    #[serde(default = "SourceConfig::default_tables")]
    pub tables: Vec<String>,
    /// What capture does when its slot is invalidated or was dropped: `refuse` (stop and
    /// say so) or `recreate` (re-create it and snapshot every table again).
    #[serde(default = "SourceConfig::default_on_slot_lost")]
    pub on_slot_lost: String,
}

impl std::fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceConfig")
            .field("dsn", &"<redacted>")
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

impl SourceConfig {
    fn default_slot() -> String {
        "wal2delta".into()
    }
    fn default_publication() -> String {
        "wal2delta".into()
    }
    fn default_tables() -> Vec<String> {
        vec!["public.*".into()]
    }
    fn default_on_slot_lost() -> String {
        "refuse".into()
    }

    /// The DSN with the password from `password_file` added when the DSN has none.
    pub fn effective_dsn(&self) -> Result<String, ConfigError> {
        let Some(path) = &self.password_file else {
            return Ok(self.dsn.clone());
        };
        let bytes = read_small_file(path, "source.password_file")?;
        let text = String::from_utf8(bytes).map_err(|_| {
            invalid(
                "source.password_file",
                format!("cannot be read ({}): it is not UTF-8", path.display()),
            )
        })?;
        let password = text.lines().next().unwrap_or("").to_owned();
        let mut config: tokio_postgres::Config = self
            .dsn
            .parse()
            .map_err(|e| invalid("source.dsn", format!("is not a valid PostgreSQL DSN: {e}")))?;
        if config.get_password().is_none() {
            config.password(password);
        }
        Ok(dsn_from_config(&config))
    }
}

fn dsn_from_config(c: &tokio_postgres::Config) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut parts = Vec::new();
    if let Some(tokio_postgres::config::Host::Tcp(h)) = c.get_hosts().first() {
        parts.push(format!("host={}", quote(h)));
    }
    if let Some(p) = c.get_ports().first() {
        parts.push(format!("port={p}"));
    }
    if let Some(u) = c.get_user() {
        parts.push(format!("user={}", quote(u)));
    }
    if let Some(d) = c.get_dbname() {
        parts.push(format!("dbname={}", quote(d)));
    }
    if let Some(pw) = c.get_password() {
        parts.push(format!("password={}", quote(&String::from_utf8_lossy(pw))));
    }
    parts.join(" ")
}

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

/// `[schema_registry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    pub url: String,
}

/// `[lake]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LakeConfig {
    pub uri: String,
}

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    #[serde(default = "MetricsConfig::default_listen")]
    pub listen: String,
}

impl MetricsConfig {
    fn default_listen() -> String {
        "127.0.0.1:9187".into()
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: Self::default_listen(),
        }
    }
}

/// `[capture]`: tuning of the capture stage. The defaults suit most databases.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// Minimum time between standby status updates sent to PostgreSQL, in milliseconds.
    /// Keepalives that ask for a reply are always answered at once.
    #[serde(default = "CaptureConfig::default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// At most this many events may wait for Kafka acknowledgement; reading the slot
    /// pauses beyond it, which bounds memory.
    #[serde(default = "CaptureConfig::default_max_in_flight")]
    pub max_in_flight: usize,
    /// Interval of heartbeat messages (`pg_logical_emit_message`) written to the source so
    /// the slot keeps moving on an idle database; 0 disables them.
    #[serde(default = "CaptureConfig::default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// Ask PostgreSQL (14+) to stream large transactions while in progress (pgoutput
    /// protocol 2) instead of spilling them to disk on the primary.
    #[serde(default = "CaptureConfig::default_stream_in_progress")]
    pub stream_in_progress: bool,
    /// Where streamed transactions are buffered until their commit (scratch files, safe to
    /// delete when capture is stopped). Default: `$TMPDIR/wal2delta-{slot}`.
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
    /// Memory for buffered streamed transactions before they go to `spill_dir`.
    #[serde(default = "CaptureConfig::default_stream_memory_bytes")]
    pub stream_memory_bytes: usize,
}

impl CaptureConfig {
    fn default_status_interval_ms() -> u64 {
        1_000
    }
    fn default_max_in_flight() -> usize {
        50_000
    }
    fn default_heartbeat_interval_ms() -> u64 {
        10_000
    }
    fn default_stream_in_progress() -> bool {
        true
    }
    /// 64 MiB: large enough that most streamed transactions never touch the disk.
    fn default_stream_memory_bytes() -> usize {
        64 * 1024 * 1024
    }

    /// The directory for streamed transactions of `slot`.
    pub fn spill_dir(&self, slot: &str) -> PathBuf {
        self.spill_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("wal2delta-{slot}")))
    }
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            status_interval_ms: Self::default_status_interval_ms(),
            max_in_flight: Self::default_max_in_flight(),
            heartbeat_interval_ms: Self::default_heartbeat_interval_ms(),
            stream_in_progress: Self::default_stream_in_progress(),
            spill_dir: None,
            stream_memory_bytes: Self::default_stream_memory_bytes(),
        }
    }
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    #[serde(default = "LogConfig::default_format")]
    pub format: String,
    /// A tracing filter such as `info` or `wal2delta=debug,info`; `RUST_LOG` wins if set.
    #[serde(default = "LogConfig::default_level")]
    pub level: String,
}

impl LogConfig {
    fn default_format() -> String {
        "text".into()
    }
    fn default_level() -> String {
        "info".into()
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: Self::default_format(),
            level: Self::default_level(),
        }
    }
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
            let (section, key) = rest
                .split_once("__")
                .filter(|(s, k)| !s.is_empty() && !k.is_empty() && !k.contains("__"))
                .ok_or_else(|| ConfigError::Env {
                    var: var.clone(),
                    message: "expected WAL2DELTA__SECTION__KEY".into(),
                })?;
            let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
            let table = root
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .ok_or_else(|| ConfigError::Env {
                    var: var.clone(),
                    message: format!("[{section}] is not a table"),
                })?;
            table.insert(key.clone(), env_value(&value));
            overridden.push((key, var.clone()));
        }
        let config: Config =
            toml::Value::Table(root)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    let message = e.message().to_owned();
                    // An unknown key that came from the environment is reported under its variable.
                    let from_env = overridden
                        .iter()
                        .find(|(key, _)| message.contains(&format!("unknown field `{key}`")));
                    match from_env {
                        Some((_, var)) => ConfigError::Env {
                            var: var.clone(),
                            message,
                        },
                        None => parse_err(message),
                    }
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every field once, so that a bad value fails at startup with its name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.source;
        if s.dsn.trim().is_empty() {
            return Err(invalid(
                "source.dsn",
                "must not be empty (e.g. postgres://replicator@127.0.0.1:5432/app)",
            ));
        }
        let pg: tokio_postgres::Config = s
            .dsn
            .parse()
            .map_err(|e| invalid("source.dsn", format!("is not a valid PostgreSQL DSN: {e}")))?;
        if pg.get_user().is_none() {
            return Err(invalid("source.dsn", "must name a user"));
        }
        for (field, name) in [
            ("source.slot", &s.slot),
            ("source.publication", &s.publication),
        ] {
            if name.is_empty()
                || name.len() > 63
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(invalid(
                    field,
                    "must be 1 to 63 characters of a-z, 0-9 and _",
                ));
            }
        }
        if s.tables.is_empty() {
            return Err(invalid(
                "source.tables",
                "must list at least one schema.table pattern",
            ));
        }
        for t in &s.tables {
            match t.split_once('.') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() => {}
                _ => {
                    return Err(invalid(
                        "source.tables",
                        format!("entry {t:?} must look like schema.table (patterns may use *)"),
                    ))
                }
            }
        }
        let k = &self.kafka;
        if k.brokers.trim().is_empty() {
            return Err(invalid(
                "kafka.brokers",
                "must not be empty (host:port[,host:port])",
            ));
        }
        if k.topic_prefix.is_empty()
            || !k
                .topic_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "kafka.topic_prefix",
                "must be non-empty and use only a-z, A-Z, 0-9, '.', '_' and '-'",
            ));
        }
        if k.topic_prefix.len() > wal2delta_model::names::MAX_TOPIC_PREFIX {
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
        if !(1..=10_000).contains(&k.topic_partitions) {
            return Err(invalid(
                "kafka.topic_partitions",
                "must be between 1 and 10000",
            ));
        }
        if k.delivery_timeout_ms < 1_000 {
            return Err(invalid(
                "kafka.delivery_timeout_ms",
                "must be at least 1000",
            ));
        }
        if !(1_000..=1_000_000_000).contains(&k.message_max_bytes) {
            return Err(invalid(
                "kafka.message_max_bytes",
                "must be between 1000 and 1000000000 (librdkafka's range for message.max.bytes)",
            ));
        }
        if k.producer.contains_key("message.max.bytes") {
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
            if k.producer.contains_key(fixed) {
                return Err(invalid(
                    &format!("kafka.producer.\"{fixed}\""),
                    "is fixed by wal2delta (acks=all, idempotent) and cannot be set",
                ));
            }
        }
        let url = &self.schema_registry.url;
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
            return Err(invalid(
                "schema_registry.url",
                "must be an http:// or https:// URL",
            ));
        }
        let lake = &self.lake.uri;
        if !lake.starts_with("file:///") {
            return Err(invalid(
                "lake.uri",
                "must be a file:///absolute/path URI (object stores such as s3:// are not built into this release)",
            ));
        }
        self.metrics
            .listen
            .parse::<SocketAddr>()
            .map_err(|_| invalid("metrics.listen", "must be an address like 127.0.0.1:9187"))?;
        if self.capture.status_interval_ms == 0 || self.capture.status_interval_ms > 60_000 {
            return Err(invalid(
                "capture.status_interval_ms",
                "must be between 1 and 60000",
            ));
        }
        if self.capture.max_in_flight == 0 {
            return Err(invalid("capture.max_in_flight", "must be greater than 0"));
        }
        self.tokenize.validate()?;
        if !matches!(&self.snapshot.mode[..], "initial" | "never") {
            return Err(invalid("snapshot.mode", "must be \"initial\" or \"never\""));
        }
        if self.snapshot.chunk_rows == 0 || self.snapshot.chunk_rows > 1_000_000 {
            return Err(invalid(
                "snapshot.chunk_rows",
                "must be between 1 and 1000000",
            ));
        }
        if !matches!(&self.source.on_slot_lost[..], "refuse" | "recreate") {
            return Err(invalid(
                "source.on_slot_lost",
                "must be \"refuse\" or \"recreate\"",
            ));
        }
        if !matches!(&self.log.format[..], "text" | "json") {
            return Err(invalid("log.format", "must be \"text\" or \"json\""));
        }
        self.bronze.validate()?;
        self.silver.validate()?;
        self.gold.validate()?;
        self.rules.validate()?;
        Ok(())
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
        assert_eq!(c.metrics.listen, "127.0.0.1:9187");
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
        let dir = std::env::temp_dir().join(format!("w2d-key-{}", std::process::id()));
        std::fs::write(&dir, "short\n").unwrap();
        let err = load(
            &with(&format!("key_file = {:?}", dir.display().to_string())),
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("at least 16 bytes"), "{err}");
        std::fs::write(&dir, "0123456789abcdef0123\n").unwrap();
        let c = load(
            &with(&format!("key_file = {:?}", dir.display().to_string())),
            &[],
        )
        .unwrap();
        assert_eq!(c.tokenize.load_key().unwrap(), b"0123456789abcdef0123");
        let _ = std::fs::remove_file(dir);
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
        assert_eq!(c.bronze.assignment, "direct");
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
        assert!(err.to_string().contains("lake.uri"), "{err}");
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
}
