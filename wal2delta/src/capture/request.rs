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
//!
//! With `--where SQL`, only the rows matching the condition are read again (Debezium's
//! ad-hoc incremental snapshot with conditions), in the same fresh chunks, and no
//! snapshot end follows: Silver cannot tell a row outside the condition from a row the
//! source no longer holds, so nothing is deleted.

use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use wal2delta_cdc::snapshot::{estimate_rows, rows_position, Chunker};
use wal2delta_cdc::source;
use wal2delta_model::clock::unix_ms as now_ms;
use wal2delta_model::{Lsn, TableName};
use wal2delta_stream::snapshots::SnapshotProgress;

use super::snapshot::publication_tables;
use crate::config::Config;

/// The state of a requested re-snapshot not started yet.
pub const REQUESTED: &str = "requested";

pub async fn run(config: &Config, table: &str, condition: Option<&str>) -> Result<ExitCode> {
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
    if let Some(condition) = condition {
        Chunker::check_condition(&client, &t, condition)
            .await
            .map_err(|e| anyhow!("{e} (--where)"))?;
    }
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
        // Part of a table: its rows are read again, nothing is deleted (Silver cannot
        // tell a row outside the condition from one the source no longer holds).
        resnapshot_from: condition.is_none().then(|| rows_position(at).0),
        condition: condition.map(str::to_owned),
    };
    let kafka = config.kafka.connection()?;
    let topic = config.kafka.snapshots_topic();
    if condition.is_some() {
        // Replacing a snapshot still running with part of the table would leave the
        // rest of it unread.
        let (k, tp, slot) = (kafka.clone(), topic.clone(), config.source.slot.clone());
        let held =
            tokio::task::spawn_blocking(move || wal2delta_stream::snapshots::load(&k, &tp, &slot))
                .await?
                .map_err(|e| anyhow!("cannot read snapshot progress from {topic}: {e}"))?;
        if held.get(&t.to_string()).is_some_and(|p| !p.is_done()) {
            bail!(
                "the snapshot of {t} is still running: a re-snapshot with --where would end it before every row is read; wait until `wal2delta status` shows it done"
            );
        }
    }
    wal2delta_stream::snapshots::write(&kafka, &topic, &config.source.slot, &progress)
        .await
        .map_err(|e| anyhow!("cannot record the request in {topic}: {e}"))?;
    match condition {
        None => println!(
            "re-snapshot of {t} requested at {at} (about {} rows): a running capture starts it within 15 s, a stopped one when it starts; `wal2delta status` shows its progress. Once it is done, Silver deletes the rows the source no longer holds.",
            progress.rows_estimate
        ),
        Some(_) => println!(
            "re-snapshot of the rows of {t} matching --where requested at {at}: a running capture starts it within 15 s, a stopped one when it starts; `wal2delta status` shows its progress. Matching rows are read again; nothing is deleted (for that, re-snapshot the whole table)."
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `schema.table` (each part may be double-quoted, as PostgreSQL spells it).
fn parse(t: &str) -> Result<TableName> {
    match crate::config::path::parse(t, 2) {
        Some(p) if p.len() == 2 => Ok(TableName::new(&p[0], &p[1])),
        _ => bail!("--table {t:?} must look like schema.table"),
    }
}
