//! `[gold]`: SQL models over Silver (docs/gold.md).

use std::path::PathBuf;

use serde::Deserialize;

use super::{invalid, ConfigError};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GoldConfig {
    /// The directory of model files (`{name}.sql`); the gold stage runs only when set.
    pub models_dir: Option<PathBuf>,
    /// How often the stage looks for changed inputs.
    pub interval_ms: u64,
    /// Seconds between compaction + checkpoint passes over the Gold tables (run between
    /// refreshes); 0 disables.
    pub maintenance_interval_s: u64,
    /// Target size of the files compaction writes.
    pub target_file_bytes: u64,
}

impl Default for GoldConfig {
    fn default() -> Self {
        GoldConfig {
            models_dir: None,
            interval_ms: 5_000,
            maintenance_interval_s: 3_600,
            target_file_bytes: 64 << 20,
        }
    }
}

impl GoldConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.interval_ms == 0 {
            return Err(invalid("gold.interval_ms", "must be at least 1"));
        }
        if self.target_file_bytes < (1 << 20) {
            return Err(invalid(
                "gold.target_file_bytes",
                "must be at least 1048576 (1 MiB)",
            ));
        }
        if let Some(dir) = &self.models_dir {
            if !dir.is_dir() {
                return Err(invalid(
                    "gold.models_dir",
                    format!("{} is not a directory", dir.display()),
                ));
            }
        }
        Ok(())
    }
}
