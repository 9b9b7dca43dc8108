//! One Silver table: reads its Bronze table after the stored cursors, applies the changes
//! whose transactions are whole, and commits rows and progress together.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use deltalake::arrow::array::{Array, AsArray, RecordBatch};
use deltalake::arrow::compute::{concat_batches, filter_record_batch};
use deltalake::arrow::datatypes::{DataType, Field, Schema};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use url::Url;

use super::checks::Check;
use super::mask::Masking;
use super::progress::SNAPSHOT_END;
use super::screen::{screen, ScreenError, Screened};
use super::tombstones::{keys_equal, newer, Tombstones};
use super::window::Window;
use super::{fold, plan, Position, Progress, TransactionCounts};
use super::{COMMIT_LSN, COMMIT_TS, MOVED_FROM, OP, ORDINAL, UNCHANGED, UNRESOLVED};
use crate::delta::{self, ident};
use crate::quarantine::QuarantineTable;
use crate::{Lake, LakeError};

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
}

/// What writing one round's folded changes did.
struct Written {
    version: u64,
    upserts: usize,
    deletes: usize,
    /// Silver rows inserted, updated or deleted.
    touched: usize,
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

/// The Bronze columns Silver reads.
const BRONZE_COLUMNS: &[&str] = &[
    "op",
    "before",
    "after",
    "key",
    "commit_lsn",
    "ordinal",
    "commit_ts",
    "unchanged_toast_columns",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
];

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
        }
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
    pub async fn apply(&mut self, counts: &TransactionCounts) -> Result<ApplyReport, LakeError> {
        let silver = delta::open(&self.name, &self.url).await?;
        let before = match &silver {
            Some(t) => Progress::load(&self.name, t).await?,
            None => Progress::default(),
        };
        let Some(bronze) = delta::open(&self.name, &self.bronze_url).await? else {
            return Ok(ApplyReport::default());
        };
        let rows = self.read_bronze(&bronze, &before).await?;
        let mut report = ApplyReport {
            read: rows.num_rows(),
            watermark: before.watermark,
            ..ApplyReport::default()
        };
        let planned = plan(&rows, &before, counts).map_err(|reason| self.rows_error(reason))?;
        report.waiting = planned.waiting;
        report.watermark = planned.progress.watermark;
        report.again = self
            .window
            .adjust(&self.name, &bronze, &before, &rows, &planned, counts)
            .await?;
        if planned.progress == before {
            return Ok(report);
        }
        let mut planned = planned;
        let applicable = filter_record_batch(&rows, &planned.applicable)
            .map_err(|e| self.rows_error(e.to_string()))?;
        // The end of a re-snapshot: once every partition's end is applied (so every row
        // the re-snapshot read is), the rows below its position are gone at the source.
        let (applicable, ends) =
            take_snapshot_ends(&applicable).map_err(|reason| self.rows_error(reason))?;
        let resnapshot = self
            .resnapshot_complete(&bronze, &ends, &planned.progress, before.truncated)
            .await?;
        if let Some(p) = resnapshot {
            tracing::info!(table = %self.name, from_lsn = p.0, "re-snapshot complete: deleting the rows it did not read again (deleted at the source while the slot was lost)");
            planned.progress.truncated = planned.progress.truncated.max(Some(p));
        }
        let screened = self.screen(&applicable, before.watermark)?;
        report.stale = screened.stale;
        // Quarantine first: a crash before the Silver commit repeats this round, and the
        // quarantine table skips the records it already holds (by id: a snapshot row may
        // be screened before the streamed rows ahead of it in its partition).
        report.quarantined = self
            .quarantine
            .append_new(wal2delta_quarantine::Stage::Silver, screened.quarantined)
            .await?;
        let applicable = screened.rows;
        let folded = fold(&applicable, before.truncated.max(resnapshot))
            .map_err(|e| self.rows_error(e.0))?;
        let new_truncate = folded.truncate.filter(|t| Some(*t) > before.truncated);

        let props = CommitProperties::default()
            .with_application_transactions(planned.progress.transactions(&self.name))
            .with_metadata([
                ("wal2delta.stage".to_owned(), serde_json::json!("silver")),
                (
                    "wal2delta.watermark".to_owned(),
                    serde_json::json!(planned.progress.watermark),
                ),
                (MASKING_KEY.to_owned(), self.masking.describe()),
            ]);
        let Some(source) = folded.rows else {
            // Nothing to write; the progress still moves (and a TRUNCATE still empties).
            let version = match (silver, new_truncate) {
                (Some(t), Some(p)) => Some(self.truncate_only(t, p, props).await?),
                (Some(t), None) => Some(
                    delta::commit_progress_only(
                        &t,
                        props,
                        "wal2delta-silver",
                        planned.progress.watermark,
                    )
                    .await
                    .map_err(LakeError::delta(&self.name))?,
                ),
                (None, _) => {
                    // Every change of the table's first round went to quarantine (or was
                    // a copy): create it empty so the progress is recorded, or the same
                    // window would be read again forever.
                    let t = self
                        .ensure_columns(None, &initial_fields(&rows, &self.name)?)
                        .await?;
                    Some(
                        delta::commit_progress_only(
                            &t,
                            props,
                            "wal2delta-silver",
                            planned.progress.watermark,
                        )
                        .await
                        .map_err(LakeError::delta(&self.name))?,
                    )
                }
            };
            report.version = version;
            return Ok(report);
        };
        let keys = key_names(&applicable);
        let written = self
            .write_folded(
                silver,
                source,
                &keys,
                &folded.unchanged_columns,
                new_truncate,
                props,
            )
            .await?;
        report.deletes = written.deletes;
        report.upserts = written.upserts;
        report.version = Some(written.version);
        Ok(report)
    }

    /// The position below which rows go, when this round completes a re-snapshot: some
    /// snapshot end (`ends`: commit LSN, partitions it was sent to) is not applied yet
    /// (above `truncated`), Bronze holds it in as many partitions as it was sent to, and
    /// `after`'s cursors pass each of them, so every snapshot row before it is applied.
    async fn resnapshot_complete(
        &self,
        bronze: &DeltaTable,
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
                "SELECT kafka_partition, MIN(kafka_offset) FROM t WHERE op = '{SNAPSHOT_END}' AND commit_lsn = {lsn} GROUP BY kafka_partition"
            );
            let mut held = Vec::new();
            for b in delta::query(&self.name, bronze, &sql).await? {
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
    async fn write_folded(
        &self,
        silver: Option<DeltaTable>,
        source: RecordBatch,
        keys: &[String],
        unchanged: &BTreeSet<String>,
        truncate: Option<Position>,
        props: CommitProperties,
    ) -> Result<Written, LakeError> {
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
        let (version, touched) = self
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
            version,
            upserts,
            deletes,
            touched,
        })
    }

    /// Re-drives the Bronze change at `partition`/`offset` (a quarantined row): checks it
    /// again with the current checks and, when it passes, merges it like any change (it
    /// enters only if no newer change of its key is in Silver or the tombstones). Progress
    /// does not move.
    pub async fn redrive(&mut self, partition: i32, offset: i64) -> Result<Redrive, LakeError> {
        let Some(bronze) = delta::open(&self.name, &self.bronze_url).await? else {
            return Ok(Redrive::NotInBronze);
        };
        let rows = self
            .select_bronze(
                &bronze,
                &format!("kafka_partition = {partition} AND kafka_offset = {offset}"),
            )
            .await?;
        if rows.num_rows() == 0 {
            return Ok(Redrive::NotInBronze);
        }
        let silver = delta::open(&self.name, &self.url).await?;
        let progress = match &silver {
            Some(t) => Progress::load(&self.name, t).await?,
            None => Progress::default(),
        };
        // Re-driven on purpose: nothing is dropped as a copy.
        let screened = self.screen(&rows, i64::MIN)?;
        if let Some(r) = screened.quarantined.first() {
            // Still failing; but when the source row has changed since (the data was
            // fixed at the source), the record is superseded.
            let masked = self
                .masking
                .mask_bronze(&rows)
                .map_err(|e| self.policy_error(e.to_string()))?;
            let folded = fold(&masked, progress.truncated).map_err(|e| self.rows_error(e.0))?;
            let Some(folded) = folded.rows else {
                return Ok(Redrive::Superseded);
            };
            let keys = key_names(&masked);
            return Ok(if self.superseded(silver.as_ref(), &keys, folded).await? {
                Redrive::Superseded
            } else {
                Redrive::StillFails(r.detail.clone())
            });
        }
        let folded = fold(&screened.rows, progress.truncated).map_err(|e| self.rows_error(e.0))?;
        let Some(source) = folded.rows else {
            return Ok(Redrive::Superseded);
        };
        let props = CommitProperties::default().with_metadata([
            ("wal2delta.stage".to_owned(), serde_json::json!("silver")),
            (
                "wal2delta.redrive".to_owned(),
                serde_json::json!(format!("{partition}/{offset}")),
            ),
            (MASKING_KEY.to_owned(), self.masking.describe()),
        ]);
        let keys = key_names(&screened.rows);
        let written = self
            .write_folded(
                silver,
                source,
                &keys,
                &folded.unchanged_columns,
                None,
                props,
            )
            .await?;
        Ok(if written.touched > 0 {
            Redrive::Applied
        } else {
            Redrive::Superseded
        })
    }

    /// Whether Silver or the tombstones hold a change newer than every row of `folded`.
    async fn superseded(
        &self,
        silver: Option<&DeltaTable>,
        keys: &[String],
        folded: RecordBatch,
    ) -> Result<bool, LakeError> {
        let n = folded.num_rows();
        let survivors: usize = self
            .tombstones
            .filter(keys, folded.clone())
            .await?
            .iter()
            .map(RecordBatch::num_rows)
            .sum();
        if survivors < n {
            return Ok(true);
        }
        let Some(silver) = silver else {
            return Ok(false);
        };
        let err = |e: deltalake::datafusion::error::DataFusionError| {
            LakeError::delta(&self.name)(e.into())
        };
        let ctx = delta::session();
        ctx.register_batch("s", folded).map_err(err)?;
        let provider = silver.table_provider().await.map_err(err)?;
        ctx.register_table("t", provider).map_err(err)?;
        let sql = format!(
            "SELECT s.{COMMIT_LSN} FROM s JOIN t ON {} WHERE {}",
            keys_equal(keys, "s", "t"),
            newer("t", "s")
        );
        let newer_rows: usize = delta::collect(&self.name, &ctx, &sql)
            .await?
            .iter()
            .map(RecordBatch::num_rows)
            .sum();
        Ok(newer_rows >= n)
    }

    /// Fills the unchanged values of moved rows (`_moved_from_{k}` set by the fold) from
    /// Silver's row under the old key, read before this round's MERGE deletes it; the
    /// filled columns leave `_unchanged`. Drops the `_moved_from_` columns.
    async fn fill_moved(
        &self,
        silver: Option<&DeltaTable>,
        source: RecordBatch,
        keys: &[String],
        unchanged: &BTreeSet<String>,
    ) -> Result<RecordBatch, LakeError> {
        let schema = source.schema();
        let moved: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| schema.field(i).name().starts_with(MOVED_FROM))
            .collect();
        if moved.is_empty() {
            return Ok(source);
        }
        let keep: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !moved.contains(i))
            .collect();
        let plain = source
            .project(&keep)
            .map_err(|e| self.rows_error(e.to_string()))?;
        let Some(silver) = silver else {
            return Ok(plain);
        };
        let have = delta::arrow_schema(&self.name, silver)?;
        let filled: Vec<&String> = unchanged
            .iter()
            .filter(|c| have.field_with_name(c).is_ok() && !keys.contains(c))
            .collect();
        if filled.is_empty() {
            return Ok(plain);
        }
        let matched = format!("m.{} IS NOT NULL", ident(&keys[0]));
        let quoted = |c: &str| format!("'{}'", c.replace('\'', "''"));
        let columns: Vec<String> = plain
            .schema()
            .fields()
            .iter()
            .map(|f| {
                let n = f.name();
                let q = ident(n);
                if n == UNCHANGED {
                    format!(
                        "CASE WHEN {matched} THEN array_except(s.{q}, make_array({})) ELSE s.{q} END AS {q}",
                        filled.iter().map(|c| quoted(c)).collect::<Vec<_>>().join(", ")
                    )
                } else if filled.contains(&n) {
                    format!(
                        "CASE WHEN {matched} AND array_has(s.{UNCHANGED}, {}) THEN m.{q} ELSE s.{q} END AS {q}",
                        quoted(n)
                    )
                } else {
                    format!("s.{q}")
                }
            })
            .collect();
        let on = keys
            .iter()
            .map(|k| format!("s.{} = m.{}", ident(&format!("{MOVED_FROM}{k}")), ident(k)))
            .collect::<Vec<_>>()
            .join(" AND ");
        let err = |e: deltalake::datafusion::error::DataFusionError| {
            LakeError::delta(&self.name)(e.into())
        };
        let ctx = delta::session();
        ctx.register_batch("s", source).map_err(err)?;
        ctx.register_table("m", silver.table_provider().await.map_err(err)?)
            .map_err(err)?;
        let sql = format!("SELECT {} FROM s LEFT JOIN m ON {on}", columns.join(", "));
        let out = delta::collect(&self.name, &ctx, &sql).await?;
        let out_schema = out.first().map_or_else(|| plain.schema(), |b| b.schema());
        concat_batches(&out_schema, &out).map_err(|e| self.rows_error(e.to_string()))
    }

    /// `screen` with this table's checks and masking; refuses a lossy mask on a key.
    fn screen(&self, rows: &RecordBatch, watermark: i64) -> Result<Screened, LakeError> {
        self.masking
            .check_keys(&key_names(rows))
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

    fn policy_error(&self, reason: String) -> LakeError {
        LakeError::Policy {
            table: self.name.clone(),
            reason,
        }
    }

    fn rows_error(&self, reason: String) -> LakeError {
        LakeError::Rows {
            table: self.name.clone(),
            reason,
        }
    }

    async fn read_bronze(
        &mut self,
        bronze: &DeltaTable,
        p: &Progress,
    ) -> Result<RecordBatch, LakeError> {
        self.window.discover(&self.name, bronze, p).await?;
        let condition = self.window.condition(p);
        self.select_bronze(bronze, &condition).await
    }

    /// The Bronze rows matching `condition`, in Kafka order.
    async fn select_bronze(
        &self,
        bronze: &DeltaTable,
        condition: &str,
    ) -> Result<RecordBatch, LakeError> {
        let schema = delta::arrow_schema(&self.name, bronze)?;
        let missing: Vec<&str> = BRONZE_COLUMNS
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
        let sql = format!(
            "SELECT {} FROM t WHERE {condition} ORDER BY kafka_partition, kafka_offset",
            BRONZE_COLUMNS
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", "),
        );
        let batches = delta::query(&self.name, bronze, &sql).await?;
        let schema = batches
            .first()
            .map(|b| b.schema())
            .unwrap_or_else(|| Arc::new(Schema::new(bronze_fields(&schema))));
        concat_batches(&schema, &batches).map_err(|e| self.rows_error(e.to_string()))
    }

    /// Opens the Silver table with every column of `fields`, creating it or adding
    /// columns (a commit of its own, without rows) when needed.
    async fn ensure_columns(
        &self,
        silver: Option<DeltaTable>,
        fields: &[Field],
    ) -> Result<DeltaTable, LakeError> {
        let wanted = Arc::new(Schema::new(fields.to_vec()));
        let needs = match &silver {
            None => true,
            Some(t) => {
                let have = delta::arrow_schema(&self.name, t)?;
                fields
                    .iter()
                    .any(|f| have.field_with_name(f.name()).is_err())
            }
        };
        let table = match silver {
            Some(t) => t,
            None => delta::handle(&self.name, &self.url)?,
        };
        if !needs {
            return Ok(table);
        }
        table
            .write(vec![RecordBatch::new_empty(wanted)])
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(SchemaMode::Merge)
            .await
            .map_err(LakeError::delta(&self.name))
    }

    #[allow(clippy::too_many_arguments)]
    async fn merge(
        &self,
        target: DeltaTable,
        source: RecordBatch,
        keys: &[String],
        fields: &[Field],
        unchanged: &BTreeSet<String>,
        truncate: Option<Position>,
        props: CommitProperties,
    ) -> Result<(u64, usize), LakeError> {
        let err = LakeError::delta(&self.name);
        let ctx = delta::session();
        let newer = newer("source", "target");
        let value = |name: &str| {
            let q = ident(name);
            if unchanged.contains(name) {
                format!("CASE WHEN array_has(source.{UNCHANGED}, '{}') THEN target.{q} ELSE source.{q} END", name.replace('\'', "''"))
            } else {
                format!("source.{q}")
            }
        };
        // Values neither the change nor the row knows (unchanged TOAST whose earlier image
        // has not arrived): they stay listed until an older change supplies them.
        let still_unknown = format!("array_intersect(source.{UNCHANGED}, target.{UNRESOLVED})");
        let fillable: Vec<String> = fields
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !n.starts_with('_') && !keys.contains(n))
            .collect();
        // Target files holding none of the round's keys are skipped by their statistics.
        let on = match key_ranges(&source, keys, MAX_KEY_RANGES) {
            Some(ranges) => format!("{} AND {ranges}", keys_equal(keys, "target", "source")),
            None => keys_equal(keys, "target", "source"),
        };
        let read_version = target.version();
        let kept = props.clone();
        let source = ctx
            .read_batch(source)
            .map_err(|e| LakeError::delta(&self.name)(e.into()))?;
        let mut m = target
            .merge(source, on)
            .with_source_alias("source")
            .with_target_alias("target")
            .with_commit_properties(props)
            .when_matched_delete(|d| d.predicate(format!("source.{OP} = 'd' AND {newer}")))
            .and_then(|m| {
                m.when_matched_update(|u| {
                    fields
                        .iter()
                        .fold(
                            u.predicate(format!("source.{OP} = 'u' AND {newer}")),
                            |u, f| u.update(f.name().as_str(), value(f.name())),
                        )
                        .update(UNRESOLVED, still_unknown.clone())
                })
            })
            .and_then(|m| {
                // An older change (a snapshot row arriving after a later update) only fills
                // the values the row is still missing.
                m.when_matched_update(|u| {
                    fillable
                        .iter()
                        .fold(
                            u.predicate(format!(
                                "source.{OP} = 'u' AND NOT {newer} AND cardinality(target.{UNRESOLVED}) > 0"
                            )),
                            |u, c| {
                                let q = ident(c);
                                let lit = format!("'{}'", c.replace('\'', "''"));
                                u.update(
                                    c.as_str(),
                                    format!("CASE WHEN array_has(target.{UNRESOLVED}, {lit}) AND NOT array_has(source.{UNCHANGED}, {lit}) THEN source.{q} ELSE target.{q} END"),
                                )
                            },
                        )
                        .update(UNRESOLVED, still_unknown.clone())
                })
            })
            .and_then(|m| {
                m.when_not_matched_insert(|i| {
                    fields
                        .iter()
                        .fold(i.predicate(format!("source.{OP} = 'u'")), |i, f| {
                            i.set(f.name().as_str(), format!("source.{}", ident(f.name())))
                        })
                        .set(UNRESOLVED, format!("source.{UNCHANGED}"))
                })
            })
            .map_err(LakeError::delta(&self.name))?;
        if let Some(Position(l, o)) = truncate {
            m = m
                .when_not_matched_by_source_delete(|d| {
                    d.predicate(format!(
                        "target.{COMMIT_LSN} < {l} OR (target.{COMMIT_LSN} = {l} AND target.{ORDINAL} < {o})"
                    ))
                })
                .map_err(LakeError::delta(&self.name))?;
        }
        let (table, metrics) = m.await.map_err(err)?;
        let touched = metrics.num_target_rows_inserted
            + metrics.num_target_rows_updated
            + metrics.num_target_rows_deleted;
        let version = self.committed(read_version, table, kept).await?;
        Ok((version, touched))
    }

    /// The version `table` is at after an operation that started from `read_version`
    /// with `props`. delta-rs makes no commit when a MERGE or DELETE changes no row (every
    /// change of the round was older than Silver's rows): the round's progress is then
    /// committed alone, or the same rows would be read, change nothing and hold the
    /// watermark back forever.
    async fn committed(
        &self,
        read_version: Option<u64>,
        table: DeltaTable,
        props: CommitProperties,
    ) -> Result<u64, LakeError> {
        if table.version() != read_version {
            return Ok(table.version().unwrap_or(0));
        }
        delta::commit_progress_only(&table, props, "wal2delta-silver", 0)
            .await
            .map_err(LakeError::delta(&self.name))
    }

    /// A TRUNCATE with nothing after it in the batch: delete every row before it.
    async fn truncate_only(
        &self,
        table: DeltaTable,
        Position(l, o): Position,
        props: CommitProperties,
    ) -> Result<u64, LakeError> {
        let read_version = table.version();
        let kept = props.clone();
        let (table, _) = table
            .delete()
            .with_predicate(format!(
                "{COMMIT_LSN} < {l} OR ({COMMIT_LSN} = {l} AND {ORDINAL} < {o})"
            ))
            .with_commit_properties(props)
            .await
            .map_err(LakeError::delta(&self.name))?;
        self.committed(read_version, table, kept).await
    }
}

/// Splits the snapshot ends (`op` = `s`) off `rows`: the other rows, and each end's
/// (commit LSN, number of partitions it was sent to, carried as its `ordinal`).
fn take_snapshot_ends(rows: &RecordBatch) -> Result<(RecordBatch, Vec<(i64, i64)>), String> {
    use deltalake::arrow::datatypes::Int64Type;
    let (Some(op), Some(lsn), Some(ordinal)) = (
        rows.column_by_name("op")
            .and_then(|a| a.as_string_opt::<i32>()),
        rows.column_by_name("commit_lsn")
            .and_then(|a| a.as_primitive_opt::<Int64Type>()),
        rows.column_by_name("ordinal")
            .and_then(|a| a.as_primitive_opt::<Int64Type>()),
    ) else {
        return Err("Bronze columns `op`, `commit_lsn` or `ordinal` are missing".into());
    };
    let is_end = |i: usize| op.is_valid(i) && op.value(i) == SNAPSHOT_END;
    let ends: BTreeSet<(i64, i64)> = (0..rows.num_rows())
        .filter(|&i| is_end(i))
        .map(|i| (lsn.value(i), ordinal.value(i)))
        .collect();
    if ends.is_empty() {
        return Ok((rows.clone(), Vec::new()));
    }
    let keep: deltalake::arrow::array::BooleanArray =
        (0..rows.num_rows()).map(|i| Some(!is_end(i))).collect();
    let rows = filter_record_batch(rows, &keep).map_err(|e| e.to_string())?;
    Ok((rows, ends.into_iter().collect()))
}

/// Most key ranges a MERGE condition names (see [`key_ranges`]).
const MAX_KEY_RANGES: usize = 32;

/// For a single integer key: the round's keys as at most `max` ranges, split at the widest
/// gaps, as a condition on the target (`(target.k BETWEEN a AND b OR ...)`). In the MERGE
/// condition it lets delta-rs skip every Silver file whose key statistics miss all ranges,
/// so a few changes spread over a big table read (and hold) only the files they touch,
/// not every file between the lowest and the highest key.
fn key_ranges(source: &RecordBatch, keys: &[String], max: usize) -> Option<String> {
    use deltalake::arrow::datatypes::Int64Type;
    let [key] = keys else { return None };
    let column = source.column_by_name(key)?;
    if !column.data_type().is_integer() || column.data_type() == &DataType::UInt64 {
        return None;
    }
    let values = deltalake::arrow::compute::cast(column, &DataType::Int64).ok()?;
    let mut v: Vec<i64> = values
        .as_primitive::<Int64Type>()
        .iter()
        .flatten()
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    v.dedup();
    // Split after the `max - 1` widest gaps.
    let mut gaps: Vec<(u64, usize)> = v
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].abs_diff(w[0]), i))
        .collect();
    gaps.sort_unstable_by(|a, b| b.cmp(a));
    let mut cuts: Vec<usize> = gaps
        .iter()
        .take(max.saturating_sub(1))
        .filter(|(g, _)| *g > 1)
        .map(|(_, i)| *i)
        .collect();
    cuts.sort_unstable();
    let q = ident(key);
    let mut ranges = Vec::new();
    let mut start = 0;
    for c in cuts.into_iter().chain([v.len() - 1]) {
        ranges.push(format!("target.{q} BETWEEN {} AND {}", v[start], v[c]));
        start = c + 1;
    }
    Some(format!("({})", ranges.join(" OR ")))
}

/// Commit metadata key of the masking policies a Silver commit was written under.
pub const MASKING_KEY: &str = "wal2delta.masking";

use wal2delta_model::clock::unix_us as now_us;

fn bronze_fields(schema: &Schema) -> Vec<Field> {
    BRONZE_COLUMNS
        .iter()
        .filter_map(|c| schema.field_with_name(c).ok().cloned())
        .collect()
}

/// The columns of a Silver table created before any row reached it: Bronze's `after`
/// columns and Silver's own, as the fold and MERGE write them.
fn initial_fields(rows: &RecordBatch, table: &str) -> Result<Vec<Field>, LakeError> {
    let after = rows
        .column_by_name("after")
        .and_then(|a| a.as_struct_opt())
        .ok_or_else(|| LakeError::Rows {
            table: table.to_owned(),
            reason: "Bronze column `after` is missing or not a struct".into(),
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

/// The primary-key columns: the fields of Bronze's `key`.
fn key_names(rows: &RecordBatch) -> Vec<String> {
    rows.column_by_name("key")
        .and_then(|k| k.as_struct_opt())
        .map(|k| k.fields().iter().map(|f| f.name().clone()).collect())
        .unwrap_or_default()
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
    let is: deltalake::arrow::array::BooleanArray =
        (0..ops.len()).map(|i| Some(ops.value(i) == op)).collect();
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

/// The Bronze quarantine records a resolution names, of changes committed above `after`:
/// (`schema.table`, commit LSN, (Kafka partition, ordinal)). Records without a commit LSN
/// (the event could not be decoded) cannot be placed in a transaction and are left out.
pub async fn resolved_bronze_events(
    lake: &Lake,
    after: i64,
) -> Result<Vec<(String, i64, (i32, i64))>, LakeError> {
    use crate::quarantine::{QuarantineTable, Resolutions};
    let records = QuarantineTable::new(lake.quarantine_records())
        .read_all()
        .await?;
    let placed: Vec<_> = records
        .into_iter()
        .filter(|r| r.stage == wal2delta_quarantine::Stage::Bronze)
        .filter_map(|r| match (r.table, r.commit_lsn, r.partition, r.ordinal) {
            (Some(t), Some(l), Some(p), Some(o)) if l > after => Some((r.id, t, l, (p, o))),
            _ => None,
        })
        .collect();
    if placed.is_empty() {
        return Ok(Vec::new());
    }
    let resolved = Resolutions::new(lake.quarantine_resolutions())
        .read()
        .await?;
    Ok(placed
        .into_iter()
        .filter(|(id, ..)| resolved.contains_key(id))
        .map(|(_, t, l, e)| (t, l, e))
        .collect())
}

/// The END counts of every table, and how far the records reach, read from
/// `bronze/_wal2delta/transactions` above `after`.
pub async fn transaction_counts(
    lake: &Lake,
    after: i64,
) -> Result<(i64, HashMap<String, TransactionCounts>), LakeError> {
    const NAME: &str = "_wal2delta.transactions";
    let Some(t) = delta::open(NAME, &lake.bronze_transactions()).await? else {
        return Ok((after, HashMap::new()));
    };
    let batches = delta::query(
        NAME,
        &t,
        &format!("SELECT status, commit_lsn, data_collections FROM t WHERE commit_lsn > {after}"),
    )
    .await?;
    let mut top = after;
    let mut by_table: HashMap<String, TransactionCounts> = HashMap::new();
    let bad = |what: &str| LakeError::Rows {
        table: NAME.into(),
        reason: format!("unexpected type of {what}"),
    };
    use deltalake::arrow::datatypes::Int64Type;
    for b in &batches {
        let lsn = b
            .column(1)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| bad("commit_lsn"))?;
        let lists = b
            .column(2)
            .as_list_opt::<i32>()
            .ok_or_else(|| bad("data_collections"))?;
        for i in 0..b.num_rows() {
            if lsn.is_null(i) {
                continue;
            }
            let l = lsn.value(i);
            top = top.max(l);
            if lists.is_null(i) {
                continue; // a watermark
            }
            let entries = lists.value(i);
            let entries = entries
                .as_struct_opt()
                .ok_or_else(|| bad("data_collections"))?;
            let names = entries
                .column(0)
                .as_string_opt::<i32>()
                .ok_or_else(|| bad("data_collection"))?;
            let counts = entries
                .column(1)
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| bad("event_count"))?;
            for j in 0..entries.len() {
                by_table
                    .entry(names.value(j).to_owned())
                    .or_default()
                    .events
                    .insert(l, counts.value(j) as u64);
            }
        }
    }
    // Bronze events quarantined and then resolved by an operator count as held: the END
    // record counts them, Bronze never will.
    if !by_table.is_empty() {
        for (table, lsn, event) in resolved_bronze_events(lake, after).await? {
            if let Some(c) = by_table.get_mut(&table) {
                c.resolved.entry(lsn).or_default().insert(event);
            }
        }
    }
    for c in by_table.values_mut() {
        c.top = top;
    }
    Ok((top, by_table))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int32Array, StringArray};

    fn batch(ids: &[i32]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, true)])),
            vec![Arc::new(Int32Array::from(ids.to_vec()))],
        )
        .unwrap()
    }

    #[test]
    fn key_ranges_split_at_the_widest_gaps() {
        let keys = ["id".to_string()];
        assert_eq!(
            key_ranges(&batch(&[5, 1, 2, 1_000_000, 3, 999_999]), &keys, 32).unwrap(),
            "(target.\"id\" BETWEEN 1 AND 3 OR target.\"id\" BETWEEN 5 AND 5 OR target.\"id\" BETWEEN 999999 AND 1000000)"
        );
        assert_eq!(
            key_ranges(&batch(&[10, 500, 20, 30]), &keys, 2).unwrap(),
            "(target.\"id\" BETWEEN 10 AND 30 OR target.\"id\" BETWEEN 500 AND 500)"
        );
        // Text keys and composite keys get no ranges.
        let text = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(vec!["a"]))],
        )
        .unwrap();
        assert!(key_ranges(&text, &keys, 32).is_none());
        assert!(key_ranges(&batch(&[1]), &["id".into(), "x".into()], 32).is_none());
    }
}
