//! Silver keeps moving on inputs that used to stop it for good (issue 11), on the real
//! stack with a read window of 50 offsets per partition:
//!
//! - a single transaction of 600 changes (twelve windows) is applied whole;
//! - a gap of 120 offsets in Bronze (events Bronze quarantined) is read past;
//! - a table whose first window holds only rows failing a check still gets its Silver
//!   table and progress, and later rows arrive;
//! - a key-changing update that fails a check still deletes the old key.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::Value;
use tokio_postgres::Client;
use wal2delta_tests::daemon::{Daemon, StageProcess};
use wal2delta_tests::lake::{duckdb, duckdb_i64, scan};
use wal2delta_tests::{Scenario, Stack, World};

const TOML: &str = r#"[bronze]
group_id = "{s}"
max_batch_ms = 300
topic_refresh_ms = 500
[silver]
interval_ms = 300
max_rows_per_partition = 50
[[silver.checks]]
name = "not_bad"
table = "{s}.t"
sql = "v IS NULL OR v <> 'bad'"
[[silver.checks]]
name = "positive"
table = "{s}.late"
sql = "n > 0"
"#;

/// `SELECT id, v, n FROM {schema}.{table}` as JSON rows, ordered by id.
async fn source_rows(pg: &Client, schema: &str, table: &str) -> Result<Vec<Vec<Value>>> {
    let rows = pg
        .query(
            &format!("SELECT id, v, n FROM {schema}.{table} ORDER BY id"),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            vec![
                Value::from(r.get::<_, i32>(0)),
                r.get::<_, Option<String>>(1)
                    .map_or(Value::Null, Value::from),
                r.get::<_, Option<i32>>(2).map_or(Value::Null, Value::from),
            ]
        })
        .collect())
}

/// Waits until Silver's `table` holds `want` (id, v, n rows).
async fn wait_silver(
    d: &Daemon,
    table: &str,
    want: &[Vec<Value>],
    run: &mut StageProcess,
    timeout: Duration,
) -> Result<()> {
    let path = d.silver(table);
    let start = Instant::now();
    let mut last = Vec::new();
    while start.elapsed() < timeout {
        run.assert_running()?;
        if let Ok(have) = duckdb(&format!("SELECT id, v, n FROM {} ORDER BY id", scan(&path))) {
            if have == want {
                return Ok(());
            }
            last = have;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let missing: Vec<_> = want.iter().filter(|r| !last.contains(r)).take(5).collect();
    let extra: Vec<_> = last.iter().filter(|r| !want.contains(r)).take(5).collect();
    bail!(
        "Silver {table} ({} rows) never equalled the source ({} rows); missing/different {missing:?}, extra {extra:?}; log: {}",
        last.len(),
        want.len(),
        run.log_text()
    )
}

async fn wait_equal(
    pg: &Client,
    d: &Daemon,
    schema: &str,
    table: &str,
    run: &mut StageProcess,
) -> Result<usize> {
    d.wait_caught_up(pg, Duration::from_secs(90)).await?;
    let want = source_rows(pg, schema, table).await?;
    wait_silver(d, table, &want, run, Duration::from_secs(120)).await?;
    Ok(want.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn silver_moves_past_large_transactions_gaps_and_failing_rows() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "hostile",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text, n int);
         CREATE TABLE {s}.late (id int PRIMARY KEY, v text, n int);",
    )
    .toml(TOML)
    .build()
    .await?;
    let s = &name;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.t SELECT g, 'v' || g, g FROM generate_series(1, 30) g;"
    ))
    .await?;
    wait_equal(&pg, &d, s, "t", &mut run).await?;

    // One transaction of 600 changes: twelve read windows.
    pg.batch_execute(&format!(
        "BEGIN;
         UPDATE {s}.t SET n = n + 1;
         INSERT INTO {s}.t SELECT g, 'w' || g, g FROM generate_series(31, 600) g;
         COMMIT;
         INSERT INTO {s}.t VALUES (601, 'after', 1);"
    ))
    .await?;
    assert_eq!(wait_equal(&pg, &d, s, "t", &mut run).await?, 601);

    // A gap of 120 offsets: messages Bronze cannot decode (it quarantines them), then a
    // normal transaction beyond them.
    let topic = format!("{name}.{name}.t");
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .create()?;
    for i in 0..120 {
        let payload = format!("not avro {i}");
        producer
            .send(
                BaseRecord::to(&topic)
                    .partition(0)
                    .key("x")
                    .payload(&payload),
            )
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    let quarantine = d.lake().join("quarantine").join("records");
    let start = Instant::now();
    loop {
        run.assert_running()?;
        let n = duckdb_i64(&format!(
            "SELECT count(*) FROM {} WHERE stage = 'bronze'",
            scan(&quarantine)
        ))
        .unwrap_or(0);
        if n >= 120 {
            break;
        }
        if start.elapsed() > Duration::from_secs(90) {
            bail!("Bronze quarantined {n} of the 120 undecodable messages");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pg.batch_execute(&format!(
        "UPDATE {s}.t SET v = 'past the gap' WHERE id <= 10; INSERT INTO {s}.t VALUES (602, 'x', 2);"
    ))
    .await?;
    assert_eq!(wait_equal(&pg, &d, s, "t", &mut run).await?, 602);

    // A key move whose new row fails a check: the old key goes, the new one is held back.
    pg.batch_execute(&format!(
        "UPDATE {s}.t SET id = 5000, v = 'bad' WHERE id = 20; INSERT INTO {s}.t VALUES (603, 'y', 3);"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(90)).await?;
    let want: Vec<Vec<Value>> = source_rows(&pg, s, "t")
        .await?
        .into_iter()
        .filter(|r| r[0] != 5000)
        .collect();
    assert!(!want.iter().any(|r| r[0] == 20));
    wait_silver(&d, "t", &want, &mut run, Duration::from_secs(120)).await?;

    // A table whose first window (50 offsets) holds only failing rows.
    pg.batch_execute(&format!(
        "INSERT INTO {s}.late SELECT g, 'neg', -g FROM generate_series(1, 80) g;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(90)).await?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.late SELECT g, 'pos', g FROM generate_series(81, 90) g;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(90)).await?;
    let want: Vec<Vec<Value>> = source_rows(&pg, s, "late")
        .await?
        .into_iter()
        .filter(|r| r[2].as_i64().is_some_and(|n| n > 0))
        .collect();
    assert_eq!(want.len(), 10);
    wait_silver(&d, "late", &want, &mut run, Duration::from_secs(120)).await?;
    let held = duckdb_i64(&format!(
        "SELECT count(*) FROM {} WHERE stage = 'silver' AND table_name = '{s}.late'",
        scan(&quarantine)
    ))?;
    assert_eq!(held, 80, "every failing row is in quarantine once");

    run.stop()?;
    Ok(())
}

/// A round whose MERGE changes nothing (re-delivered snapshot rows older than Silver's
/// rows) still records its progress: delta-rs makes no commit for such a MERGE, and the
/// watermark used to stay where it was for good (issue 11 #12: `reconcile` gave up).
#[tokio::test(flavor = "multi_thread")]
async fn a_round_that_changes_nothing_still_moves_the_watermark() -> Result<()> {
    let stack = Stack::from_env();
    let toml = "[snapshot]\nmode = \"initial\"\n[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n";
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "noop",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text, n int);
         INSERT INTO {s}.t SELECT g, 'snap', g FROM generate_series(1, 20) g;",
    )
    .toml(toml)
    .build()
    .await?;
    let s = &name;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    wait_equal(&pg, &d, s, "t", &mut run).await?;
    pg.batch_execute(&format!("UPDATE {s}.t SET v = 'streamed';"))
        .await?;
    wait_equal(&pg, &d, s, "t", &mut run).await?;

    // The snapshot rows again, straight to the topic: older than every Silver row.
    let topic = format!("{name}.{name}.t");
    let old = wal2delta_tests::kafka::read_topic_to_end(&stack.brokers, &topic)?;
    let snapshot: Vec<_> = old.iter().take(20).collect();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .create()?;
    for r in &snapshot {
        let mut rec = BaseRecord::to(&topic)
            .partition(r.partition)
            .payload(&r.payload);
        if let Some(k) = &r.key {
            rec = rec.key(k);
        }
        producer.send(rec).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    let bronze = d.bronze("t");
    let start = Instant::now();
    while duckdb_i64(&format!("SELECT count(*) FROM {}", scan(&bronze)))? < 60 {
        run.assert_running()?;
        if start.elapsed() > Duration::from_secs(90) {
            bail!("Bronze never stored the re-delivered snapshot rows");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Silver is unchanged, and its watermark reaches a snapshot taken now.
    wait_equal(&pg, &d, s, "t", &mut run).await?;
    let out = d.command(&[
        "reconcile",
        "--table",
        &format!("{s}.t"),
        "--wait-secs",
        "60",
    ])?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "reconcile: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    run.stop()?;
    Ok(())
}

/// The silver table entry of `wal2delta status --json` for `table`.
fn silver_status(d: &Daemon, table: &str) -> Result<Value> {
    let out = d.command(&["status", "--json"])?;
    let doc: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        anyhow::anyhow!(
            "status --json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    doc["stages"]["silver"]["tables"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["table"] == table).cloned())
        .ok_or_else(|| anyhow::anyhow!("status has no silver table {table}: {doc}"))
}

/// Issue 11, defect 10: an event Bronze quarantined is still counted by its transaction's
/// END record, so Silver's watermark holds before that transaction (and `status` says
/// why) until `quarantine resolve` closes the record; then Silver passes the transaction
/// without it and applies the rest, later transactions included.
#[tokio::test(flavor = "multi_thread")]
async fn a_resolved_bronze_quarantine_record_lets_silver_pass_its_transaction() -> Result<()> {
    let stack = Stack::from_env();
    let toml = "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n";
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "qres",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text, n int);",
    )
    .toml(toml)
    .partitions(2)
    .build()
    .await?;
    let s = &name;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.t SELECT g, 'a', g FROM generate_series(1, 10) g;"
    ))
    .await?;
    let before = source_rows(&pg, s, "t").await?;
    wait_equal(&pg, &d, s, "t", &mut run).await?;

    // One transaction: an update Bronze stores, and an insert whose column type changed
    // (int -> double precision, not a widening Bronze takes), which Bronze cannot merge
    // into the table and quarantines. The next
    // transaction changes the type back, so its insert lands.
    pg.batch_execute(&format!(
        "BEGIN; UPDATE {s}.t SET v = 'updated' WHERE id = 1;
         ALTER TABLE {s}.t ALTER COLUMN n TYPE double precision; INSERT INTO {s}.t VALUES (11, 'q', 11.5); COMMIT;
         BEGIN; ALTER TABLE {s}.t ALTER COLUMN n TYPE int; INSERT INTO {s}.t VALUES (12, 'later', 12); COMMIT;"
    ))
    .await?;
    let records = scan(&d.lake().join("quarantine/records"));
    let bronze = scan(&d.bronze("t"));
    let start = Instant::now();
    let id = loop {
        run.assert_running()?;
        let held = duckdb(&format!(
            "SELECT id FROM {records} WHERE stage = 'bronze' AND table_name = '{s}.t'"
        ))
        .unwrap_or_default();
        let stored = duckdb_i64(&format!("SELECT count(*) FROM {bronze}")).unwrap_or(0);
        if let (Some(id), 12) = (held.first().and_then(|r| r[0].as_str()), stored) {
            break id.to_owned();
        }
        if start.elapsed() > Duration::from_secs(90) {
            bail!(
                "Bronze never quarantined the insert and stored the rest ({held:?}, {stored} rows): {}",
                run.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // The transaction is not whole: Silver shows none of it, nor anything after it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    wait_silver(&d, "t", &before, &mut run, Duration::from_secs(5)).await?;
    let st = silver_status(&d, &format!("{s}.t"))?;
    let held = st["held_by_quarantine"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !(held.len() == 1 && held[0]["id"] == id.as_str()) {
        bail!("status names the open Bronze record holding the watermark: {st}");
    }
    if !st["held_reason"]
        .as_str()
        .is_some_and(|r| r.contains("quarantine resolve"))
    {
        bail!("status says how to release it: {st}");
    }

    let out = d.command(&["quarantine", "resolve", &id])?;
    if !out.status.success() {
        bail!(
            "quarantine resolve: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Silver passes the transaction without the quarantined insert: the update and the
    // next transaction's insert arrive.
    let mut want: Vec<Vec<Value>> = source_rows(&pg, s, "t").await?;
    want.retain(|r| r[0] != 11);
    wait_silver(&d, "t", &want, &mut run, Duration::from_secs(60)).await?;
    let st = silver_status(&d, &format!("{s}.t"))?;
    if st.get("held_by_quarantine").is_some() {
        bail!("nothing holds the watermark once resolved: {st}");
    }
    run.stop()?;
    Ok(())
}

/// Issue 11, defect 10: with `on_slot_lost = "recreate"`, the re-snapshot after the slot
/// was lost re-reads the source, and Silver deletes the rows it did not read again (rows
/// deleted while the slot was gone), once every row of the re-snapshot is applied. The
/// first snapshot deleted nothing; changes after the re-snapshot apply as usual.
#[tokio::test(flavor = "multi_thread")]
async fn a_resnapshot_after_a_lost_slot_deletes_what_the_source_deleted_meanwhile() -> Result<()> {
    let stack = Stack::from_env();
    let toml = "[snapshot]\nmode = \"initial\"\nchunk_rows = 40\n[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n";
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "resnap",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text, n int);
         INSERT INTO {s}.t SELECT g, 'snap', g FROM generate_series(1, 200) g;",
    )
    .toml(toml)
    .partitions(3)
    .build()
    .await?;
    let s = &name;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let n = wait_equal(&pg, &d, s, "t", &mut run).await?;
    assert_eq!(n, 200, "the first snapshot deletes nothing");
    pg.batch_execute(&format!(
        "UPDATE {s}.t SET v = 'streamed' WHERE id <= 50; DELETE FROM {s}.t WHERE id > 190;"
    ))
    .await?;
    wait_equal(&pg, &d, s, "t", &mut run).await?;
    run.stop()?;

    // The slot is lost while the source changes: deletes (in the middle and at both
    // ends), updates and inserts nobody streams.
    pg.execute("SELECT pg_drop_replication_slot($1)", &[&d.slot])
        .await?;
    pg.batch_execute(&format!(
        "DELETE FROM {s}.t WHERE id IN (1, 2, 77, 120, 121, 122, 190);
         UPDATE {s}.t SET v = 'lost', n = -n WHERE id BETWEEN 40 AND 60;
         INSERT INTO {s}.t SELECT g, 'new', g FROM generate_series(300, 320) g;"
    ))
    .await?;
    d.env
        .push(("WAL2DELTA__SOURCE__ON_SLOT_LOST".into(), "recreate".into()));
    let mut run = d.spawn_stage("capture,bronze,silver", "rerun")?;
    let n = wait_equal(&pg, &d, s, "t", &mut run).await?;
    assert_eq!(n, 190 - 7 + 21);
    // Changes after the re-snapshot (including re-inserting a deleted key) apply.
    pg.batch_execute(&format!(
        "INSERT INTO {s}.t VALUES (77, 'back', 77); DELETE FROM {s}.t WHERE id = 300;"
    ))
    .await?;
    wait_equal(&pg, &d, s, "t", &mut run).await?;
    let out = d.command(&[
        "reconcile",
        "--table",
        &format!("{s}.t"),
        "--wait-secs",
        "60",
    ])?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "reconcile: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    run.stop()?;
    Ok(())
}

/// The commit info of every JSON commit of the Delta table at `table`, with its version,
/// in version order (none before the table exists).
fn commit_infos(table: &std::path::Path) -> Result<Vec<(i64, Value)>> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(table.join("_delta_log")) else {
        return Ok(out);
    };
    for entry in dir {
        let path = entry?.path();
        let Some(version) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.parse::<i64>().ok())
        else {
            continue;
        };
        for line in std::fs::read_to_string(&path)?.lines() {
            let v: Value = serde_json::from_str(line)?;
            if v.get("commitInfo").is_some() {
                out.push((version, v["commitInfo"].clone()));
            }
        }
    }
    out.sort_by_key(|(v, _)| *v);
    Ok(out)
}

/// The commits of the Delta table at `table` whose commit info names a partial source
/// transaction (`wal2delta.partial_transaction`): (version, the transaction's LSN).
fn partial_commits(table: &std::path::Path) -> Result<Vec<(i64, i64)>> {
    Ok(commit_infos(table)?
        .into_iter()
        .filter_map(|(v, info)| Some((v, info["wal2delta.partial_transaction"].as_i64()?)))
        .collect())
}

/// The Silver versions of input `input` that the commits of the Gold table at `gold`
/// record (`wal2delta.gold`).
fn gold_recorded(gold: &std::path::Path, input: &str) -> Result<Vec<i64>> {
    Ok(commit_infos(gold)?
        .into_iter()
        .filter_map(|(_, info)| info["wal2delta.gold"]["inputs"][input].as_i64())
        .collect())
}

/// Issue 15: a transaction over `[silver] max_atomic_transaction_rows` is applied in
/// pieces of the read window (memory stays bounded by the window, not the transaction),
/// each piece's commit marked as partial; a SIGKILL between pieces loses and doubles
/// nothing; the watermark passes the transaction after its last piece, so the
/// transactions behind it follow. The transaction inserts, updates, deletes and
/// re-inserts keys, on three partitions.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_over_the_atomic_limit_is_applied_in_pieces_and_survives_a_kill() -> Result<()>
{
    let stack = Stack::from_env();
    let toml = "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n\
                [silver]\ninterval_ms = 300\nmax_rows_per_partition = 40\nmax_atomic_transaction_rows = 300\n";
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "pieces",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text, n int);",
    )
    .toml(toml)
    .partitions(3)
    .build()
    .await?;
    let s = &name;
    // A Gold model over the table (issue 38, defect 5): it never reflects a Silver
    // version that holds part of the transaction.
    let models = d.lake().join("../models");
    std::fs::create_dir_all(&models)?;
    std::fs::write(
        models.join("totals.sql"),
        format!("SELECT count(*) AS row_count, sum(n) AS n FROM {s}.t"),
    )?;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    d.env
        .push(("WAL2DELTA__GOLD__INTERVAL_MS".into(), "200".into()));
    let mut feed = d.spawn_stage("capture,bronze", "feed")?;
    let mut silver = d.spawn_stage("silver", "silver")?;
    let mut gold = d.spawn_stage("gold", "gold")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.t SELECT g, 'v' || g, g FROM generate_series(1, 30) g;"
    ))
    .await?;
    wait_equal(&pg, &d, s, "t", &mut silver).await?;

    // About 3,000 changes in one transaction: far over the limit of 300, and 25 windows
    // of 40 offsets on each of the 3 partitions.
    pg.batch_execute(&format!(
        "BEGIN;
         UPDATE {s}.t SET n = n + 1;
         INSERT INTO {s}.t SELECT g, 'w' || g, g FROM generate_series(31, 2400) g;
         DELETE FROM {s}.t WHERE id % 7 = 0;
         INSERT INTO {s}.t SELECT g, 'again' || g, -g FROM generate_series(7, 700, 7) g;
         UPDATE {s}.t SET v = 'last' WHERE id % 5 = 0;
         COMMIT;"
    ))
    .await?;
    let silver_path = d.silver("t");
    let start = Instant::now();
    while partial_commits(&silver_path)?.len() < 3 {
        silver.assert_running()?;
        feed.assert_running()?;
        if start.elapsed() > Duration::from_secs(120) {
            bail!(
                "Silver committed no pieces of the large transaction; log: {}",
                silver.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Partly applied: the source's final rows are not all in Silver yet.
    let want = source_rows(&pg, s, "t").await?;
    let have = duckdb(&format!(
        "SELECT id, v, n FROM {} ORDER BY id",
        scan(&silver_path)
    ))?;
    assert_ne!(
        have, want,
        "the transaction was applied whole, not in pieces"
    );
    let status = silver_status(&d, &format!("{s}.t"))?;
    assert!(
        status["partial_transaction_lsn"].is_string(),
        "status names the transaction applied in pieces: {status}"
    );
    let first_log = silver.log_text();
    assert!(
        first_log.contains("applying it in pieces"),
        "the stage says it applies the transaction in pieces: {first_log}"
    );
    silver.kill9();
    let mut silver = d.spawn_stage("silver", "silver-2")?;
    pg.batch_execute(&format!("INSERT INTO {s}.t VALUES (5000, 'after', 1);"))
        .await?;
    let rows = wait_equal(&pg, &d, s, "t", &mut silver).await?;
    assert_eq!(rows, 2400 - 2400 / 7 + 700 / 7 + 1);

    let partial: Vec<i64> = partial_commits(&silver_path)?
        .into_iter()
        .map(|(_, lsn)| lsn)
        .collect();
    assert!(
        partial.len() >= 5 && partial.iter().all(|l| *l == partial[0]),
        "pieces of one transaction, each marked: {partial:?}"
    );
    let log = silver.log_text();
    assert!(
        log.contains("the last piece"),
        "the restarted stage resumes the pieces and says when the last is applied: {log}"
    );
    let status = silver_status(&d, &format!("{s}.t"))?;
    assert!(
        status.get("partial_transaction_lsn").is_none(),
        "no transaction is partial once its last piece is applied: {status}"
    );

    // Gold caught up with the whole transaction, and no Gold version reflects a piece.
    let gold_path = d.lake().join("gold/totals");
    let start = Instant::now();
    loop {
        gold.assert_running()?;
        let got =
            duckdb(&format!("SELECT row_count FROM {}", scan(&gold_path))).unwrap_or_default();
        if got.first().and_then(|r| r[0].as_i64()) == Some(rows as i64) {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "Gold never reflected the whole transaction: {got:?} {}",
            gold.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pieces: std::collections::BTreeSet<i64> = partial_commits(&silver_path)?
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    let recorded = gold_recorded(&gold_path, &format!("{s}.t"))?;
    assert!(
        recorded.len() >= 2 && recorded.iter().all(|v| !pieces.contains(v)),
        "Gold recorded Silver versions {recorded:?}, pieces were {pieces:?}"
    );
    gold.stop()?;
    silver.stop()?;
    feed.stop()?;
    Ok(())
}
