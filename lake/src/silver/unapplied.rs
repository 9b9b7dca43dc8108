//! A table's changes that Bronze holds whole and Silver has not applied yet, as the row
//! versions the table's next round will apply: what a lookup as of a later position needs
//! of a looked-up table (docs/rules.md, "Lookups").
//!
//! A table whose rules look up another sees the related rows as of each change's commit.
//! Stepping the looked-up table one change at a time costs a round per change; instead,
//! right after the looked-up table's round, the silver stage reads what its next round
//! would apply (the same Bronze rows, planned, screened, masked and folded per transaction
//! as that round will, with TOAST values filled from Silver: [`SilverTable::unapplied`]),
//! and the lookups put those versions over the Silver rows: the related row of key K as of
//! LSN L is K's latest version at or below L, or K's Silver row when K has none.
//!
//! Nothing here commits or quarantines anything: the looked-up table's own round does, on
//! the same rows.

use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::filter_record_batch;
use wal2delta_model::ChangeOp;

use super::round::Read;
use super::table::{SilverTable, Steps};
use super::{plan, settle, versions, Pieces, TransactionCounts};
use crate::stopwatch::Stopwatch;
use crate::LakeError;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Unapplied {
    /// The table's Silver watermark the versions follow: they hold its changes above it.
    pub from: i64,
    /// Every change of the table at or below `reach` is in `versions` (whole
    /// transactions), so a lookup as of a position up to `reach` is exact; above it (a
    /// transaction Bronze does not hold whole yet, a TRUNCATE or a re-snapshot's end,
    /// which versions cannot show) it is not.
    pub reach: i64,
    /// The table's primary-key columns.
    pub keys: Vec<String>,
    /// One row per key and transaction, in key then position order, with Silver's
    /// columns, `_op` (`u` or `d`) and `_commit_lsn` (`None`: no change to apply).
    pub versions: Option<RecordBatch>,
}

impl SilverTable {
    /// This table's unapplied changes as of its latest Silver version (see the module
    /// docs), given its transaction records `counts`. `None` when they cannot stand for
    /// it: the table has no Silver table yet, or is in the middle of a transaction
    /// applied in pieces (Silver then holds part of a transaction).
    pub async fn unapplied(
        &mut self,
        counts: &TransactionCounts,
    ) -> Result<Option<Unapplied>, LakeError> {
        let mut clock = Stopwatch::start();
        let Some(Read {
            silver: Some(silver),
            before,
            rows,
        }) = self.read(&mut clock, &mut Steps::default()).await?
        else {
            return Ok(None);
        };
        if before.partial.is_some() {
            return Ok(None);
        }
        let pieces = Pieces {
            limit: self.atomic_limit,
            complete: None,
        };
        let planned = plan(&self.view(&rows)?, &before, counts, pieces)
            .map_err(|e| self.rows_error(e.to_string()))?;
        let applicable = filter_record_batch(&rows, &planned.applicable)
            .map_err(|e| self.rows_error(e.to_string()))?;
        let view = self.view(&applicable)?;
        // Whole transactions up to the planned watermark; a transaction in pieces lies
        // above it. A TRUNCATE or a re-snapshot's end removes rows no version names: the
        // lookups stop below it.
        let mut reach = planned.progress.watermark;
        for i in 0..view.num_rows() {
            if matches!(
                view.op(i),
                None | Some(ChangeOp::Truncate | ChangeOp::SnapshotEnd)
            ) {
                reach = reach.min(view.commit_lsn(i).saturating_sub(1));
            }
        }
        let reach = reach.max(before.watermark);
        let screened = self.screen(&view, before.watermark)?;
        let screened = self.view(&screened.rows)?;
        let keys = screened.key_names();
        let v = versions(&screened, before.truncated).map_err(|e| self.rows_error(e.0))?;
        let reads = (0..screened.num_rows()).any(|i| screened.op(i) == Some(ChangeOp::Read));
        let versions = match v.rows {
            Some(b) => {
                Some(settle(&self.name, b, Some(&silver), &self.tombstones, &keys, reads).await?)
            }
            None => None,
        };
        Ok(Some(Unapplied {
            from: before.watermark,
            reach,
            keys,
            versions,
        }))
    }
}
