//! `[snapshot]`: reading the rows tables already hold.

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[snapshot]`: reading the rows tables already hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    /// Whether capture snapshots the tables ([`SnapshotMode`]).
    #[serde(default)]
    pub mode: SnapshotMode,
    /// Rows per chunk; progress is recorded per chunk.
    #[serde(default = "SnapshotConfig::default_chunk_rows")]
    pub chunk_rows: usize,
    /// The snapshot pauses while the slot retains more WAL than this.
    #[serde(default = "SnapshotConfig::default_max_retained_wal_bytes")]
    pub max_retained_wal_bytes: u64,
}

impl SnapshotConfig {
    fn default_chunk_rows() -> usize {
        10_000
    }
    /// 1 GiB.
    fn default_max_retained_wal_bytes() -> u64 {
        1 << 30
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.chunk_rows == 0 || self.chunk_rows > 1_000_000 {
            return Err(invalid(
                "snapshot.chunk_rows",
                "must be between 1 and 1000000",
            ));
        }
        Ok(())
    }
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            mode: SnapshotMode::default(),
            chunk_rows: Self::default_chunk_rows(),
            max_retained_wal_bytes: Self::default_max_retained_wal_bytes(),
        }
    }
}

/// `[snapshot] mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Snapshot every captured table once (at the first start, from the slot's exported
    /// snapshot; tables added later when they appear).
    #[default]
    Initial,
    /// Stream only.
    Never,
}
