//! `wal2delta snapshot --table schema.table`: re-snapshot one table on demand.
//!
//! The command records, in the snapshots topic, a progress of state `requested` for the
//! table with `resnapshot_from` = the source's current WAL position *P* (as a snapshot row
//! position). Capture's snapshot task looks for such records every 15 s (and at start):
//! it reads the table again in fresh chunks, each in a snapshot taken after *P*, and ends
//! with a snapshot-end event at *P*, after which Silver deletes the rows whose last change
//! is below *P*: the rows the source no longer holds (docs/silver.md, "Re-snapshot after
//! a lost slot"; the same mechanism). The request is durable: a capture that is down or
//! restarts mid-way picks it up or resumes it.

use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use wal2delta_cdc::snapshot::{estimate_rows, rows_position};
use wal2delta_cdc::source;
use wal2delta_model::clock::unix_ms as now_ms;
use wal2delta_model::{Lsn, TableName};
use wal2delta_stream::snapshots::SnapshotProgress;

use super::snapshot::publication_tables;
use crate::config::Config;

/// The state of a requested re-snapshot not started yet.
pub const REQUESTED: &str = "requested";

pub async fn run(config: &Config, table: &str) -> Result<ExitCode> {
    let wanted = parse(table)?;
    let dsn = config.source.effective_dsn()?;
    let client = source::connect(&dsn)
        .await
        .map_err(|e| anyhow!("{e} ([source] dsn)"))?;
    let published = publication_tables(&client, &config.source.publication).await?;
    let Some(t) = published
        .into_iter()
        .find(|t| *t == wanted || t.to_string() == table || t.to_string() == wanted.to_string())
    else {
        bail!(
            "{} is not in the publication {:?}: only published tables are captured (`wal2delta setup` adds the tables [source] tables names)",
            wanted.quoted(),
            config.source.publication
        );
    };
    let lsn: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .context("reading the source's WAL position")?
        .get(0);
    let at: Lsn = lsn
        .parse()
        .map_err(|_| anyhow!("the source returned an unreadable WAL position {lsn:?}"))?;
    let progress = SnapshotProgress {
        table: t.to_string(),
        state: REQUESTED.into(),
        last_key: None,
        last_key_sealed: None,
        rows_done: 0,
        rows_estimate: estimate_rows(&client, &t).await?.max(0) as u64,
        ts_ms: now_ms(),
        resnapshot_from: Some(rows_position(at).0),
    };
    let kafka = config.kafka.connection()?;
    let topic = config.kafka.snapshots_topic();
    wal2delta_stream::snapshots::write(&kafka, &topic, &config.source.slot, &progress)
        .await
        .map_err(|e| anyhow!("cannot record the request in {topic}: {e}"))?;
    println!(
        "re-snapshot of {t} requested at {at} (about {} rows): a running capture starts it within 15 s, a stopped one when it starts; `wal2delta status` shows its progress. Once it is done, Silver deletes the rows the source no longer holds.",
        progress.rows_estimate
    );
    Ok(ExitCode::SUCCESS)
}

/// `schema.table` (each part may be double-quoted, as PostgreSQL spells it).
fn parse(t: &str) -> Result<TableName> {
    match crate::config::path::parse(t, 2) {
        Some(p) if p.len() == 2 => Ok(TableName::new(&p[0], &p[1])),
        _ => bail!("--table {t:?} must look like schema.table"),
    }
}
