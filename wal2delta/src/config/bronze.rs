//! `[bronze]`: the Kafka → Bronze stage.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{invalid, ConfigError};

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
    #[serde(default)]
    pub assignment: Assignment,
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
    pub(super) fn default_group_id() -> String {
        "wal2delta-bronze".into()
    }
    /// One second: Bronze's batch is the first wait of every later layer. With the
    /// defaults at 5,000 changes/s it brought Silver's and the rules' p99 under 5 s on a
    /// 2-core machine with room to spare, where 5 s made Bronze alone 5.8 s
    /// (docs/benchmarks.md, "Where issue 42 stands"; not on a saturated machine).
    fn default_max_batch_ms() -> u64 {
        1_000
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

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.group_id.trim().is_empty() {
            return Err(invalid("bronze.group_id", "must not be empty"));
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
        super::kafka_security::refuse_connection_properties(
            "bronze.consumer",
            self.consumer.keys(),
        )?;
        Ok(())
    }
}

impl Default for BronzeConfig {
    fn default() -> Self {
        BronzeConfig {
            group_id: Self::default_group_id(),
            assignment: Assignment::default(),
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

/// `[bronze] assignment`: how a bronze process gets its partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Assignment {
    /// One bronze process reads every partition of every table topic itself.
    #[default]
    Direct,
    /// Bronze processes share the partitions through the consumer group `group_id`.
    Group,
}

impl std::fmt::Display for Assignment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Assignment::Direct => "direct",
            Assignment::Group => "group",
        })
    }
}
