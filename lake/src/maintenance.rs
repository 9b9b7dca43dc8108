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
use std::time::Duration;

use deltalake::operations::optimize::OptimizeType;
use deltalake::table::config::TablePropertiesExt;
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
    /// Log entries removed as older than the log retention.
    pub log_entries_removed: u64,
}

/// Compacts the table's small files (into files of about `target_bytes`), writes a
/// checkpoint of its log and removes the log entries older than the log retention that
/// the checkpoint makes unnecessary. The retention is the table's own
/// (`delta.logRetentionDuration`, 30 days by default), or `log_retention` where that is
/// shorter (`[lake] log_retention_s`): applied here rather than written into the
/// table's properties, because a metadata commit would fail the stages' concurrent
/// commits. No commit of the lake removes entries ([`delta::commit_properties`]):
/// delta-rs would list the whole log after every commit to find them. A table that does
/// not exist yet is left alone.
pub async fn maintain(
    name: &str,
    url: &Url,
    target_bytes: u64,
    log_retention: Option<Duration>,
) -> Result<MaintenanceReport, LakeError> {
    let Some((table, mut report)) =
        optimize(name, url, target_bytes, OptimizeType::Compact).await?
    else {
        return Ok(MaintenanceReport::default());
    };
    // A table unchanged since its last checkpoint (idle, nothing compacted) needs none:
    // writing it again would only rewrite the same state.
    let store = table.log_store().object_store(None);
    if crate::storage::last_checkpoint(store.as_ref()).await != table.version() {
        deltalake::checkpoints::create_checkpoint(&table, None)
            .await
            .map_err(LakeError::delta(&name))?;
    }
    // (delta-rs' OPTIMIZE commit runs its own cleanup whatever its commit properties
    // say; a pass with nothing to compact makes no commit, hence this call.)
    let snapshot = table.snapshot().map_err(LakeError::delta(&name))?;
    let own = snapshot.table_config().log_retention_duration();
    let retention = log_retention.map_or(own, |r| r.min(own));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let cutoff_ms = now.saturating_sub(retention).as_millis() as i64;
    let removed = deltalake::checkpoints::cleanup_expired_logs_for(
        snapshot.version(),
        table.log_store().as_ref(),
        cutoff_ms,
        None,
    )
    .await
    .map_err(LakeError::delta(&name))?;
    report.log_entries_removed = removed as u64;
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
        .with_commit_properties(delta::commit_metadata(carried))
        .await
        .map_err(LakeError::delta(&name))?;
    let report = MaintenanceReport {
        files_removed: metrics.num_files_removed,
        files_added: metrics.num_files_added,
        checkpoint_version: table.version(),
        log_entries_removed: 0,
    };
    Ok(Some((table, report)))
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
                .with_commit_properties(delta::commit_metadata([(
                    "wal2delta.masking".to_owned(),
                    json!({"v": i}),
                )]))
                .await
                .unwrap();
        }
        let report = maintain("t", &url, 64 << 20, None).await.unwrap();
        assert_eq!(report.files_removed, 4, "{report:?}");
        assert_eq!(report.files_added, 1, "{report:?}");
        let table = delta::open("t", &url).await.unwrap().unwrap();
        let info: std::collections::BTreeMap<_, _> = own_commit_info("t", &table)
            .await
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(
            info,
            [
                ("wal2delta.format".to_owned(), json!(1)),
                ("wal2delta.masking".to_owned(), json!({"v": 3}))
            ]
            .into()
        );
        let rows = delta::query("t", &table, "select sum(id), count(*) from t")
            .await
            .unwrap();
        assert!(format!("{rows:?}").contains("28"), "{rows:?}");
        // Nothing left to compact: no new version, and no second checkpoint of it.
        let checkpointed = crate::storage::modified(&url, "_delta_log/_last_checkpoint").await;
        assert!(checkpointed.is_some());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let again = maintain("t", &url, 64 << 20, None).await.unwrap();
        assert_eq!(again.files_removed, 0);
        assert_eq!(again.checkpoint_version, report.checkpoint_version);
        assert_eq!(
            crate::storage::modified(&url, "_delta_log/_last_checkpoint").await,
            checkpointed,
            "an unchanged table is not checkpointed again"
        );
    }

    /// The log entries of a table's directory.
    fn log_entries(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("_delta_log"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                let name = name.to_string_lossy();
                name.ends_with(".json") || name.ends_with(".parquet")
            })
            .count()
    }

    /// A one-row batch of `id`.
    fn batch(i: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![i]))]).unwrap()
    }

    /// A fresh table in a directory of its own, ids 0 to 4 in five commits, with the
    /// log retention `retention` (`None`: delta-rs' default).
    async fn five_commits(
        tag: &str,
        retention: Option<&str>,
    ) -> (std::path::PathBuf, Url, DeltaTable) {
        let dir = std::env::temp_dir().join(format!("w2d-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let url = Url::from_directory_path(&dir).unwrap();
        let mut write = delta::handle("t", &url).unwrap().write(vec![batch(0)]);
        if let Some(r) = retention {
            write = write.with_configuration([("delta.logRetentionDuration", Some(r))]);
        }
        let mut table = write
            .with_commit_properties(delta::commit_properties())
            .await
            .unwrap();
        for i in 1..5 {
            table = table
                .write(vec![batch(i)])
                .with_commit_properties(delta::commit_properties())
                .await
                .unwrap();
        }
        (dir, url, table)
    }

    #[tokio::test]
    async fn expired_log_entries_go_with_maintenance_and_never_with_a_commit() {
        // A log retention of one second: every entry expires at once.
        let (dir, url, table) = five_commits("log-cleanup", Some("interval 1 second")).await;
        deltalake::checkpoints::create_checkpoint(&table, None)
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        // A commit after a checkpoint, with every earlier entry expired: delta-rs' own
        // hook would remove them now; the lake's commits leave them.
        let before = log_entries(&dir);
        table
            .write(vec![batch(5)])
            .with_commit_properties(delta::commit_properties())
            .await
            .unwrap();
        assert_eq!(
            log_entries(&dir),
            before + 1,
            "a commit removed log entries"
        );

        // Maintenance removes them, also when it has nothing to compact.
        maintain("t", &url, 64 << 20, None).await.unwrap();
        let after = log_entries(&dir);
        assert!(after < before, "{after} log entries of {before} left");
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        let report = maintain("t", &url, 64 << 20, None).await.unwrap();
        assert_eq!(report.files_removed, 0, "{report:?}");
        assert!(
            log_entries(&dir) < after,
            "nothing compacted: no entry removed"
        );
        let table = delta::open("t", &url).await.unwrap().unwrap();
        let rows = delta::query("t", &table, "select sum(id), count(*) from t")
            .await
            .unwrap();
        assert!(format!("{rows:?}").contains("15"), "{rows:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_lakes_log_retention_removes_what_the_tables_own_would_keep() {
        // The table's own retention: the default 30 days.
        let (dir, url, _) = five_commits("log-retention", None).await;
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let report = maintain("t", &url, 64 << 20, None).await.unwrap();
        assert_eq!(report.log_entries_removed, 0, "{report:?}");
        let before = log_entries(&dir);
        // Longer than the entries' age: nothing goes either.
        let report = maintain("t", &url, 64 << 20, Some(Duration::from_secs(3600)))
            .await
            .unwrap();
        assert_eq!(report.log_entries_removed, 0, "{report:?}");
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let report = maintain("t", &url, 64 << 20, Some(Duration::from_secs(1)))
            .await
            .unwrap();
        assert!(report.log_entries_removed > 0, "{report:?}");
        assert_eq!(
            log_entries(&dir),
            before - report.log_entries_removed as usize,
            "{report:?}"
        );
        // What is left still reads as the whole table, and still takes commits.
        let table = delta::open("t", &url).await.unwrap().unwrap();
        let table = table
            .write(vec![batch(5)])
            .with_commit_properties(delta::commit_properties())
            .await
            .unwrap();
        let rows = delta::query("t", &table, "select sum(id), count(*) from t")
            .await
            .unwrap();
        assert!(format!("{rows:?}").contains("15"), "{rows:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
