//! Bronze lag for `wal2delta status`: per table, the events Kafka holds that the Bronze
//! table does not yet (high watermark − stored offset − 1, summed over partitions).

use std::time::Duration;

use serde::Serialize;
use wal2delta_stream::consumer::{high_watermarks, list_topics};

use super::offsets::LakeOffsets;
use crate::config::Config;

#[derive(Debug, Clone, Serialize)]
pub struct TableLag {
    pub table: String,
    pub topic: String,
    /// Events in Kafka not yet in Bronze.
    pub lag_events: i64,
    /// Latest Bronze table version, when the table exists.
    pub version: Option<u64>,
    /// The source table has no primary key: it is kept in Bronze only (append-only
    /// history) and Silver does not hold it.
    pub bronze_only: bool,
    /// Seconds since the table's last commit, when events wait and that is longer than
    /// [`stalled_after`]: no bronze writer is storing this table (none running, or one
    /// its consumer group gave no partitions).
    pub stalled_s: Option<u64>,
}

/// How long a table with waiting events may go without a commit before `status` calls it
/// stalled: ten micro-batches, at least 30 s.
pub fn stalled_after(config: &Config) -> Duration {
    Duration::from_millis(config.bronze.max_batch_ms * 10).max(Duration::from_secs(30))
}

/// The Bronze lag of every table topic.
pub async fn lag(config: &Config) -> Result<Vec<TableLag>, String> {
    let lake = config.lake.open().map_err(|e| e.to_string())?;
    let topics = super::bronze_topics(config);
    let kafka = config.kafka.connection().map_err(|e| e.to_string())?;
    let t = topics.clone();
    let marks = tokio::task::spawn_blocking(move || {
        let timeout = wal2delta_stream::KAFKA_REQUEST_TIMEOUT;
        let topics = list_topics(&kafka, |name| t.table_name(name).is_some(), timeout)?;
        high_watermarks(&kafka, &topics, timeout)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    // One table read per topic, for all its partitions.
    let mut by_topic: std::collections::BTreeMap<String, Vec<(i32, i64)>> = Default::default();
    for (topic, partition, high) in marks {
        by_topic.entry(topic).or_default().push((partition, high));
    }
    let mut out: Vec<TableLag> = Vec::new();
    for (topic, parts) in by_topic {
        let Some(mut table) = LakeOffsets::table_for(&lake, &topics, &topic) else {
            continue;
        };
        let ids: Vec<i32> = parts.iter().map(|(p, _)| *p).collect();
        let stored = table
            .stored_offsets(&topic, &ids)
            .await
            .map_err(|e| e.to_string())?;
        let lag_events: i64 = parts
            .iter()
            .map(|(p, high)| {
                let next = stored.get(p).copied().flatten().map_or(0, |s| s + 1);
                (high - next).max(0)
            })
            .sum();
        out.push(TableLag {
            table: table.name().to_owned(),
            topic,
            lag_events,
            version: table.version(),
            bronze_only: table.has_key() == Some(false),
            stalled_s: table
                .last_commit_age()
                .await
                .filter(|age| lag_events > 0 && *age > stalled_after(config))
                .map(|age| age.as_secs()),
        });
    }
    Ok(out)
}
