//! Table names that earlier releases sanitised (issue 11, defect 5) on the real stack:
//! `"Order Items"` (space and capitals), `"a b"` and `a_b` (which a replacing sanitiser
//! sends to one topic, where their rows merge by key) go through capture → Bronze →
//! Silver, each to its own topic and lake tables, and each Silver table ends equal to its
//! source table. END records count the events under the same identity as the lake tables,
//! so Silver waits for every event instead of passing them.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::Value;
use tokio_postgres::Client;
use wal2delta_model::TableName;
use wal2delta_tests::daemon::{Daemon, StageProcess};
use wal2delta_tests::kafka::read_topic_to_end;
use wal2delta_tests::lake::{duckdb, scan};
use wal2delta_tests::{cleanup, scenario, Stack};

const TOML: &str = "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n";

/// The source tables: (name, SQL spelling of the value column).
const TABLES: [(&str, &str); 3] = [
    ("Order Items", "\"Unit Price\""),
    ("a b", "v"),
    ("a_b", "v"),
];

/// The Silver column of each value column (Avro field names replace the space).
fn silver_column(sql: &str) -> &str {
    if sql == "v" {
        "v"
    } else {
        "\"Unit_Price\""
    }
}

async fn source_rows(pg: &Client, schema: &str, table: &str, col: &str) -> Result<Vec<Vec<Value>>> {
    let t = TableName::new(schema, table).quoted();
    let rows = pg
        .query(&format!("SELECT id, {col}, note FROM {t} ORDER BY id"), &[])
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            vec![
                Value::from(r.get::<_, i32>(0)),
                r.get::<_, Option<i64>>(1).map_or(Value::Null, Value::from),
                r.get::<_, Option<String>>(2)
                    .map_or(Value::Null, Value::from),
            ]
        })
        .collect())
}

fn silver_path(d: &Daemon, schema: &str, table: &str) -> std::path::PathBuf {
    let (s, t) = TableName::new(schema, table).ident_parts();
    d.lake().join("silver").join(s).join(t)
}

/// Waits until every Silver table equals its source table.
async fn wait_all_equal(
    pg: &Client,
    d: &Daemon,
    schema: &str,
    run: &mut StageProcess,
    timeout: Duration,
) -> Result<()> {
    let start = Instant::now();
    for (table, col) in TABLES {
        let want = source_rows(pg, schema, table, col).await?;
        let path = silver_path(d, schema, table);
        let sql = format!(
            "SELECT id, {}, note FROM {} ORDER BY id",
            silver_column(col),
            scan(&path)
        );
        let mut last = Vec::new();
        loop {
            run.assert_running()?;
            if let Ok(have) = duckdb(&sql) {
                if have == want {
                    break;
                }
                last = have;
            }
            if start.elapsed() > timeout {
                let missing: Vec<_> = want.iter().filter(|r| !last.contains(r)).take(5).collect();
                let extra: Vec<_> = last.iter().filter(|r| !want.contains(r)).take(5).collect();
                bail!(
                    "Silver of {schema}.{table:?} ({} rows) never equalled the source ({} rows); missing/different {missing:?}, extra {extra:?}; log: {}",
                    last.len(),
                    want.len(),
                    run.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn odd_table_names_get_their_own_topics_and_tables() -> Result<()> {
    let stack = Stack::from_env();
    let (name, pg, d) = scenario(
        &stack,
        "names",
        "CREATE TABLE {s}.\"Order Items\" (id int PRIMARY KEY, \"Unit Price\" bigint, note text);
         CREATE TABLE {s}.\"a b\" (id int PRIMARY KEY, v bigint, note text);
         CREATE TABLE {s}.a_b (id int PRIMARY KEY, v bigint, note text);",
        TOML,
        3,
    )
    .await?;
    let result = body(&stack, &name, &pg, &d).await;
    cleanup(&pg, &name, &name).await;
    result
}

async fn body(stack: &Stack, name: &str, pg: &Client, d: &Daemon) -> Result<()> {
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    // The same keys in every table, with different values: merged tables would show it.
    for round in 0..30 {
        let mut sql = String::from("BEGIN;");
        for (i, (table, col)) in TABLES.iter().enumerate() {
            let t = TableName::new(name, *table).quoted();
            let base = (i as i64 + 1) * 1_000;
            sql.push_str(&format!(
                "INSERT INTO {t} SELECT g, {base} + g + {round}, '{table}' FROM generate_series({round} * 10 + 1, {round} * 10 + 10) g;
                 UPDATE {t} SET {col} = {col} + {base}, note = note || ' u' WHERE id % 7 = {round} % 7;
                 DELETE FROM {t} WHERE id % 11 = {round} % 11 AND id < {round} * 10 - {i};"
            ));
        }
        sql.push_str("COMMIT;");
        pg.batch_execute(&sql).await?;
    }
    d.wait_caught_up(pg, Duration::from_secs(120)).await?;
    wait_all_equal(pg, d, name, &mut run, Duration::from_secs(120)).await?;

    // Each table has a topic of its own, holding only its own rows.
    for (table, _) in TABLES {
        let topic = format!("{}.{}", d.prefix, TableName::new(name, table).ident());
        let records = read_topic_to_end(&stack.brokers, &topic)?;
        if records.is_empty() {
            bail!("topic {topic} of {name}.{table:?} holds no event");
        }
    }
    let mut bronze: Vec<String> = std::fs::read_dir(d.lake().join("bronze").join(name))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    bronze.sort();
    assert_eq!(
        bronze,
        ["-4frder-20-49tems", "a-20b", "a_b"],
        "one Bronze table per source table"
    );
    run.stop()?;
    Ok(())
}
