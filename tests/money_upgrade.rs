//! Money is a number, for a lake an earlier release wrote (issue 40 item 4,
//! docs/upgrading.md): a bounded numeric that Bronze and Silver hold as text keeps working
//! when its events start to arrive as Avro decimals, Bronze records the decimal type, and
//! `replay --layer silver --table` rebuilds Silver with the `DECIMAL(p,s)` column, whose
//! sum then equals PostgreSQL's exactly; the live stage goes on into it.

use std::path::Path;

use anyhow::{ensure, Result};
use serde_json::{json, Value as Json};
use wal2delta_tests::lake::{duckdb, scan};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.pay (id bigint PRIMARY KEY, amount numeric(18,2));
     CREATE TABLE {s}.acct (no numeric(20,0) PRIMARY KEY, balance numeric(12,2));";

/// The accounts table, keyed by a bounded numeric: its rows as text, sorted.
async fn accounts(pg: &tokio_postgres::Client, s: &str) -> Result<Vec<Vec<Json>>> {
    let rows = pg
        .query(
            &format!("SELECT no::text, balance::text FROM {s}.acct"),
            &[],
        )
        .await?;
    let mut rows: Vec<Vec<Json>> = rows
        .iter()
        .map(|r| {
            vec![
                json!(r.get::<_, String>(0)),
                json!(r.get::<_, Option<String>>(1)),
            ]
        })
        .collect();
    // In the order of the keys' text, whatever their type in the lake.
    rows.sort_by_key(|r| r[0].to_string());
    Ok(rows)
}

fn account_rows(silver: &Path) -> Result<Vec<Vec<Json>>> {
    if !silver.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let mut rows = duckdb(&format!(
        "SELECT no::VARCHAR, balance::VARCHAR FROM {}",
        scan(silver)
    ))?;
    rows.sort_by_key(|r| r[0].to_string());
    Ok(rows)
}

/// The source's rows: id and amount as PostgreSQL prints it, NaN as `nan` says.
async fn source(pg: &tokio_postgres::Client, s: &str, nan: Json) -> Result<Vec<Vec<Json>>> {
    let rows = pg
        .query(
            &format!("SELECT id, amount::text FROM {s}.pay ORDER BY id"),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let a: Option<String> = r.get(1);
            let a = match a.as_deref() {
                Some("NaN") => nan.clone(),
                other => json!(other),
            };
            vec![json!(r.get::<_, i64>(0)), a]
        })
        .collect())
}

fn silver_rows(silver: &Path) -> Result<Vec<Vec<Json>>> {
    if !silver.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    duckdb(&format!(
        "SELECT id, amount::VARCHAR FROM {} ORDER BY id",
        scan(silver)
    ))
}

fn type_of(table: &str, column: &str) -> Result<Vec<Vec<Json>>> {
    duckdb(&format!("SELECT DISTINCT typeof({column}) FROM {table}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_text_column_of_an_earlier_release_keeps_working_and_a_replay_makes_it_a_decimal(
) -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "moneyup", TABLES)
        .env("WAL2DELTA__KAFKA__DECIMAL_HANDLING", "string")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .build()
        .await?;
    let (s, pg, mut d) = (w.name, w.pg, w.d);
    let silver = d.silver("pay");
    let acct = d.silver("acct");
    let bronze = scan(&d.bronze("pay"));

    // An earlier release's lake: numerics as text everywhere.
    let mut run = d.spawn_stage("capture,bronze,silver", "text")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.pay VALUES (1, 12345.67), (2, -0.01), (3, 'NaN'), (4, NULL), (5, 9999999999999999.99);
         INSERT INTO {s}.acct VALUES (10000000000000000001, 5.00), (2, -7.25)"
    ))
    .await?;
    let want = source(&pg, &s, json!("NaN")).await?;
    run.wait_for("Silver as text", &want, || silver_rows(&silver))
        .await?;
    ensure!(type_of(&scan(&silver), "amount")? == [[json!("VARCHAR")]]);
    ensure!(run.stop()?.success(), "{}", run.log_text());

    // This release: the events are decimals; Bronze and Silver keep their text.
    d.env
        .retain(|(k, _)| k != "WAL2DELTA__KAFKA__DECIMAL_HANDLING");
    let mut run = d.spawn_stage("capture,bronze,silver", "decimal")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.pay VALUES (6, 0.10), (7, 'NaN'); UPDATE {s}.pay SET amount = 20000.5 WHERE id = 2;
         UPDATE {s}.acct SET balance = 6.00 WHERE no = 10000000000000000001; INSERT INTO {s}.acct VALUES (3, 1)"
    ))
    .await?;
    // A NaN that arrives as a decimal is NULL in the text column too (its text is in
    // Bronze's out_of_range_values); the earlier release's NaN (row 3) keeps its text.
    let mut want = source(&pg, &s, json!("NaN")).await?;
    want[6][1] = Json::Null;
    run.wait_for("Silver still text", &want, || silver_rows(&silver))
        .await?;
    let want = accounts(&pg, &s).await?;
    run.wait_for("the accounts as text", &want, || account_rows(&acct))
        .await?;
    ensure!(type_of(&bronze, "after.amount")? == [[json!("VARCHAR")]]);
    ensure!(type_of(&scan(&silver), "amount")? == [[json!("VARCHAR")]]);
    ensure!(run.stop()?.success(), "{}", run.log_text());
    let log = std::fs::read_dir(d.bronze("pay").join("_delta_log"))?
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect::<String>();
    ensure!(
        log.contains(r#""wal2delta.decimal.amount":"18,2""#),
        "Bronze records the decimal type of its text column"
    );

    // The replay rebuilds Silver with the decimal column.
    let out = d.command(&[
        "replay",
        "--layer",
        "silver",
        "--table",
        &format!("{s}.pay"),
    ])?;
    ensure!(
        out.status.success(),
        "replay: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(type_of(&scan(&silver), "amount")? == [[json!("DECIMAL(18,2)")]]);
    let want = source(&pg, &s, Json::Null).await?;
    ensure!(silver_rows(&silver)? == want, "the rebuilt rows");
    let out = d.command(&[
        "replay",
        "--layer",
        "silver",
        "--table",
        &format!("{s}.acct"),
    ])?;
    ensure!(
        out.status.success(),
        "replay: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(type_of(&scan(&acct), "no")? == [[json!("DECIMAL(20,0)")]]);
    let (got, want) = (account_rows(&acct)?, accounts(&pg, &s).await?);
    ensure!(
        got == want,
        "the rebuilt accounts: {got:?}, the source {want:?}"
    );
    let sum = |q: &str| -> Result<Json> { Ok(duckdb(q)?[0][0].clone()) };
    let pg_sum: String = pg
        .query_one(
            &format!("SELECT sum(amount) FILTER (WHERE amount <> 'NaN')::text FROM {s}.pay"),
            &[],
        )
        .await?
        .get(0);
    ensure!(
        sum(&format!(
            "SELECT sum(amount)::VARCHAR FROM {}",
            scan(&silver)
        ))? == json!(pg_sum),
        "the sum equals PostgreSQL's {pg_sum}"
    );

    // The stage goes on into the decimal column, from Bronze's text.
    let mut run = d.spawn_stage("capture,bronze,silver", "after")?;
    pg.batch_execute(&format!(
        "UPDATE {s}.pay SET amount = 'NaN' WHERE id = 1; INSERT INTO {s}.pay VALUES (8, 42.42); DELETE FROM {s}.pay WHERE id = 5;
         UPDATE {s}.acct SET balance = 0 WHERE no = 2; DELETE FROM {s}.acct WHERE no = 3; UPDATE {s}.acct SET no = 4 WHERE no = 10000000000000000001"
    ))
    .await?;
    let want = source(&pg, &s, Json::Null).await?;
    run.wait_for("Silver goes on as decimals", &want, || silver_rows(&silver))
        .await?;
    // Keyed by a decimal now: updates, a delete and a key change find their rows.
    let want = accounts(&pg, &s).await?;
    run.wait_for("the accounts go on", &want, || account_rows(&acct))
        .await?;
    ensure!(type_of(&scan(&silver), "amount")? == [[json!("DECIMAL(18,2)")]]);
    ensure!(run.stop()?.success(), "{}", run.log_text());
    Ok(())
}
