//! The quarantine table (`quarantine/records`): appended exactly once per event.
//!
//! Events quarantined while reading a topic partition are appended with a `txn` action
//! `wal2delta-quarantine/{stage}/{topic}/{partition}` = the last offset quarantined, in the
//! same commit. When a stage re-reads events after a crash, records at or below that offset
//! are already in the table and are skipped, so a record never appears twice.
//!
//! Records are never rewritten. Resolving one (`quarantine replay` re-drove it, or an
//! operator resolved it) appends a row to `quarantine/resolutions`; a record is open while
//! no resolution names its id.

use std::collections::BTreeMap;

use deltalake::kernel::Transaction;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use url::Url;
use wal2delta_quarantine::{QuarantineRecord, Stage};

use crate::{delta, LakeError};

const NAME: &str = "quarantine/records";

/// The quarantine table handle.
pub struct QuarantineTable {
    url: Url,
    table: Option<DeltaTable>,
}

/// The `txn` application id for events of `topic/partition` quarantined by `stage`.
pub fn quarantine_app_id(stage: Stage, topic: &str, partition: i32) -> String {
    format!(
        "wal2delta-quarantine/{}/{topic}/{partition}",
        stage.as_str()
    )
}

impl QuarantineTable {
    pub fn new(url: Url) -> Self {
        QuarantineTable { url, table: None }
    }

    /// Appends the records not already stored; returns how many were appended. Records
    /// with Kafka coordinates are deduplicated by the per-partition `txn` versions; records
    /// without are always appended.
    pub async fn append(
        &mut self,
        stage: Stage,
        records: Vec<QuarantineRecord>,
    ) -> Result<usize, LakeError> {
        for _ in 0..8 {
            delta::refresh(NAME, &self.url, &mut self.table).await?;
            let mut last: BTreeMap<(String, i32), i64> = BTreeMap::new();
            for r in &records {
                if let (Some(t), Some(p), Some(o)) = (&r.topic, r.partition, r.offset) {
                    let e = last.entry((t.clone(), p)).or_insert(o);
                    *e = (*e).max(o);
                }
            }
            let mut stored = BTreeMap::new();
            for (t, p) in last.keys() {
                let v = match &self.table {
                    Some(table) => {
                        delta::txn_version(NAME, table, quarantine_app_id(stage, t, *p)).await?
                    }
                    None => None,
                };
                stored.insert((t.clone(), *p), v);
            }
            let fresh: Vec<QuarantineRecord> = records
                .iter()
                .filter(|r| match (&r.topic, r.partition, r.offset) {
                    (Some(t), Some(p), Some(o)) => stored
                        .get(&(t.clone(), p))
                        .copied()
                        .flatten()
                        .is_none_or(|s| o > s),
                    _ => true,
                })
                .cloned()
                .collect();
            if fresh.is_empty() {
                return Ok(0);
            }
            let txns = last
                .iter()
                .map(|((t, p), o)| Transaction::new(quarantine_app_id(stage, t, *p), *o))
                .collect();
            if self.write(stage, &fresh, txns).await? {
                return Ok(fresh.len());
            }
        }
        Err(conflicted())
    }

    /// Appends `records` with `txns` in one commit; `false` when the commit conflicted
    /// (the caller re-reads and retries).
    async fn write(
        &mut self,
        stage: Stage,
        records: &[QuarantineRecord],
        txns: Vec<Transaction>,
    ) -> Result<bool, LakeError> {
        let batch = QuarantineRecord::to_batch(records).map_err(|e| LakeError::Rows {
            table: NAME.into(),
            reason: e.to_string(),
        })?;
        let table = match self.table.take() {
            Some(t) => t,
            None => delta::handle(NAME, &self.url)?,
        };
        let result = table
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            // Tables written before `check_name` existed gain the column.
            .with_schema_mode(SchemaMode::Merge)
            .with_commit_properties(
                delta::commit_metadata([(
                    "wal2delta.stage".to_owned(),
                    serde_json::json!(stage.as_str()),
                )])
                .with_application_transactions(txns),
            )
            .await;
        match result {
            Ok(t) => {
                self.table = Some(t);
                Ok(true)
            }
            Err(e) if delta::is_conflict(&e) => Ok(false),
            Err(e) => Err(LakeError::delta(&NAME)(e)),
        }
    }

    /// Appends the records whose id the table does not hold yet; returns how many.
    ///
    /// For records whose offsets do not rise with the order they are found in (Silver
    /// screens snapshot rows before the streamed rows ahead of them in the partition), so
    /// the per-partition high-water mark of [`Self::append`] would skip some.
    pub async fn append_new(
        &mut self,
        stage: Stage,
        records: Vec<QuarantineRecord>,
    ) -> Result<usize, LakeError> {
        if records.is_empty() {
            return Ok(0);
        }
        for _ in 0..8 {
            delta::refresh(NAME, &self.url, &mut self.table).await?;
            let mut held = std::collections::HashSet::new();
            if let Some(table) = &self.table {
                use deltalake::arrow::array::AsArray;
                let list = records
                    .iter()
                    .map(|r| crate::delta::literal(&r.id))
                    .collect::<Vec<_>>()
                    .join(", ");
                let sql = format!("SELECT id FROM t WHERE id IN ({list})");
                for b in delta::query(NAME, table, &sql).await? {
                    if let Some(ids) = b.column(0).as_string_opt::<i32>() {
                        held.extend(ids.iter().flatten().map(str::to_owned));
                    }
                }
            }
            let fresh: Vec<QuarantineRecord> = records
                .iter()
                .filter(|r| !held.contains(&r.id))
                .cloned()
                .collect();
            if fresh.is_empty() {
                return Ok(0);
            }
            if self.write(stage, &fresh, Vec::new()).await? {
                return Ok(fresh.len());
            }
        }
        Err(conflicted())
    }

    /// Every record in the table (small by design: records are exceptions).
    pub async fn read_all(&mut self) -> Result<Vec<QuarantineRecord>, LakeError> {
        use deltalake::datafusion::prelude::SessionContext;
        if !delta::refresh(NAME, &self.url, &mut self.table).await? {
            return Ok(Vec::new());
        }
        let Some(table) = self.table.clone() else {
            return Ok(Vec::new());
        };
        let ctx = SessionContext::new();
        let provider = table
            .table_provider()
            .await
            .map_err(|e| LakeError::delta(&NAME)(e.into()))?;
        let df = ctx
            .read_table(provider)
            .map_err(|e| LakeError::delta(&NAME)(e.into()))?;
        let batches = df
            .collect()
            .await
            .map_err(|e| LakeError::delta(&NAME)(e.into()))?;
        let mut out = Vec::new();
        for b in &batches {
            out.extend(
                QuarantineRecord::from_batch(b).map_err(|e| LakeError::Rows {
                    table: NAME.into(),
                    reason: e.to_string(),
                })?,
            );
        }
        Ok(out)
    }
}

fn conflicted() -> LakeError {
    LakeError::Delta {
        table: NAME.into(),
        source: deltalake::DeltaTableError::Generic("commit conflicted 8 times in a row".into()),
    }
}

/// How a record was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// `quarantine replay` re-checked the row and it entered Silver.
    Replayed,
    /// `quarantine replay` found a newer change of the key already in Silver.
    Superseded,
    /// An operator resolved it (`quarantine resolve`).
    Resolved,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Replayed => "replayed",
            Resolution::Superseded => "superseded",
            Resolution::Resolved => "resolved",
        }
    }
}

/// `quarantine/resolutions`: id, resolution, resolved_at.
pub struct Resolutions {
    url: Url,
}

const RESOLUTIONS: &str = "quarantine/resolutions";

impl Resolutions {
    pub fn new(url: Url) -> Self {
        Resolutions { url }
    }

    /// Appends one resolution per id (a second resolution of an id is harmless: a record
    /// is open while none exists).
    pub async fn record(&self, ids: &[(String, Resolution)]) -> Result<(), LakeError> {
        use deltalake::arrow::array::{RecordBatch, StringArray, TimestampMicrosecondArray};
        use deltalake::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
        use std::sync::Arc;
        if ids.is_empty() {
            return Ok(());
        }
        let now = wal2delta_model::clock::unix_us();
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("resolution", DataType::Utf8, true),
            Field::new("resolved_at", utc, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(
                    ids.iter()
                        .map(|(i, _)| Some(i.as_str()))
                        .collect::<StringArray>(),
                ),
                Arc::new(
                    ids.iter()
                        .map(|(_, r)| Some(r.as_str()))
                        .collect::<StringArray>(),
                ),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![now; ids.len()]).with_timezone("UTC"),
                ),
            ],
        )
        .map_err(|e| LakeError::Rows {
            table: RESOLUTIONS.into(),
            reason: e.to_string(),
        })?;
        let table = match delta::open(RESOLUTIONS, &self.url).await? {
            Some(t) => t,
            None => delta::handle(RESOLUTIONS, &self.url)?,
        };
        table
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(delta::commit_properties())
            .await
            .map_err(LakeError::delta(&RESOLUTIONS))?;
        Ok(())
    }

    /// The resolved ids and how.
    pub async fn read(&self) -> Result<BTreeMap<String, String>, LakeError> {
        use deltalake::arrow::array::AsArray;
        let Some(table) = delta::open(RESOLUTIONS, &self.url).await? else {
            return Ok(BTreeMap::new());
        };
        let batches = delta::query(RESOLUTIONS, &table, "SELECT id, resolution FROM t").await?;
        let mut out = BTreeMap::new();
        for b in &batches {
            let (Some(ids), Some(how)) = (
                b.column(0).as_string_opt::<i32>(),
                b.column(1).as_string_opt::<i32>(),
            ) else {
                return Err(LakeError::Rows {
                    table: RESOLUTIONS.into(),
                    reason: "id and resolution must be text".into(),
                });
            };
            for i in 0..b.num_rows() {
                out.insert(ids.value(i).to_owned(), how.value(i).to_owned());
            }
        }
        Ok(out)
    }
}
