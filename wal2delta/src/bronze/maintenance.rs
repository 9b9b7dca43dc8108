//! Scheduled compaction and checkpoints of the Bronze tables, beside ingestion.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use wal2delta_lake::maintenance::maintain;
use wal2delta_lake::Lake;

use crate::config::Config;
use crate::metrics as m;

/// Starts the maintenance task (`None` when `[bronze] maintenance_interval_s = 0`).
pub fn spawn(
    config: &Config,
    lake: Lake,
    mut shutdown: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let interval = config.bronze.maintenance_interval_s;
    if interval == 0 {
        return None;
    }
    let target = config.bronze.target_file_bytes;
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(interval));
        tick.tick().await; // the first tick is immediate: wait one interval first
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            for (schema, table, url) in lake.bronze_tables() {
                let name = format!("{schema}.{table}");
                let started = std::time::Instant::now();
                // In a task of its own: a panic in the writer (compaction rewrites files and
                // their statistics) fails this table's maintenance, not the loop.
                let task = {
                    let name = name.clone();
                    tokio::spawn(async move { maintain(&name, &url, target).await })
                };
                let outcome = match task.await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(e) => Err(format!("maintenance task ended: {e}")),
                };
                match outcome {
                    Ok(r) => {
                        metrics::counter!(m::LAKE_FILES_COMPACTED, "table" => name.clone())
                            .increment(r.files_removed);
                        // At 0 once the table was maintained, so an alert on its increase
                        // sees the first failure.
                        metrics::counter!(m::LAKE_MAINTENANCE_FAILURES, "table" => name.clone())
                            .increment(0);
                        tracing::info!(table = %name, files_removed = r.files_removed, files_added = r.files_added, checkpoint = ?r.checkpoint_version, ms = started.elapsed().as_millis() as u64, "Bronze table compacted and checkpointed");
                    }
                    Err(e) => {
                        metrics::counter!(m::LAKE_MAINTENANCE_FAILURES, "table" => name.clone())
                            .increment(1);
                        tracing::warn!(table = %name, error = %e, "Bronze maintenance failed; ingestion is not affected, retrying next interval");
                    }
                }
            }
        }
    }))
}
