//! One Silver table: reads its Bronze table after the stored cursors, applies the changes
//! whose transactions are whole, and commits rows and progress together.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use deltalake::arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use deltalake::arrow::compute::{concat_batches, filter_record_batch};
use deltalake::arrow::datatypes::{DataType, Field, Schema};
use deltalake::arrow::error::ArrowError;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::DeltaTable;
use url::Url;
use wal2delta_model::{bronze, ChangeOp};

use super::checks::Check;
use super::columns::{
    Position, COMMIT_LSN, COMMIT_TS, MASKING_KEY, OP, ORDINAL, UNCHANGED, UNRESOLVED,
};
use super::hook::RoundHook;
use super::kept::KeptTables;
use super::mask::Masking;
use super::rows::BronzeRows;
use super::screen::{screen, ScreenError, Screened};
use super::tombstones::Tombstones;
use super::window::Window;
use super::{Progress, TransactionCounts};
use crate::delta::{self, ident};
use crate::follow::Listing;
use crate::quarantine::QuarantineTable;
use crate::{Lake, LakeError};

/// The commit-info key of a Silver commit that holds part of a source transaction (its
/// commit LSN): every commit of a transaction applied in pieces but the last.
pub const PARTIAL_KEY: &str = "wal2delta.partial_transaction";

/// What one round did.
#[derive(Debug, Clone, Default)]
pub struct ApplyReport {
    /// Bronze rows read.
    pub read: usize,
    /// Keys upserted and deleted (after folding and tombstones).
    pub upserts: usize,
    pub deletes: usize,
    /// Source transactions read but not whole in Bronze yet.
    pub waiting: usize,
    /// Rows that failed a quality check, newly quarantined.
    pub quarantined: usize,
    /// Streamed changes read again at or below the watermark (duplicates), dropped.
    pub stale: usize,
    pub watermark: i64,
    /// The Silver version committed, if any.
    pub version: Option<u64>,
    /// The read window widened (a large transaction, a gap in the offsets): another round
    /// at once gets further even when this one committed nothing.
    pub again: bool,
    /// The source transaction this round leaves applied in part (pieces), if any.
    pub partial: Option<i64>,
    /// Columns whose type widened this round: Silver was rewritten under the wider types
    /// before the round's MERGE ([`crate::widen`]).
    pub widened: Vec<String>,
    /// Where the round's time went.
    pub steps: Steps,
    /// What the round's MERGE rewrote.
    pub rewritten: super::merge::Rewritten,
}

/// How long each step of a round took: what an operator (or a benchmark) reads to tell
/// which part of a slow round to tune. Steps a round did not reach stay zero.
#[derive(Debug, Clone, Copy, Default)]
pub struct Steps {
    /// Opening Silver (its log's new commits).
    pub open: Duration,
    /// Loading Silver's progress (its `txn` actions).
    pub progress: Duration,
    /// Opening Bronze (its log's new commits).
    pub bronze: Duration,
    /// Reading Bronze after the cursors.
    pub read: Duration,
    /// Rules' start, planning the whole transactions, the completion checks, the window.
    pub plan: Duration,
    /// Screening, quarantine appends and folding to one change per key.
    pub screen: Duration,
    /// The hooks ([`RoundHook`]): the rules evaluated and their transitions committed.
    pub hooks: Duration,
    /// The MERGE (or progress-only commit) into Silver.
    pub write: Duration,
}

/// What writing one round's folded changes did.
pub(super) struct Written {
    pub(super) version: u64,
    pub(super) upserts: usize,
    pub(super) deletes: usize,
    /// Silver rows inserted, updated or deleted.
    pub(super) touched: usize,
    pub(super) rewritten: super::merge::Rewritten,
    /// Columns whose type widened: Silver was rewritten under the wider types first.
    pub(super) widened: Vec<String>,
}

/// The outcome of re-driving one quarantined change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redrive {
    /// It passed the checks and entered Silver.
    Applied,
    /// It passed, but a newer change of its key (or a delete or TRUNCATE) is in Silver.
    Superseded,
    /// It fails a check still (the detail says which).
    StillFails(String),
    /// Bronze has no such row.
    NotInBronze,
}

pub struct SilverTable {
    /// `schema.table`.
    pub(super) name: String,
    pub(super) bronze_url: Url,
    pub(super) url: Url,
    pub(super) tombstones: Tombstones,
    /// Which Bronze offsets a round reads.
    pub(super) window: Window,
    pub(super) masking: Masking,
    pub(super) checks: Vec<Check>,
    pub(super) quarantine: QuarantineTable,
    /// What runs inside every round ([`RoundHook`]: the rules, when the stage runs them).
    pub(super) hooks: Vec<Box<dyn RoundHook>>,
    /// The size of the files its MERGE writes (`delta.targetFileSize`; `None`: leave the
    /// table's setting alone).
    pub(super) file_bytes: Option<u64>,
    /// Events above which a source transaction is applied in pieces ([`Pieces`]).
    pub(super) atomic_limit: u64,
    /// The Silver and Bronze tables, kept open between rounds.
    pub(super) kept: KeptTables,
}

impl SilverTable {
    pub fn new(lake: &Lake, schema: &str, table: &str, window: i64) -> Self {
        let name = format!("{schema}.{table}");
        SilverTable {
            bronze_url: lake.bronze(schema, table),
            url: lake.silver(schema, table),
            tombstones: Tombstones::new(&name, lake.silver_tombstones(schema, table)),
            name,
            window: Window::new(window),
            masking: Masking::default(),
            checks: Vec::new(),
            quarantine: QuarantineTable::new(lake.quarantine_records()),
            hooks: Vec::new(),
            file_bytes: None,
            atomic_limit: u64::MAX,
            kept: KeptTables::default(),
        }
    }

    /// Applies a source transaction of more than `events` changes in pieces of the read
    /// window, in successive commits, instead of holding it whole in one round
    /// (`[silver] max_atomic_transaction_rows`; [`Pieces`]).
    pub fn with_atomic_limit(mut self, events: u64) -> Self {
        self.atomic_limit = events.max(1);
        self
    }

    /// Has the MERGE write files of about `bytes` (`[silver] target_file_bytes`), the size
    /// compaction packs small files into: kept as the table's `delta.targetFileSize`,
    /// which delta-rs' MERGE writes by (100 MiB when unset). A MERGE rewrites every file
    /// holding a changed key, so the size of the files it writes is the size the next
    /// round rewrites when the same keys change again (`ops/bench silver-files`).
    pub fn with_file_size(mut self, bytes: u64) -> Self {
        self.file_bytes = Some(bytes);
        self
    }

    /// Runs `hooks` inside every round (replacing any): see [`RoundHook`].
    pub fn with_hooks(mut self, hooks: Vec<Box<dyn RoundHook>>) -> Self {
        self.hooks = hooks;
        self
    }

    /// Has the hooks commit what they hold pending (for a clean stop, and for a benchmark
    /// that must count that commit).
    pub async fn flush_hooks(&mut self) -> Result<(), LakeError> {
        for h in &mut self.hooks {
            h.flush().await?;
        }
        Ok(())
    }

    /// Masks columns by `masking` and sets rows failing `checks` aside in quarantine.
    pub fn with_policy(mut self, masking: Masking, checks: Vec<Check>) -> Self {
        self.masking = masking;
        self.checks = checks;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `txn` actions of a Silver commit at `progress`: the progress, and what the
    /// hooks record ([`RoundHook::commit_actions`]).
    fn transactions(&self, progress: &Progress) -> Vec<deltalake::kernel::Transaction> {
        let mut out = progress.transactions(&self.name);
        out.extend(self.hooks.iter().flat_map(|h| h.commit_actions()));
        out
    }

    /// The properties of a Silver commit at `progress`: its `txn` actions (the progress,
    /// the rules seq) and what readers can tell from its commit info (the watermark, the
    /// masking, and whether it holds part of a source transaction applied in pieces:
    /// every commit of such a transaction but the last says so).
    pub(super) fn commit_properties(&self, progress: &Progress) -> CommitProperties {
        let mut info = vec![
            ("wal2delta.stage".to_owned(), serde_json::json!("silver")),
            (
                "wal2delta.watermark".to_owned(),
                serde_json::json!(progress.watermark),
            ),
            (MASKING_KEY.to_owned(), self.masking.describe()),
        ];
        // One metadata set: a second `with_metadata` would replace the first.
        if let Some(lsn) = progress.partial {
            info.push((PARTIAL_KEY.to_owned(), serde_json::json!(lsn)));
        }
        delta::commit_metadata(info).with_application_transactions(self.transactions(progress))
    }

    /// A commit of `t` that records `progress` and changes no row.
    pub(super) async fn commit_progress(
        &self,
        t: &DeltaTable,
        progress: &Progress,
    ) -> Result<u64, LakeError> {
        delta::commit_progress_only(
            t,
            self.commit_properties(progress),
            "wal2delta-silver",
            progress.watermark,
        )
        .await
        .map_err(LakeError::delta(&self.name))
    }

    /// The progress the Silver table records (default when it does not exist yet).
    pub async fn progress(&self) -> Result<Progress, LakeError> {
        match delta::open(&self.name, &self.url).await? {
            Some(t) => Progress::load(&self.name, &t).await,
            None => Ok(Progress::default()),
        }
    }

    /// Deletes tombstones at or below the watermark older than `retention`.
    pub async fn prune_tombstones(
        &self,
        retention: std::time::Duration,
    ) -> Result<usize, LakeError> {
        let watermark = self.progress().await?.watermark;
        let cutoff = now_us() - retention.as_micros().min(i64::MAX as u128) as i64;
        self.tombstones.prune(watermark, cutoff).await
    }

    /// One round: read, plan, fold, write tombstones, MERGE with progress.
    ///
    /// A failed round drops the tables kept open: whatever made it fail (a table
    /// replaced under the stage, files gone) is not read again from a kept state, the next
    /// round opens both tables afresh.
    pub async fn apply(&mut self, counts: &TransactionCounts) -> Result<ApplyReport, LakeError> {
        let applied = self.round(counts).await;
        if applied.is_err() {
            self.kept = KeptTables::default();
            for h in &mut self.hooks {
                h.failed(false);
            }
        }
        applied
    }

    /// Whether every event of the partial transaction `lsn` is applied once `after`'s
    /// cursors are: Bronze holds as many distinct events of it as its END record counts
    /// (resolved quarantine records included), and in every partition each of its
    /// distinct events has a copy at or below the cursor (pieces apply only rows the
    /// cursors pass). Reads only positions, by an aggregate over the transaction's rows.
    pub(super) async fn pieces_complete(
        &mut self,
        lsn: i64,
        after: &Progress,
        counts: &TransactionCounts,
    ) -> Result<bool, LakeError> {
        let need = counts.events.get(&lsn).copied().unwrap_or(0);
        let passed = if after.cursors.is_empty() {
            "false".to_owned()
        } else {
            let arms: Vec<String> = after
                .cursors
                .iter()
                .map(|(p, c)| format!("WHEN {p} THEN kafka_offset <= {c}"))
                .collect();
            format!("CASE kafka_partition {} ELSE false END", arms.join(" "))
        };
        let sql = format!(
            "SELECT COUNT(DISTINCT ordinal) AS events, \
             COUNT(DISTINCT CASE WHEN {passed} THEN ordinal END) AS applied \
             FROM t WHERE commit_lsn = {lsn} AND op <> 'r' AND op <> 's' GROUP BY kafka_partition"
        );
        let mut held = counts.held(lsn, None);
        let bronze = self.kept.bronze_table(&self.name).await?;
        for b in delta::query(&self.name, &bronze, &sql).await? {
            let (Some(events), Some(applied)) = (
                b.column(0)
                    .as_primitive_opt::<deltalake::arrow::datatypes::Int64Type>(),
                b.column(1)
                    .as_primitive_opt::<deltalake::arrow::datatypes::Int64Type>(),
            ) else {
                return Err(self.rows_error(
                    "unexpected types counting a partial transaction's Bronze events".into(),
                ));
            };
            for i in 0..b.num_rows() {
                if events.value(i) != applied.value(i) {
                    return Ok(false);
                }
                held += events.value(i).max(0) as u64;
            }
        }
        Ok(held >= need)
    }

    /// The position below which rows go, when this round completes a re-snapshot: some
    /// snapshot end (`ends`: commit LSN, partitions it was sent to) is not applied yet
    /// (above `truncated`), Bronze holds it in as many partitions as it was sent to, and
    /// `after`'s cursors pass each of them, so every snapshot row before it is applied.
    pub(super) async fn resnapshot_complete(
        &mut self,
        ends: &[(i64, i64)],
        after: &Progress,
        truncated: Option<Position>,
    ) -> Result<Option<Position>, LakeError> {
        let mut done = None;
        for &(lsn, partitions) in ends {
            let at = Position(lsn, 0);
            if Some(at) <= truncated.max(done) {
                continue;
            }
            let sql = format!(
                "SELECT kafka_partition, MIN(kafka_offset) FROM t WHERE op = '{end}' AND commit_lsn = {lsn} GROUP BY kafka_partition",
                end = ChangeOp::SnapshotEnd.code(),
            );
            let mut held = Vec::new();
            let bronze = self.kept.bronze_table(&self.name).await?;
            for b in delta::query(&self.name, &bronze, &sql).await? {
                let (Some(p), Some(o)) = (
                    b.column(0)
                        .as_primitive_opt::<deltalake::arrow::datatypes::Int32Type>(),
                    b.column(1)
                        .as_primitive_opt::<deltalake::arrow::datatypes::Int64Type>(),
                ) else {
                    return Err(self.rows_error(
                        "unexpected types reading the snapshot end's partitions".into(),
                    ));
                };
                held.extend((0..b.num_rows()).map(|i| (p.value(i), o.value(i))));
            }
            let passed = held
                .iter()
                .all(|(p, o)| after.cursors.get(p).is_some_and(|c| c >= o));
            if held.len() as i64 >= partitions && passed {
                done = done.max(Some(at));
            }
        }
        Ok(done)
    }

    /// Writes folded changes: tombstones of the deletes first (a crash after them only
    /// repeats the round), then the upserts no tombstone covers, by MERGE.
    pub(super) async fn write_folded(
        &self,
        silver: Option<DeltaTable>,
        source: RecordBatch,
        keys: &[String],
        unchanged: &BTreeSet<String>,
        truncate: Option<Position>,
        props: CommitProperties,
    ) -> Result<Written, LakeError> {
        let (silver, widened) = match silver {
            Some(t) => {
                let (t, widened) = self.widen(t, source.schema().fields()).await?;
                (Some(t), widened)
            }
            None => (None, Vec::new()),
        };
        let (deletes, _) = split(&source, "d")?;
        self.tombstones
            .record(
                keys,
                project_tombstones(&deletes, keys).map_err(|e| self.rows_error(e))?,
            )
            .await?;
        let survivors = self.tombstones.filter(keys, source.clone()).await?;
        let source = concat_batches(&source.schema(), &survivors)
            .map_err(|e| self.rows_error(e.to_string()))?;
        let deletes = deletes.num_rows();
        let upserts = source.num_rows() - count_op(&source, "d");
        let source = self
            .fill_moved(silver.as_ref(), source, keys, unchanged)
            .await?;
        let value_fields: Vec<Field> = source
            .schema()
            .fields()
            .iter()
            .filter(|f| f.name() != OP && f.name() != UNCHANGED)
            .map(|f| f.as_ref().clone())
            .collect();
        let mut target_fields = value_fields.clone();
        target_fields.push(Field::new(
            UNRESOLVED,
            DataType::List(Arc::new(Field::new("element", DataType::Utf8, true))),
            true,
        ));
        let target = self.ensure_columns(silver, &target_fields).await?;
        let merged = self
            .merge(
                target,
                source,
                keys,
                &value_fields,
                unchanged,
                truncate,
                props,
            )
            .await?;
        Ok(Written {
            version: merged.version,
            upserts,
            deletes,
            touched: merged.touched,
            rewritten: merged.rewritten,
            widened,
        })
    }

    /// `screen` with this table's checks and masking; refuses a lossy mask on a key.
    pub(super) fn screen(&self, rows: &BronzeRows, watermark: i64) -> Result<Screened, LakeError> {
        self.masking
            .check_keys(&rows.key_names())
            .map_err(|e| self.policy_error(e.to_string()))?;
        screen(
            &self.name,
            rows,
            watermark,
            &self.checks,
            &self.masking,
            now_us(),
        )
        .map_err(|e| match e {
            ScreenError::Rows(r) => self.rows_error(r),
            other => self.policy_error(other.to_string()),
        })
    }

    pub(super) fn policy_error(&self, reason: String) -> LakeError {
        LakeError::Policy {
            table: self.name.clone(),
            reason,
        }
    }

    /// The typed view of Bronze rows `b`; an error naming the column it lacks.
    pub(super) fn view<'a>(&self, b: &'a RecordBatch) -> Result<BronzeRows<'a>, LakeError> {
        BronzeRows::new(b).map_err(|e| self.rows_error(e.to_string()))
    }

    pub(super) fn rows_error(&self, reason: String) -> LakeError {
        LakeError::Rows {
            table: self.name.clone(),
            reason,
        }
    }

    /// The rows of this round's window, from the files of `bronze` that can hold them
    /// (through a query when only a query can read them exactly).
    pub(super) async fn read_bronze(
        &mut self,
        bronze: &Listing,
        p: &Progress,
        silver: Option<&DeltaTable>,
    ) -> Result<RecordBatch, LakeError> {
        self.window.discover(&self.name, &mut self.kept, p).await?;
        let selection = self.window.selection(p);
        let schema = self.read_schema(&bronze.schema, &bronze.text_decimals, silver)?;
        let footers = &mut self.kept.footers;
        match super::files::read(&self.name, bronze, &selection, &schema, footers).await {
            Some(rows) => Ok(rows),
            None => {
                let table = self.kept.bronze_table(&self.name).await?;
                self.select_bronze(&table, &selection.sql(), silver).await
            }
        }
    }

    /// The Bronze columns Silver reads, typed as the table (whose schema is `schema`) has
    /// them (text as `Utf8`), but a bounded numeric an earlier release wrote as text as
    /// its decimal (`decimals`) unless `silver` holds it as text
    /// ([`super::text_decimals`]); an error when the table lacks one.
    pub(super) fn read_schema(
        &self,
        schema: &Schema,
        decimals: &BTreeMap<String, (u8, i8)>,
        silver: Option<&DeltaTable>,
    ) -> Result<Arc<Schema>, LakeError> {
        let missing: Vec<&str> = bronze::SILVER_READS
            .iter()
            .copied()
            .filter(|c| schema.field_with_name(c).is_err())
            .collect();
        if !missing.is_empty() {
            return Err(self.rows_error(format!(
                "the Bronze table has no column(s) {}: it was written by an older wal2delta, or the source table has no primary key",
                missing.join(", ")
            )));
        }
        let fields = delta::plain_fields(schema, bronze::SILVER_READS);
        let silver = match silver {
            Some(t) if !decimals.is_empty() => Some(delta::arrow_schema(&self.name, t)?),
            _ => None,
        };
        Ok(Arc::new(Schema::new(super::text_decimals::read_types(
            fields,
            decimals,
            silver.as_deref(),
        ))))
    }

    /// The Bronze rows matching `condition`, in Kafka order.
    pub(super) async fn select_bronze(
        &self,
        bronze: &DeltaTable,
        condition: &str,
        silver: Option<&DeltaTable>,
    ) -> Result<RecordBatch, LakeError> {
        let whole = delta::arrow_schema(&self.name, bronze)?;
        let decimals = crate::bronze::text_decimals(
            bronze
                .snapshot()
                .map_err(LakeError::delta(&self.name))?
                .metadata()
                .configuration(),
        );
        let schema = self.read_schema(&whole, &decimals, silver)?;
        let sql = format!(
            "SELECT {} FROM t WHERE {condition} ORDER BY kafka_partition, kafka_offset",
            bronze::SILVER_READS
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", "),
        );
        let mut batches = delta::query(&self.name, bronze, &sql).await?;
        if !decimals.is_empty() {
            batches = batches
                .iter()
                .map(|b| super::files::conform_batch(b, &schema))
                .collect::<Result<_, _>>()
                .map_err(|e| self.rows_error(e.to_string()))?;
        }
        let schema = batches.first().map(|b| b.schema()).unwrap_or(schema);
        concat_batches(&schema, &batches).map_err(|e| self.rows_error(e.to_string()))
    }
}

/// Splits the snapshot ends (`op` = `s`) off `rows`: the other rows, and each end's
/// (commit LSN, number of partitions it was sent to, carried as its `ordinal`).
pub(super) fn take_snapshot_ends(
    rows: &BronzeRows,
) -> Result<(RecordBatch, Vec<(i64, i64)>), ArrowError> {
    let is_end = |i: usize| rows.op(i) == Some(ChangeOp::SnapshotEnd);
    let ends: BTreeSet<(i64, i64)> = (0..rows.num_rows())
        .filter(|&i| is_end(i))
        .map(|i| (rows.commit_lsn(i), rows.ordinal(i)))
        .collect();
    if ends.is_empty() {
        return Ok((rows.batch().clone(), Vec::new()));
    }
    let keep: BooleanArray = (0..rows.num_rows()).map(|i| Some(!is_end(i))).collect();
    let rows = filter_record_batch(rows.batch(), &keep)?;
    Ok((rows, ends.into_iter().collect()))
}

use wal2delta_model::clock::unix_us as now_us;

/// The columns of a Silver table created before any row reached it: Bronze's `after`
/// columns and Silver's own, as the fold and MERGE write them.
pub(super) fn initial_fields(rows: &BronzeRows, table: &str) -> Result<Vec<Field>, LakeError> {
    let after = rows.after().map_err(|e| LakeError::Rows {
        table: table.to_owned(),
        reason: e.to_string(),
    })?;
    let mut fields: Vec<Field> = after
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), f.data_type().clone(), true))
        .collect();
    fields.push(Field::new(COMMIT_LSN, DataType::Int64, true));
    fields.push(Field::new(ORDINAL, DataType::Int64, true));
    fields.push(Field::new(
        COMMIT_TS,
        DataType::Timestamp(
            deltalake::arrow::datatypes::TimeUnit::Microsecond,
            Some("UTC".into()),
        ),
        true,
    ));
    fields.push(Field::new(
        UNRESOLVED,
        DataType::List(Arc::new(Field::new("element", DataType::Utf8, true))),
        true,
    ));
    Ok(fields)
}

fn count_op(b: &RecordBatch, op: &str) -> usize {
    b.column_by_name(OP)
        .and_then(|a| a.as_string_opt::<i32>())
        .map_or(0, |a| (0..a.len()).filter(|&i| a.value(i) == op).count())
}

/// The rows of `b` with `_op = op`, and the rest.
fn split(b: &RecordBatch, op: &str) -> Result<(RecordBatch, RecordBatch), LakeError> {
    let ops = b
        .column_by_name(OP)
        .and_then(|a| a.as_string_opt::<i32>())
        .ok_or_else(|| LakeError::Rows {
            table: "silver".into(),
            reason: "folded rows have no _op".into(),
        })?;
    let is: BooleanArray = (0..ops.len()).map(|i| Some(ops.value(i) == op)).collect();
    let not = deltalake::arrow::compute::not(&is).map_err(|e| LakeError::Rows {
        table: "silver".into(),
        reason: e.to_string(),
    })?;
    let f = |m| {
        filter_record_batch(b, m).map_err(|e| LakeError::Rows {
            table: "silver".into(),
            reason: e.to_string(),
        })
    };
    Ok((f(&is)?, f(&not)?))
}

/// Key columns plus position and time: a tombstone row.
fn project_tombstones(deletes: &RecordBatch, keys: &[String]) -> Result<RecordBatch, String> {
    let names: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .chain([COMMIT_LSN, ORDINAL, COMMIT_TS])
        .collect();
    let schema = deletes.schema();
    let idx: Vec<usize> = names
        .iter()
        .map(|n| schema.index_of(n).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    deletes.project(&idx).map_err(|e| e.to_string())
}
