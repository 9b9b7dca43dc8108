//! The silver stage: Bronze → Silver, one round every `[silver] interval_ms`.
//!
//! Each round reads the transaction records once (END counts and watermarks above the
//! lowest Silver watermark), then applies every table in turn (`wal2delta_lake::silver`).
//! A table's failure is logged and counted and the table is retried next round; the other
//! tables go on. Progress lives in the Silver tables' commits, so a killed stage resumes
//! where its last commit left off.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use tokio::sync::watch;
use wal2delta_lake::silver::{transaction_counts, SilverTable, TransactionCounts};
use wal2delta_lake::{Lake, LakeError};

use crate::config::Config;
use crate::metrics as m;

pub async fn run(config: &Config, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let lake = Lake::new(&config.lake.uri).map_err(|e| anyhow!("{e} ([lake] uri)"))?;
    let mut tables: HashMap<String, SilverTable> = HashMap::new();
    let mut watermarks: HashMap<String, i64> = HashMap::new();
    let every = Duration::from_millis(config.silver.interval_ms.max(10));
    tracing::info!("silver stage started");
    loop {
        if *shutdown.borrow() {
            break;
        }
        let started = Instant::now();
        if let Err(e) = round(config, &lake, &mut tables, &mut watermarks).await {
            tracing::warn!(error = %e, "silver round failed; retrying next round");
        }
        let rest = every.saturating_sub(started.elapsed());
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(rest) => {}
        }
    }
    tracing::info!("silver stage stopped");
    Ok(())
}

/// Applies every Bronze table once.
async fn round(
    config: &Config,
    lake: &Lake,
    tables: &mut HashMap<String, SilverTable>,
    watermarks: &mut HashMap<String, i64>,
) -> Result<(), LakeError> {
    let window = config.silver.max_rows_per_partition;
    let mut names = Vec::new();
    for (schema, table, _) in lake.bronze_tables() {
        let name = format!("{schema}.{table}");
        if !tables.contains_key(&name) {
            let t = SilverTable::new(lake, &schema, &table, window);
            watermarks.insert(name.clone(), t.progress().await?.watermark);
            tables.insert(name.clone(), t);
        }
        names.push(name);
    }
    if names.is_empty() {
        return Ok(());
    }
    let lowest = names
        .iter()
        .filter_map(|n| watermarks.get(n))
        .copied()
        .min()
        .unwrap_or(0);
    let (top, counts) = transaction_counts(lake, lowest).await?;
    for name in names {
        let Some(table) = tables.get_mut(&name) else {
            continue;
        };
        let counts = counts.get(&name).cloned().unwrap_or(TransactionCounts {
            top,
            events: Default::default(),
        });
        let started = Instant::now();
        match table.apply(&counts).await {
            Ok(r) => {
                watermarks.insert(name.clone(), r.watermark);
                metrics::counter!(m::SILVER_UPSERTS, "table" => name.clone())
                    .increment(r.upserts as u64);
                metrics::counter!(m::SILVER_DELETES, "table" => name.clone())
                    .increment(r.deletes as u64);
                metrics::gauge!(m::SILVER_WATERMARK_LSN, "table" => name.clone())
                    .set(r.watermark as f64);
                metrics::gauge!(m::SILVER_WAITING_TRANSACTIONS, "table" => name.clone())
                    .set(r.waiting as f64);
                metrics::histogram!(m::SILVER_ROUND_SECONDS, "table" => name.clone())
                    .record(started.elapsed().as_secs_f64());
                if let Some(v) = r.version {
                    tracing::debug!(table = %name, version = v, read = r.read, upserts = r.upserts, deletes = r.deletes, waiting = r.waiting, watermark = r.watermark, "silver commit");
                }
            }
            Err(e) => {
                let class = format!("{:?}", e.class()).to_lowercase();
                metrics::counter!(m::SILVER_ERRORS, "table" => name.clone(), "class" => class)
                    .increment(1);
                tracing::warn!(table = %name, error = %e, "silver round of the table failed; retrying next round");
            }
        }
    }
    Ok(())
}
