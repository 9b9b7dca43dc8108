//! Writing a round's folded changes into Silver: the MERGE (highest position wins,
//! unchanged TOAST values kept, rows still missing values filled by older changes, a
//! TRUNCATE's deletes), the fill of moved rows' unchanged values, and the SQL they are
//! built from.

use std::collections::BTreeSet;
use std::sync::Arc;

use deltalake::arrow::array::{Array, AsArray, RecordBatch};
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use super::columns::{Position, COMMIT_LSN, MOVED_FROM, OP, ORDINAL, UNCHANGED, UNRESOLVED};
use super::table::SilverTable;
use super::tombstones::{keys_equal, newer};
use crate::delta::{self, ident, literal};
use crate::widen;
use crate::LakeError;

/// The Delta table property delta-rs' writers size their files by.
const FILE_SIZE_PROPERTY: &str = "delta.targetFileSize";

/// What one Silver MERGE did.
pub(super) struct Merged {
    pub(super) version: u64,
    /// Silver rows inserted, updated or deleted.
    pub(super) touched: usize,
    pub(super) rewritten: Rewritten,
}

/// The copy-on-write cost of a round: the data files a MERGE replaced because they held a
/// changed key, and the rows it copied unchanged from them into new files. Copies per
/// change is what makes a round cost more than its changes (docs/silver.md, "Metrics").
#[derive(Debug, Clone, Copy, Default)]
pub struct Rewritten {
    pub files: usize,
    pub copied: usize,
}

impl SilverTable {
    /// Fills the unchanged values of moved rows (`_moved_from_{k}` set by the fold) from
    /// Silver's row under the old key, read before this round's MERGE deletes it; the
    /// filled columns leave `_unchanged`. Drops the `_moved_from_` columns.
    pub(super) async fn fill_moved(
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
                        filled.iter().map(|c| literal(c)).collect::<Vec<_>>().join(", ")
                    )
                } else if filled.contains(&n) {
                    format!(
                        "CASE WHEN {matched} AND array_has(s.{UNCHANGED}, {}) THEN m.{q} ELSE s.{q} END AS {q}",
                        literal(n)
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

    /// Rewrites Silver under the wider column types `fields` bring ([`crate::widen`]),
    /// carrying its last commit's `wal2delta.*` info (the progress and masking readers
    /// take from it) forward as compaction does; the columns that widened (none: `table`
    /// as it was).
    pub(super) async fn widen(
        &self,
        table: DeltaTable,
        fields: &Fields,
    ) -> Result<(DeltaTable, Vec<String>), LakeError> {
        let carried = crate::maintenance::own_commit_info(&self.name, &table).await?;
        match widen::widen_table("Silver", &self.name, &table, fields, &[], carried)
            .await
            .map_err(LakeError::delta(&self.name))?
        {
            Some(widened) => Ok(widened),
            None => Ok((table, Vec::new())),
        }
    }

    /// Opens the Silver table with every column of `fields`, creating it or adding
    /// columns (a commit of its own, without rows) when needed.
    pub(super) async fn ensure_columns(
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
        let creating = silver.is_none();
        let table = match silver {
            Some(t) => t,
            None => delta::handle(&self.name, &self.url)?,
        };
        let table = if !needs {
            table
        } else {
            let mut write = table
                .write(vec![RecordBatch::new_empty(wanted)])
                .with_save_mode(SaveMode::Append)
                .with_schema_mode(SchemaMode::Merge)
                .with_commit_properties(delta::commit_properties());
            if let (true, Some(bytes)) = (creating, self.file_bytes) {
                write = write.with_configuration([(FILE_SIZE_PROPERTY, Some(bytes.to_string()))]);
            }
            write.await.map_err(LakeError::delta(&self.name))?
        };
        self.ensure_file_size(table).await
    }

    /// Sets the table's `delta.targetFileSize` to [`SilverTable::with_file_size`]'s when
    /// it differs (a table made before, or a changed setting), in a commit that carries
    /// the last commit's `wal2delta.*` info forward as compaction does, so the masking
    /// the last MERGE recorded stays visible.
    async fn ensure_file_size(&self, table: DeltaTable) -> Result<DeltaTable, LakeError> {
        use deltalake::table::config::TablePropertiesExt;
        let Some(bytes) = self.file_bytes else {
            return Ok(table);
        };
        let state = table.snapshot().map_err(LakeError::delta(&self.name))?;
        let explicit = state
            .metadata()
            .configuration()
            .contains_key(FILE_SIZE_PROPERTY);
        if explicit && state.table_config().target_file_size().get() == bytes {
            return Ok(table);
        }
        let carried = crate::maintenance::own_commit_info(&self.name, &table).await?;
        table
            .set_tbl_properties()
            .with_properties([(FILE_SIZE_PROPERTY.to_owned(), bytes.to_string())].into())
            .with_commit_properties(delta::commit_metadata(carried))
            .await
            .map_err(LakeError::delta(&self.name))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn merge(
        &self,
        target: DeltaTable,
        source: RecordBatch,
        keys: &[String],
        fields: &[Field],
        unchanged: &BTreeSet<String>,
        truncate: Option<Position>,
        props: CommitProperties,
    ) -> Result<Merged, LakeError> {
        let err = LakeError::delta(&self.name);
        let ctx = delta::session();
        let newer = newer("source", "target");
        let value = |name: &str| {
            let q = ident(name);
            if unchanged.contains(name) {
                format!("CASE WHEN array_has(source.{UNCHANGED}, {}) THEN target.{q} ELSE source.{q} END", literal(name))
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
            .with_session_state(delta::merge_session())
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
                                let lit = literal(c);
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
        Ok(Merged {
            version,
            touched,
            rewritten: Rewritten {
                files: metrics.num_target_files_removed,
                copied: metrics.num_target_rows_copied,
            },
        })
    }

    /// The version `table` is at after an operation that started from `read_version`
    /// with `props`. delta-rs makes no commit when a MERGE or DELETE changes no row (every
    /// change of the round was older than Silver's rows): the round's progress is then
    /// committed alone, or the same rows would be read, change nothing and hold the
    /// watermark back forever.
    pub(super) async fn committed(
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
    pub(super) async fn truncate_only(
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

/// Most key ranges a MERGE condition names (see [`key_ranges`]).
pub(super) const MAX_KEY_RANGES: usize = 32;

/// For a single integer key: the round's keys as at most `max` ranges, split at the widest
/// gaps, as a condition on the target (`(target.k BETWEEN a AND b OR ...)`). In the MERGE
/// condition it lets delta-rs skip every Silver file whose key statistics miss all ranges,
/// so a few changes spread over a big table read (and hold) only the files they touch,
/// not every file between the lowest and the highest key.
pub(super) fn key_ranges(source: &RecordBatch, keys: &[String], max: usize) -> Option<String> {
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

    /// A new table is made with the file size; a table made before, or with another size,
    /// gets it in a commit that keeps the last commit's `wal2delta.*` info visible.
    #[tokio::test]
    async fn the_merge_file_size_is_the_tables_property() {
        use deltalake::table::config::TablePropertiesExt;
        let lake = crate::Lake::new("memory:///silver-file-size/").unwrap();
        let fields = [Field::new("id", DataType::Int32, true)];
        let size = |t: &DeltaTable| {
            t.snapshot()
                .unwrap()
                .table_config()
                .target_file_size()
                .get()
        };
        let t = SilverTable::new(&lake, "public", "t", 10)
            .with_file_size(8 << 20)
            .ensure_columns(None, &fields)
            .await
            .unwrap();
        assert_eq!(size(&t), 8 << 20);
        let created = t.version();
        // Unchanged: no commit.
        let silver = SilverTable::new(&lake, "public", "t", 10).with_file_size(8 << 20);
        let t = silver.ensure_columns(Some(t), &fields).await.unwrap();
        assert_eq!(t.version(), created);
        // A commit recording masking, then another size.
        let t = t
            .write(vec![batch(&[1])])
            .with_commit_properties(delta::commit_metadata([(
                "wal2delta.masking".to_owned(),
                serde_json::json!({"v": 1}),
            )]))
            .await
            .unwrap();
        let silver = SilverTable::new(&lake, "public", "t", 10).with_file_size(32 << 20);
        let t = silver.ensure_columns(Some(t), &fields).await.unwrap();
        assert_eq!(size(&t), 32 << 20);
        let mut info = crate::maintenance::own_commit_info("t", &t).await.unwrap();
        info.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            info,
            vec![
                ("wal2delta.format".to_owned(), serde_json::json!(1)),
                ("wal2delta.masking".to_owned(), serde_json::json!({"v": 1})),
            ]
        );
        // Without a size, the table's setting is left alone.
        let t = SilverTable::new(&lake, "public", "t", 10)
            .ensure_columns(Some(t), &fields)
            .await
            .unwrap();
        assert_eq!(size(&t), 32 << 20);
    }
}
