//! Appending without delta-rs' file list.
//!
//! delta-rs brings a table's state up to date after every commit it makes, and that state
//! always holds the table's file list: each file's statistics are parsed again from the
//! log, so a commit costs in proportion to the files the table holds. In the low-latency
//! setting (four micro-batches a second) that was most of Bronze's CPU
//! (docs/benchmarks.md, "Bronze at low latency: where its CPU goes"). A Bronze append
//! needs none of it: it adds files and `txn` actions and reads nothing.
//!
//! So a writer that knows it is at the table's latest version (it made that commit
//! itself) writes the next commit directly: the Parquet files and their `add` actions
//! (statistics included) by delta-rs' `RecordBatchWriter`, the commit entry by the
//! table's own log store, which refuses a version that exists (put-if-absent, the
//! guarantee every Delta commit rests on). **Why this is exactly once:** the commit is
//! written at `v + 1` where `v` is the version the writer's offsets were checked at; if
//! another writer took `v + 1` first, the entry is refused, nothing is committed, and
//! the table is loaded and the offsets checked again before the next attempt
//! (lake/src/bronze/table.rs, module docs). The
//! files written for the refused entry are referenced by no commit: readers never see
//! them and `vacuum` removes them.
//!
//! The direct path is taken only for tables whose protocol it can honour (no writer
//! feature that changes what an append must write, such as row tracking or
//! constraints) and on log stores that commit by put-if-absent; anything else, a schema
//! change or a type widening goes through delta-rs. Every `delta.checkpointInterval`
//! versions the table is loaded once and a checkpoint written, as delta-rs would.

use std::collections::HashMap;

use deltalake::arrow::array::RecordBatch;
use deltalake::kernel::transaction::{CommitData, TransactionError};
use deltalake::kernel::{Action, Add, Transaction};
use deltalake::logstore::CommitOrBytes;
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::{DeltaTable, DeltaTableError};

/// Writer features a direct append honours: none of them asks an append for more than
/// files and `txn` actions (appendOnly and invariants are checked by the writer before:
/// Bronze only appends and its schema has no invariants, see [`eligible`]).
const FEATURES: &[&str] = &[
    "appendOnly",
    "invariants",
    "timestampNtz",
    "typeWidening",
    "typeWidening-preview",
];

/// Commits a writer made past its loaded table state.
#[derive(Debug, Default)]
pub(super) struct Ahead {
    /// The table version of the last of them.
    pub version: u64,
    /// The `txn` versions they recorded, by app id.
    pub txns: HashMap<String, i64>,
}

/// Whether appends to `table` (loaded) may be committed directly.
pub(super) fn eligible(table: &DeltaTable) -> bool {
    if table.log_store().name() != "DefaultLogStore" {
        // A log store that commits another way than put-if-absent of the entry (one a
        // deployment registers itself): its own commit path is the one to use.
        return false;
    }
    let Ok(state) = table.snapshot() else {
        return false;
    };
    let Ok(protocol) = serde_json::to_value(state.protocol()) else {
        return false;
    };
    let writer = protocol["minWriterVersion"].as_i64().unwrap_or(i64::MAX);
    let features_ok = protocol["writerFeatures"].as_array().is_none_or(|f| {
        f.iter()
            .all(|f| f.as_str().is_some_and(|f| FEATURES.contains(&f)))
    });
    let constraints = state
        .metadata()
        .configuration()
        .keys()
        .any(|k| k.starts_with("delta.constraints."));
    (writer <= 2 || writer == 7) && features_ok && !constraints
}

/// How a direct commit ended.
pub(super) enum Direct {
    /// Committed at this version.
    Committed(u64),
    /// Another writer committed `version` first: nothing was committed.
    Taken,
}

/// Writes `batches` (already in the table's schema) as files of `table` and commits them
/// with `txns` and `info` at `version`, the version after the one this writer's checks
/// were made at (module docs).
pub(super) async fn append(
    table: &DeltaTable,
    version: u64,
    batches: Vec<RecordBatch>,
    txns: Vec<Transaction>,
    info: HashMap<String, serde_json::Value>,
    partition_by: &str,
) -> Result<Direct, DeltaTableError> {
    let adds = write_files(table, batches).await?;
    let data = CommitData::new(
        adds.into_iter().map(Action::Add).collect(),
        DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: Some(vec![partition_by.to_owned()]),
            predicate: None,
        },
        info,
        txns,
    );
    let bytes = data.get_bytes()?;
    match table
        .log_store()
        .write_commit_entry(
            version,
            CommitOrBytes::LogBytes(bytes),
            uuid::Uuid::new_v4(),
        )
        .await
    {
        Ok(()) => Ok(Direct::Committed(version)),
        Err(TransactionError::VersionAlreadyExists(_)) => Ok(Direct::Taken),
        Err(e) => Err(e.into()),
    }
}

async fn write_files(
    table: &DeltaTable,
    batches: Vec<RecordBatch>,
) -> Result<Vec<Add>, DeltaTableError> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(Vec::new());
    }
    let mut writer = RecordBatchWriter::for_table(table)?;
    for b in batches {
        writer.write(b).await?;
    }
    writer.flush().await
}

/// Whether a checkpoint is due at `version` (delta-rs writes one every
/// `delta.checkpointInterval` versions after its commits).
pub(super) fn checkpoint_due(table: &DeltaTable, version: u64) -> bool {
    let interval = table
        .snapshot()
        .ok()
        .and_then(|s| s.table_config().checkpoint_interval)
        .map_or(100, |i| i.get());
    version > 0 && version.is_multiple_of(interval)
}
