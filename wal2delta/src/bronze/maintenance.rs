//! Scheduled compaction and checkpoints of the Bronze tables and the transaction records,
//! beside ingestion.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use wal2delta_lake::Lake;

use super::offsets::TRANSACTIONS_TABLE;
use crate::config::Config;
use crate::maintenance::maintain_tables;

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
    let retention = config.lake.log_retention();
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(interval));
        tick.tick().await; // the first tick is immediate: wait one interval first
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let tables = match lake.bronze_tables().await {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "Bronze maintenance skipped this interval: cannot list the Bronze tables");
                    continue;
                }
            };
            // The transaction records too: Bronze appends to them with every batch that
            // carries a transaction's END, and Silver reads them every round.
            let tables = tables
                .into_iter()
                .map(|(schema, table, url)| (format!("{schema}.{table}"), url))
                .chain([(TRANSACTIONS_TABLE.to_owned(), lake.bronze_transactions())])
                .collect();
            maintain_tables("bronze", tables, target, retention).await;
        }
    }))
}
