//! How the cost of bringing an open Delta table up to date grows with the files it holds
//! (docs/benchmarks.md, "What a kept table's refresh costs").
//!
//! `cargo run --release --example refresh_cost -p wal2delta-lake -- [COMMITS]` (default
//! 2,000) appends COMMITS single-file commits of 100 rows to a fresh table of 40 columns
//! under the temp directory (so the log holds statistics for 32 columns, like Bronze),
//! and every 250 commits prints, for a handle kept open: the refresh over those 250
//! commits, the refresh over one more commit, and a fresh open of the table. The table
//! is removed at the end.

use std::sync::Arc;
use std::time::Instant;

use deltalake::arrow::array::{ArrayRef, Int64Array, StringArray};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::arrow::record_batch::RecordBatch;
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};

const COLUMNS: usize = 40;
const ROWS: i64 = 100;

fn batch(schema: &SchemaRef, n: i64) -> Result<RecordBatch, DeltaTableError> {
    let mut cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(
        n * ROWS..(n + 1) * ROWS,
    ))];
    for _ in 1..COLUMNS {
        cols.push(Arc::new(StringArray::from_iter_values(
            (0..ROWS).map(|i| format!("v{i}")),
        )));
    }
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

fn table(url: &url::Url) -> Result<DeltaTable, DeltaTableError> {
    DeltaTableBuilder::from_url(url.clone())?.build()
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let commits: i64 = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 2_000,
    };
    let dir = std::env::temp_dir().join(format!("wal2delta-refresh-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = url::Url::from_directory_path(&dir).map_err(|()| "temp dir is not a path")?;
    let mut fields = vec![Field::new("p", DataType::Int64, false)];
    fields.extend((1..COLUMNS).map(|i| Field::new(format!("c{i}"), DataType::Utf8, true)));
    let schema: SchemaRef = Arc::new(Schema::new(fields));

    let mut writer = table(&url)?;
    let mut kept = table(&url)?;
    for i in 0..commits {
        writer = writer
            .write(vec![batch(&schema, i)?])
            .with_save_mode(SaveMode::Append)
            .await?;
        if i == 0 {
            kept.load().await?;
            continue;
        }
        if i % 250 != 0 && i != commits - 1 {
            continue;
        }
        let started = Instant::now();
        kept.update_state().await?;
        let many = ms(started);
        writer = writer
            .write(vec![batch(&schema, i)?])
            .with_save_mode(SaveMode::Append)
            .await?;
        let started = Instant::now();
        kept.update_state().await?;
        let one = ms(started);
        let started = Instant::now();
        table(&url)?.load().await?;
        let open = ms(started);
        println!(
            "files {:5}  refresh over 250 commits {many:6.1} ms  over 1 commit {one:6.1} ms  open {open:6.1} ms",
            kept.snapshot()?.log_data().num_files()
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
