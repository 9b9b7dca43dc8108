//! The lake on object storage (issue 14): every stage against the development S3 server
//! of `ops/stack` (ops/s3: files behind the S3 protocol, atomic conditional writes), the way users point wal2delta at
//! S3: `[lake] uri = "s3://bucket/prefix"`, the endpoint in `[lake] storage_options`, the
//! credentials in the AWS environment variables. Bronze is written by two writers in one
//! consumer group, Silver quarantines a row that fails its check, reconcile compares the
//! source with Silver, replay rebuilds Silver from Bronze, and DuckDB (httpfs) and the
//! deltalake package read every table from the server.
//!
//! And the refusal: a store that ignores `If-None-Match` (where two writers could both
//! commit the same Delta version) stops a writing stage with the fix, unless the operator
//! declares a single writer.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::lake::{deltalake_info, duckdb, duckdb_i64};
use wal2delta_tests::s3::S3;
use wal2delta_tests::{Scenario, Stack, World};

/// A payments table, and a keyless one with an odd name (Bronze only) for extreme values.
const TABLE: &str =
    "CREATE TABLE {s}.pay (id int PRIMARY KEY, amount numeric(12,2), note text, at timestamptz);
  CREATE TABLE {s}.\"Événements Log\" (\"Zeit Punkt\" timestamptz, n numeric, d date);
  ALTER TABLE {s}.\"Événements Log\" REPLICA IDENTITY FULL;";

const TOML: &str = r#"[bronze]
assignment = "group"
group_id = "{s}"
max_batch_ms = 300
topic_refresh_ms = 500
[silver]
interval_ms = 300
maintenance_interval_s = 5
[[silver.checks]]
name = "amount_not_negative"
table = "{s}.pay"
column = "amount"
min = 0
[capture]
heartbeat_interval_ms = 500
"#;

fn scan(uri: &str) -> String {
    format!("delta_scan('{uri}')")
}

/// Waits until `sql` (one integer) gives `want`, while every process keeps running.
async fn wait_value(
    sql: &str,
    want: i64,
    procs: &mut [&mut StageProcess],
    timeout: Duration,
) -> Result<()> {
    let start = Instant::now();
    let mut have = None;
    while start.elapsed() < timeout {
        for p in procs.iter_mut() {
            p.assert_running()?;
        }
        if let Ok(n) = duckdb_i64(sql) {
            if n == want {
                return Ok(());
            }
            have = Some(n);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let logs: Vec<String> = procs.iter().map(|p| p.log_text()).collect();
    bail!("{sql}: {have:?}, never {want}\n{}", logs.join("\n---\n"))
}

/// Waits up to 60 s for the `n`-th line holding `needle` in the process's log.
fn wait_log(p: &mut StageProcess, needle: &str, n: usize) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        p.assert_running()?;
        let text = std::fs::read_to_string(&p.log).unwrap_or_default();
        if text.matches(needle).count() >= n {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("no {needle:?} within 60 s: {}", p.log_text())
}

fn reconcile(d: &wal2delta_tests::daemon::Daemon) -> Result<Value> {
    let out = d.command(&["reconcile", "--json"])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.code() == Some(0),
        "reconcile exited {:?}: {stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&stdout).context("reconcile printed no JSON")?;
    let tables = doc["tables"].as_array().context("no tables")?;
    tables
        .iter()
        .find(|t| t["name"].as_str().is_some_and(|n| n.ends_with(".pay")))
        .cloned()
        .with_context(|| format!("no pay table in {doc}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_stage_runs_on_an_s3_lake_read_by_duckdb_and_deltalake() -> Result<()> {
    let stack = Stack::from_env();
    let s3 = S3::from_env();
    let mut scenario = Scenario::new(&stack, "s3lake", TABLE)
        .toml(TOML)
        .partitions(3);
    let lake_uri = format!("s3://{}/{{s}}/lake", s3.bucket);
    for (k, v) in s3.daemon_env(&lake_uri) {
        scenario = scenario.env(&k, &v);
    }
    let World {
        name, pg, mut d, ..
    } = scenario.build().await?;
    let lake = format!("s3://{}/{name}/lake", s3.bucket);
    let bronze = format!("{lake}/bronze/{name}/pay");
    let silver = format!("{lake}/silver/{name}/pay");

    let out = d.command(&["check-config"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.contains(&lake) && text.contains("aws_endpoint_url"),
        "check-config names the lake and its option keys: {text}"
    );
    ensure!(
        !text.contains("wal2delta-dev-secret"),
        "no credential in check-config"
    );

    // The topic first, then writer A, then writer B joining A's group: both own
    // partitions while the workload runs.
    let mut capture = d.spawn_stage("capture", "capture")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.pay VALUES (0, 0, 'first', now());"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let mut writer_a = d.spawn_stage("bronze", "writer-a")?;
    wait_log(&mut writer_a, "partitions assigned", 1)?;
    let mut writer_b = d.spawn_stage("bronze", "writer-b")?;
    wait_log(&mut writer_b, "partitions assigned", 1)?;
    let mut silver_p = d.spawn_stage("silver", "silver")?;

    // Inserts, updates and deletes in many small transactions, and one insert that fails
    // Silver's check (quarantined).
    let mut rng = StdRng::seed_from_u64(14);
    let mut next = 0;
    for _ in 0..150 {
        let mut sql = String::from("BEGIN;");
        for _ in 0..rng.random_range(1..6) {
            match rng.random_range(0..10) {
                0..=4 => {
                    next += 1;
                    sql.push_str(&format!(
                        "INSERT INTO {name}.pay VALUES ({next}, {next}.25, 'n{next} é', now());"
                    ));
                }
                5..=7 if next > 0 => {
                    let id = rng.random_range(1..=next);
                    sql.push_str(&format!(
                        "UPDATE {name}.pay SET amount = amount + 1, note = 'u' WHERE id = {id};"
                    ));
                }
                _ if next > 0 => {
                    let id = rng.random_range(1..=next);
                    sql.push_str(&format!("DELETE FROM {name}.pay WHERE id = {id};"));
                }
                _ => {}
            }
        }
        sql.push_str("COMMIT;");
        pg.batch_execute(&sql).await?;
    }
    pg.batch_execute(&format!(
        "INSERT INTO {name}.pay VALUES (100000, -5, 'negative', now());
         INSERT INTO {name}.\"Événements Log\" VALUES ('infinity', 'NaN', '-infinity'),
           ('294276-12-31 23:59:59+00', 1e300, '5874897-12-31'), (NULL, '-1e-300', '4713-01-01 BC');"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    let rows: i64 = pg
        .query_one(&format!("SELECT count(*) FROM {name}.pay"), &[])
        .await?
        .get(0);

    // Silver holds the source minus the quarantined row (DuckDB over httpfs).
    let mut procs = [&mut capture, &mut writer_a, &mut writer_b, &mut silver_p];
    wait_value(
        &format!("SELECT count(*) FROM {}", scan(&silver)),
        rows - 1,
        &mut procs,
        Duration::from_secs(180),
    )
    .await?;

    // Bronze: every Kafka offset once, though two writers shared the partitions.
    let r = &duckdb(&format!(
        "SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)) FROM {}",
        scan(&bronze)
    ))?[0];
    ensure!(r[0] == r[1], "every offset exactly once: {r:?}");

    // The keyless table with an odd name and extreme values: in Bronze on S3 too, under
    // its escaped identity (a long key: the development server once failed those), found
    // by listing through the store. The year-294276 row cannot be sent (microseconds since
    // 1970 overflow) and is the one dead letter; the row with a NULL lands.
    let (odd_schema, odd_table) =
        wal2delta_model::TableName::new(&name, "Événements Log").ident_parts();
    let odd = format!("{lake}/bronze/{odd_schema}/{odd_table}");
    let mut procs = [&mut capture, &mut writer_a, &mut writer_b, &mut silver_p];
    wait_value(
        &format!("SELECT count(*) FROM {}", scan(&odd)),
        2,
        &mut procs,
        Duration::from_secs(60),
    )
    .await?;
    // As docs/types.md says: infinity as the sentinel DuckDB reads as infinite, numerics
    // as exact text, -infinity as the first date of the writer's calendar with the
    // original in out_of_range_values.
    let extreme = duckdb(&format!(
        "SELECT isinf(after.\"Zeit_Punkt\"), after.n, after.d::VARCHAR,
                CAST(out_of_range_values AS VARCHAR) FROM {} ORDER BY after.n",
        scan(&odd)
    ))?;
    let tiny = format!("-0.{}1", "0".repeat(299));
    ensure!(
        extreme
            == vec![
                vec![json!(null), json!(tiny), json!("4713-01-01 (BC)"), json!(null)],
                vec![
                    json!(true),
                    json!("NaN"),
                    json!("262144-01-01 (BC)"),
                    json!("[{'column': after.d, 'value': -infinity}, {'column': key.d, 'value': -infinity}]")
                ],
            ],
        "the extreme values as stored: {extreme:?}"
    );
    let dlq = wal2delta_tests::kafka::dead_letters(&stack.brokers, &name)?;
    ensure!(
        dlq.len() == 1,
        "one dead letter, the year-294276 row: {}",
        dlq.len()
    );

    // The deltalake package reads the same tables from the server.
    let info = deltalake_info(std::path::Path::new(&silver))?;
    assert_eq!(info["rows"], json!(rows - 1), "{info}");
    let info = deltalake_info(std::path::Path::new(&bronze))?;
    assert_eq!(info["rows"], r[0], "{info}");

    // The quarantine table lives on S3 too, readable by `quarantine list` and DuckDB.
    let out = d.command(&["quarantine", "list"])?;
    let listed = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && listed.contains("amount_not_negative"),
        "quarantine list: {listed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let q = duckdb_i64(&format!(
        "SELECT count(*) FROM {}",
        scan(&format!("{lake}/quarantine/records"))
    ))?;
    ensure!(q == 1, "one quarantine record on S3, found {q}");

    // Reconcile: source and Silver equal, the quarantined row excluded.
    let t = reconcile(&d)?;
    assert_eq!(t["equal"], json!(true), "{t}");
    assert_eq!(t["silver_rows"], json!(rows - 1), "{t}");
    assert_eq!(t["excluded"]["quarantined"], json!(1), "{t}");

    // Silver's scheduled maintenance compacted and checkpointed its table on S3.
    let silver_log = std::fs::read_to_string(&silver_p.log)?;
    ensure!(
        silver_log.contains("Silver table compacted and checkpointed"),
        "Silver maintenance ran: {}",
        silver_p.log_text()
    );

    // Replay rebuilds Silver from Bronze on S3 (the staging table is created, swapped in
    // and removed through the object store); the result still equals the source.
    ensure!(silver_p.stop()?.success(), "silver stops cleanly");
    let out = d.command(&["replay", "--layer", "silver"])?;
    let said = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success()
            && said.contains(&format!(
                "{odd_schema}.{odd_table}: no primary key: kept in Bronze only"
            ))
            && said.contains(&format!("{name}.pay: rebuilt from")),
        "replay rebuilds pay and skips the keyless table ({}): {said}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let staged = duckdb_i64(&format!(
        "SELECT count(*) FROM glob('{lake}/silver/_wal2delta/rebuild/**')"
    ))?;
    ensure!(
        staged == 0,
        "the staging table was removed ({staged} objects left)"
    );
    let n = duckdb_i64(&format!("SELECT count(*) FROM {}", scan(&silver)))?;
    ensure!(
        n == rows - 1,
        "Silver after replay holds {n}, want {}",
        rows - 1
    );
    // Silver resumes on the rebuilt table; more changes arrive and reconcile agrees.
    let mut silver_p = d.spawn_stage("silver", "silver-after-replay")?;
    pg.batch_execute(&format!(
        "UPDATE {name}.pay SET note = 'after replay' WHERE id IN (SELECT id FROM {name}.pay WHERE amount >= 0 ORDER BY id LIMIT 5);
         INSERT INTO {name}.pay VALUES (100001, 1, 'after replay', now());"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    wait_value(
        &format!(
            "SELECT count(*) FILTER (WHERE note = 'after replay') FROM {}",
            scan(&silver)
        ),
        6,
        &mut [&mut silver_p, &mut writer_a, &mut writer_b],
        Duration::from_secs(120),
    )
    .await?;
    let t = reconcile(&d)?;
    assert_eq!(t["equal"], json!(true), "after replay: {t}");
    assert_eq!(t["silver_rows"], json!(rows), "after replay: {t}");

    // Gold on S3: a keyed model is merged for the changed keys, not rewritten whole
    // (issue 38, defect 9: its reads of Silver's files found no object store).
    let models = std::env::temp_dir().join(format!("{name}-models"));
    std::fs::create_dir_all(&models)?;
    std::fs::write(
        models.join("by_note.sql"),
        format!("-- key: note\n-- key of {name}.pay: note\nSELECT note, count(*) AS n FROM {name}.pay GROUP BY note"),
    )?;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    d.env
        .push(("WAL2DELTA__GOLD__INTERVAL_MS".into(), "300".into()));
    let mut gold_p = d.spawn_stage("gold", "gold")?;
    let gold = format!("{lake}/gold/by_note");
    let gold_sum = format!("SELECT COALESCE(sum(n), 0)::BIGINT FROM {}", scan(&gold));
    wait_value(
        &gold_sum,
        rows,
        &mut [&mut gold_p, &mut silver_p],
        Duration::from_secs(120),
    )
    .await?;
    pg.batch_execute(&format!(
        "UPDATE {name}.pay SET note = 'gold' WHERE id IN (SELECT id FROM {name}.pay ORDER BY id LIMIT 3);
         INSERT INTO {name}.pay VALUES (100002, 2, 'gold', now());"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    wait_value(
        &format!(
            "SELECT COALESCE(max(n) FILTER (WHERE note = 'gold'), 0)::BIGINT FROM {}",
            scan(&gold)
        ),
        4,
        &mut [&mut gold_p, &mut silver_p],
        Duration::from_secs(120),
    )
    .await?;
    let merges = duckdb_i64(&format!(
        "SELECT count(*) FROM read_text('{gold}/_delta_log/*.json') WHERE content LIKE '%\"operation\":\"MERGE\"%'"
    ))?;
    ensure!(
        merges >= 1 && !gold_p.log_text().contains("rewritten whole"),
        "the keyed model merged the changed keys on S3 ({merges} merges): {}",
        gold_p.log_text()
    );
    ensure!(gold_p.stop()?.success(), "gold stops cleanly");
    std::fs::remove_dir_all(&models)?;
    ensure!(silver_p.stop()?.success(), "silver stops cleanly");

    for (p, label) in [
        (&mut writer_a, "A"),
        (&mut writer_b, "B"),
        (&mut capture, "capture"),
    ] {
        ensure!(
            p.stop()?.success(),
            "{label} stops cleanly: {}",
            p.log_text()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_without_conditional_writes_is_refused_unless_single_writer() -> Result<()> {
    let stack = Stack::from_env();
    let s3 = S3::from_env();
    let World { name, d, .. } = Scenario::new(&stack, "s3nocas", TABLE)
        .toml("[bronze]\ngroup_id = \"{s}\"\n")
        .build()
        .await?;
    let server = s3.without_conditional_writes(&d.dir.join("s3-no-cas"))?;
    let lake = format!("s3://{}/{name}/lake", s3.bucket);
    let env = server.s3.daemon_env(&lake);

    // Refused: the stage stops with the reason and the fix, the process exits non-zero.
    let mut refused = d.command_line(&["run", "--stage", "bronze"]);
    refused.envs(env.iter().cloned());
    let out = tokio::task::spawn_blocking(move || refused.output()).await??;
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "bronze ran on a store without conditional writes: {log}"
    );
    ensure!(
        log.contains("If-None-Match") && log.contains("single_writer"),
        "the refusal names the cause and the fix: {log}"
    );
    ensure!(
        !log.contains("wal2delta-dev-secret"),
        "no credential in the log"
    );

    // Accepted with a warning when the operator declares a single writer.
    let mut accepted = d.command_line(&["run", "--stage", "bronze"]);
    accepted.envs(env.iter().cloned());
    accepted.env("WAL2DELTA__LAKE__SINGLE_WRITER", "true");
    let log_path = d.dir.join("single-writer.log");
    accepted
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path)?);
    let mut child = accepted.spawn()?;
    let start = Instant::now();
    let mut text = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        if let Some(status) = child.try_wait()? {
            bail!(
                "bronze exited ({status}) with single_writer = true: {}",
                std::fs::read_to_string(&log_path)?
            );
        }
        text = std::fs::read_to_string(&log_path)?;
        if text.contains("single_writer = true") && text.contains("stage started") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    ensure!(
        text.contains("single_writer = true"),
        "the warning names the setting: {text}"
    );
    Ok(())
}
