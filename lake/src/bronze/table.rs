//! One Bronze table: append with the Kafka offsets in the same Delta commit.
//!
//! **Why this is exactly once.** Each commit carries, for every topic partition whose
//! events it holds, a `txn` action `(app id = wal2delta-bronze/{topic}/{partition},
//! version = last offset)`. Delta commits are atomic, so the table holds a partition's
//! events up to offset *v* exactly when its `txn` version is *v*. Before writing, the
//! batch's first offset of every partition is checked against the table's version at the
//! snapshot the commit is built on; if another writer already stored any of them the batch
//! is stale and nothing is written. If another writer commits the same partition after
//! that snapshot, delta-rs' conflict checker refuses our commit (`ConcurrentTransaction`:
//! both commits carry the same app id), and the check runs again on the new snapshot. A
//! writer killed between writing Parquet files and committing leaves files no commit
//! references: readers never see them, and `vacuum` removes them.
//!
//! **Why the snapshot is not loaded before every commit.** Loading a table costs in
//! proportion to the files it holds (delta-rs rebuilds its file list), and at four
//! micro-batches a second that was most of Bronze's CPU (docs/benchmarks.md). After its
//! own commit at version *v* a writer knows the table as of *v*; when the next batch only
//! adds rows, it checks the offsets at *v* and commits at *v + 1* directly, by
//! put-if-absent ([`super::direct`]). If another writer took *v + 1*, nothing is committed,
//! and the table is loaded and the offsets checked again. Every other commit (the first,
//! a schema change, a widening, after a failure, or a table whose protocol or log store
//! the direct path does not serve) goes through delta-rs on a freshly loaded state, as
//! above.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{DataType, Schema};
use deltalake::kernel::schema::cast::cast_record_batch;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, DeltaTableError};
use url::Url;

use super::direct::{self, Ahead, Direct};
use super::rows::PARTITION_COLUMN;
use super::schema::{
    adds_nothing, decimals_into_text, merge_schemas, text_decimals, TEXT_DECIMAL_PROPERTY,
};
use crate::{delta, LakeError};

/// The `txn` application id recording how far `topic/partition` is stored.
pub fn app_id(topic: &str, partition: i32) -> String {
    format!("wal2delta-bronze/{topic}/{partition}")
}

/// The offsets of one partition a batch holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetRange {
    pub first: i64,
    pub last: i64,
}

/// What to append: rows of one topic and the offsets they (and any quarantined events
/// among them) cover.
#[derive(Debug, Clone)]
pub struct Append {
    pub topic: String,
    pub batches: Vec<RecordBatch>,
    pub ranges: BTreeMap<i32, OffsetRange>,
}

/// How an append ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Rows and offsets are committed at this table version.
    Committed {
        version: u64,
        rows: usize,
        schema_changed: bool,
        /// Columns whose type widened: the table was rewritten under the wider types in
        /// the commit before this one ([`crate::widen`]).
        widened: Vec<String>,
    },
    /// Another writer stored some of these offsets first: nothing was written. Each
    /// partition of the batch with the last offset the table now holds for it.
    Stale { stored: BTreeMap<i32, Option<i64>> },
    /// No rows and no table yet to record offsets in.
    NoTable,
}

/// How many times a commit refused for a conflict is re-checked and retried.
const CONFLICT_RETRIES: usize = 8;

/// A Bronze table handle; the Delta state is loaded lazily (module docs: when it is loaded
/// again).
pub struct BronzeTable {
    name: String,
    url: Url,
    table: Option<DeltaTable>,
    conflicts: u64,
    /// Whether the loaded state may lack a commit this writer must see before its next
    /// one: set after a conflict or a failure, cleared by a refresh ([`Self::load`]).
    behind: bool,
    /// Commits this writer wrote directly past the loaded state ([`direct`]), until the
    /// table is loaded again.
    ahead: Option<Ahead>,
    /// Whether the state was loaded within this append and nothing committed since:
    /// delta-rs' path commits only on such a state (its update after the commit reads the log from the state's
    /// version on, and maintenance may have removed those entries since).
    loaded: bool,
    /// The source this writer appends for, recorded in its commits and compared with the
    /// table's when it is first loaded (`None`: a reader, which checks nothing).
    source: Option<String>,
}

/// The `commitInfo` key naming the source whose rows a Bronze commit appended.
pub const SOURCE_COMMIT_KEY: &str = "wal2delta.source";

impl BronzeTable {
    pub fn new(name: impl Into<String>, url: Url) -> Self {
        BronzeTable {
            name: name.into(),
            url,
            table: None,
            conflicts: 0,
            behind: false,
            ahead: None,
            loaded: false,
            source: None,
        }
    }

    /// Appends for `source`: recorded in each commit; a table whose commits record
    /// another source is refused ([`LakeError::Source`]) instead of mixing two
    /// databases' rows in one table.
    pub fn with_source(mut self, source: Option<String>) -> Self {
        self.source = source;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Commits refused because another writer committed first, since this handle was made.
    pub fn conflicts(&self) -> u64 {
        self.conflicts
    }

    /// Brings the state to write on up to date: kept as of this writer's last commit when
    /// the next may be committed directly ([`direct`], module docs), else loaded; `false`
    /// when the table does not exist yet. A writer calls this, not [`Self::refresh`],
    /// before preparing a batch against [`Self::arrow_schema`].
    pub async fn load(&mut self) -> Result<bool, LakeError> {
        if self.direct_next().is_some() {
            return Ok(true);
        }
        self.refresh().await
    }

    /// Loads the latest table state; `false` when the table does not exist yet.
    pub async fn refresh(&mut self) -> Result<bool, LakeError> {
        let loaded = self.load_latest().await;
        // The latest state holds this writer's direct commits; after a failure the state
        // may be half updated.
        self.ahead = None;
        self.behind = loaded.is_err();
        self.loaded = loaded.is_ok();
        loaded
    }

    async fn load_latest(&mut self) -> Result<bool, LakeError> {
        let Some(ours) = self.source.as_ref().filter(|_| self.table.is_none()) else {
            return delta::refresh(&self.name, &self.url, &mut self.table).await;
        };
        // The first open reads the format and the source in one pass over the history.
        let Some((t, found)) =
            delta::open_with_recorded(&self.name, &self.url, SOURCE_COMMIT_KEY).await?
        else {
            return Ok(false);
        };
        if let Some(found) = found.filter(|f| f != ours) {
            return Err(LakeError::Source {
                table: self.name.clone(),
                found,
                ours: ours.clone(),
            });
        }
        self.table = Some(t);
        Ok(true)
    }

    /// The last offset stored for each of `partitions` of `topic`, at the loaded state.
    async fn stored_at_loaded(
        &self,
        topic: &str,
        partitions: impl Iterator<Item = i32>,
    ) -> Result<BTreeMap<i32, Option<i64>>, LakeError> {
        let mut out = BTreeMap::new();
        for p in partitions {
            let id = app_id(topic, p);
            let v = match (
                &self.table,
                self.ahead.as_ref().and_then(|a| a.txns.get(&id)),
            ) {
                (_, Some(v)) => Some(*v),
                (Some(t), None) => delta::txn_version(&self.name, t, id).await?,
                (None, None) => None,
            };
            out.insert(p, v);
        }
        Ok(out)
    }

    /// The last offset stored for each of `partitions` of `topic` (latest table version).
    pub async fn stored_offsets(
        &mut self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, Option<i64>>, LakeError> {
        self.refresh().await?;
        self.stored_at_loaded(topic, partitions.iter().copied())
            .await
    }

    /// The loaded table's Arrow schema.
    pub fn arrow_schema(&self) -> Option<Arc<Schema>> {
        let t = self.table.as_ref()?;
        Some(t.snapshot().ok()?.snapshot().arrow_schema())
    }

    /// Whether the loaded table has a `key` column (`None` before it exists). The Bronze
    /// table of a source table without a primary key has none: its Kafka key is an empty
    /// record, which Arrow and Parquet cannot hold as a struct. Silver does not hold such
    /// tables (docs/silver.md).
    pub fn has_key(&self) -> Option<bool> {
        Some(
            self.arrow_schema()?
                .field_with_name(wal2delta_model::bronze::KEY)
                .is_ok(),
        )
    }

    /// [`Self::has_key`] of the table at `url`, at its latest version.
    pub async fn has_key_at(name: &str, url: &Url) -> Result<Option<bool>, LakeError> {
        let mut t = BronzeTable::new(name, url.clone());
        if !t.refresh().await? {
            return Ok(None);
        }
        Ok(t.has_key())
    }

    /// How long ago the loaded version was committed (the age of its log object).
    pub async fn last_commit_age(&self) -> Option<std::time::Duration> {
        let v = self.version()?;
        let log = format!("_delta_log/{v:020}.json");
        crate::storage::modified(&self.url, &log)
            .await?
            .elapsed()
            .ok()
    }

    /// The table version this handle knows: its last direct commit, or the loaded state's.
    pub fn version(&self) -> Option<u64> {
        match &self.ahead {
            Some(a) => Some(a.version),
            None => self.table.as_ref().and_then(DeltaTable::version),
        }
    }

    /// Appends `append` exactly once (see the module docs).
    pub async fn append(&mut self, append: Append) -> Result<AppendOutcome, LakeError> {
        let outcome = self.try_append(append).await;
        if outcome.is_err() {
            // Whatever failed, a commit may have landed or the state may be half updated.
            self.behind = true;
        }
        outcome
    }

    async fn try_append(&mut self, append: Append) -> Result<AppendOutcome, LakeError> {
        let rows: usize = append.batches.iter().map(RecordBatch::num_rows).sum();
        // delta-rs' path below commits only on a state loaded within this append.
        self.loaded = false;
        for _ in 0..CONFLICT_RETRIES {
            let exists = self.load().await?;
            let stored = self
                .stored_at_loaded(&append.topic, append.ranges.keys().copied())
                .await?;
            let stale = append.ranges.iter().any(|(p, r)| {
                stored
                    .get(p)
                    .copied()
                    .flatten()
                    .is_some_and(|s| s >= r.first)
            });
            if stale {
                return Ok(AppendOutcome::Stale { stored });
            }
            if !exists && rows == 0 {
                return Ok(AppendOutcome::NoTable);
            }
            let txns: Vec<Transaction> = append
                .ranges
                .iter()
                .map(|(p, r)| Transaction::new(app_id(&append.topic, *p), r.last))
                .collect();
            let mut info = vec![
                ("wal2delta.stage".to_owned(), serde_json::json!("bronze")),
                (
                    "wal2delta.topic".to_owned(),
                    serde_json::json!(append.topic),
                ),
            ];
            if let Some(source) = &self.source {
                info.push((SOURCE_COMMIT_KEY.to_owned(), serde_json::json!(source)));
            }
            let conformed = if rows == 0 {
                None
            } else {
                Some(self.conform(&append.batches)?)
            };
            let plain = match &conformed {
                None => true,
                Some((batches, schema_changed)) => {
                    !schema_changed && self.adds_only(&append.batches, batches)
                }
            };
            if let (true, Some(next), Some(table)) = (plain, self.direct_next(), &self.table) {
                let batches = conformed.as_ref().map(|c| c.0.clone()).unwrap_or_default();
                let outcome = direct::append(
                    table,
                    next,
                    batches,
                    txns.clone(),
                    delta::commit_info(info.clone()),
                    PARTITION_COLUMN,
                )
                .await;
                match outcome {
                    Ok(Direct::Committed(version)) => {
                        self.committed_ahead(version, &txns).await;
                        return Ok(AppendOutcome::Committed {
                            version,
                            rows,
                            schema_changed: false,
                            widened: Vec::new(),
                        });
                    }
                    Ok(Direct::Taken) => {
                        // Another writer committed that version: load the table and
                        // check the offsets again.
                        self.conflicts += 1;
                        self.behind = true;
                        tracing::info!(table = %self.name, version = next, "another writer committed first; re-checking offsets");
                        continue;
                    }
                    Err(e) => {
                        // delta-rs' path writes the batch instead, and reports the error
                        // if it is not the direct path's own. Should the entry have
                        // landed despite the error, that path's conflict check or the
                        // offsets check after the next load finds it: stored once.
                        tracing::debug!(table = %self.name, error = %e, "direct append failed; appending through delta-rs");
                    }
                }
            }
            if !self.loaded {
                // delta-rs' path commits on a state it brings up to date afterwards by
                // reading the log from that state on, which may lack this writer's direct
                // commits or log entries maintenance has removed since: load the table
                // first, and check the offsets against it.
                self.behind = true;
                continue;
            }
            // Whatever happens below, the state is no longer the one loaded.
            self.loaded = false;
            let props = delta::commit_metadata(info).with_application_transactions(txns);
            let mut widened = Vec::new();
            let result = match conformed {
                None => self.commit_offsets_only(props, &append).await,
                Some((batches, schema_changed)) => {
                    let before_rows = match self.record_text_decimals(&append.batches).await {
                        Ok(()) => self.widen_for(&batches).await,
                        Err(e) => Err(e),
                    };
                    match before_rows {
                        Ok(w) => {
                            widened = w;
                            self.write_rows(props, batches, schema_changed).await
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match result {
                Ok((version, schema_changed)) => {
                    return Ok(AppendOutcome::Committed {
                        version,
                        rows,
                        schema_changed,
                        widened,
                    })
                }
                Err(e) if delta::is_conflict(&e) => {
                    self.conflicts += 1;
                    self.behind = true;
                    tracing::info!(table = %self.name, "commit conflict with another writer; re-checking offsets");
                    continue;
                }
                Err(e) => return Err(LakeError::delta(&self.name)(e)),
            }
        }
        Err(LakeError::Delta {
            table: self.name.clone(),
            source: DeltaTableError::Generic(format!(
                "commit conflicted {CONFLICT_RETRIES} times in a row"
            )),
        })
    }

    /// The batches cast to one schema holding the table's columns and theirs, and whether
    /// that schema adds columns to the table.
    fn conform(&self, batches: &[RecordBatch]) -> Result<(Vec<RecordBatch>, bool), LakeError> {
        let conflict = |reason: String| LakeError::SchemaConflict {
            table: self.name.clone(),
            reason,
        };
        let table_schema = self.arrow_schema();
        let mut merged: Option<Schema> = table_schema.as_deref().cloned();
        for b in batches {
            merged = Some(match merged {
                None => b.schema().as_ref().clone(),
                Some(m) => merge_schemas(&m, &b.schema()).map_err(conflict)?,
            });
        }
        let merged = Arc::new(merged.unwrap_or_else(Schema::empty));
        let changed = match &table_schema {
            Some(t) => !adds_nothing(t, &merged),
            None => true,
        };
        let cast = batches
            .iter()
            .map(|b| cast_record_batch(b, merged.clone(), false, true))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| conflict(e.to_string()))?;
        Ok((cast, changed))
    }

    /// Whether `conformed` (cast from `batches`, adding no column) only adds rows: no
    /// column of the table widens and no decimal arrives for a text column an earlier
    /// release wrote (those commit a change of the table first).
    fn adds_only(&self, batches: &[RecordBatch], conformed: &[RecordBatch]) -> bool {
        let Some(schema) = self.arrow_schema() else {
            return false;
        };
        let widens = conformed
            .first()
            .is_some_and(|b| crate::widen::widened(&schema, b.schema().fields()).is_some());
        let text_decimals = batches
            .iter()
            .any(|b| !decimals_into_text(&schema, &b.schema()).is_empty());
        !widens && !text_decimals
    }

    /// The version a direct commit takes ([`direct`]): the one after this writer's last
    /// commit, when the table is loaded, not behind, and eligible.
    fn direct_next(&self) -> Option<u64> {
        let table = self.table.as_ref()?;
        if self.behind || !direct::eligible(table) {
            return None;
        }
        Some(self.version()? + 1)
    }

    /// Records a direct commit at `version`: its `txn` versions answer the offset checks
    /// until the table is loaded again, which it is for a checkpoint when one is due.
    async fn committed_ahead(&mut self, version: u64, txns: &[Transaction]) {
        self.loaded = false;
        let ahead = self.ahead.get_or_insert_with(Default::default);
        ahead.version = version;
        for t in txns {
            ahead.txns.insert(t.app_id.clone(), t.version);
        }
        let due = self
            .table
            .as_ref()
            .is_some_and(|t| direct::checkpoint_due(t, version));
        if due {
            // The commit stands whatever happens here: a checkpoint that cannot be written
            // now only makes loading the table slower until the next one (maintenance
            // writes them too).
            let checkpoint = async {
                self.refresh().await?;
                if let Some(t) = &self.table {
                    deltalake::checkpoints::create_checkpoint(t, None)
                        .await
                        .map_err(LakeError::delta(&self.name))?;
                }
                Ok::<(), LakeError>(())
            };
            if let Err(e) = checkpoint.await {
                tracing::warn!(table = %self.name, version, error = %e, "could not write the table's checkpoint; the next is due in delta.checkpointInterval versions");
            }
        }
    }

    /// Records in the table's properties the decimal type of the bounded numerics that
    /// `batches` (as they came) bring into a text column an earlier release wrote
    /// ([`TEXT_DECIMAL_PROPERTY`]), in a commit of its own before theirs, when it is new
    /// or wider than the one recorded. The column keeps its text; Silver reads the
    /// property when it creates the table (docs/upgrading.md). A crash between the two
    /// commits re-reads the events, which find the property recorded.
    async fn record_text_decimals(
        &mut self,
        batches: &[RecordBatch],
    ) -> Result<(), DeltaTableError> {
        let (Some(table), Some(schema)) = (&self.table, self.arrow_schema()) else {
            return Ok(());
        };
        let mut found = BTreeMap::new();
        for b in batches {
            found.extend(decimals_into_text(&schema, &b.schema()));
        }
        if found.is_empty() {
            return Ok(());
        }
        let recorded = text_decimals(table.snapshot()?.metadata().configuration());
        let changed: HashMap<String, String> = found
            .into_iter()
            .filter_map(|(column, (p, s))| {
                let ty = match recorded.get(&column) {
                    Some(&(rp, rs)) => crate::widen::wider(
                        &DataType::Decimal128(rp, rs),
                        &DataType::Decimal128(p, s),
                    )
                    .unwrap_or(DataType::Decimal128(rp, rs)),
                    None => DataType::Decimal128(p, s),
                };
                let DataType::Decimal128(p, s) = ty else {
                    return None;
                };
                (recorded.get(&column) != Some(&(p, s))).then(|| {
                    (
                        format!("{TEXT_DECIMAL_PROPERTY}{column}"),
                        format!("{p},{s}"),
                    )
                })
            })
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        tracing::info!(table = %self.name, columns = changed.len(), "decimals arrive for text columns an earlier release wrote: the table keeps the text and records their type for Silver (docs/upgrading.md)");
        let props =
            delta::commit_metadata([("wal2delta.stage".to_owned(), serde_json::json!("bronze"))]);
        let t = table
            .clone()
            .set_tbl_properties()
            .with_properties(changed)
            .with_raise_if_not_exists(false)
            .with_commit_properties(props)
            .await?;
        self.table = Some(t);
        Ok(())
    }

    /// Rewrites the table under the wider column types `batches` (already conformed) bring,
    /// in a commit of its own before theirs; the columns that widened. A crash between the
    /// two commits re-reads the events from the offsets the table still holds, and they
    /// then find the table wide already.
    async fn widen_for(&mut self, batches: &[RecordBatch]) -> Result<Vec<String>, DeltaTableError> {
        let (Some(table), Some(first)) = (&self.table, batches.first()) else {
            return Ok(Vec::new());
        };
        let info = vec![("wal2delta.stage".to_owned(), serde_json::json!("bronze"))];
        let wanted = first.schema();
        match crate::widen::widen_table(
            "Bronze",
            &self.name,
            table,
            wanted.fields(),
            &[PARTITION_COLUMN],
            info,
        )
        .await?
        {
            Some((table, paths)) => {
                self.table = Some(table);
                Ok(paths)
            }
            None => Ok(Vec::new()),
        }
    }

    async fn write_rows(
        &mut self,
        props: CommitProperties,
        batches: Vec<RecordBatch>,
        schema_changed: bool,
    ) -> Result<(u64, bool), DeltaTableError> {
        let table = match self.table.take() {
            Some(t) => t,
            None => crate::storage::builder(&self.url)?.build()?,
        };
        let mut write = table
            .write(batches)
            .with_save_mode(SaveMode::Append)
            .with_partition_columns([PARTITION_COLUMN])
            .with_commit_properties(props);
        if schema_changed {
            write = write.with_schema_mode(SchemaMode::Merge);
        }
        let table = write.await?;
        let version = table.version().unwrap_or(0);
        self.table = Some(table);
        Ok((version, schema_changed))
    }

    async fn commit_offsets_only(
        &mut self,
        props: CommitProperties,
        append: &Append,
    ) -> Result<(u64, bool), DeltaTableError> {
        let Some(table) = &self.table else {
            return Err(DeltaTableError::NotATable(self.name.clone()));
        };
        let epoch = append.ranges.values().map(|r| r.last).max().unwrap_or(0);
        let version = delta::commit_progress_only(table, props, "wal2delta-bronze", epoch).await?;
        // The loaded state does not hold this commit.
        self.behind = true;
        Ok((version, false))
    }
}
