//! Type widening mid-stream (issue 38, defect 12): `ALTER COLUMN … TYPE bigint` of a key
//! and of a non-key column, `numeric(10,2)` → `numeric(14,4)`, `varchar(10)` → `text`
//! and `real` → `double precision`, applied while the daemon runs. Bronze and Silver take
//! the wider types without a restart (each rewritten once, in one commit), nothing goes to
//! quarantine, Silver equals the source, Gold and the rule hits follow, and DuckDB and
//! the `deltalake` package read every version of Bronze and Silver.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use serde_json::Value;
use tokio_postgres::Client;
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::lake::{duckdb, every_version, rule_hits};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.pay (id int PRIMARY KEY, merchant_id int NOT NULL, ref int, amount numeric(10,2), code varchar(10), rate real);";

/// The columns compared, as text both sides print alike: numbers at a fixed scale.
const PG_ROW: &str = "id::text, merchant_id::text, ref::text, amount::numeric(18,4)::text, code, round(rate::numeric, 2)::text";
const DUCK_ROW: &str = "CAST(id AS VARCHAR), CAST(merchant_id AS VARCHAR), CAST(ref AS VARCHAR), CAST(CAST(amount AS DECIMAL(18,4)) AS VARCHAR), code, CAST(CAST(round(CAST(rate AS DOUBLE), 2) AS DECIMAL(18,2)) AS VARCHAR)";

/// Rows sorted by their first column, a number.
fn by_id(mut rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    rows.sort_by_key(|r| r[0].parse::<i64>().unwrap_or(i64::MIN));
    rows
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

async fn source_rows(pg: &Client, s: &str) -> Result<Vec<Vec<String>>> {
    let rows = pg
        .query(&format!("SELECT {PG_ROW} FROM {s}.pay"), &[])
        .await?;
    Ok(by_id(
        rows.iter()
            .map(|r| {
                (0..6)
                    .map(|i| {
                        r.get::<_, Option<String>>(i)
                            .unwrap_or_else(|| "NULL".into())
                    })
                    .collect()
            })
            .collect(),
    ))
}

fn silver_rows(silver: &Path) -> Result<Vec<Vec<String>>> {
    Ok(by_id(
        duckdb(&format!(
            "SELECT {DUCK_ROW} FROM delta_scan('{}')",
            silver.display()
        ))?
        .iter()
        .map(|r| r.iter().map(text).collect())
        .collect(),
    ))
}

/// Per merchant: rows and the sum of `ref`, as the keyed model computes them.
async fn expected_gold(pg: &Client, s: &str) -> Result<Vec<Vec<String>>> {
    let rows = pg
        .query(
            &format!("SELECT merchant_id::text, count(*)::text, sum(ref)::text FROM {s}.pay GROUP BY merchant_id ORDER BY merchant_id"),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (0..3)
                .map(|i| {
                    r.get::<_, Option<String>>(i)
                        .unwrap_or_else(|| "NULL".into())
                })
                .collect()
        })
        .collect())
}

fn gold_rows(gold: &Path) -> Result<Vec<Vec<String>>> {
    Ok(duckdb(&format!(
        "SELECT CAST(merchant_id AS VARCHAR), CAST(n AS VARCHAR), CAST(refs AS VARCHAR) FROM delta_scan('{}') ORDER BY merchant_id",
        gold.display()
    ))?
    .iter()
    .map(|r| r.iter().map(text).collect())
    .collect())
}

/// Keys with `ref > 1000`, as `rules/hits` holds them.
async fn expected_hits(pg: &Client, s: &str) -> Result<Vec<(String, String)>> {
    let rows = pg
        .query(
            &format!("SELECT id::text FROM {s}.pay WHERE ref > 1000"),
            &[],
        )
        .await?;
    let mut out: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                format!("{{\"id\":{}}}", r.get::<_, String>(0)),
                "big_ref".to_owned(),
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Waits until Silver, Gold and the hits equal what the source says.
async fn wait_all_equal(
    pg: &Client,
    s: &str,
    lake: &Path,
    run: &mut StageProcess,
    what: &str,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let silver = silver_rows(&lake.join(format!("silver/{s}/pay"))).unwrap_or_default();
        let gold = gold_rows(&lake.join("gold/by_merchant")).unwrap_or_default();
        let hits = rule_hits(lake).unwrap_or_default();
        let (want_silver, want_gold, want_hits) = (
            source_rows(pg, s).await?,
            expected_gold(pg, s).await?,
            expected_hits(pg, s).await?,
        );
        if silver == want_silver && gold == want_gold && hits == want_hits {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(180) {
            let first_diff = silver
                .iter()
                .zip(&want_silver)
                .find(|(a, b)| a != b)
                .map(|(a, b)| format!("silver {a:?} source {b:?}"));
            bail!(
                "{what}: never equal (silver {} rows vs {}, first difference {first_diff:?}; gold {gold:?} vs {want_gold:?}; hits {} vs {})\n{}",
                silver.len(),
                want_silver.len(),
                hits.len(),
                want_hits.len(),
                run.log_text()
            );
        }
        run.assert_running()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The DuckDB type of `column` in the table at `path` (a nested one as `after.id`).
fn column_type(path: &Path, column: &str) -> Result<String> {
    let rows = duckdb(&format!(
        "SELECT typeof({column}) FROM delta_scan('{}') LIMIT 1",
        path.display()
    ))?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .map(text)
        .unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn widened_columns_are_taken_mid_stream_by_bronze_silver_gold_and_rules() -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "widen", TABLES)
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .env("WAL2DELTA__GOLD__INTERVAL_MS", "300")
        .env("WAL2DELTA__GOLD__MODELS_DIR", "{dir}/models")
        .without_setup()
        .build_with_rules(|s| {
            format!("[[rule]]\nid = \"big_ref\"\ntable = \"{s}.pay\"\nwhen = \"ref > 1000\"\nversion = 1\n")
        })
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let models = d.dir.join("models");
    std::fs::create_dir_all(&models)?;
    std::fs::write(
        models.join("by_merchant.sql"),
        format!("-- key: merchant_id\n-- key of {s}.pay: merchant_id\nSELECT merchant_id, count(*) AS n, sum(ref) AS refs FROM {s}.pay GROUP BY merchant_id"),
    )?;
    d.setup()?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.pay SELECT g, g % 5, g * 10, g + 0.25, 'c' || g, g / 4.0 FROM generate_series(1, 300) g"
    ))
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver,rules,gold", "run")?;
    let lake = d.lake();
    wait_all_equal(&pg, &s, &lake, &mut run, "before the ALTERs").await?;
    let bronze = d.bronze("pay");
    let silver = d.silver("pay");
    ensure!(
        column_type(&silver, "id")? == "INTEGER",
        "Silver starts with int ids"
    );

    // The classic migration, a key and a non-key column, with values only bigint holds,
    // a key moved past the int range, and changes to old rows.
    pg.batch_execute(&format!(
        "ALTER TABLE {s}.pay ALTER COLUMN id TYPE bigint, ALTER COLUMN ref TYPE bigint;
         INSERT INTO {s}.pay VALUES (3000000000, 2, 5000000000, 1.5, 'big', 0.5);
         UPDATE {s}.pay SET ref = ref + 4000000000 WHERE id % 7 = 0;
         DELETE FROM {s}.pay WHERE id % 11 = 0;
         UPDATE {s}.pay SET id = id + 4000000000 WHERE id = 5;"
    ))
    .await?;
    wait_all_equal(&pg, &s, &lake, &mut run, "after int → bigint").await?;
    // Then more digits, unbounded text and double precision.
    pg.batch_execute(&format!(
        "ALTER TABLE {s}.pay ALTER COLUMN amount TYPE numeric(14,4), ALTER COLUMN code TYPE text, ALTER COLUMN rate TYPE double precision;
         INSERT INTO {s}.pay VALUES (3000000001, 3, 7, 1234567890.1234, repeat('x', 40), 1e15);
         UPDATE {s}.pay SET amount = amount + 0.0001, code = code || repeat('y', 20) WHERE id % 3 = 0;
         DELETE FROM {s}.pay WHERE id = 3000000000;"
    ))
    .await?;
    wait_all_equal(&pg, &s, &lake, &mut run, "after numeric, text and double").await?;

    // Nothing was quarantined, and each layer holds the wider types.
    let q = lake.join("quarantine/records");
    if q.join("_delta_log").is_dir() {
        let n = duckdb(&format!(
            "SELECT count(*) FROM delta_scan('{}')",
            q.display()
        ))?;
        ensure!(n[0][0] == 0, "no event or row quarantined: {n:?}");
    }
    ensure!(
        column_type(&bronze, "after.id")? == "BIGINT",
        "Bronze after.id is bigint"
    );
    ensure!(
        column_type(&bronze, "after.rate")? == "DOUBLE",
        "Bronze after.rate is double"
    );
    ensure!(
        column_type(&silver, "id")? == "BIGINT",
        "Silver id is bigint"
    );
    ensure!(
        column_type(&silver, "ref")? == "BIGINT",
        "Silver ref is bigint"
    );
    ensure!(
        column_type(&silver, "rate")? == "DOUBLE",
        "Silver rate is double"
    );
    ensure!(
        !column_type(&lake.join("gold/by_merchant"), "refs")?.is_empty(),
        "Gold readable"
    );
    let log = run.log_text();
    ensure!(
        log.contains("Bronze table rewritten under the wider type")
            && log.contains("Silver table rewritten under the wider type"),
        "each layer says it rewrote the table: {log}"
    );

    // Every version of Bronze and Silver reads with both readers, and agrees.
    for table in [&bronze, &silver] {
        let versions = every_version(table)?;
        ensure!(versions.len() > 3, "{}: {versions:?}", table.display());
        for [v, deltalake, duck] in &versions {
            ensure!(
                deltalake == duck,
                "{} version {v}: deltalake reads {deltalake} rows, DuckDB {duck}",
                table.display()
            );
        }
    }
    run.assert_running()?;
    ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    Ok(())
}
