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
use wal2delta_tests::{Scenario, Stack, World};

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
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "names",
        "CREATE TABLE {s}.\"Order Items\" (id int PRIMARY KEY, \"Unit Price\" bigint, note text);
         CREATE TABLE {s}.\"a b\" (id int PRIMARY KEY, v bigint, note text);
         CREATE TABLE {s}.a_b (id int PRIMARY KEY, v bigint, note text);",
    )
    .toml(TOML)
    .partitions(3)
    .build()
    .await?;
    let result = body(&stack, &name, &pg, &d).await;
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

/// Issue 11, defect 14: a masking policy names the real column `"Card No"` of the real
/// table `"Card Holders"`; no raw value may reach a Silver file.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_on_real_names_masks_the_column() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "mask_names",
        "CREATE TABLE {s}.\"Card Holders\" (id int PRIMARY KEY, \"Card No\" text, owner text);",
    )
    .toml(&format!(
        "{TOML}[silver.mask]\n\"{{s}}.Card Holders.Card No\" = \"redact\"\n"
    ))
    .build()
    .await?;
    let result = async {
        let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
        pg.batch_execute(&format!(
            "INSERT INTO {name}.\"Card Holders\" SELECT g, '41111111' || lpad(g::text, 8, '0'), 'o' || g FROM generate_series(1, 50) g;
             UPDATE {name}.\"Card Holders\" SET \"Card No\" = '41111111' || lpad((id + 1000)::text, 8, '0') WHERE id <= 10;"
        ))
        .await?;
        d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
        let path = silver_path(&d, &name, "Card Holders");
        let start = Instant::now();
        loop {
            run.assert_running()?;
            let rows = duckdb(&format!(
                "SELECT count(*), count(*) FILTER (WHERE \"Card_No\" = '****') FROM {}",
                scan(&path)
            ))
            .unwrap_or_default();
            if rows.first().is_some_and(|r| r[0] == 50) {
                assert_eq!(rows[0][1], Value::from(50), "every card number is redacted");
                break;
            }
            if start.elapsed() > Duration::from_secs(90) {
                bail!("Silver never held the 50 rows ({rows:?}): {}", run.log_text());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let silver = d.lake().join("silver");
        let leaks = duckdb(&format!(
            "SELECT count(*) FROM read_parquet('{}/**/*.parquet', union_by_name = true) t WHERE CAST(t AS VARCHAR) LIKE '%41111111%'",
            silver.display()
        ))?;
        assert_eq!(leaks[0][0], Value::from(0), "raw card numbers under {}", silver.display());
        run.stop()?;
        Ok(())
    }
    .await;
    result
}

/// A policy naming a column the table does not have stops the start, naming the entry.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_naming_no_column_refuses_to_start() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name: _,
        pg: _pg,
        d,
        ..
    } = Scenario::new(
        &stack,
        "mask_unknown",
        "CREATE TABLE {s}.\"Card Holders\" (id int PRIMARY KEY, \"Card No\" text);",
    )
    .toml(&format!(
        "{TOML}[silver.mask]\n\"{{s}}.Card Holders.Card Number\" = \"redact\"\n"
    ))
    .build()
    .await?;
    let result = async {
        let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
        let Some(status) = run.wait_exit(Duration::from_secs(60))? else {
            bail!(
                "wal2delta kept running with a policy naming no column: {}",
                run.log_text()
            );
        };
        assert!(!status.success(), "{status}");
        let log = run.log_text();
        assert!(
            log.contains("silver.mask") && log.contains("\"Card Number\""),
            "the error names the entry and the column: {log}"
        );
        Ok(())
    }
    .await;
    result
}
