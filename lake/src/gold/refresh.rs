//! Refreshing one model: its inputs read at one version each, the SELECT run, the result
//! written as the whole new version of `gold/{model}`.
//!
//! **Invariant.** A Gold commit records, in its commit info, the SQL's hash and the
//! version of every input it was computed from (`wal2delta.gold`). A refresh whose inputs
//! and SQL are those of the last commit is skipped; any other writes the full result as
//! one overwrite commit. So a reader knows exactly what a version reflects, a crash before
//! the commit leaves the previous version whole, and a refresh that is repeated (after a
//! crash, or by `replay --layer gold`) writes the same rows again: nothing is applied
//! twice.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::catalog::MemorySchemaProvider;
use deltalake::datafusion::common::TableReference;
use deltalake::datafusion::prelude::{SessionConfig, SessionContext};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use futures::StreamExt;
use serde_json::{json, Value};

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
    /// Written as this version, with this many rows.
    Written { version: i64, rows: usize },
    /// Inputs and SQL unchanged since the last version.
    Unchanged,
    /// An input does not exist yet (Silver has not created the table): nothing written.
    Waiting { input: String },
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

    /// Refreshes the model when its inputs or SQL changed since its last version (always
    /// when `force`).
    pub async fn refresh(&self, force: bool) -> Result<Refreshed, LakeError> {
        let name = self.name();
        let url = self.lake.gold(&self.model.name);
        let ctx = session();
        let mut versions = BTreeMap::new();
        let mut data = BTreeMap::new();
        for input in &self.model.inputs {
            let (label, input_url, reference) = match input {
                Input::Silver(t) => {
                    let (s, tb) = t.ident_parts();
                    (
                        t.to_string(),
                        self.lake.silver(&s, &tb),
                        TableReference::full(CATALOG, t.schema.as_str(), t.name.as_str()),
                    )
                }
                Input::Model(m) => (
                    format!("gold/{m}"),
                    self.lake.gold(m),
                    TableReference::full(CATALOG, MODEL_SCHEMA, m.as_str()),
                ),
            };
            let Some(table) = delta::open(&label, &input_url).await? else {
                return Ok(Refreshed::Waiting { input: label });
            };
            versions.insert(label.clone(), table.version().map_or(-1, |v| v as i64));
            data.insert(label.clone(), data_fingerprint(&table));
            register(&ctx, reference, table, &label).await?;
        }
        let recorded =
            json!({ "sql_sha256": self.model.sql_hash, "inputs": versions, "data": data });
        let current = delta::open(&name, &url).await?;
        if !force {
            if let Some(t) = &current {
                // Unchanged when the SQL and the inputs' data files are: a Silver commit
                // that only moved its progress (an idle watermark) changes no result.
                let last = last_recorded(&name, t).await?;
                let same = |key: &str| last.as_ref().map(|l| &l[key]) == Some(&recorded[key]);
                if same("sql_sha256") && same("data") {
                    return Ok(Refreshed::Unchanged);
                }
            }
        }
        let batches = self.run(&ctx).await?;
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
            .with_commit_properties(
                CommitProperties::default().with_metadata([(GOLD_KEY.to_owned(), recorded)]),
            )
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
        let failed = |e: deltalake::datafusion::error::DataFusionError| LakeError::Model {
            model: self.model.name.clone(),
            reason: e.to_string(),
        };
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
            .map_err(|e| LakeError::Model {
                model: self.model.name.clone(),
                reason: e.to_string(),
            })
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

/// The `wal2delta.gold` info of the table's last commit.
/// A fingerprint of the data files of `table`'s loaded version (FNV-1a over their sorted
/// paths, as hex): equal exactly when the rows are.
fn data_fingerprint(table: &DeltaTable) -> String {
    let mut files: Vec<String> = table
        .get_file_uris()
        .map(|f| f.collect())
        .unwrap_or_default();
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        for b in f.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

async fn last_recorded(name: &str, table: &DeltaTable) -> Result<Option<Value>, LakeError> {
    let mut history = table.history(Some(1));
    if let Some(c) = history.next().await {
        let c = c.map_err(LakeError::delta(&name))?;
        return Ok(c.info.get(GOLD_KEY).cloned());
    }
    Ok(None)
}

/// A session whose default catalog and schema are the models' own, reading text as `Utf8`.
fn session() -> SessionContext {
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
async fn register(
    ctx: &SessionContext,
    reference: TableReference,
    table: DeltaTable,
    label: &str,
) -> Result<(), LakeError> {
    let err = |e: deltalake::datafusion::error::DataFusionError| LakeError::delta(&label)(e.into());
    if let (Some(catalog), Some(schema)) = (reference.catalog(), reference.schema()) {
        if let Some(c) = ctx.catalog(catalog) {
            if c.schema(schema).is_none() {
                c.register_schema(schema, Arc::new(MemorySchemaProvider::new()))
                    .map_err(err)?;
            }
        }
    }
    let provider = table.table_provider().await.map_err(err)?;
    ctx.register_table(reference, provider).map_err(err)?;
    Ok(())
}
