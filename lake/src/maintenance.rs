//! Table maintenance: compaction of small files and checkpoints of the Delta log.
//!
//! Both run beside ingestion, never blocking it: `optimize` rewrites small files into
//! larger ones with `dataChange = false`, which does not conflict with concurrent appends,
//! and a checkpoint only adds a file readers may use to skip replaying the log.
//!
//! Silver and Gold read what their own last commits recorded (`wal2delta.masking`,
//! `wal2delta.gold` in the commit info): the compaction commit carries those keys of the
//! table's latest commit forward, so that a compaction never hides them. Silver's progress
//! lives in `txn` actions, which every later version keeps.

use std::num::NonZeroU64;

use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::optimize::OptimizeType;
use deltalake::DeltaTable;
use futures::StreamExt;
use serde_json::Value;
use url::Url;

use crate::{delta, LakeError};

/// What one maintenance pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub files_removed: u64,
    pub files_added: u64,
    pub checkpoint_version: Option<u64>,
}

/// Compacts the table's small files (into files of about `target_bytes`) and writes a
/// checkpoint of its log. A table that does not exist yet is left alone.
pub async fn maintain(
    name: &str,
    url: &Url,
    target_bytes: u64,
) -> Result<MaintenanceReport, LakeError> {
    let Some((table, report)) = optimize(name, url, target_bytes, OptimizeType::Compact).await?
    else {
        return Ok(MaintenanceReport::default());
    };
    // A table unchanged since its last checkpoint (idle, nothing compacted) needs none:
    // writing it again would only rewrite the same state.
    if last_checkpoint(url).await != table.version() {
        deltalake::checkpoints::create_checkpoint(&table, None)
            .await
            .map_err(LakeError::delta(&name))?;
    }
    Ok(report)
}

/// Rewrites every file of the table into files of about `target_bytes` whose rows are
/// ordered by `columns` (a Z-order; one column is a plain sort), carrying the commit info
/// forward as [`maintain`] does. What `ops/bench silver-files` lays Silver out with to
/// measure how file size and key clustering change the cost of a round.
pub async fn rewrite_ordered(
    name: &str,
    url: &Url,
    target_bytes: u64,
    columns: &[String],
) -> Result<MaintenanceReport, LakeError> {
    let kind = OptimizeType::ZOrder(columns.to_vec());
    Ok(optimize(name, url, target_bytes, kind)
        .await?
        .map(|(_, report)| report)
        .unwrap_or_default())
}

/// Optimizes the table at `url` (none there: `None`) into files of about `target_bytes`,
/// carrying its last commit's `wal2delta.*` info forward.
async fn optimize(
    name: &str,
    url: &Url,
    target_bytes: u64,
    kind: OptimizeType,
) -> Result<Option<(DeltaTable, MaintenanceReport)>, LakeError> {
    let Some(table) = delta::open(name, url).await? else {
        return Ok(None);
    };
    let target = NonZeroU64::new(target_bytes.max(1)).unwrap_or(NonZeroU64::MIN);
    let carried = own_commit_info(name, &table).await?;
    let (table, metrics) = table
        .optimize()
        .with_type(kind)
        .with_target_size(target)
        .with_commit_properties(CommitProperties::default().with_metadata(carried))
        .await
        .map_err(LakeError::delta(&name))?;
    let report = MaintenanceReport {
        files_removed: metrics.num_files_removed,
        files_added: metrics.num_files_added,
        checkpoint_version: table.version(),
    };
    Ok(Some((table, report)))
}

/// The version of the table's latest checkpoint, from `_delta_log/_last_checkpoint`.
async fn last_checkpoint(url: &Url) -> Option<u64> {
    let bytes = crate::storage::read(url, "_delta_log/_last_checkpoint").await?;
    serde_json::from_slice::<Value>(&bytes)
        .ok()?
        .get("version")?
        .as_u64()
}

/// The `wal2delta.*` entries of the commit info of the table's latest commit.
pub(crate) async fn own_commit_info(
    name: &str,
    table: &DeltaTable,
) -> Result<Vec<(String, Value)>, LakeError> {
    let mut history = table.history(Some(1));
    let Some(last) = history.next().await else {
        return Ok(Vec::new());
    };
    let last = last.map_err(LakeError::delta(&name))?;
    Ok(last
        .info
        .into_iter()
        .filter(|(k, _)| k.starts_with("wal2delta."))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use deltalake::arrow::array::{Int64Array, RecordBatch};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn compaction_keeps_the_rows_and_carries_wal2delta_commit_info_forward() {
        let url = Url::parse("memory:///maintenance/carry/").unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let mut table = delta::handle("t", &url).unwrap();
        for i in 0..4_i64 {
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(vec![i * 2, i * 2 + 1]))],
            )
            .unwrap();
            table = table
                .write(vec![batch])
                .with_commit_properties(
                    CommitProperties::default()
                        .with_metadata([("wal2delta.masking".to_owned(), json!({"v": i}))]),
                )
                .await
                .unwrap();
        }
        let report = maintain("t", &url, 64 << 20).await.unwrap();
        assert_eq!(report.files_removed, 4, "{report:?}");
        assert_eq!(report.files_added, 1, "{report:?}");
        let table = delta::open("t", &url).await.unwrap().unwrap();
        let info = own_commit_info("t", &table).await.unwrap();
        assert_eq!(
            info,
            vec![("wal2delta.masking".to_owned(), json!({"v": 3}))]
        );
        let rows = delta::query("t", &table, "select sum(id), count(*) from t")
            .await
            .unwrap();
        assert!(format!("{rows:?}").contains("28"), "{rows:?}");
        // Nothing left to compact: no new version, and no second checkpoint of it.
        let checkpointed = crate::storage::modified(&url, "_delta_log/_last_checkpoint").await;
        assert!(checkpointed.is_some());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let again = maintain("t", &url, 64 << 20).await.unwrap();
        assert_eq!(again.files_removed, 0);
        assert_eq!(again.checkpoint_version, report.checkpoint_version);
        assert_eq!(
            crate::storage::modified(&url, "_delta_log/_last_checkpoint").await,
            checkpointed,
            "an unchanged table is not checkpointed again"
        );
    }
}
