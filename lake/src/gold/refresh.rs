//! Refreshing one model: its inputs read at one version each, the SELECT run, the result
//! written as the whole new version of `gold/{model}` (or, for a keyed model, merged for
//! the keys whose inputs changed: [`super::incremental`]).
//!
//! **Invariant.** A Gold commit records, in its commit info, the SQL's hash and the
//! version of every input it was computed from (`wal2delta.gold`). A refresh whose inputs
//! and SQL are those of the last commit is skipped; any other writes the full result as
//! one overwrite commit, or one MERGE of the changed keys. So a reader knows exactly what
//! a version reflects, a crash before the commit leaves the previous version whole, and a
//! refresh that is repeated (after a crash, or by `replay --layer gold`) writes the same
//! rows again: nothing is applied twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::catalog::MemorySchemaProvider;
use deltalake::datafusion::common::TableReference;
use deltalake::datafusion::prelude::{SessionConfig, SessionContext};
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use futures::StreamExt;
use serde_json::{json, Value};

use super::incremental;
use super::model::{Input, Model};
use crate::{delta, Lake, LakeError};

/// The commit-info key holding what a Gold version was computed from.
pub const GOLD_KEY: &str = "wal2delta.gold";

/// The DataFusion catalog and schema models run in: a bare name (another model) resolves
/// to `wal2delta.gold.{name}`, `schema.table` (Silver) to `wal2delta.{schema}.{table}`.
const CATALOG: &str = "wal2delta";
const MODEL_SCHEMA: &str = "gold";

/// What a refresh did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    /// Written whole as this version, with this many rows.
    Written { version: i64, rows: usize },
    /// A keyed model refreshed incrementally as this version: `keys` recomputed, `rows`
    /// of the result for them merged.
    Merged {
        version: i64,
        keys: usize,
        rows: usize,
    },
    /// Inputs and SQL unchanged since the last version.
    Unchanged,
    /// An input does not exist yet (Silver has not created the table): nothing written.
    Waiting { input: String },
    /// A Silver input holds part of source transaction `lsn` (a transaction larger than
    /// `[silver] max_atomic_transaction_rows`, applied in pieces): nothing written until
    /// its last piece is, so a Gold version never reflects half a source transaction.
    Partial { input: String, lsn: i64 },
}

/// The Gold table of `model`.
pub struct GoldTable<'a> {
    lake: &'a Lake,
    model: &'a Model,
}

impl<'a> GoldTable<'a> {
    pub fn new(lake: &'a Lake, model: &'a Model) -> Self {
        GoldTable { lake, model }
    }

    fn name(&self) -> String {
        format!("gold/{}", self.model.name)
    }

    /// Opens the model's inputs at their latest versions; `Err` names one that does not
    /// exist yet, or a Silver input that holds part of a source transaction.
    async fn open_inputs(&self) -> Result<Result<Vec<Opened>, Refreshed>, LakeError> {
        let mut opened = Vec::new();
        for input in &self.model.inputs {
            let (label, url, reference, silver_name) = match input {
                Input::Silver(t) => {
                    let (s, tb) = t.ident_parts();
                    (
                        t.to_string(),
                        self.lake.silver(&s, &tb),
                        TableReference::full(CATALOG, t.schema.as_str(), t.name.as_str()),
                        Some(format!("{s}.{tb}")),
                    )
                }
                Input::Model(m) => (
                    format!("gold/{m}"),
                    self.lake.gold(m),
                    TableReference::full(CATALOG, MODEL_SCHEMA, m.as_str()),
                    None,
                ),
            };
            let Some(table) = delta::open(&label, &url).await? else {
                return Ok(Err(Refreshed::Waiting { input: label }));
            };
            // Silver's own progress says whether its version holds part of a transaction
            // (a compaction commit in between keeps it: it is the table's `txn` state).
            if let Some(name) = silver_name {
                if let Some(lsn) = crate::silver::Progress::load(&name, &table).await?.partial {
                    return Ok(Err(Refreshed::Partial { input: label, lsn }));
                }
            }
            opened.push(Opened {
                input: input.clone(),
                label,
                url,
                reference,
                table,
            });
        }
        Ok(Ok(opened))
    }

    /// Refreshes the model when its inputs or SQL changed since its last version (always,
    /// and whole, when `force`). A keyed model is refreshed incrementally when it can be
    /// ([`super::incremental`]).
    pub async fn refresh(&self, force: bool) -> Result<Refreshed, LakeError> {
        let name = self.name();
        let url = self.lake.gold(&self.model.name);
        let opened = match self.open_inputs().await? {
            Ok(o) => o,
            Err(waiting) => return Ok(waiting),
        };
        let mut versions = BTreeMap::new();
        let mut data = BTreeMap::new();
        for o in &opened {
            versions.insert(o.label.clone(), o.table.version().map_or(-1, |v| v as i64));
            data.insert(o.label.clone(), data_fingerprint(&o.table));
        }
        let recorded =
            json!({ "sql_sha256": self.model.sql_hash, "inputs": versions, "data": data });
        let current = delta::open(&name, &url).await?;
        if let (false, Some(t)) = (force, &current) {
            // Unchanged when the SQL and the inputs' data files are: a Silver commit that
            // only moved its progress (an idle watermark) changes no result.
            let last = last_recorded(&name, t).await?;
            let same = |key: &str| last.as_ref().map(|l| &l[key]) == Some(&recorded[key]);
            if same("sql_sha256") && same("data") {
                return Ok(Refreshed::Unchanged);
            }
            if let (Some(key), Some(last), true) = (&self.model.key, &last, same("sql_sha256")) {
                match incremental::affected_keys(self.model, key, &opened, last).await {
                    Ok(Ok(affected)) => {
                        return incremental::merge(
                            self.model,
                            key,
                            opened,
                            affected,
                            t.clone(),
                            recorded,
                        )
                        .await
                    }
                    Ok(Err(why)) => {
                        tracing::info!(model = %self.model.name, reason = %why, "gold model rewritten whole")
                    }
                    Err(e) => {
                        tracing::warn!(model = %self.model.name, error = %crate::conditions::without_values(&e.to_string()), "gold model: the changed keys could not be found; rewritten whole")
                    }
                }
            }
        }
        let ctx = session();
        for o in opened {
            register(&ctx, o.reference, o.table, &o.label).await?;
        }
        let batches = self.run(&ctx).await?;
        if let Some(key) = &self.model.key {
            incremental::ensure_unique_rows(self.model, key, &batches).await?;
        }
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        let table = match current {
            Some(t) => t,
            None => delta::handle(&name, &url)?,
        };
        let written = table
            .write(batches)
            .with_save_mode(SaveMode::Overwrite)
            // A changed model may change its columns: each version is the whole result.
            .with_schema_mode(SchemaMode::Overwrite)
            .with_commit_properties(delta::commit_metadata([(GOLD_KEY.to_owned(), recorded)]))
            .await
            .map_err(LakeError::delta(&name))?;
        Ok(Refreshed::Written {
            version: written.version().map_or(0, |v| v as i64),
            rows,
        })
    }

    /// Runs the model's SELECT: its rows with plain (not view) types; an empty result
    /// keeps its columns.
    async fn run(&self, ctx: &SessionContext) -> Result<Vec<RecordBatch>, LakeError> {
        let failed = |e| super::run_failed(&self.model.name, e);
        let df = ctx.sql(&self.model.sql).await.map_err(failed)?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let mut stream = df.execute_stream().await.map_err(failed)?;
        let mut batches = Vec::new();
        while let Some(b) = stream.next().await {
            let b = b.map_err(failed)?;
            if b.num_rows() > 0 {
                batches.push(b);
            }
        }
        if batches.is_empty() {
            batches.push(RecordBatch::new_empty(schema));
        }
        batches
            .iter()
            .map(delta::without_views)
            .collect::<Result<_, _>>()
            .map_err(|e| super::run_failed(&self.model.name, e))
    }

    /// What the model's last version was computed from, `None` before the first.
    pub async fn recorded(&self) -> Result<Option<Value>, LakeError> {
        let name = self.name();
        match delta::open(&name, &self.lake.gold(&self.model.name)).await? {
            Some(t) => last_recorded(&name, &t).await,
            None => Ok(None),
        }
    }
}

/// One input of a refresh, opened at its latest version.
pub(super) struct Opened {
    pub input: Input,
    /// `public.transactions` or `gold/{model}`: its name in the recorded versions.
    pub label: String,
    pub url: url::Url,
    /// Where the model's SQL finds it.
    pub reference: TableReference,
    pub table: DeltaTable,
}

/// The data files of `table`'s loaded version.
pub(super) fn files(table: &DeltaTable) -> BTreeSet<String> {
    table
        .get_file_uris()
        .map(|f| f.collect())
        .unwrap_or_default()
}

/// The data files of `table`'s loaded version (URIs, as [`files`] gives them) with the
/// rows their log statistics record (`None` when a file has none).
pub(super) fn file_rows(table: &DeltaTable) -> BTreeMap<String, Option<usize>> {
    let Ok(snapshot) = table.snapshot() else {
        return BTreeMap::new();
    };
    snapshot
        .log_data()
        .into_iter()
        .map(|f| {
            (
                table.log_store().to_uri(&f.object_store_path()),
                f.num_records(),
            )
        })
        .collect()
}

/// A fingerprint of the data files of `table`'s loaded version (FNV-1a over their sorted
/// paths, as hex): equal exactly when the rows are.
pub(super) fn data_fingerprint(table: &DeltaTable) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files(table) {
        for b in f.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The `wal2delta.gold` info of the table's last commit.
async fn last_recorded(name: &str, table: &DeltaTable) -> Result<Option<Value>, LakeError> {
    let mut history = table.history(Some(1));
    if let Some(c) = history.next().await {
        let c = c.map_err(LakeError::delta(&name))?;
        return Ok(c.info.get(GOLD_KEY).cloned());
    }
    Ok(None)
}

/// A session whose default catalog and schema are the models' own, reading text as `Utf8`.
pub(super) fn session() -> SessionContext {
    let config = SessionConfig::new()
        .with_default_catalog_and_schema(CATALOG, MODEL_SCHEMA)
        .with_create_default_catalog_and_schema(true)
        .set_bool(
            "datafusion.execution.parquet.schema_force_view_types",
            false,
        );
    SessionContext::new_with_config(config)
}

/// Registers `table` (at its loaded version) under `reference`, creating its schema.
pub(super) async fn register(
    ctx: &SessionContext,
    reference: TableReference,
    table: DeltaTable,
    label: &str,
) -> Result<(), LakeError> {
    let err = |e: deltalake::datafusion::error::DataFusionError| LakeError::delta(&label)(e.into());
    let provider = table.table_provider().await.map_err(err)?;
    register_provider(ctx, reference, provider).map_err(err)
}

/// Registers `provider` under `reference`, creating its schema.
pub(super) fn register_provider(
    ctx: &SessionContext,
    reference: TableReference,
    provider: Arc<dyn deltalake::datafusion::catalog::TableProvider>,
) -> Result<(), deltalake::datafusion::error::DataFusionError> {
    if let (Some(catalog), Some(schema)) = (reference.catalog(), reference.schema()) {
        if let Some(c) = ctx.catalog(catalog) {
            if c.schema(schema).is_none() {
                c.register_schema(schema, Arc::new(MemorySchemaProvider::new()))?;
            }
        }
    }
    ctx.register_table(reference, provider)?;
    Ok(())
}
