//! Bronze → Silver on the real stack: a randomised workload (inserts, updates, deletes,
//! key updates with and without the TOASTed column, a TRUNCATE, TOAST-unchanged updates, snapshot rows) ends with Silver equal
//! to the source, read by DuckDB; re-delivered old events, in reverse order, change
//! nothing and bring no deleted row back.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::Value;
use tokio_postgres::Client;
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::kafka::read_topic_to_end;
use wal2delta_tests::lake::{duckdb, duckdb_i64, scan};
use wal2delta_tests::{Scenario, Stack, World};

const TOML: &str = "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n";

/// The source rows as JSON values: id, owner, balance, md5(doc).
async fn source_rows(pg: &Client, schema: &str) -> Result<Vec<Vec<Value>>> {
    let rows = pg
        .query(
            &format!("SELECT id, owner, balance, md5(doc) FROM {schema}.acct ORDER BY id"),
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
                r.get::<_, Option<i64>>(2).map_or(Value::Null, Value::from),
                r.get::<_, Option<String>>(3)
                    .map_or(Value::Null, Value::from),
            ]
        })
        .collect())
}

fn silver_rows(path: &std::path::Path) -> Result<Vec<Vec<Value>>> {
    duckdb(&format!(
        "SELECT id, owner, balance, md5(doc) FROM {} ORDER BY id",
        scan(path)
    ))
}

/// Waits until Silver equals the source.
async fn wait_equal(
    pg: &Client,
    schema: &str,
    path: &std::path::Path,
    run: &mut StageProcess,
    timeout: Duration,
) -> Result<usize> {
    let want = source_rows(pg, schema).await?;
    let start = Instant::now();
    let mut last = Vec::new();
    while start.elapsed() < timeout {
        run.assert_running()?;
        if let Ok(have) = silver_rows(path) {
            if have == want {
                return Ok(want.len());
            }
            last = have;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let diff: Vec<_> = want.iter().filter(|r| !last.contains(r)).take(5).collect();
    let extra: Vec<_> = last.iter().filter(|r| !want.contains(r)).take(5).collect();
    bail!(
        "Silver ({} rows) never equalled the source ({} rows); missing/different {diff:?}, extra {extra:?}; log: {}",
        last.len(),
        want.len(),
        run.log_text()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn silver_equals_the_source_and_ignores_redelivered_changes() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(&stack, "slv", "CREATE TABLE {s}.acct (id int PRIMARY KEY, owner text, balance bigint, doc text);
         ALTER TABLE {s}.acct ALTER COLUMN doc SET STORAGE EXTERNAL;
         INSERT INTO {s}.acct SELECT g, 'o' || g, g * 10, repeat(md5(g::text), 100) FROM generate_series(1, 300) g;")
        .toml(TOML)
        .partitions(3)
        .build()
        .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;

    // Randomised transactions over a small key space, so changes collide.
    let mut rng = StdRng::seed_from_u64(7);
    let mut next_id = 1_000;
    for round in 0..120 {
        let mut sql = String::from("BEGIN;");
        for _ in 0..rng.random_range(1..6) {
            let id = rng.random_range(1..next_id.min(1_400));
            let stmt = match rng.random_range(0..100) {
                0..=29 => {
                    next_id += 1;
                    format!("INSERT INTO {name}.acct VALUES ({next_id}, 'n{next_id}', {id}, repeat(md5('{next_id}'), 100)) ON CONFLICT DO NOTHING;")
                }
                // Leaves the TOASTed doc unchanged.
                30..=59 => format!("UPDATE {name}.acct SET balance = balance + {id} WHERE id = {id};"),
                60..=69 => format!("UPDATE {name}.acct SET doc = repeat(md5('{round}'), 120), owner = NULL WHERE id = {id};"),
                70..=84 => format!("DELETE FROM {name}.acct WHERE id = {id};"),
                // A key update (the old key is deleted), half of them leaving the TOASTed
                // doc unchanged: the new key's row takes it from the old key.
                85..=92 => {
                    next_id += 1;
                    format!("UPDATE {name}.acct SET id = {next_id} WHERE id = {id};")
                }
                _ => {
                    next_id += 1;
                    format!("UPDATE {name}.acct SET id = {next_id}, doc = repeat(md5('{next_id}'), 100) WHERE id = {id};")
                }
            };
            sql.push_str(&stmt);
        }
        if round == 60 {
            sql.push_str(&format!(
                "TRUNCATE {name}.acct; INSERT INTO {name}.acct SELECT g, 't' || g, g, repeat(md5(g::text), 90) FROM generate_series(1, 200) g;"
            ));
        }
        sql.push_str("COMMIT;");
        pg.batch_execute(&sql).await?;
    }
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    let silver = d.silver("acct");
    let n = wait_equal(&pg, &name, &silver, &mut run, Duration::from_secs(180)).await?;
    assert!(n > 100, "the workload left {n} rows");

    // Key updates leaving the TOASTed doc unchanged, on rows only Silver holds now: the
    // new key's doc comes from Silver's row under the old key.
    pg.batch_execute(&format!(
        "UPDATE {name}.acct SET id = id + 100000 WHERE id IN (SELECT id FROM {name}.acct ORDER BY id LIMIT 20);"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    wait_equal(&pg, &name, &silver, &mut run, Duration::from_secs(60)).await?;

    // Re-deliver 400 old events, newest first, straight to the table topic: Bronze stores
    // them (they are new Kafka messages), Silver must not change.
    let topic = format!("{name}.{name}.acct");
    // Change events only: a tombstone is not a change, Bronze stores no row for it.
    let old: Vec<_> = read_topic_to_end(&stack.brokers, &topic)?
        .into_iter()
        .filter(|r| !r.tombstone)
        .collect();
    let bronze = d.bronze("acct");
    let before = duckdb_i64(&format!("SELECT count(*) FROM {}", scan(&bronze)))?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .create()?;
    let mut picked: Vec<_> = (0..400)
        .map(|_| &old[rng.random_range(0..old.len())])
        .collect();
    picked.sort_by_key(|r| std::cmp::Reverse((r.partition, r.offset)));
    for r in &picked {
        let mut rec = BaseRecord::to(&topic)
            .partition(r.partition)
            .payload(&r.payload);
        if let Some(k) = &r.key {
            rec = rec.key(k);
        }
        producer.send(rec).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    let want = before + picked.len() as i64;
    let start = Instant::now();
    while duckdb_i64(&format!("SELECT count(*) FROM {}", scan(&bronze)))? < want {
        run.assert_running()?;
        if start.elapsed() > Duration::from_secs(120) {
            bail!("Bronze never stored the re-delivered events");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Several Silver rounds after Bronze has them.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let have = silver_rows(&silver)?;
    let src = source_rows(&pg, &name).await?;
    assert_eq!(
        have.len(),
        src.len(),
        "re-delivered changes altered Silver's row count"
    );
    assert!(have == src, "re-delivered changes altered Silver's rows");

    run.stop()?;
    Ok(())
}

/// A primary-key change reaches Kafka as Debezium emits it (issue 11, defect 15): a delete
/// of the old key, a tombstone of the old key, a create of the new key naming the old one
/// in the `__debezium.oldkey` header; every delete is followed by a tombstone; a table
/// without a primary key gets none. Bronze stores no row and no quarantine record for a
/// tombstone and moves its offsets past them exactly once; Silver ends with the old keys
/// gone and the new ones holding the whole row, the unchanged TOASTed doc included
/// (taken from Silver's row and from the same batch); reconcile says equal.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_change_is_a_delete_a_tombstone_and_a_create_naming_the_old_key() -> Result<()> {
    use wal2delta_tests::kafka::{field, long, string, AvroDecoder};
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "dbz",
        "CREATE TABLE {s}.acct (id int PRIMARY KEY, owner text, balance bigint, doc text);
         ALTER TABLE {s}.acct ALTER COLUMN doc SET STORAGE EXTERNAL;
         CREATE TABLE {s}.nokey (a int, b text);
         ALTER TABLE {s}.nokey REPLICA IDENTITY FULL;",
    )
    .toml(TOML)
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let silver = d.silver("acct");
    pg.batch_execute(&format!(
        "INSERT INTO {name}.acct VALUES (1, 'a', 10, repeat(md5('1'), 200)), (3, 'c', 30, 'small');"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    wait_equal(&pg, &name, &silver, &mut run, Duration::from_secs(60)).await?;
    // 2 moves in the transaction that inserted it (its doc is in the same Silver round);
    // 1 moves alone (its doc is only in Silver, under the old key). Both leave doc alone.
    pg.batch_execute(&format!(
        "BEGIN; INSERT INTO {name}.acct VALUES (2, 'b', 20, repeat(md5('2'), 200));
                UPDATE {name}.acct SET id = 20 WHERE id = 2; COMMIT;
         UPDATE {name}.acct SET id = 10, balance = 11 WHERE id = 1;
         DELETE FROM {name}.acct WHERE id = 3;
         INSERT INTO {name}.nokey VALUES (1, 'x'); UPDATE {name}.nokey SET a = 2; DELETE FROM {name}.nokey;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;

    // The topic: d(old), tombstone(old), c(new, header = old key), and a tombstone after
    // the plain delete.
    let topic = format!("{name}.{name}.acct");
    let recs = read_topic_to_end(&stack.brokers, &topic)?;
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut shape = Vec::new();
    for r in &recs {
        if r.tombstone {
            shape.push(("T".to_owned(), None, Vec::new(), None));
            continue;
        }
        let v = dec.decode(&r.payload)?;
        let key = r.key.as_deref().map(|k| dec.decode(k)).transpose()?;
        let toast = match field(&v, "unchanged_toast_columns") {
            Some(apache_avro::types::Value::Array(a)) => {
                a.iter().filter_map(|x| string(Some(x))).collect()
            }
            _ => vec![],
        };
        let before_id = field(&v, "before").and_then(|b| long(field(b, "id")));
        shape.push((
            string(field(&v, "op")).unwrap_or_default(),
            key.and_then(|k| long(field(&k, "id"))),
            toast,
            before_id,
        ));
    }
    let ops: Vec<&str> = shape.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        ops,
        ["c", "c", "c", "d", "T", "c", "d", "T", "c", "d", "T"],
        "events on the topic: {shape:?}"
    );
    let ids: Vec<Option<i64>> = shape.iter().map(|s| s.1).collect();
    assert_eq!(
        ids,
        [
            Some(1),
            Some(3),
            Some(2),
            Some(2),
            None,
            Some(20),
            Some(1),
            None,
            Some(10),
            Some(3),
            None
        ]
    );
    // Each tombstone has the key of the delete before it and a null value; each create
    // after a delete names the deleted key in the header and in `before`, and marks the
    // TOASTed doc unchanged.
    for i in [4, 7, 10] {
        assert_eq!(
            recs[i].key,
            recs[i - 1].key,
            "tombstone {i} keys its delete"
        );
    }
    for (i, old) in [(5, 2), (8, 1)] {
        let header: Vec<&Vec<u8>> = recs[i]
            .headers
            .iter()
            .filter(|(k, _)| k == "__debezium.oldkey")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            header,
            vec![recs[i - 2].key.as_ref().expect("delete key")],
            "create {i} names the old key"
        );
        assert_eq!(
            shape[i].3,
            Some(old),
            "create {i}: before names the old key"
        );
        assert_eq!(
            shape[i].2,
            vec!["doc".to_string()],
            "create {i}: doc unchanged"
        );
    }
    assert!(recs.iter().all(|r| r.tombstone
        || r.headers.is_empty()
        || r.headers.iter().all(|(k, _)| k == "__debezium.oldkey")));
    // No primary key: no tombstone, the update stays an update.
    let nokey = read_topic_to_end(&stack.brokers, &format!("{name}.{name}.nokey"))?;
    assert!(
        nokey.iter().all(|r| !r.tombstone),
        "no tombstones without a key"
    );
    let nokey_ops: Vec<String> = nokey
        .iter()
        .map(|r| {
            dec.decode(&r.payload)
                .map(|v| string(field(&v, "op")).unwrap_or_default())
        })
        .collect::<Result<_>>()?;
    assert_eq!(nokey_ops, ["c", "u", "d"]);

    // Silver: the old keys are gone, the new ones hold the whole row.
    wait_equal(&pg, &name, &silver, &mut run, Duration::from_secs(120)).await?;
    let ids = duckdb(&format!("SELECT id FROM {} ORDER BY id", scan(&silver)))?;
    assert_eq!(ids, vec![vec![Value::from(10)], vec![Value::from(20)]]);

    // Bronze: one row per change event, none for the tombstones, nothing quarantined, and
    // its offsets past the last tombstone (no lag).
    let bronze = scan(&d.bronze("acct"));
    let rows = duckdb(&format!(
        "SELECT kafka_offset, op FROM {bronze} ORDER BY kafka_offset"
    ))?;
    let want: Vec<Vec<Value>> = recs
        .iter()
        .zip(&shape)
        .filter(|(r, _)| !r.tombstone)
        .map(|(r, s)| vec![Value::from(r.offset), Value::from(s.0.clone())])
        .collect();
    assert_eq!(rows, want, "Bronze rows by offset");
    let quarantine = d.lake().join("quarantine/records");
    if quarantine.exists() {
        let n = duckdb_i64(&format!("SELECT count(*) FROM {}", scan(&quarantine)))?;
        assert_eq!(n, 0, "nothing quarantined");
    }
    let start = Instant::now();
    loop {
        let out = d.command(&["status", "--json"])?;
        let doc: Value = serde_json::from_slice(&out.stdout)?;
        let caught_up = doc["stages"]["bronze"]["tables"]
            .as_array()
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t["table"] == format!("{name}.acct") && t["lag_events"] == 0)
            });
        if caught_up {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("Bronze never moved past the tombstones: {doc}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let out = d.command(&[
        "reconcile",
        "--table",
        &format!("{name}.acct"),
        "--json",
        "--wait-secs",
        "120",
    ])?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "reconcile equal: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    run.stop()?;
    Ok(())
}

/// The copy-on-write cost is counted: an update of one row of a 100-row file rewrites
/// that file, copying its 99 other rows, and a round of inserts alone copies nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_merge_counts_the_files_it_rewrites_and_the_rows_it_copies() -> Result<()> {
    use wal2delta_tests::metrics::{free_port, of_table, text};
    let stack = Stack::from_env();
    let port = free_port()?;
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "slvcopy",
        "CREATE TABLE {s}.acct (id int PRIMARY KEY, balance bigint);",
    )
    .toml(TOML)
    .env("WAL2DELTA__METRICS__LISTEN", &format!("127.0.0.1:{port}"))
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let silver = d.silver("acct");
    let rows = |sql: &str| -> Result<i64> {
        if !silver.join("_delta_log").is_dir() {
            return Ok(0);
        }
        duckdb_i64(&format!("{sql} FROM delta_scan('{}')", silver.display()))
    };
    pg.batch_execute(&format!(
        "INSERT INTO {name}.acct SELECT g, g FROM generate_series(1, 100) g"
    ))
    .await?;
    run.wait_for("the 100 rows in Silver", &100, || rows("SELECT count(*)"))
        .await?;
    let table = format!("{name}.acct");
    let counters = |body: &str| {
        (
            of_table(body, "wal2delta_silver_files_rewritten_total", &table),
            of_table(body, "wal2delta_silver_rows_copied_total", &table),
        )
    };
    // (The counters move right after the Silver commit the rows were read from.)
    let settled = |want: (Option<f64>, Option<f64>)| async move {
        let mut got = (None, None);
        for _ in 0..40 {
            got = counters(&text(port).await?);
            if got == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::Ok(got)
    };
    let got = settled((Some(0.0), Some(0.0))).await?;
    assert_eq!(got, (Some(0.0), Some(0.0)), "inserts alone");

    pg.batch_execute(&format!(
        "UPDATE {name}.acct SET balance = -1 WHERE id = 50"
    ))
    .await?;
    run.wait_for("the update in Silver", &-1, || rows("SELECT min(balance)"))
        .await?;
    let got = settled((Some(1.0), Some(99.0))).await?;
    assert_eq!(got, (Some(1.0), Some(99.0)), "{}", run.log_text());
    Ok(())
}
