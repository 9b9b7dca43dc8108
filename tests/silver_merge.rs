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
use wal2delta_tests::{cleanup, scenario, Stack};

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
    let (name, pg, d) = scenario(
        &stack,
        "slv",
        "CREATE TABLE {s}.acct (id int PRIMARY KEY, owner text, balance bigint, doc text);
         ALTER TABLE {s}.acct ALTER COLUMN doc SET STORAGE EXTERNAL;
         INSERT INTO {s}.acct SELECT g, 'o' || g, g * 10, repeat(md5(g::text), 100) FROM generate_series(1, 300) g;",
        TOML,
        3,
    )
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
    let old = read_topic_to_end(&stack.brokers, &topic)?;
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
    cleanup(&pg, &name, &name).await;
    Ok(())
}
