//! Values at the edges of what the lake's writer can describe: Bronze lands them next to a
//! plain table, readable by DuckDB and the `deltalake` package, and nothing panics.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use wal2delta_tests::daemon::{Daemon, StageProcess};
use wal2delta_tests::kafka::dead_letters;
use wal2delta_tests::lake::{deltalake_info, duckdb, duckdb_i64, scan};
use wal2delta_tests::{Scenario, Stack, World};

const BRONZE_TOML: &str =
    "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n";

/// Waits until `sql` (one integer) returns at least `want`; the process must keep running.
fn wait_for(sql: &str, want: i64, timeout: Duration, run: &mut StageProcess) -> Result<i64> {
    let start = Instant::now();
    let mut last = -1;
    while start.elapsed() < timeout {
        run.assert_running()?;
        if let Ok(n) = duckdb_i64(sql) {
            last = n;
            if n >= want {
                return Ok(n);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!(
        "{sql} reached {last}, wanted {want} within {timeout:?}; log: {}",
        run.log_text()
    )
}

/// `date 'infinity'`, `'-infinity'`, a year-300000 date and a `date[]` holding them: deltalake
/// cannot write file statistics for them (it panicked and stopped the Bronze session), so the
/// lake holds them mapped into its calendar, the originals in `out_of_range_values`.
#[tokio::test(flavor = "multi_thread")]
async fn dates_beyond_the_writers_calendar_land_next_to_a_plain_table() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "brzdate",
        "CREATE TABLE {s}.odd (id int PRIMARY KEY, d date, ds date[]);
         CREATE TABLE {s}.plain (id int PRIMARY KEY, note text);",
    )
    .toml(BRONZE_TOML)
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze", "run")?;
    let result = dates(&name, &pg, &d, &mut run).await;
    if result.is_ok() {
        ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    }
    drop(run);
    result
}

async fn dates(
    name: &str,
    pg: &tokio_postgres::Client,
    d: &Daemon,
    run: &mut StageProcess,
) -> Result<()> {
    pg.batch_execute(&format!(
        "INSERT INTO {name}.plain SELECT g, 'n' || g FROM generate_series(1, 50) g;
         INSERT INTO {name}.odd VALUES
           (1, 'infinity', NULL),
           (2, '-infinity', NULL),
           (3, '300000-01-01', NULL),
           (4, '2024-02-29', ARRAY['infinity', '-infinity', '300000-01-01', '2024-02-29', NULL]::date[]),
           (5, '262142-12-31', ARRAY['0044-03-15 BC']::date[]);
         UPDATE {name}.odd SET d = '5874897-12-31' WHERE id = 3;
         INSERT INTO {name}.plain SELECT g, 'n' || g FROM generate_series(51, 100) g;"
    ))
    .await?;
    let (odd, plain) = (scan(&d.bronze("odd")), scan(&d.bronze("plain")));
    wait_for(
        &format!("SELECT count(*) FROM {plain}"),
        100,
        Duration::from_secs(90),
        run,
    )?;
    wait_for(
        &format!("SELECT count(*) FROM {odd}"),
        6,
        Duration::from_secs(60),
        run,
    )?;

    // The lake values keep the order (-infinity < finite < infinity) inside the calendar.
    let rows = duckdb(&format!(
        "SELECT after.id, after.d::VARCHAR, list_transform(after.ds, x -> x::VARCHAR)::VARCHAR,
                out_of_range_values::VARCHAR
         FROM {odd} ORDER BY kafka_offset"
    ))?;
    let want: Vec<Value> = vec![
        json!([1, "262142-12-31", null, "[{'column': after.d, 'value': infinity}]"]),
        json!([2, "262144-01-01 (BC)", null, "[{'column': after.d, 'value': -infinity}]"]),
        json!([3, "262142-12-30", null, "[{'column': after.d, 'value': 300000-01-01}]"]),
        json!([4, "2024-02-29",
            "[262142-12-31, '262144-01-01 (BC)', 262142-12-30, 2024-02-29, NULL]",
            "[{'column': 'after.ds[1]', 'value': infinity}, {'column': 'after.ds[2]', 'value': -infinity}, {'column': 'after.ds[3]', 'value': 300000-01-01}]"]),
        json!([5, "262142-12-30", "['0044-03-15 (BC)']", "[{'column': after.d, 'value': 262142-12-31}]"]),
        json!([3, "262142-12-30", null, "[{'column': after.d, 'value': 5874897-12-31}]"]),
    ];
    let got: Vec<Value> = rows.into_iter().map(Value::from).collect();
    ensure!(got == want, "Bronze rows:\n{got:#?}\nwanted:\n{want:#?}");
    ensure!(
        duckdb_i64(&format!(
            "SELECT count(*) FROM {odd} WHERE after.d > current_date AND after.id IN (1, 3, 5)"
        ))? == 4,
        "infinity and far dates compare after today"
    );
    ensure!(
        duckdb_i64(&format!(
            "SELECT count(*) FROM {plain} WHERE out_of_range_values IS NULL"
        ))? == 100,
        "rows without such values have none listed"
    );
    for table in ["odd", "plain"] {
        let info = deltalake_info(&d.bronze(table))?;
        ensure!(
            info["rows"] == if table == "odd" { 6 } else { 100 },
            "deltalake reads {table}: {info}"
        );
    }
    let log = std::fs::read_to_string(&run.log).context("log")?;
    ensure!(
        !log.contains("panicked") && !log.contains("bronze session ended"),
        "nothing panicked, the session never restarted: {}",
        run.log_text()
    );
    Ok(())
}

/// A table without a primary key (append-only history, like pgbench_history): every event
/// lands in Bronze once (its Kafka key is an empty record, which used to be quarantined as
/// `unsupported_schema`); Silver does not hold it and `status` and `reconcile` say why.
/// Rows with NULLs, and an update that leaves a TOASTed value unchanged, land too: the
/// whole-row key of a REPLICA IDENTITY FULL table used to require every column, so each
/// such row went to the DLQ (`encode_failed`) instead of Bronze.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_without_a_primary_key_lands_in_bronze_only() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "brzkeyless",
        "CREATE TABLE {s}.hist (a int, note text);
         ALTER TABLE {s}.hist REPLICA IDENTITY FULL;
         CREATE TABLE {s}.keyed (id int PRIMARY KEY, note text);",
    )
    .toml(&format!("{BRONZE_TOML}[silver]\ninterval_ms = 300\n"))
    .partitions(2)
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let result = keyless(&name, &pg, &d, &mut run).await.and_then(|()| {
        let dlq = dead_letters(&stack.brokers, &name)?;
        ensure!(dlq.is_empty(), "{} dead letters", dlq.len());
        Ok(())
    });
    if result.is_ok() {
        ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    }
    drop(run);
    result
}

async fn keyless(
    name: &str,
    pg: &tokio_postgres::Client,
    d: &Daemon,
    run: &mut StageProcess,
) -> Result<()> {
    pg.batch_execute(&format!(
        "INSERT INTO {name}.hist SELECT g, 'n' || g FROM generate_series(1, 60) g;
         INSERT INTO {name}.hist SELECT g, 'dup' FROM generate_series(1, 5) g;
         UPDATE {name}.hist SET note = 'u' WHERE a BETWEEN 11 AND 20;
         DELETE FROM {name}.hist WHERE a > 55;
         INSERT INTO {name}.hist VALUES (NULL, NULL), (61, NULL), (NULL, 'nokey');
         INSERT INTO {name}.hist SELECT 70, string_agg(md5(g::text), '') FROM generate_series(1, 2000) g;
         UPDATE {name}.hist SET a = 71 WHERE a = 70;
         INSERT INTO {name}.keyed SELECT g, 'k' || g FROM generate_series(1, 20) g;"
    ))
    .await?;
    // 69 inserts, 11 updates, 5 deletes of rows (the 'dup' rows have a <= 5).
    let hist = scan(&d.bronze("hist"));
    wait_for(
        &format!("SELECT count(*) FROM {hist}"),
        85,
        Duration::from_secs(90),
        run,
    )?;
    let rows = duckdb(&format!(
        "SELECT op, count(*), count(DISTINCT (kafka_partition, kafka_offset)) FROM {hist} GROUP BY op ORDER BY op"
    ))?;
    ensure!(
        rows == vec![
            vec![json!("c"), json!(69), json!(69)],
            vec![json!("d"), json!(5), json!(5)],
            vec![json!("u"), json!(11), json!(11)],
        ],
        "every event once: {rows:?}"
    );
    let nulls = duckdb(&format!(
        "SELECT count(*) FILTER (WHERE after.a IS NULL), count(*) FILTER (WHERE after.note IS NULL) FROM {hist} WHERE op = 'c'"
    ))?;
    ensure!(
        nulls == vec![vec![json!(2), json!(2)]],
        "rows with NULLs: {nulls:?}"
    );
    let toast = duckdb(&format!(
        "SELECT length(before.note), unchanged_toast_columns FROM {hist} WHERE op = 'u' AND after.a = 71"
    ))?;
    ensure!(
        toast == vec![vec![json!(64000), json!("['note']")]],
        "the update that left the TOASTed note unchanged: {toast:?}"
    );
    let updated = duckdb(&format!(
        "SELECT before.a, before.note, after.note FROM {hist} WHERE op = 'u' AND after.a = 11"
    ))?;
    ensure!(
        updated == vec![vec![json!(11), json!("n11"), json!("u")]],
        "the whole old row: {updated:?}"
    );
    let q = scan(&d.lake().join("quarantine/records"));
    let quarantined = duckdb_i64(&format!("SELECT count(*) FROM {q}")).unwrap_or(0);
    ensure!(quarantined == 0, "{quarantined} events quarantined");
    let keyed = scan(&d.silver("keyed"));
    wait_for(
        &format!("SELECT count(*) FROM {keyed}"),
        20,
        Duration::from_secs(60),
        run,
    )?;
    ensure!(
        !d.silver("hist").join("_delta_log").exists(),
        "no Silver table for the keyless table"
    );

    let out = d.command(&["status", "--json"])?;
    let doc: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let table = format!("{name}.hist");
    let bronze = &doc["stages"]["bronze"]["tables"];
    ensure!(
        bronze
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["table"] == table.as_str()
                && t["bronze_only"] == true
                && t["lag_events"] == 0)),
        "status: Bronze only, caught up: {bronze}"
    );
    let silver = &doc["stages"]["silver"]["tables"];
    ensure!(
        silver
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["table"] == table.as_str()
                && t["not_in_silver"]
                    .as_str()
                    .is_some_and(|s| s.contains("no primary key: Bronze only")))),
        "status: not in Silver, and why: {silver}"
    );
    let text = d.command(&["status"])?;
    ensure!(
        String::from_utf8_lossy(&text.stdout)
            .contains("not in Silver (no primary key: Bronze only"),
        "status text: {}",
        String::from_utf8_lossy(&text.stdout)
    );

    let out = d.command(&["reconcile", "--json"])?;
    let report: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    ensure!(
        out.status.code() == Some(0),
        "reconcile equal: {report} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        report["tables_without_primary_key"] == json!([table])
            && report["tables_not_in_silver"] == json!([]),
        "reconcile says why the table is not compared: {report}"
    );
    let text = d.command(&["reconcile"])?;
    ensure!(
        String::from_utf8_lossy(&text.stdout).contains(&format!(
            "not compared (no primary key: Bronze only (append-only history)): {table}"
        )),
        "reconcile text: {}",
        String::from_utf8_lossy(&text.stdout)
    );
    let log = std::fs::read_to_string(&run.log)?;
    ensure!(
        log.matches("kept in Bronze only").count() == 1,
        "the silver stage says it once: {}",
        run.log_text()
    );
    Ok(())
}

/// A table that gains a primary key later, as `pgbench -i` builds its tables (rows loaded,
/// then `ADD PRIMARY KEY` on a column they already have): Bronze first holds keyless
/// events, then keyed ones; Silver starts holding the table once Bronze has a key, takes
/// the key of the old events from their rows, and ends equal to the source, rows changed
/// before the key included. It used to fail every round on the keyless rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_that_gains_a_primary_key_later_reaches_silver() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "brzgainskey",
        "CREATE TABLE {s}.acct (aid int NOT NULL, bal int, filler text);
         ALTER TABLE {s}.acct REPLICA IDENTITY FULL;",
    )
    .toml(&format!("{BRONZE_TOML}[silver]\ninterval_ms = 300\n"))
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let result = gains_key(&name, &pg, &d, &mut run).await;
    if result.is_ok() {
        ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    }
    drop(run);
    result
}

async fn gains_key(
    name: &str,
    pg: &tokio_postgres::Client,
    d: &Daemon,
    run: &mut StageProcess,
) -> Result<()> {
    pg.batch_execute(&format!(
        "INSERT INTO {name}.acct SELECT g, 0, 'f' || g FROM generate_series(1, 100) g;
         UPDATE {name}.acct SET bal = 7 WHERE aid <= 10;
         DELETE FROM {name}.acct WHERE aid > 95;"
    ))
    .await?;
    // 100 inserts, 10 updates, 5 deletes, all without a key.
    let acct = scan(&d.bronze("acct"));
    wait_for(
        &format!("SELECT count(*) FROM {acct}"),
        115,
        Duration::from_secs(90),
        run,
    )?;
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.acct ADD PRIMARY KEY (aid);
         ALTER TABLE {name}.acct REPLICA IDENTITY DEFAULT;
         UPDATE {name}.acct SET bal = bal + 1 WHERE aid BETWEEN 5 AND 15;
         DELETE FROM {name}.acct WHERE aid <= 3;
         INSERT INTO {name}.acct SELECT g, 1, 'new' FROM generate_series(200, 209) g;"
    ))
    .await?;
    let want: i64 = pg
        .query_one(&format!("SELECT count(*) FROM {name}.acct"), &[])
        .await?
        .get(0);
    let silver = scan(&d.silver("acct"));
    // Silver looks at a keyless Bronze table again once a minute.
    wait_for(
        &format!("SELECT count(*) FROM {silver}"),
        want,
        Duration::from_secs(180),
        run,
    )?;
    let out = d.command(&["reconcile", "--json", "--wait-secs", "120"])?;
    let report: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    ensure!(
        out.status.code() == Some(0),
        "reconcile equal: {report} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        report["tables_without_primary_key"] == json!([]),
        "the table is compared once it has a key: {report}"
    );
    let rows = duckdb(&format!(
        "SELECT aid, bal FROM {silver} WHERE aid IN (4, 5, 10, 11, 95) ORDER BY aid"
    ))?;
    ensure!(
        rows == vec![
            vec![json!(4), json!(7)],
            vec![json!(5), json!(8)],
            vec![json!(10), json!(8)],
            vec![json!(11), json!(1)],
            vec![json!(95), json!(0)],
        ],
        "rows changed before and after the key: {rows:?}"
    );
    Ok(())
}
