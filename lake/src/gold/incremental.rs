//! Incremental refresh of a keyed model (docs/gold.md, "Keyed models").
//!
//! **Which keys.** For each keyed input whose data changed since the model's last version
//! (which recorded the input's version then, the *base*), the rows that differ between
//! the base and now are the rows of the files removed since that are not found, column for
//! column, in the files added since, and the rows of the added files not found in the
//! removed ones. A Silver MERGE rewrites whole files: the rows it copies unchanged are in
//! both sets and cancel out; what remains is the old image of every changed or deleted row
//! and the new image of every changed or inserted one. (Rows of one table are distinct:
//! each holds its own primary key, so a set difference is exact.) The input's key
//! expressions over those rows give the affected keys: a row that moved from one key to
//! another affects both.
//!
//! **Recompute.** The model's SQL runs with each keyed input restricted to its rows whose
//! key is affected (the other inputs whole); its rows for the affected keys replace the
//! model's rows for those keys in one MERGE, which deletes the affected keys that have no
//! row any more, and records the input versions it reflects. Repeated after a crash before
//! its commit, it computes the same rows from the same base: nothing is applied twice.
//!
//! **When it cannot.** A changed input the model declares no key for, an input whose
//! schema changed or that is partitioned, a base version no longer readable: the model is
//! rewritten whole, as a model without a key. So is any failure while finding the keys:
//! the incremental path saves work, it never decides what the rows are.
//!
//! **When it would cost more.** An input of [`REBUILD_FROM_ROWS`] rows or more whose files
//! removed and added since hold more rows than it does now (a Silver MERGE rewrote most of
//! it) is rebuilt from: the difference would read it twice before the recompute reads it
//! again.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::arrow::array::{AsArray, RecordBatch};
use deltalake::arrow::datatypes::{Int64Type, SchemaRef};
use deltalake::datafusion::common::TableReference;
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::error::DataFusionError;
use deltalake::datafusion::prelude::{DataFrame, ParquetReadOptions, SessionContext};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::DeltaTable;
use serde_json::Value;

use super::model::{Model, ModelKey};
use super::refresh::{data_fingerprint, file_rows, session, Opened, Refreshed, GOLD_KEY};
use crate::delta::{self, ident};
use crate::LakeError;

/// Names of the refresh's own tables: upper case, so that no model (lowercase names) can
/// be one of them.
const AFFECTED: &str = "__W2D_AFFECTED";
const RESULT: &str = "__W2D_RESULT";

fn full_name(i: usize) -> String {
    format!("__W2D_FULL_{i}")
}

fn diff_name(i: usize) -> String {
    format!("__W2D_DIFF_{i}")
}

/// The column of the affected keys holding key column `j`.
fn key_col(j: usize) -> String {
    format!("__w2d_k{j}")
}

/// Why a keyed model is rewritten whole this time.
pub(super) type Whole = String;

/// Inputs of at least this many rows are rebuilt from rather than diffed when the Silver
/// files rewritten since the model's last version hold more rows than the input does now.
///
/// Why: finding the keys compares every row of the files removed since with those added
/// (all columns), and the recompute then scans the input anyway; a rebuild scans the input
/// once. A Silver MERGE replaces every file holding a changed key, so changes spread over
/// a table make the difference read the table twice (docs/benchmarks.md, "Where Silver's
/// and Gold's CPU goes"). Below this size both are quick, and the MERGE of the affected
/// keys leaves the model's other files alone.
pub(super) const REBUILD_FROM_ROWS: usize = 10_000;

/// The affected keys of `model` since its last version (`last`, its recorded
/// `wal2delta.gold` info): `Ok(Err(why))` when they cannot be found incrementally.
pub(super) async fn affected_keys(
    model: &Model,
    key: &ModelKey,
    opened: &[Opened],
    last: &Value,
) -> Result<Result<Vec<RecordBatch>, Whole>, DataFusionError> {
    let ctx = session();
    let mut parts: Vec<DataFrame> = Vec::new();
    let mut load = std::time::Duration::ZERO;
    for (i, o) in opened.iter().enumerate() {
        if last["data"][&o.label].as_str() == Some(data_fingerprint(&o.table).as_str()) {
            continue;
        }
        let Some(exprs) = key.inputs.get(&o.input) else {
            return Ok(Err(format!(
                "{} changed and the model declares no key for it",
                o.label
            )));
        };
        let Some(base) = last["inputs"][&o.label].as_i64() else {
            return Ok(Err(format!("no recorded version of {}", o.label)));
        };
        let loading = std::time::Instant::now();
        let Some(then) = at_version(o, base).await else {
            return Ok(Err(format!(
                "version {base} of {} cannot be read any more",
                o.label
            )));
        };
        let schema = delta::arrow_schema(&o.label, &o.table)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let schema_then = delta::arrow_schema(&o.label, &then)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        if schema != schema_then {
            return Ok(Err(format!("the columns of {} changed", o.label)));
        }
        let partitioned = o
            .table
            .snapshot()
            .map(|s| !s.metadata().partition_columns().is_empty())
            .unwrap_or(true);
        if partitioned {
            return Ok(Err(format!("{} is partitioned", o.label)));
        }
        load += loading.elapsed();
        let (before, now) = (file_rows(&then), file_rows(&o.table));
        let removed: Vec<String> = before
            .keys()
            .filter(|f| !now.contains_key(*f))
            .cloned()
            .collect();
        let added: Vec<String> = now
            .keys()
            .filter(|f| !before.contains_key(*f))
            .cloned()
            .collect();
        let rows = |of: &BTreeMap<String, Option<usize>>, files: &[String]| -> Option<usize> {
            files.iter().map(|f| of.get(f).copied().flatten()).sum()
        };
        let (gone, new, total) = (
            rows(&before, &removed),
            rows(&now, &added),
            now.values().copied().sum::<Option<usize>>(),
        );
        if let (Some(gone), Some(new), Some(total)) = (gone, new, total) {
            if total >= REBUILD_FROM_ROWS && gone + new > total {
                return Ok(Err(format!(
                    "the files of {} rewritten since hold {} rows, more than its {total}: a rebuild reads less",
                    o.label,
                    gone + new
                )));
            }
        }
        register_input_store(&ctx, o);
        let r = read_files(&ctx, removed, &schema).await?;
        let a = read_files(&ctx, added, &schema).await?;
        let diff = r.clone().except(a.clone())?.union(a.except(r)?)?;
        ctx.register_table(TableReference::bare(diff_name(i)), diff.into_view())?;
        let select: Vec<String> = exprs
            .iter()
            .enumerate()
            .map(|(j, e)| format!("{e} AS {}", key_col(j)))
            .collect();
        parts.push(
            ctx.sql(&format!(
                "SELECT {} FROM {}",
                select.join(", "),
                ident(&diff_name(i))
            ))
            .await?,
        );
    }
    let Some(first) = parts.pop() else {
        return Ok(Ok(Vec::new()));
    };
    let all = parts.into_iter().try_fold(first, |acc, p| acc.union(p))?;
    let diffing = std::time::Instant::now();
    let keys = all.distinct()?.collect().await?;
    tracing::debug!(model = %model.name, keys = keys.iter().map(RecordBatch::num_rows).sum::<usize>(),
        load_ms = load.as_millis() as u64, diff_ms = diffing.elapsed().as_millis() as u64, "gold keys affected");
    Ok(Ok(keys))
}

/// `o`'s table at `version`, `None` when that version cannot be loaded (its log cleaned up).
async fn at_version(o: &Opened, version: i64) -> Option<DeltaTable> {
    let mut t = delta::handle(&o.label, &o.url).ok()?;
    t.load_version(u64::try_from(version).ok()?).await.ok()?;
    Some(t)
}

/// Lets `ctx` read the data files of input `o` by the URIs the table lists them with: on
/// an object store (`s3://bucket/…`, `gs://`, `az://`) the session has no store for the
/// bucket, so the input table's own store at the bucket's root (with the lake's storage
/// options: endpoint, credentials) is registered for it. Local files need none.
fn register_input_store(ctx: &SessionContext, o: &Opened) {
    let url = o.table.log_store().root_url().clone();
    if url.scheme() == "file" {
        return;
    }
    let mut root = url.clone();
    root.set_path("/");
    root.set_query(None);
    root.set_fragment(None);
    ctx.register_object_store(&root, o.table.log_store().root_object_store(None));
}

/// The rows of data files `uris`, read with `schema`.
async fn read_files(
    ctx: &SessionContext,
    uris: Vec<String>,
    schema: &SchemaRef,
) -> Result<DataFrame, DataFusionError> {
    if uris.is_empty() {
        return ctx.read_batch(RecordBatch::new_empty(schema.clone()));
    }
    ctx.read_parquet(uris, ParquetReadOptions::default().schema(schema))
        .await
}

/// `left.k0 IS NOT DISTINCT FROM right.__w2d_k0 AND …` for the key columns or expressions
/// `left` (already qualified).
fn same_key(left: &[String], right: &str) -> String {
    left.iter()
        .enumerate()
        // Parenthesised whole: `a IS NOT DISTINCT FROM b AND c` parses as `… FROM (b AND c)`.
        .map(|(j, l)| format!("(({l}) IS NOT DISTINCT FROM {right}.{})", key_col(j)))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The MERGE condition: the target's key columns equal the source's affected key.
fn target_key(key: &ModelKey) -> String {
    let target: Vec<String> = key
        .columns
        .iter()
        .map(|c| format!("target.{}", ident(c)))
        .collect();
    same_key(&target, "source")
}

/// Recomputes the `affected` keys of `model` and MERGEs them into `target`, recording
/// `recorded` (the inputs' versions now).
pub(super) async fn merge(
    model: &Model,
    key: &ModelKey,
    opened: Vec<Opened>,
    affected: Vec<RecordBatch>,
    target: DeltaTable,
    recorded: Value,
) -> Result<Refreshed, LakeError> {
    let name = format!("gold/{}", model.name);
    let failed = |e: DataFusionError| super::run_failed(&model.name, e);
    let keys: usize = affected.iter().map(RecordBatch::num_rows).sum();
    let props = delta::commit_metadata([(GOLD_KEY.to_owned(), recorded)]);
    let read_version = target.version();
    if keys == 0 {
        // The inputs' data files changed without changing a row the model reads (a
        // compaction): record the versions, so the next refresh starts from them.
        let version = delta::commit_progress_only(&target, props, "wal2delta-gold", 0)
            .await
            .map_err(LakeError::delta(&name))?;
        return Ok(Refreshed::Merged {
            version: version as i64,
            keys,
            rows: 0,
        });
    }
    let ctx = session();
    let schema = affected[0].schema();
    let mem = MemTable::try_new(schema, vec![affected]).map_err(failed)?;
    ctx.register_table(TableReference::bare(AFFECTED), Arc::new(mem))
        .map_err(failed)?;
    for (i, o) in opened.into_iter().enumerate() {
        let Some(exprs) = key.inputs.get(&o.input) else {
            super::refresh::register(&ctx, o.reference.clone(), o.table, &o.label).await?;
            continue;
        };
        super::refresh::register(&ctx, TableReference::bare(full_name(i)), o.table, &o.label)
            .await?;
        let restricted = ctx
            .sql(&format!(
                "SELECT i.* FROM {} i LEFT SEMI JOIN {} a ON {}",
                ident(&full_name(i)),
                ident(AFFECTED),
                same_key(exprs, "a")
            ))
            .await
            .map_err(failed)?;
        super::refresh::register_provider(&ctx, o.reference.clone(), restricted.into_view())
            .map_err(failed)?;
    }
    let result = ctx.sql(&model.sql).await.map_err(failed)?;
    for c in &key.columns {
        if result.schema().field_with_unqualified_name(c).is_err() {
            return Err(LakeError::Model {
                model: model.name.clone(),
                reason: format!("its key column {c:?} is not a column of its result"),
            });
        }
    }
    let columns: Vec<String> = result
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    ctx.register_table(TableReference::bare(RESULT), result.into_view())
        .map_err(failed)?;
    let keyed: Vec<String> = key
        .columns
        .iter()
        .map(|c| format!("o.{}", ident(c)))
        .collect();
    // The result's rows for the affected keys only: the MERGE touches nothing else.
    let rows = delta::collect(
        &name,
        &ctx,
        &format!(
            "SELECT o.* FROM {} o LEFT SEMI JOIN {} a ON {}",
            ident(RESULT),
            ident(AFFECTED),
            same_key(&keyed, "a")
        ),
    )
    .await?;
    let n: usize = rows.iter().map(RecordBatch::num_rows).sum();
    let kept = rows.first().map(RecordBatch::schema);
    let rows_table = match kept {
        Some(s) => MemTable::try_new(s, vec![rows]).map_err(failed)?,
        None => return merge_empty(model, key, ctx, target, props, read_version, keys).await,
    };
    // From here on the result is the rows collected (the view is not run again).
    ctx.deregister_table(TableReference::bare(RESULT))
        .map_err(failed)?;
    ctx.register_table(TableReference::bare(RESULT), Arc::new(rows_table))
        .map_err(failed)?;
    ensure_unique(model, key, &ctx).await?;
    let source = source(&ctx, key, &columns).await.map_err(failed)?;
    let on = target_key(key);
    let (table, _) = target
        .merge(source, on)
        .with_source_alias("source")
        .with_target_alias("target")
        .with_session_state(delta::merge_session())
        .with_commit_properties(props.clone())
        .when_matched_delete(|d| d.predicate("source.__w2d_present IS NULL"))
        .and_then(|m| {
            m.when_matched_update(|u| {
                columns
                    .iter()
                    .fold(u.predicate("source.__w2d_present IS NOT NULL"), |u, c| {
                        u.update(ident(c), format!("source.{}", ident(c)))
                    })
            })
        })
        .and_then(|m| {
            m.when_not_matched_insert(|i| {
                columns
                    .iter()
                    .fold(i.predicate("source.__w2d_present IS NOT NULL"), |i, c| {
                        i.set(ident(c), format!("source.{}", ident(c)))
                    })
            })
        })
        .map_err(LakeError::delta(&name))?
        .await
        .map_err(super::write_failed(&name))?;
    let version = committed(&name, read_version, table, props).await?;
    Ok(Refreshed::Merged {
        version,
        keys,
        rows: n,
    })
}

/// The MERGE when the model has no row left for any affected key: delete them.
async fn merge_empty(
    model: &Model,
    key: &ModelKey,
    ctx: SessionContext,
    target: DeltaTable,
    props: CommitProperties,
    read_version: Option<u64>,
    keys: usize,
) -> Result<Refreshed, LakeError> {
    let name = format!("gold/{}", model.name);
    let failed = |e: DataFusionError| super::run_failed(&model.name, e);
    let source = ctx.table(AFFECTED).await.map_err(failed)?;
    let on = target_key(key);
    let (table, _) = target
        .merge(source, on)
        .with_source_alias("source")
        .with_target_alias("target")
        .with_session_state(delta::merge_session())
        .with_commit_properties(props.clone())
        .when_matched_delete(|d| d)
        .map_err(LakeError::delta(&name))?
        .await
        .map_err(super::write_failed(&name))?;
    let version = committed(&name, read_version, table, props).await?;
    Ok(Refreshed::Merged {
        version,
        keys,
        rows: 0,
    })
}

/// Refused: a keyed model whose result holds two rows for one key (the MERGE could not
/// say which one the key has).
pub(super) async fn ensure_unique(
    model: &Model,
    key: &ModelKey,
    ctx: &SessionContext,
) -> Result<(), LakeError> {
    let cols: Vec<String> = key.columns.iter().map(|c| ident(c)).collect();
    let sql = format!(
        "SELECT count(*) FROM (SELECT {cols} FROM {result} GROUP BY {cols} HAVING count(*) > 1)",
        cols = cols.join(", "),
        result = ident(RESULT)
    );
    let batches = delta::collect(&format!("gold/{}", model.name), ctx, &sql).await?;
    let dup = batches
        .first()
        .filter(|b| b.num_rows() > 0)
        .map_or(0, |b| b.column(0).as_primitive::<Int64Type>().value(0));
    if dup > 0 {
        return Err(LakeError::Model {
            model: model.name.clone(),
            reason: format!(
                "its result holds more than one row for {dup} key(s) of ({}): a keyed model returns one row per key (fix its GROUP BY or its -- key: header)",
                key.columns.join(", ")
            ),
        });
    }
    Ok(())
}

/// `ensure_unique` for a whole result (a full refresh of a keyed model).
pub(super) async fn ensure_unique_rows(
    model: &Model,
    key: &ModelKey,
    rows: &[RecordBatch],
) -> Result<(), LakeError> {
    let ctx = session();
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let mem = MemTable::try_new(first.schema(), vec![rows.to_vec()])
        .map_err(|e| super::run_failed(&model.name, e))?;
    ctx.register_table(TableReference::bare(RESULT), Arc::new(mem))
        .map_err(|e| super::run_failed(&model.name, e))?;
    for c in &key.columns {
        if first.schema().field_with_name(c).is_err() {
            return Err(LakeError::Model {
                model: model.name.clone(),
                reason: format!("its key column {c:?} is not a column of its result"),
            });
        }
    }
    ensure_unique(model, key, &ctx).await
}

/// The MERGE source: every affected key, with the result's row for it when there is one
/// (`__w2d_present` set) and nulls when there is none (the key is deleted).
async fn source(
    ctx: &SessionContext,
    key: &ModelKey,
    columns: &[String],
) -> Result<DataFrame, DataFusionError> {
    let keys: Vec<String> = (0..key.columns.len())
        .map(|j| format!("a.{}", key_col(j)))
        .collect();
    let cols: Vec<String> = columns.iter().map(|c| format!("o.{}", ident(c))).collect();
    let qualified: Vec<String> = key
        .columns
        .iter()
        .map(|c| format!("o.{}", ident(c)))
        .collect();
    ctx.sql(&format!(
        "SELECT {keys}, {cols}, o.__w2d_present FROM {affected} a LEFT JOIN (SELECT *, true AS __w2d_present FROM {result}) o ON {on}",
        keys = keys.join(", "),
        cols = cols.join(", "),
        affected = ident(AFFECTED),
        result = ident(RESULT),
        on = same_key(&qualified, "a"),
    ))
    .await
}

/// The version `table` is at after a MERGE that started from `read_version`: delta-rs
/// makes no commit when the MERGE changed no row (the recomputed rows equal the old
/// ones), and the inputs' versions are then recorded by a commit of their own.
async fn committed(
    name: &str,
    read_version: Option<u64>,
    table: DeltaTable,
    props: CommitProperties,
) -> Result<i64, LakeError> {
    if table.version() != read_version {
        return Ok(table.version().map_or(0, |v| v as i64));
    }
    delta::commit_progress_only(&table, props, "wal2delta-gold", 0)
        .await
        .map(|v| v as i64)
        .map_err(LakeError::delta(&name))
}
