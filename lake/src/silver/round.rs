//! One Silver round as a pipeline of named steps:
//!
//! read → begin the hooks → plan → screen and fold → the hooks' changes → commit
//!
//! Each step is a method below, timed in [`Steps`]; what one step hands to the next is a
//! value of its own ([`Read`], [`Applicable`]). Why a round may apply what it applies is
//! stated where it is decided ([`super::progress`], [`super::window`]); what a hook may rely
//! on, in [`super::hook`].

use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::filter_record_batch;
use deltalake::DeltaTable;

use super::hook::{Begin, Changes};
use super::table::{initial_fields, take_snapshot_ends, ApplyReport, SilverTable, Steps};
use super::{fold, plan, Folded, Pieces, Plan, Position, Progress, TransactionCounts};
use crate::stopwatch::Stopwatch;
use crate::LakeError;

/// What the read step gives the others: Silver before the round and the Bronze rows after
/// its cursors.
pub(super) struct Read {
    pub silver: Option<DeltaTable>,
    pub before: Progress,
    pub rows: RecordBatch,
}

/// What the hooks said as the round began.
struct Begun {
    /// Per hook, what it has covered already.
    covered: Vec<Option<Progress>>,
    /// Some hook committed work only a Silver commit records.
    committed: bool,
}

/// The rows the round applies, screened (checks, masking, copies dropped) and folded.
struct Applicable {
    rows: RecordBatch,
    folded: Folded,
    /// The position below which a completed re-snapshot removes rows.
    resnapshot: Option<Position>,
}

impl SilverTable {
    pub(super) async fn round(
        &mut self,
        counts: &TransactionCounts,
    ) -> Result<ApplyReport, LakeError> {
        let mut clock = Stopwatch::start();
        let mut report = ApplyReport::default();
        let Some(read) = self.read(&mut clock, &mut report.steps).await? else {
            return Ok(report);
        };
        report.read = read.rows.num_rows();
        report.watermark = read.before.watermark;
        let begun = self.begin_hooks(&read).await?;
        let mut planned = self.plan(&read, counts, &mut report).await?;
        report.steps.plan = clock.lap();
        if planned.progress == read.before {
            if let (Some(t), true) = (&read.silver, begun.committed) {
                // A hook committed work only a Silver commit records (the rules' new seq
                // after a backfill): record it now, or it would wait for the table's next
                // change.
                report.version = Some(self.commit_progress(t, &read.before).await?);
                report.steps.write = clock.lap();
            }
            return Ok(report);
        }
        let screened = self
            .screen_and_fold(&read, &mut planned, &mut report)
            .await?;
        report.steps.screen = clock.lap();
        self.hooks_changes(&read, &screened, &planned.progress, &begun)
            .await?;
        report.steps.hooks = clock.lap();
        self.commit(read, screened, &planned.progress, &mut report)
            .await?;
        report.steps.write = clock.lap();
        Ok(report)
    }

    /// Opens Silver (and loads its progress) and Bronze, and reads Bronze's rows after the
    /// cursors; `None` when Bronze has no table yet.
    pub(super) async fn read(
        &mut self,
        clock: &mut Stopwatch,
        steps: &mut Steps,
    ) -> Result<Option<Read>, LakeError> {
        let silver = self.kept.silver.latest(&self.name, &self.url).await?;
        steps.open = clock.lap();
        let before = match &silver {
            Some(t) => Progress::load(&self.name, t).await?,
            None => Progress::default(),
        };
        steps.progress = clock.lap();
        let Some(bronze) = self
            .kept
            .bronze_latest(&self.name, &self.bronze_url)
            .await?
        else {
            return Ok(None);
        };
        steps.bronze = clock.lap();
        let rows = self.read_bronze(&bronze, &before, silver.as_ref()).await?;
        steps.read = clock.lap();
        Ok(Some(Read {
            silver,
            before,
            rows,
        }))
    }

    /// Starts every hook with Silver as it is before the round; their quarantine records
    /// are appended before anything of the round is committed.
    async fn begin_hooks(&mut self, read: &Read) -> Result<Begun, LakeError> {
        let keys = self.view(&read.rows)?.key_names();
        let mut begun = Begun {
            covered: Vec::with_capacity(self.hooks.len()),
            committed: false,
        };
        for h in &mut self.hooks {
            let begin = Begin {
                silver: read.silver.as_ref(),
                before: &read.before,
                keys: &keys,
                tombstones: &self.tombstones,
            };
            let b = match h.begin(begin).await {
                Ok(b) => b,
                Err(e) => {
                    h.failed(true);
                    return Err(e);
                }
            };
            self.quarantine
                .append_new(wal2delta_quarantine::Stage::Silver, b.quarantined)
                .await?;
            begun.committed |= b.needs_commit;
            begun.covered.push(b.covered);
        }
        Ok(begun)
    }

    /// Which of the rows read may be applied now, and the progress the round commits: whole
    /// transactions, or the next piece of one too large for a round ([`Pieces`]); then the
    /// read window adjusts to what the next round needs.
    async fn plan(
        &mut self,
        read: &Read,
        counts: &TransactionCounts,
        report: &mut ApplyReport,
    ) -> Result<Plan, LakeError> {
        let rows = self.view(&read.rows)?;
        let before = &read.before;
        let pieces = Pieces {
            limit: self.atomic_limit,
            complete: None,
        };
        let mut planned =
            plan(&rows, before, counts, pieces).map_err(|e| self.rows_error(e.to_string()))?;
        if let Some(lsn) = planned.progress.partial {
            if self.pieces_complete(lsn, &planned.progress, counts).await? {
                let complete = Pieces {
                    complete: Some(lsn),
                    ..pieces
                };
                planned = plan(&rows, before, counts, complete)
                    .map_err(|e| self.rows_error(e.to_string()))?;
                tracing::info!(table = %self.name, commit_lsn = lsn, "the last piece of a large source transaction is applied in this round");
            }
        }
        // After the completion check: the transaction behind a completed one may be the
        // next to go in pieces, in the same round.
        if let Some(lsn) = planned
            .progress
            .partial
            .filter(|l| before.partial != Some(*l))
        {
            tracing::info!(table = %self.name, commit_lsn = lsn, events = counts.events.get(&lsn).copied().unwrap_or(0), limit = self.atomic_limit, "a source transaction is larger than [silver] max_atomic_transaction_rows: applying it in pieces; Silver shows it partly applied until its last piece commits");
        }
        report.waiting = planned.waiting;
        report.partial = planned.progress.partial;
        report.watermark = planned.progress.watermark;
        report.again = self
            .window
            .adjust(&self.name, &mut self.kept, before, &rows, &planned, counts)
            .await?;
        Ok(planned)
    }

    /// The planned rows screened (quarantined first: a crash before the Silver commit
    /// repeats the round, and the quarantine table skips what it holds already) and folded
    /// to one change per key; a completed re-snapshot moves the truncation point.
    async fn screen_and_fold(
        &mut self,
        read: &Read,
        planned: &mut Plan,
        report: &mut ApplyReport,
    ) -> Result<Applicable, LakeError> {
        let before = &read.before;
        let applicable = filter_record_batch(&read.rows, &planned.applicable)
            .map_err(|e| self.rows_error(e.to_string()))?;
        // The end of a re-snapshot: once every partition's end is applied (so every row
        // the re-snapshot read is), the rows below its position are gone at the source.
        let (applicable, ends) = take_snapshot_ends(&self.view(&applicable)?)
            .map_err(|e| self.rows_error(e.to_string()))?;
        let resnapshot = self
            .resnapshot_complete(&ends, &planned.progress, before.truncated)
            .await?;
        if let Some(p) = resnapshot {
            tracing::info!(table = %self.name, from_lsn = p.0, "re-snapshot complete: deleting the rows it did not read again (deleted at the source while the slot was lost)");
            planned.progress.truncated = planned.progress.truncated.max(Some(p));
        }
        let screened = self.screen(&self.view(&applicable)?, before.watermark)?;
        report.stale = screened.stale;
        // By id: a snapshot row may be screened before the streamed rows ahead of it in
        // its partition.
        report.quarantined = self
            .quarantine
            .append_new(wal2delta_quarantine::Stage::Silver, screened.quarantined)
            .await?;
        let folded = fold(
            &self.view(&screened.rows)?,
            before.truncated.max(resnapshot),
        )
        .map_err(|e| self.rows_error(e.0))?;
        Ok(Applicable {
            rows: screened.rows,
            folded,
            resnapshot,
        })
    }

    /// Gives every hook the round's changes, between the fold and the commit.
    async fn hooks_changes(
        &mut self,
        read: &Read,
        screened: &Applicable,
        after: &Progress,
        begun: &Begun,
    ) -> Result<(), LakeError> {
        let rows = self.view(&screened.rows)?;
        for (h, covered) in self.hooks.iter_mut().zip(&begun.covered) {
            let changes = Changes {
                rows: &rows,
                truncated: read.before.truncated,
                covered: covered.as_ref(),
                silver: read.silver.as_ref(),
                tombstones: &self.tombstones,
                after,
                resnapshot: screened.resnapshot.is_some(),
            };
            let outcome = match h.changes(changes).await {
                Ok(o) => o,
                Err(e) => {
                    h.failed(true);
                    return Err(e);
                }
            };
            self.quarantine
                .append_new(wal2delta_quarantine::Stage::Silver, outcome.quarantined)
                .await?;
        }
        Ok(())
    }

    /// Commits the folded changes with the progress `after`: tombstones and MERGE, or a
    /// commit of the progress alone (a TRUNCATE still empties the table).
    async fn commit(
        &mut self,
        read: Read,
        screened: Applicable,
        after: &Progress,
        report: &mut ApplyReport,
    ) -> Result<(), LakeError> {
        let before = &read.before;
        let new_truncate = screened
            .folded
            .truncate
            .filter(|t| Some(*t) > before.truncated);
        let props = self.commit_properties(after);
        let Some(source) = screened.folded.rows else {
            report.version = Some(match (read.silver, new_truncate) {
                (Some(t), Some(p)) => self.truncate_only(t, p, props).await?,
                (Some(t), None) => self.commit_progress(&t, after).await?,
                (None, _) => {
                    // Every change of the table's first round went to quarantine (or was
                    // a copy): create it empty so the progress is recorded, or the same
                    // window would be read again forever.
                    let fields = initial_fields(&self.view(&read.rows)?, &self.name)?;
                    let t = self.ensure_columns(None, &fields).await?;
                    self.commit_progress(&t, after).await?
                }
            });
            return Ok(());
        };
        let keys = self.view(&screened.rows)?.key_names();
        let written = self
            .write_folded(
                read.silver,
                source,
                &keys,
                &screened.folded.unchanged_columns,
                new_truncate,
                props,
            )
            .await?;
        report.deletes = written.deletes;
        report.upserts = written.upserts;
        report.version = Some(written.version);
        report.widened = written.widened;
        report.rewritten = written.rewritten;
        Ok(())
    }
}
