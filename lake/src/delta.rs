//! Small helpers over delta-rs shared by every table kind.

use deltalake::kernel::transaction::{CommitProperties, TransactionError};
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use url::Url;

use futures::StreamExt;
use wal2delta_model::format::{check_lake, FormatCheck, LAKE_FORMAT, LAKE_FORMAT_COMMIT_KEY};

use crate::LakeError;

/// The commit properties every commit of the lake starts from: delta-rs' post-commit
/// cleanup of expired log entries switched off.
///
/// With `delta.enableExpiredLogCleanup` on (the default), delta-rs lists the table's whole
/// `_delta_log` after every commit to look for entries older than the log retention (30
/// days by default). The stages commit several times a second (Silver records even an
/// idle table's progress every round), so a log gains tens of thousands of entries a day
/// and each commit's listing grows with them: `lake/examples/commit_cost.rs` measured
/// it (docs/benchmarks.md). The cleanup runs with each table's scheduled maintenance
/// instead ([`crate::maintenance::maintain`]), once per pass.
///
/// Every commit also records the lake format of the binary that made it
/// ([`LAKE_FORMAT_COMMIT_KEY`]); add metadata with [`commit_metadata`], which keeps it.
pub(crate) fn commit_properties() -> CommitProperties {
    commit_metadata(std::iter::empty())
}

/// [`commit_properties`] with `metadata` in the commit's `commitInfo` besides the format
/// (delta-rs' `with_metadata` replaces what was set before, so it is set once, here).
pub(crate) fn commit_metadata(
    metadata: impl IntoIterator<Item = (String, serde_json::Value)>,
) -> CommitProperties {
    CommitProperties::default()
        .with_cleanup_expired_logs(Some(false))
        .with_metadata(commit_info(metadata))
}

/// The `commitInfo` entries [`commit_metadata`] records: `metadata` and the format; also
/// for a commit written without delta-rs' `CommitBuilder` (lake/src/bronze/direct.rs).
pub(crate) fn commit_info(
    metadata: impl IntoIterator<Item = (String, serde_json::Value)>,
) -> std::collections::HashMap<String, serde_json::Value> {
    let format = (
        LAKE_FORMAT_COMMIT_KEY.to_owned(),
        serde_json::json!(LAKE_FORMAT),
    );
    // The format last: it wins over a value carried from an older commit.
    metadata
        .into_iter()
        .chain(std::iter::once(format))
        .collect()
}

/// How many of a table's latest commits [`recorded_format`] looks through. A commit not
/// made by wal2delta (another tool's OPTIMIZE, a VACUUM's start and end) records no
/// format, so the latest commit that does is the table's format.
const FORMAT_LOOKBACK: usize = 16;

/// The lake format of the latest of `table`'s last [`FORMAT_LOOKBACK`] commits that
/// records one (`None`: none does; an earlier release's table, format 0).
pub async fn recorded_format(name: &str, table: &DeltaTable) -> Result<Option<String>, LakeError> {
    recorded(name, table, LAKE_FORMAT_COMMIT_KEY).await
}

/// The value of `key` in the `commitInfo` of the latest of `table`'s last
/// [`FORMAT_LOOKBACK`] commits that records one (a string as it is, anything else as
/// JSON), or `None`.
pub(crate) async fn recorded(
    name: &str,
    table: &DeltaTable,
    key: &str,
) -> Result<Option<String>, LakeError> {
    Ok(recorded_keys(name, table, &[key]).await?.pop().flatten())
}

/// [`recorded`] for each of `keys`, in one read of the history.
pub(crate) async fn recorded_keys(
    name: &str,
    table: &DeltaTable,
    keys: &[&str],
) -> Result<Vec<Option<String>>, LakeError> {
    let mut out = vec![None; keys.len()];
    if table.version().is_none() {
        return Ok(out);
    }
    let mut history = table.history(Some(FORMAT_LOOKBACK));
    while let Some(info) = history.next().await {
        let info = info.map_err(LakeError::delta(&name))?;
        for (key, slot) in keys.iter().zip(out.iter_mut()) {
            if slot.is_none() {
                *slot = info.info.get(*key).map(|value| match value {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
            }
        }
        if out.iter().all(Option::is_some) {
            break;
        }
    }
    Ok(out)
}

/// Refuses a table this binary must not write: one of a newer lake format, or of an older
/// one not yet migrated by `wal2delta upgrade` (docs/upgrading.md, "Format versions").
pub(crate) async fn check_format(name: &str, table: &DeltaTable) -> Result<(), LakeError> {
    check_recorded_format(name, recorded_format(name, table).await?)
}

/// [`check_format`] of a format already read.
fn check_recorded_format(name: &str, recorded: Option<String>) -> Result<(), LakeError> {
    let fix = match check_lake(recorded.as_deref()) {
        FormatCheck::Current => return Ok(()),
        FormatCheck::Older(_) => {
            "an earlier release wrote it: run `wal2delta upgrade --dry-run`, then `wal2delta upgrade` (docs/upgrading.md)"
        }
        FormatCheck::Newer(_) => {
            "a newer release wrote it: run that release (or newer); this one would misread it"
        }
        FormatCheck::Unreadable => {
            "its commits record a wal2delta.format that is not a number (docs/upgrading.md)"
        }
    };
    Err(LakeError::Format {
        table: name.to_owned(),
        found: recorded.unwrap_or_else(|| "0".into()),
        ours: LAKE_FORMAT,
        fix,
    })
}

/// An unloaded handle of the table at `url`.
pub(crate) fn handle(name: &str, url: &Url) -> Result<DeltaTable, LakeError> {
    crate::storage::builder(url)
        .and_then(DeltaTableBuilder::build)
        .map_err(LakeError::delta(&name))
}

/// The table at `url` with its latest state, or `None` when no table exists there yet.
///
/// A table this binary must not write ([`check_format`]) is an operator error.
pub(crate) async fn open(name: &str, url: &Url) -> Result<Option<DeltaTable>, LakeError> {
    // delta-rs reports a missing directory as a kernel error, not as "not a table".
    let t = open_unchecked(name, url).await?;
    if let Some(t) = &t {
        check_format(name, t).await?;
    }
    Ok(t)
}

/// [`open`], also returning the value the latest commits record for `key` (read with the
/// format in one pass over the history).
pub(crate) async fn open_with_recorded(
    name: &str,
    url: &Url,
    key: &str,
) -> Result<Option<(DeltaTable, Option<String>)>, LakeError> {
    let Some(t) = open_unchecked(name, url).await? else {
        return Ok(None);
    };
    let mut found = recorded_keys(name, &t, &[LAKE_FORMAT_COMMIT_KEY, key]).await?;
    let value = found.pop().flatten();
    check_recorded_format(name, found.pop().flatten())?;
    Ok(Some((t, value)))
}

/// [`open`] without the format check: for `wal2delta upgrade`, which reads every format.
pub async fn open_unchecked(name: &str, url: &Url) -> Result<Option<DeltaTable>, LakeError> {
    if !crate::storage::table_exists(url).await? {
        return Ok(None);
    }
    let mut t = handle(name, url)?;
    match t.load().await {
        Ok(()) => Ok(Some(t)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(e) => Err(LakeError::delta(&name)(e)),
    }
}

/// A table kept open between rounds. Opening a table replays its log from the last
/// checkpoint, up to 100 commits; refreshing an open one reads only the commits since.
/// Both still cost in proportion to the files the table holds (delta-rs 1.1 rebuilds the
/// file list on every refresh: `lake/examples/refresh_cost.rs`), so keeping pays most for
/// tables with many commits and few files.
///
/// A refresh assumes the table at the URL is the one opened: the stages only ever add
/// commits (a Silver rebuild swaps its rows in by a commit too). A table removed is seen
/// on the next call; one removed and made again between two calls is not, so a caller
/// drops its kept tables after a failed round and opens them afresh.
#[derive(Default)]
pub(crate) struct Kept {
    table: Option<DeltaTable>,
}

impl Kept {
    /// The table's latest state (a clone sharing the kept snapshot), or `None` when no
    /// table exists at `url` (any kept state is dropped then: a table created there later
    /// is opened afresh). A failed refresh opens the table again.
    pub(crate) async fn latest(
        &mut self,
        name: &str,
        url: &Url,
    ) -> Result<Option<DeltaTable>, LakeError> {
        if !crate::storage::table_exists(url).await? {
            self.table = None;
            return Ok(None);
        }
        if let Some(t) = &mut self.table {
            match t.update_state().await {
                Ok(()) => return Ok(Some(t.clone())),
                Err(e) => {
                    tracing::debug!(table = %name, error = %e, "refreshing the kept table failed; opening it again");
                    self.table = None;
                }
            }
        }
        self.table = open(name, url).await?;
        Ok(self.table.clone())
    }
}

/// Refreshes `slot` to the latest state (opening it when needed); `false` when no table
/// exists yet.
pub(crate) async fn refresh(
    name: &str,
    url: &Url,
    slot: &mut Option<DeltaTable>,
) -> Result<bool, LakeError> {
    match slot {
        Some(t) => {
            t.update_state().await.map_err(LakeError::delta(&name))?;
            Ok(true)
        }
        None => {
            *slot = open(name, url).await?;
            Ok(slot.is_some())
        }
    }
}

/// The version of `app_id`'s last `txn` action in the loaded state of `table` (kept up
/// to date from the commits since it was last asked: [`crate::txns`]).
pub(crate) async fn txn_version(
    name: &str,
    table: &DeltaTable,
    app_id: String,
) -> Result<Option<i64>, LakeError> {
    crate::txns::version(table, &app_id)
        .await
        .map_err(LakeError::delta(&name))
}

/// Commits `props` (its `txn` actions and metadata) with no data actions: records
/// progress when a batch added nothing.
pub(crate) async fn commit_progress_only(
    table: &DeltaTable,
    props: deltalake::kernel::transaction::CommitProperties,
    query_id: &str,
    epoch_id: i64,
) -> Result<u64, DeltaTableError> {
    use deltalake::kernel::transaction::CommitBuilder;
    use deltalake::kernel::Action;
    use deltalake::protocol::{DeltaOperation, OutputMode};
    let finalized = CommitBuilder::from(props)
        .with_actions(Vec::<Action>::new())
        .build(
            Some(table.snapshot()?),
            table.log_store(),
            DeltaOperation::StreamingUpdate {
                output_mode: OutputMode::Append,
                query_id: query_id.into(),
                epoch_id,
            },
        )
        .await?;
    Ok(finalized.version())
}

/// Runs `sql` against `table` registered as `t`, and collects the result.
pub(crate) async fn query(
    name: &str,
    table: &DeltaTable,
    sql: &str,
) -> Result<Vec<deltalake::arrow::array::RecordBatch>, LakeError> {
    let err = |e: deltalake::datafusion::error::DataFusionError| LakeError::delta(&name)(e.into());
    let ctx = session();
    let provider = table.table_provider().await.map_err(err)?;
    ctx.register_table("t", provider).map_err(err)?;
    collect(name, &ctx, sql).await
}

/// Runs `sql` in `ctx` and collects the result with plain (not view) types.
pub(crate) async fn collect(
    name: &str,
    ctx: &deltalake::datafusion::prelude::SessionContext,
    sql: &str,
) -> Result<Vec<deltalake::arrow::array::RecordBatch>, LakeError> {
    let err = |e: deltalake::datafusion::error::DataFusionError| LakeError::delta(&name)(e.into());
    let batches = ctx
        .sql(sql)
        .await
        .map_err(err)?
        .collect()
        .await
        .map_err(err)?;
    batches
        .iter()
        .map(without_views)
        .collect::<Result<_, _>>()
        .map_err(|e| LakeError::Rows {
            table: name.to_owned(),
            reason: e.to_string(),
        })
}

/// The fields of `schema` named `names` that it has, in that order, typed [`plain`]: the
/// types a read gives them.
pub(crate) fn plain_fields(
    schema: &deltalake::arrow::datatypes::Schema,
    names: &[&str],
) -> Vec<deltalake::arrow::datatypes::Field> {
    names
        .iter()
        .filter_map(|c| schema.field_with_name(c).ok())
        .map(|f| f.clone().with_data_type(plain(f.data_type())))
        .collect()
}

/// `ty` with text and binary views replaced by plain `Utf8`/`Binary`, at any depth.
fn plain(ty: &deltalake::arrow::datatypes::DataType) -> deltalake::arrow::datatypes::DataType {
    use deltalake::arrow::datatypes::{DataType, Field};
    use std::sync::Arc;
    let field = |f: &Field| Arc::new(f.clone().with_data_type(plain(f.data_type())));
    match ty {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::Struct(fs) => DataType::Struct(fs.iter().map(|f| field(f)).collect()),
        DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
        other => other.clone(),
    }
}

/// The batch with view types cast to the plain types the tables are written with
/// (DataFusion's Parquet reader hands out views).
pub(crate) fn without_views(
    b: &deltalake::arrow::array::RecordBatch,
) -> Result<deltalake::arrow::array::RecordBatch, deltalake::arrow::error::ArrowError> {
    use deltalake::arrow::array::RecordBatch;
    use deltalake::arrow::datatypes::Schema;
    use std::sync::Arc;
    let schema = b.schema();
    if schema
        .fields()
        .iter()
        .all(|f| &plain(f.data_type()) == f.data_type())
    {
        return Ok(b.clone());
    }
    let mut fields = Vec::new();
    let mut cols = Vec::new();
    for (f, c) in schema.fields().iter().zip(b.columns()) {
        let ty = plain(f.data_type());
        cols.push(if &ty == c.data_type() {
            c.clone()
        } else {
            deltalake::arrow::compute::cast(c, &ty)?
        });
        fields.push(f.as_ref().clone().with_data_type(ty));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)
}

/// A DataFusion session that reads text as `Utf8` (not `Utf8View`), the type Bronze and
/// Silver are written with.
pub(crate) fn session() -> deltalake::datafusion::prelude::SessionContext {
    use deltalake::datafusion::prelude::{SessionConfig, SessionContext};
    let config = SessionConfig::new().set_bool(
        "datafusion.execution.parquet.schema_force_view_types",
        false,
    );
    SessionContext::new_with_config(config)
}

/// The DataFusion session every MERGE runs in: delta-rs's own (its planner executes the
/// MERGE), with three settings that bound its memory to the round's source plus what is
/// streaming through (issue 15: under a steady load of 5,000 changes/s the Silver
/// process's peak grew with the table, to 2.3 GiB after 2 minutes; heaptrack put most of
/// it in DataFusion's batches):
///
/// - **The source is always the join's build side** (`join_reordering` off). The join
///   is `source FULL JOIN target`; left to its statistics, DataFusion made the target the
///   build side in those runs, and held a hash table of every target row the MERGE
///   scanned (the round's changes are far fewer).
/// - **One partition** (`target_partitions` 1). With more, repartitions sit between the
///   scan, the join and the writer, and a repartition buffers whatever its consumer has
///   not taken yet, without bound.
/// - **Plain `Utf8` strings** (`schema_force_view_types` off), as Silver stores them.
///   DataFusion's batch coalescer gives each string-view column of each batch a buffer of
///   up to 1 MiB whatever the strings need, and the MERGE keeps batches alive while it
///   runs.
pub(crate) fn merge_session() -> std::sync::Arc<dyn deltalake::datafusion::catalog::Session> {
    use deltalake::delta_datafusion::DeltaSessionContext;
    // Fails only if DataFusion renames an option (a unit test checks they apply); the
    // MERGE then still runs, with DataFusion's defaults, and says so.
    let ctx = DeltaSessionContext::new_with_session_overrides(&merge_options())
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the MERGE memory bounds could not be set; MERGE runs with DataFusion's defaults");
            DeltaSessionContext::default()
        })
        .into_inner();
    std::sync::Arc::new(ctx.state())
}

fn merge_options() -> std::collections::HashMap<String, String> {
    [
        ("datafusion.execution.target_partitions", "1"),
        (
            "datafusion.execution.parquet.schema_force_view_types",
            "false",
        ),
        ("datafusion.optimizer.join_reordering", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The Arrow schema of the table's loaded version.
pub(crate) fn arrow_schema(
    name: &str,
    table: &DeltaTable,
) -> Result<deltalake::arrow::datatypes::SchemaRef, LakeError> {
    Ok(table
        .snapshot()
        .map_err(LakeError::delta(&name))?
        .snapshot()
        .arrow_schema())
}

/// `name` as a quoted SQL identifier.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `value` as a quoted SQL string literal. Every literal built into Silver's and the
/// quarantine's SQL goes through here.
pub(crate) fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A commit refused because another writer committed first.
pub(crate) fn is_conflict(e: &DeltaTableError) -> bool {
    matches!(
        e,
        DeltaTableError::VersionAlreadyExists(_)
            | DeltaTableError::Transaction {
                source: TransactionError::CommitConflict(_)
                    | TransactionError::MaxCommitAttempts(_)
                    | TransactionError::VersionAlreadyExists(_)
            }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_merge_session_bounds_memory() {
        use deltalake::delta_datafusion::DeltaSessionContext;
        // The options exist under these names (else `merge_session` would fall back to
        // the defaults, and MERGE memory would grow with the table again).
        let ctx = DeltaSessionContext::new_with_session_overrides(&merge_options())
            .expect("every MERGE option is known to DataFusion")
            .into_inner();
        let options = ctx.state().config().options().clone();
        assert_eq!(options.execution.target_partitions, 1);
        assert!(!options.execution.parquet.schema_force_view_types);
        assert!(!options.optimizer.join_reordering);
        let used = merge_session();
        let used = used.config().options();
        assert_eq!(used.execution.target_partitions, 1);
        assert!(!used.optimizer.join_reordering);
    }
}
