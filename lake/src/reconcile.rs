//! Reading Silver for `wal2delta reconcile`: one Silver table at one version, with the
//! progress that version records, and the delete tombstones positioned after a point.
//!
//! Every read of a [`SilverRead`] sees the same table version, so a second scan (to name
//! the columns that differ) reads exactly the rows the first one compared.

use std::pin::Pin;

use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::DeltaTable;
use futures::StreamExt;

use crate::delta::{self, ident, without_views};
use crate::silver::{Progress, COMMIT_LSN};
use crate::{Lake, LakeError};

/// One Silver table, loaded at its latest version when opened.
pub struct SilverRead {
    name: String,
    table: DeltaTable,
    progress: Progress,
}

impl SilverRead {
    /// The Silver table of `schema.table`, or `None` when Silver has no such table.
    pub async fn open(lake: &Lake, schema: &str, table: &str) -> Result<Option<Self>, LakeError> {
        let name = format!("{schema}.{table}");
        let Some(t) = delta::open(&name, &lake.silver(schema, table)).await? else {
            return Ok(None);
        };
        let progress = Progress::load(&name, &t).await?;
        Ok(Some(SilverRead {
            name,
            table: t,
            progress,
        }))
    }

    /// The table version every scan reads.
    pub fn version(&self) -> u64 {
        self.table.version().unwrap_or(0)
    }

    /// The progress recorded in that version (watermark, truncate position).
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// The table's columns as Arrow fields.
    pub fn schema(&self) -> Result<SchemaRef, LakeError> {
        delta::arrow_schema(&self.name, &self.table)
    }

    /// Streams `columns` of every row, in no particular order, with plain (not view) types.
    pub async fn scan(&self, columns: &[String]) -> Result<SilverRows, LakeError> {
        let sql = format!(
            "SELECT {} FROM t",
            columns
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let stream = stream(&self.name, &self.table, &sql).await?;
        Ok(SilverRows {
            name: self.name.clone(),
            stream,
        })
    }
}

/// Batches of a [`SilverRead::scan`].
pub struct SilverRows {
    name: String,
    stream: SendableRecordBatchStream,
}

impl SilverRows {
    /// The next batch; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<RecordBatch, LakeError>> {
        let b = Pin::new(&mut self.stream).next().await?;
        Some(
            b.map_err(|e| LakeError::delta(&self.name)(e.into()))
                .and_then(|b| {
                    without_views(&b).map_err(|e| LakeError::Rows {
                        table: self.name.clone(),
                        reason: e.to_string(),
                    })
                }),
        )
    }
}

async fn stream(
    name: &str,
    table: &DeltaTable,
    sql: &str,
) -> Result<SendableRecordBatchStream, LakeError> {
    let err = |e: deltalake::datafusion::error::DataFusionError| LakeError::delta(&name)(e.into());
    let ctx = delta::session();
    let provider = table.table_provider().await.map_err(err)?;
    ctx.register_table("t", provider).map_err(err)?;
    ctx.sql(sql)
        .await
        .map_err(err)?
        .execute_stream()
        .await
        .map_err(err)
}

/// The delete tombstones of `schema.table` with a commit LSN at or above `lsn`: the key
/// columns `keys` and `_commit_lsn`. Empty when the table has no tombstones.
pub async fn tombstones_from(
    lake: &Lake,
    schema: &str,
    table: &str,
    keys: &[String],
    lsn: i64,
) -> Result<Vec<RecordBatch>, LakeError> {
    let name = format!("tombstones of {schema}.{table}");
    let Some(t) = delta::open(&name, &lake.silver_tombstones(schema, table)).await? else {
        return Ok(Vec::new());
    };
    let sql = format!(
        "SELECT {}, {COMMIT_LSN} FROM t WHERE {COMMIT_LSN} >= {lsn}",
        keys.iter().map(|k| ident(k)).collect::<Vec<_>>().join(", ")
    );
    delta::query(&name, &t, &sql).await
}
