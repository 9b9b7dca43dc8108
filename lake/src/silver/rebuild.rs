//! Rebuilding a Silver table from Bronze alone (`replay --layer silver`, and a changed
//! masking policy).
//!
//! The table is built from scratch into a staging table
//! (`silver/_wal2delta/rebuild/{schema}/{table}`) by the same rounds the stage runs, until
//! a round finds nothing more to apply. Then the staging tombstones replace the live ones
//! (keyed under the new masking) and the live table is overwritten with the staging rows in one commit, which carries the
//! staging progress: readers see the old version or the rebuilt one, never a mix, and the
//! stage continues from the rebuilt progress. The source is never read.
//!
//! The silver stage must not commit to the table meanwhile: the rebuild refuses to swap
//! when the live table's version moved since it started.

use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use futures::StreamExt;

use super::columns::MASKING_KEY;
use super::tombstones::Tombstones;
use super::window::Window;
use super::{transaction_counts, Progress, SilverTable, TransactionCounts};
use crate::delta;
use crate::{Lake, LakeError, INTERNAL_SCHEMA};

/// What a rebuild did.
#[derive(Debug, Clone, Default)]
pub struct RebuildReport {
    /// Rounds run on the staging table.
    pub rounds: usize,
    /// Bronze rows read.
    pub read: usize,
    /// Rows in the rebuilt table.
    pub rows: usize,
    /// Rows newly quarantined by the checks (those already quarantined are not repeated).
    pub quarantined: usize,
    /// Transactions Bronze does not hold whole yet (left for the stage).
    pub waiting: usize,
    pub watermark: i64,
    /// The live table's new version.
    pub version: Option<u64>,
}

impl SilverTable {
    /// The masking policies the table's latest Silver commit recorded (`None` when no
    /// commit recorded any, e.g. a table written before masking existed).
    pub async fn recorded_masking(&self) -> Result<Option<serde_json::Value>, LakeError> {
        let Some(table) = delta::open(&self.name, &self.url).await? else {
            return Ok(None);
        };
        let mut history = table.history(Some(20));
        while let Some(c) = history.next().await {
            let c = c.map_err(LakeError::delta(&self.name))?;
            if let Some(v) = c.info.get(MASKING_KEY) {
                return Ok(Some(v.clone()));
            }
        }
        Ok(None)
    }

    /// The masking policies this table applies.
    pub fn masking_description(&self) -> serde_json::Value {
        self.masking.describe()
    }

    /// Rebuilds the table from Bronze (see the module docs). `schema`/`table` name it.
    pub async fn rebuild(
        &mut self,
        lake: &Lake,
        schema: &str,
        table: &str,
    ) -> Result<RebuildReport, LakeError> {
        let live = delta::open(&self.name, &self.url).await?;
        let started_at = live.as_ref().and_then(|t| t.version());
        let staging_url = lake.table(&["silver", INTERNAL_SCHEMA, "rebuild", schema, table]);
        let staging_tombs = lake.table(&[
            "silver",
            INTERNAL_SCHEMA,
            "rebuild-tombstones",
            schema,
            table,
        ]);
        crate::storage::remove_all(&staging_url).await?;
        crate::storage::remove_all(&staging_tombs).await?;
        let mut staging = SilverTable {
            name: self.name.clone(),
            bronze_url: self.bronze_url.clone(),
            url: staging_url.clone(),
            tombstones: Tombstones::new(&self.name, staging_tombs.clone()),
            window: Window::new(self.window.size()),
            masking: self.masking.clone(),
            checks: self.checks.clone(),
            quarantine: crate::quarantine::QuarantineTable::new(lake.quarantine_records()),
            // No hooks while rebuilding: the swap commit carries what each hook records
            // for a commit it took no part in (the rules: a seq no round writes, so the
            // first round after the swap backfills every rule against the rebuilt rows).
            hooks: Vec::new(),
            file_bytes: self.file_bytes,
            atomic_limit: self.atomic_limit,
            kept: Default::default(),
        };
        let (top, mut counts) = transaction_counts(lake, 0).await?;
        let counts = counts.remove(&self.name).unwrap_or(TransactionCounts {
            top,
            ..TransactionCounts::default()
        });
        let mut report = RebuildReport::default();
        loop {
            let r = staging.apply(&counts).await?;
            report.rounds += 1;
            report.read += r.read;
            report.quarantined += r.quarantined;
            report.waiting = r.waiting;
            report.watermark = r.watermark;
            if r.version.is_none() && !r.again {
                break;
            }
            tracing::info!(table = %self.name, round = report.rounds, read = report.read, watermark = r.watermark, "rebuilding silver");
        }
        let Some(built) = delta::open(&self.name, &staging_url).await? else {
            // Bronze had nothing to apply: nothing to swap in.
            return Ok(report);
        };
        let progress = Progress::load(&self.name, &built).await?;
        self.tombstones.replace_with(&staging.tombstones).await?;

        let live = delta::open(&self.name, &self.url).await?;
        if live.as_ref().and_then(|t| t.version()) != started_at {
            return Err(LakeError::Policy {
                table: self.name.clone(),
                reason: "the silver stage committed to the table during the rebuild; stop the stage (or its process) and run the replay again".into(),
            });
        }
        let err = |e: deltalake::datafusion::error::DataFusionError| {
            LakeError::delta(&self.name)(e.into())
        };
        let ctx = delta::session();
        let provider = built.table_provider().await.map_err(err)?;
        let df = ctx.read_table(provider).map_err(err)?;
        report.rows = df.clone().count().await.map_err(err)?;
        let target = match live {
            Some(t) => t,
            None => delta::handle(&self.name, &self.url)?,
        };
        let mut txns = progress.transactions(&self.name);
        txns.extend(self.hooks.iter().flat_map(|h| h.untagged_actions()));
        let props = delta::commit_metadata([
            ("wal2delta.stage".to_owned(), serde_json::json!("silver")),
            ("wal2delta.rebuilt".to_owned(), serde_json::json!(true)),
            (
                "wal2delta.watermark".to_owned(),
                serde_json::json!(progress.watermark),
            ),
            (MASKING_KEY.to_owned(), self.masking.describe()),
        ])
        .with_application_transactions(txns);
        let table = target
            .write(Vec::new())
            .with_input_plan(df.logical_plan().clone())
            .with_save_mode(SaveMode::Overwrite)
            .with_schema_mode(SchemaMode::Overwrite)
            .with_commit_properties(props)
            .await
            .map_err(LakeError::delta(&self.name))?;
        report.version = table.version();
        crate::storage::remove_all(&staging_url).await?;
        crate::storage::remove_all(&staging_tombs).await?;
        Ok(report)
    }

    /// Deletes the files no version after the latest needs (every earlier version's
    /// files), of the table and of its tombstones: after a masking change, so no file under
    /// either holds values masked the old way. Time travel to earlier versions ends here.
    pub async fn purge_history(&self) -> Result<usize, LakeError> {
        let tombstones = self.tombstones.purge_history().await?;
        let Some(table) = delta::open(&self.name, &self.url).await? else {
            return Ok(tombstones);
        };
        let (_, metrics) = table
            .vacuum()
            .with_retention_period(chrono::Duration::zero())
            .with_enforce_retention_duration(false)
            .with_commit_properties(delta::commit_properties())
            .await
            .map_err(LakeError::delta(&self.name))?;
        Ok(tombstones + metrics.files_deleted.len())
    }
}
