//! The silver stage: Bronze → Silver, one round every `[silver] interval_ms`.
//!
//! Each round reads the transaction records once (END counts and watermarks above the
//! lowest Silver watermark), then applies every table in turn (`wal2delta_lake::silver`).
//! A table's failure is logged and counted and the table is retried next round; the other
//! tables go on. Progress lives in the Silver tables' commits, so a killed stage resumes
//! where its last commit left off.

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub mod replay;

use anyhow::anyhow;
use tokio::sync::watch;
use wal2delta_lake::silver::{transaction_counts, SilverTable, TransactionCounts};
use wal2delta_lake::{Lake, LakeError};

use crate::config::{Config, Policies};
use crate::metrics as m;

/// `policies`: the masking and checks resolved against the source at startup
/// ([`crate::policies`]).
pub async fn run(
    config: &Config,
    policies: Policies,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let lake = Lake::new(&config.lake.uri).map_err(|e| anyhow!("{e} ([lake] uri)"))?;
    let mut tables: HashMap<String, Tracked> = HashMap::new();
    let mut watermarks: HashMap<String, i64> = HashMap::new();
    let mut keyless: HashMap<String, Instant> = HashMap::new();
    let every = Duration::from_millis(config.silver.interval_ms.max(10));
    tracing::info!("silver stage started");
    let mut counted: Option<Instant> = None;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let started = Instant::now();
        if let Err(e) = round(
            config,
            &policies,
            &lake,
            &mut tables,
            &mut watermarks,
            &mut keyless,
        )
        .await
        {
            tracing::warn!(error = %e, "silver round failed; retrying next round");
        }
        if counted.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
            counted = Some(Instant::now());
            match crate::quarantine::open_counts(&lake).await {
                Ok(counts) => {
                    for stage in ["bronze", "silver"] {
                        metrics::gauge!(m::QUARANTINE_OPEN, "stage" => stage)
                            .set(counts.get(stage).copied().unwrap_or(0) as f64);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot count open quarantine records"),
            }
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

/// A Silver table the stage works on, and when its tombstones were last pruned.
struct Tracked {
    table: SilverTable,
    pruned: Option<Instant>,
}

const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// How often a Bronze table without a `key` column is looked at again (it gains one when
/// its source table gains a primary key).
const KEYLESS_RECHECK: Duration = Duration::from_secs(60);

/// The Silver table of `schema.table` (identity parts, as in the lake) with its masking
/// and checks.
pub fn silver_table(
    config: &Config,
    policies: &Policies,
    lake: &Lake,
    schema: &str,
    table: &str,
) -> SilverTable {
    let policy = policies.of(&format!("{schema}.{table}"));
    SilverTable::new(lake, schema, table, config.silver.max_rows_per_partition)
        .with_policy(policy.masking, policy.checks)
}

/// Opens a table for the stage. When the masking its last commit recorded differs from
/// the config, the table is rebuilt from Bronze under the new policies and the files of
/// earlier versions are deleted, so no file keeps values masked the old way.
async fn open_table(
    config: &Config,
    policies: &Policies,
    lake: &Lake,
    schema: &str,
    table: &str,
) -> anyhow::Result<SilverTable> {
    let mut t = silver_table(config, policies, lake, schema, table);
    let wanted = t.masking_description();
    let recorded = t.recorded_masking().await?;
    let exists = t.progress().await? != Default::default();
    let empty = serde_json::json!({});
    if exists && recorded.as_ref().unwrap_or(&empty) != &wanted {
        tracing::warn!(table = %t.name(), from = %recorded.unwrap_or(empty), to = %wanted, "masking policy changed: rebuilding the Silver table from Bronze");
        let r = t.rebuild(lake, schema, table).await?;
        let purged = t.purge_history().await?;
        tracing::info!(table = %t.name(), rows = r.rows, version = ?r.version, files_deleted = purged, "Silver table rebuilt under the new masking policy");
    }
    Ok(t)
}

/// Applies every Bronze table once.
async fn round(
    config: &Config,
    policies: &Policies,
    lake: &Lake,
    tables: &mut HashMap<String, Tracked>,
    watermarks: &mut HashMap<String, i64>,
    keyless: &mut HashMap<String, Instant>,
) -> Result<(), LakeError> {
    let mut names = Vec::new();
    for (schema, table, url) in lake.bronze_tables() {
        let name = format!("{schema}.{table}");
        if !tables.contains_key(&name) {
            // Silver merges by primary key: a table without one (its Bronze rows have no
            // `key`) is kept in Bronze only, as append-only history.
            if keyless
                .get(&name)
                .is_some_and(|at| at.elapsed() < KEYLESS_RECHECK)
            {
                continue;
            }
            match wal2delta_lake::bronze::BronzeTable::has_key_at(&name, &url).await {
                Ok(Some(false)) => {
                    if keyless.insert(name.clone(), Instant::now()).is_none() {
                        tracing::info!(table = %name, "no primary key: the table is kept in Bronze only (append-only history); Silver does not hold it");
                    }
                    continue;
                }
                Ok(_) => {
                    keyless.remove(&name);
                }
                Err(e) => {
                    tracing::warn!(table = %name, error = %e, "cannot read the Bronze table's schema; retrying next round");
                    continue;
                }
            }
            let t = match open_table(config, policies, lake, &schema, &table).await {
                Ok(t) => t,
                Err(e) => {
                    metrics::counter!(m::SILVER_ERRORS, "table" => name.clone(), "class" => "operator")
                        .increment(1);
                    tracing::error!(table = %name, error = %e, "cannot open the Silver table; retrying next round");
                    continue;
                }
            };
            watermarks.insert(name.clone(), t.progress().await?.watermark);
            tables.insert(
                name.clone(),
                Tracked {
                    table: t,
                    pruned: None,
                },
            );
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
        let Some(tracked) = tables.get_mut(&name) else {
            continue;
        };
        if tracked.pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            let retention = Duration::from_secs(config.silver.tombstone_retention_hours * 3600);
            // Once an hour, whether it works or not (a failure is retried an hour later).
            tracked.pruned = Some(Instant::now());
            match tracked.table.prune_tombstones(retention).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(table = %name, tombstones = n, "pruned tombstones past the retention");
                    }
                }
                Err(e) => {
                    tracing::warn!(table = %name, error = %e, "pruning tombstones failed; retrying next round")
                }
            }
        }
        let table = &mut tracked.table;
        let counts = counts.get(&name).cloned().unwrap_or(TransactionCounts {
            top,
            ..TransactionCounts::default()
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
                metrics::counter!(m::SILVER_DUPLICATES, "table" => name.clone())
                    .increment(r.stale as u64);
                if r.quarantined > 0 {
                    metrics::counter!(m::QUARANTINED, "stage" => "silver", "reason" => wal2delta_lake::silver::CHECK_FAILED)
                        .increment(r.quarantined as u64);
                    tracing::warn!(table = %name, rows = r.quarantined, "rows failed quality checks and went to quarantine");
                }
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
