//! How the cost of one commit grows with the entries of the table's `_delta_log`
//! (docs/benchmarks.md, "What a commit costs as the log grows").
//!
//! `cargo run --release --example commit_cost -p wal2delta-lake -- [COMMITS]` (default
//! 8,000) makes two tables under the temp directory and gives each COMMITS commits that
//! add no file (as Silver records an idle table's progress every round). One is committed
//! with delta-rs' default post-commit hook, which lists the whole log after every commit
//! to look for expired entries; the other with that cleanup switched off, as wal2delta
//! commits (the cleanup runs with each table's maintenance instead). Every 1,000 commits it
//! prints the median of 25 commits of each. The tables are removed at the end.

use std::sync::Arc;
use std::time::Instant;

use deltalake::arrow::array::{Int64Array, RecordBatch};
use deltalake::arrow::datatypes::{DataType, Field, Schema};
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Transaction};
use deltalake::protocol::{DeltaOperation, OutputMode};
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};

async fn create(dir: &std::path::Path) -> Result<DeltaTable, DeltaTableError> {
    std::fs::create_dir_all(dir)?;
    let url = url::Url::from_directory_path(dir)
        .map_err(|()| DeltaTableError::Generic("temp dir is not a path".into()))?;
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))])?;
    DeltaTableBuilder::from_url(url)?
        .build()?
        .write(vec![batch])
        .await
}

/// One commit with only a `txn` action; its milliseconds.
async fn commit(table: &mut DeltaTable, n: i64, cleanup: bool) -> Result<f64, DeltaTableError> {
    let props = CommitProperties::default()
        .with_application_transactions(vec![Transaction::new("bench", n)])
        .with_cleanup_expired_logs(Some(cleanup));
    let started = Instant::now();
    let done = CommitBuilder::from(props)
        .with_actions(Vec::<Action>::new())
        .build(
            Some(table.snapshot()?),
            table.log_store(),
            DeltaOperation::StreamingUpdate {
                output_mode: OutputMode::Append,
                query_id: "bench".into(),
                epoch_id: n,
            },
        )
        .await?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    table.update_incremental(Some(done.version())).await?;
    Ok(ms)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let commits: i64 = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 8_000,
    };
    let dir = std::env::temp_dir().join(format!("wal2delta-commit-cost-{}", std::process::id()));
    let mut default = create(&dir.join("default")).await?;
    let mut off = create(&dir.join("off")).await?;
    let mut n = 0;
    while n < commits {
        n += 1;
        commit(&mut default, n, true).await?;
        commit(&mut off, n, false).await?;
        if n % 1_000 == 0 {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..25 {
                n += 1;
                a.push(commit(&mut default, n, true).await?);
                b.push(commit(&mut off, n, false).await?);
            }
            let entries = std::fs::read_dir(dir.join("default/_delta_log"))?.count();
            println!(
                "log entries {entries:6}  commit with the default cleanup {:6.2} ms  without {:6.2} ms",
                median(a),
                median(b)
            );
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
