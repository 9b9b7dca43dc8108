//! `[log]`: the log format and level.

use serde::Deserialize;

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// How each line is written ([`LogFormat`]).
    #[serde(default)]
    pub format: LogFormat,
    /// A tracing filter such as `info` or `wal2delta=debug,info`; `RUST_LOG` wins if set.
    #[serde(default = "LogConfig::default_level")]
    pub level: String,
}

impl LogConfig {
    fn default_level() -> String {
        "info".into()
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::default(),
            level: Self::default_level(),
        }
    }
}

/// `[log] format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}
