//! Table maintenance: compaction of small files and checkpoints of the Delta log.
//!
//! Both run beside ingestion, never blocking it: `optimize` rewrites small files into
//! larger ones with `dataChange = false`, which does not conflict with concurrent appends,
//! and a checkpoint only adds a file readers may use to skip replaying the log.

use std::num::NonZeroU64;

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
    let Some(table) = delta::open(name, url).await? else {
        return Ok(MaintenanceReport::default());
    };
    let target = NonZeroU64::new(target_bytes.max(1)).unwrap_or(NonZeroU64::MIN);
    let (table, metrics) = table
        .optimize()
        .with_target_size(target)
        .await
        .map_err(LakeError::delta(&name))?;
    deltalake::checkpoints::create_checkpoint(&table, None)
        .await
        .map_err(LakeError::delta(&name))?;
    Ok(MaintenanceReport {
        files_removed: metrics.num_files_removed,
        files_added: metrics.num_files_added,
        checkpoint_version: table.version(),
    })
}
