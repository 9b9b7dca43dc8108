//! Delete tombstones of one Silver table: the key and position of every delete, so that an
//! old change delivered again after the delete cannot bring the row back.
//!
//! Kept in `silver/_wal2delta/tombstones/{schema}/{table}` (the Silver table itself holds
//! only live rows). A tombstone is written before the Silver commit that deletes the row;
//! rewriting it is idempotent (the higher position stays).

use deltalake::arrow::array::RecordBatch;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use url::Url;

use super::{COMMIT_LSN, COMMIT_TS, ORDINAL};
use crate::delta::{self, ident};
use crate::LakeError;

/// `a` is positioned after `b` (SQL over aliases).
pub(crate) fn newer(a: &str, b: &str) -> String {
    format!(
        "({a}.{l} > {b}.{l} OR ({a}.{l} = {b}.{l} AND {a}.{o} > {b}.{o}))",
        l = COMMIT_LSN,
        o = ORDINAL
    )
}

/// `a.k = b.k AND ...` over the key columns.
pub(crate) fn keys_equal(keys: &[String], a: &str, b: &str) -> String {
    keys.iter()
        .map(|k| format!("{a}.{q} = {b}.{q}", q = ident(k)))
        .collect::<Vec<_>>()
        .join(" AND ")
}

pub struct Tombstones {
    name: String,
    url: Url,
}

impl Tombstones {
    pub fn new(table: &str, url: Url) -> Self {
        Tombstones {
            name: format!("tombstones of {table}"),
            url,
        }
    }

    async fn open(&self) -> Result<Option<DeltaTable>, LakeError> {
        delta::open(&self.name, &self.url).await
    }

    /// The tombstones of the deletes of source transaction `lsn` (key columns,
    /// `_commit_lsn`, `_ordinal`, `_commit_ts`): none when the table has none.
    pub async fn at_lsn(&self, lsn: i64) -> Result<Vec<RecordBatch>, LakeError> {
        match self.open().await? {
            None => Ok(Vec::new()),
            Some(t) => {
                delta::query(
                    &self.name,
                    &t,
                    &format!("SELECT * FROM t WHERE {COMMIT_LSN} = {lsn}"),
                )
                .await
            }
        }
    }

    /// Records `deletes` (key columns, `_commit_lsn`, `_ordinal`, `_commit_ts`).
    pub async fn record(&self, keys: &[String], deletes: RecordBatch) -> Result<(), LakeError> {
        if deletes.num_rows() == 0 {
            return Ok(());
        }
        let err = LakeError::delta(&self.name);
        match self.open().await? {
            None => {
                delta::handle(&self.name, &self.url)?
                    .write(vec![deletes])
                    .with_save_mode(SaveMode::Append)
                    .with_commit_properties(delta::commit_properties())
                    .await
                    .map_err(err)?;
            }
            Some(table) => {
                // A key whose type widened (`int` → `bigint`) widens here too, or the
                // MERGE would cast the new keys into the old type.
                let widened = crate::widen::widen_table(
                    "tombstones",
                    &self.name,
                    &table,
                    deletes.schema().fields(),
                    &[],
                    Vec::new(),
                )
                .await
                .map_err(LakeError::delta(&self.name))?;
                let table = widened.map_or(table, |(t, _)| t);
                let ctx = delta::session();
                let source = ctx
                    .read_batch(deletes)
                    .map_err(|e| LakeError::delta(&self.name)(e.into()))?;
                let cols = keys
                    .iter()
                    .map(String::as_str)
                    .chain([COMMIT_LSN, ORDINAL, COMMIT_TS])
                    .map(str::to_owned)
                    .collect::<Vec<_>>();
                let set_cols = cols.clone();
                table
                    .merge(source, keys_equal(keys, "target", "source"))
                    .with_source_alias("source")
                    .with_target_alias("target")
                    .with_session_state(delta::merge_session())
                    .with_commit_properties(delta::commit_properties())
                    .when_matched_update(|u| {
                        [COMMIT_LSN, ORDINAL, COMMIT_TS]
                            .into_iter()
                            .fold(u.predicate(newer("source", "target")), |u, c| {
                                u.update(c, format!("source.{}", ident(c)))
                            })
                    })
                    .and_then(|m| {
                        m.when_not_matched_insert(|i| {
                            set_cols
                                .iter()
                                .fold(i, |i, c| i.set(c.as_str(), format!("source.{}", ident(c))))
                        })
                    })
                    .map_err(LakeError::delta(&self.name))?
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    /// Replaces every tombstone here with those of `other` (a rebuilt table's). The rebuilt
    /// tombstones come from all of Bronze under the new masking, so they hold every delete
    /// the live ones guard, keyed as the rebuilt rows are: merging the two instead would
    /// keep the raw values of a key column that is now hashed. Returns how many there are.
    pub async fn replace_with(&self, other: &Tombstones) -> Result<usize, LakeError> {
        let err = LakeError::delta(&self.name);
        let live = self.open().await?;
        let Some(rebuilt) = other.open().await? else {
            // No delete in Bronze at all: no tombstone stays.
            if let Some(t) = live {
                t.delete()
                    .with_commit_properties(delta::commit_properties())
                    .await
                    .map_err(err)?;
            }
            return Ok(0);
        };
        let df_err = |e: deltalake::datafusion::error::DataFusionError| {
            LakeError::delta(&self.name)(e.into())
        };
        let ctx = delta::session();
        let provider = rebuilt.table_provider().await.map_err(df_err)?;
        let df = ctx.read_table(provider).map_err(df_err)?;
        let n = df.clone().count().await.map_err(df_err)?;
        let target = match live {
            Some(t) => t,
            None => delta::handle(&self.name, &self.url)?,
        };
        target
            .write(Vec::new())
            .with_input_plan(df.logical_plan().clone())
            .with_save_mode(SaveMode::Overwrite)
            .with_schema_mode(SchemaMode::Overwrite)
            .with_commit_properties(delta::commit_properties())
            .await
            .map_err(err)?;
        Ok(n)
    }

    /// Deletes the files no version after the latest needs, so that no file here holds a
    /// key as an earlier masking wrote it. Returns how many were deleted.
    pub async fn purge_history(&self) -> Result<usize, LakeError> {
        let Some(table) = self.open().await? else {
            return Ok(0);
        };
        let (_, metrics) = table
            .vacuum()
            .with_retention_period(chrono::Duration::zero())
            .with_enforce_retention_duration(false)
            .with_commit_properties(delta::commit_properties())
            .await
            .map_err(LakeError::delta(&self.name))?;
        Ok(metrics.files_deleted.len())
    }

    /// Deletes the tombstones at or below `watermark` whose delete committed before
    /// `older_than_us` (µs since the epoch). Returns how many were deleted.
    ///
    /// Safe because a streamed change at or below the watermark is dropped as a copy
    /// before it reaches the tombstones (`screen`); what a tombstone still guards after
    /// that is a snapshot row (`r`) of the key delivered again, which the retention must
    /// outlast (see docs/silver.md).
    pub async fn prune(&self, watermark: i64, older_than_us: i64) -> Result<usize, LakeError> {
        let Some(table) = self.open().await? else {
            return Ok(0);
        };
        let Some(cutoff) = chrono::DateTime::from_timestamp_micros(older_than_us) else {
            return Ok(0);
        };
        // `_commit_ts` is a UTC timestamp: compare it with a UTC literal.
        let cutoff = cutoff.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let (_, metrics) = table
            .delete()
            .with_predicate(format!(
                "{COMMIT_LSN} <= {watermark} AND {COMMIT_TS} < '{cutoff}'"
            ))
            .with_commit_properties(delta::commit_properties())
            .await
            .map_err(LakeError::delta(&self.name))?;
        Ok(metrics.num_deleted_rows.unwrap_or(0))
    }

    /// Drops the upserts of `folded` at or below a tombstone of their key.
    pub async fn filter(
        &self,
        keys: &[String],
        folded: RecordBatch,
    ) -> Result<Vec<RecordBatch>, LakeError> {
        let Some(table) = self.open().await? else {
            return Ok(vec![folded]);
        };
        let err = |e: deltalake::datafusion::error::DataFusionError| {
            LakeError::delta(&self.name)(e.into())
        };
        let ctx = delta::session();
        ctx.register_batch("s", folded).map_err(err)?;
        let provider = table.table_provider().await.map_err(err)?;
        ctx.register_table("tomb", provider).map_err(err)?;
        let sql = format!(
            "SELECT s.* FROM s LEFT JOIN tomb ON {on} WHERE s._op = 'd' OR tomb.{l} IS NULL OR {newer}",
            on = keys_equal(keys, "s", "tomb"),
            l = COMMIT_LSN,
            newer = newer("s", "tomb"),
        );
        delta::collect(&self.name, &ctx, &sql).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int32Array, Int64Array, TimestampMicrosecondArray};
    use deltalake::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use std::sync::Arc;

    fn rows(r: &[(i32, i64, i64)]) -> RecordBatch {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int32, true),
                Field::new(COMMIT_LSN, DataType::Int64, true),
                Field::new(ORDINAL, DataType::Int64, true),
                Field::new(COMMIT_TS, utc, true),
            ])),
            vec![
                Arc::new(Int32Array::from_iter_values(r.iter().map(|x| x.0))),
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.1))),
                Arc::new(Int64Array::from_iter_values(r.iter().map(|_| 1))),
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values(r.iter().map(|x| x.2))
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn prune_deletes_only_old_tombstones_below_the_watermark() {
        let dir = std::env::temp_dir().join(format!(
            "wal2delta-tombstones-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let url = Url::from_directory_path(&dir).unwrap();
        let t = Tombstones::new("s.t", url);
        let hour = 3_600_000_000i64;
        // (key, commit LSN, commit time): old below the watermark, old above it, recent.
        t.record(
            &["id".into()],
            rows(&[(1, 100, hour), (2, 900, hour), (3, 100, 50 * hour)]),
        )
        .await
        .unwrap();
        assert_eq!(t.prune(500, 10 * hour).await.unwrap(), 1);
        let left = delta::query(
            &t.name,
            &t.open().await.unwrap().unwrap(),
            "SELECT id FROM t ORDER BY id",
        )
        .await
        .unwrap();
        let ids: Vec<i32> = left
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(ids, vec![2, 3]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
