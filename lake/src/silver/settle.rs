//! Row versions settled against Silver: the values an update left unchanged (TOAST) filled
//! from the Silver row before the round, and the versions Silver will not apply dropped.
//! What the rules evaluate, and what a lookup sees of a looked-up table's pending changes
//! ([`super::pending`]), is exactly what Silver applies.

use deltalake::arrow::array::{AsArray, RecordBatch};
use deltalake::DeltaTable;

use super::{Tombstones, COMMIT_LSN, MOVED_FROM, OP, UNCHANGED};
use crate::delta::{self, ident, literal};
use crate::LakeError;

fn rows_error(name: &str, e: impl std::fmt::Display) -> LakeError {
    LakeError::Rows {
        table: name.to_owned(),
        reason: e.to_string(),
    }
}

/// Fills the values versions left unchanged (TOAST) from the Silver row before the
/// round, and drops the versions Silver will not apply: older than the Silver row, or
/// than a tombstone (a snapshot row arriving after later changes).
pub async fn settle(
    name: &str,
    batch: RecordBatch,
    silver: Option<&DeltaTable>,
    tombstones: &Tombstones,
    keys: &[String],
    reads: bool,
) -> Result<RecordBatch, LakeError> {
    let unchanged = batch
        .column_by_name(UNCHANGED)
        .and_then(|a| a.as_list_opt::<i32>().map(|l| !l.values().is_empty()))
        .unwrap_or(false);
    let mut batch = batch;
    if reads {
        let kept = tombstones.filter(keys, batch.clone()).await?;
        batch = deltalake::arrow::compute::concat_batches(&batch.schema(), &kept)
            .map_err(|e| rows_error(name, e))?;
    }
    let Some(silver) = silver else {
        return Ok(batch);
    };
    if !(unchanged || reads) || batch.num_rows() == 0 {
        return Ok(batch);
    }
    let have = delta::arrow_schema(name, silver)?;
    let schema = batch.schema();
    let moved = |k: &str| schema.field_with_name(&format!("{MOVED_FROM}{k}")).is_ok();
    let columns: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| {
            let n = f.name();
            let q = ident(n);
            if n.starts_with('_') || keys.contains(n) || have.field_with_name(n).is_err() {
                format!("s.{q}")
            } else {
                format!(
                    "CASE WHEN array_has(s.{UNCHANGED}, {}) THEN f.{q} ELSE s.{q} END AS {q}",
                    literal(n)
                )
            }
        })
        .collect();
    let own = super::keys_equal(keys, "s", "m");
    let fill = keys
        .iter()
        .map(|k| {
            let q = ident(k);
            if moved(k) {
                format!(
                    "f.{q} = COALESCE(s.{}, s.{q})",
                    ident(&format!("{MOVED_FROM}{k}"))
                )
            } else {
                format!("f.{q} = s.{q}")
            }
        })
        .collect::<Vec<_>>()
        .join(" AND ");
    let sql = format!(
        "SELECT {} FROM s LEFT JOIN m ON {own} LEFT JOIN m f ON {fill} WHERE s.{OP} = 'd' OR m.{l} IS NULL OR {newer}",
        columns.join(", "),
        l = COMMIT_LSN,
        newer = super::newer("s", "m"),
    );
    let err = |e: deltalake::datafusion::error::DataFusionError| LakeError::delta(&name)(e.into());
    let ctx = delta::session();
    ctx.register_batch("s", batch.clone()).map_err(err)?;
    ctx.register_table("m", silver.table_provider().await.map_err(err)?)
        .map_err(err)?;
    let out = delta::collect(name, &ctx, &sql).await?;
    deltalake::arrow::compute::concat_batches(&schema, &out).map_err(|e| rows_error(name, e))
}
