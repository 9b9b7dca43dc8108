//! Schema evolution mid-stream, partitioned tables and TRUNCATE ordering.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{ensure, Result};
use apache_avro::types::Value;
use wal2delta_tests::kafka::{
    dead_letters, field, long, read_topic, schema_versions, AvroDecoder, Record,
};
use wal2delta_tests::{streamed_transactions, Scenario, Stack, World};

fn decoded(stack: &Stack, topic: &str, expect: usize) -> Result<Vec<(Record, Value)>> {
    let recs = read_topic(&stack.brokers, topic, Some(expect), Duration::from_secs(20))?;
    let mut dec = AvroDecoder::new(&stack.registry);
    recs.into_iter()
        .map(|r| dec.decode(&r.payload).map(|v| (r, v)))
        .collect()
}

fn op(v: &Value) -> String {
    match field(v, "op") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn drop_widen_rename_and_add_columns_mid_stream() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "evo",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, a int, b text, c int);",
    )
    .build()
    .await?;
    d.start()?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t VALUES (1, 1, 'b', 1);
         ALTER TABLE {name}.t DROP COLUMN b;
         INSERT INTO {name}.t VALUES (2, 2, 2);
         ALTER TABLE {name}.t ALTER COLUMN a TYPE bigint;
         INSERT INTO {name}.t VALUES (3, 3000000000, 3);
         ALTER TABLE {name}.t RENAME COLUMN c TO renamed;
         INSERT INTO {name}.t VALUES (4, 4, 4);
         ALTER TABLE {name}.t ADD COLUMN e text NOT NULL DEFAULT 'x';
         INSERT INTO {name}.t VALUES (5, 5, 5, 'y');"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    d.assert_running()?;
    let events = decoded(&stack, &format!("{name}.{name}.t"), 5)?;
    ensure!(
        events.len() == 5,
        "every change is published under a compatible schema, got {}",
        events.len()
    );
    let after: Vec<Value> = events
        .iter()
        .map(|(_, v)| field(v, "after").cloned().unwrap_or(Value::Null))
        .collect();
    ensure!(
        field(&after[0], "b").is_some() && field(&after[1], "b").is_none(),
        "dropped column gone from the schema"
    );
    ensure!(
        matches!(field(&after[2], "a"), Some(Value::Long(3_000_000_000))),
        "widened to long: {:?}",
        field(&after[2], "a")
    );
    ensure!(
        long(field(&after[3], "renamed")) == Some(4) && field(&after[3], "c").is_none(),
        "renamed column"
    );
    ensure!(
        matches!(field(&after[4], "e"), Some(Value::String(s)) if s == "y"),
        "added column"
    );
    let versions = schema_versions(&stack.registry, &format!("{name}.{name}.t-value")).await?;
    ensure!(
        versions == vec![1, 2, 3, 4, 5],
        "one schema version per shape: {versions:?}"
    );
    ensure!(
        dead_letters(&stack.brokers, &name)?.is_empty(),
        "nothing went to the DLQ"
    );
    d.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_are_published_under_the_root_including_new_ones() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name,
        pg,
        mut d,
        setup,
    } = Scenario::new(&stack, "part", "CREATE TABLE {s}.orders (id int, region text, amount int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE {s}.orders_eu PARTITION OF {s}.orders FOR VALUES IN ('eu');")
        .build()
        .await?;
    ensure!(
        setup.contains(&format!("{name}.orders")) && !setup.contains("orders_eu"),
        "only the root is listed: {setup}"
    );
    d.start()?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.orders VALUES (1, 'eu', 10);
         CREATE TABLE {name}.orders_us PARTITION OF {name}.orders FOR VALUES IN ('us');
         INSERT INTO {name}.orders VALUES (2, 'us', 20);
         UPDATE {name}.orders SET amount = 21 WHERE id = 2;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let events = decoded(&stack, &format!("{name}.{name}.orders"), 3)?;
    let ops: Vec<String> = events.iter().map(|(_, v)| op(v)).collect();
    ensure!(ops == ["c", "c", "u"], "{ops:?}");
    let ids: Vec<Option<i64>> = events
        .iter()
        .map(|(_, v)| {
            long(field(
                &field(v, "after").cloned().unwrap_or(Value::Null),
                "id",
            ))
        })
        .collect();
    ensure!(ids == [Some(1), Some(2), Some(2)], "{ids:?}");
    for p in ["orders_eu", "orders_us"] {
        ensure!(
            read_topic(
                &stack.brokers,
                &format!("{name}.{name}.{p}"),
                None,
                Duration::from_secs(1)
            )?
            .is_empty(),
            "no topic per partition"
        );
    }
    d.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn truncate_is_ordered_after_the_rows_in_every_partition() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(&stack, "trunc", "CREATE TABLE {s}.t (id int PRIMARY KEY);")
        .partitions(3)
        .build()
        .await?;
    d.start()?;
    pg.batch_execute(&format!("INSERT INTO {name}.t SELECT generate_series(1, 60); TRUNCATE {name}.t; INSERT INTO {name}.t VALUES (1000);")).await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let events = decoded(&stack, &format!("{name}.{name}.t"), 64)?;
    ensure!(
        events.len() == 64,
        "60 inserts, 3 truncates (one per partition), 1 insert: got {}",
        events.len()
    );
    let mut per_partition: HashMap<i32, Vec<String>> = HashMap::new();
    for (r, v) in &events {
        per_partition.entry(r.partition).or_default().push(op(v));
    }
    ensure!(per_partition.len() == 3, "rows spread over 3 partitions");
    for (p, ops) in &per_partition {
        let t = ops
            .iter()
            .position(|o| o == "t")
            .ok_or_else(|| anyhow::anyhow!("no truncate in partition {p}"))?;
        ensure!(
            ops.iter().filter(|o| *o == "t").count() == 1,
            "one truncate in partition {p}"
        );
        ensure!(
            ops[..t].iter().all(|o| o == "c"),
            "rows before the truncate in partition {p}"
        );
    }
    d.stop()?;
    Ok(())
}

/// Finds every JSON object in `v` that has the key `key`.
fn objects_with<'a>(v: &'a serde_json::Value, key: &str, out: &mut Vec<&'a serde_json::Value>) {
    match v {
        serde_json::Value::Object(m) => {
            if m.contains_key(key) {
                out.push(v);
            }
            m.values().for_each(|x| objects_with(x, key, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| objects_with(x, key, out)),
        _ => {}
    }
}

/// Defect 10 (issue 11): a user type created by a large transaction that PostgreSQL
/// streams while in progress. Its Relation message arrives before the commit, when the
/// catalog connection cannot see the type yet; the column must be published with its real
/// type once the transaction commits, and stay so after a restart. The registry holds no
/// shape that was never committed: an earlier version registered the in-progress shape
/// (the column as text, and the columns of a streamed transaction that rolled back).
#[tokio::test(flavor = "multi_thread")]
async fn a_type_created_inside_a_streamed_transaction_is_published_with_its_real_type() -> Result<()>
{
    let stack = Stack::from_env();
    // The smallest decoding memory makes the server stream the transactions below, and
    // each stays open for a while, so they are streamed while still in progress.
    let sep = if stack.dsn.contains('?') { '&' } else { '?' };
    let dsn = format!(
        "{}{sep}options=-c%20logical_decoding_work_mem%3D64kB",
        stack.dsn
    );
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "styp",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v int);",
    )
    .env("WAL2DELTA__SOURCE__DSN", &dsn)
    .build()
    .await?;
    d.start()?;
    pg.batch_execute(&format!(
        "BEGIN;
         ALTER TABLE {name}.t ADD COLUMN junk int;
         INSERT INTO {name}.t SELECT g, g, g FROM generate_series(100001, 120000) g;
         SELECT pg_sleep(2);
         ROLLBACK;
         BEGIN;
         CREATE TYPE {name}.mood AS ENUM ('calm', 'busy');
         ALTER TABLE {name}.t ADD COLUMN m {name}.mood;
         INSERT INTO {name}.t SELECT g, g, 'busy' FROM generate_series(1, 20000) g;
         SELECT pg_sleep(2);
         COMMIT;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(300)).await?;
    let streamed = streamed_transactions(&pg, &d.slot).await?;
    ensure!(
        streamed >= 2,
        "both transactions should have been streamed in progress: {streamed}"
    );
    let subject = format!("{name}.{name}.t-value");
    let expected_type = format!("{name}.mood");
    let check = |when: &'static str| {
        let url = format!("{}/subjects/{subject}/versions/latest", stack.registry);
        let expected_type = expected_type.clone();
        async move {
            let reply: serde_json::Value = reqwest::get(url).await?.json().await?;
            let schema: serde_json::Value =
                serde_json::from_str(reply["schema"].as_str().unwrap_or("null"))?;
            let mut typed = Vec::new();
            objects_with(&schema, "pg.type", &mut typed);
            // Column m: named for its type, or (the defect) for an unresolved OID.
            let cols: Vec<&serde_json::Value> = typed
                .into_iter()
                .filter(|o| {
                    o["pg.type"]
                        .as_str()
                        .is_some_and(|t| t.contains("mood") || t.starts_with("oid:"))
                })
                .collect();
            ensure!(
                cols.len() == 1
                    && cols[0]["pg.type"] == serde_json::json!(expected_type)
                    && cols[0]["pg.enum.labels"] == serde_json::json!(["calm", "busy"]),
                "{when}: column m must be the enum {expected_type} with its labels: {cols:?}"
            );
            anyhow::Ok(())
        }
    };
    check("after the streamed commit").await?;
    // A restart resolves every type afresh; the column keeps its type.
    d.stop()?;
    d.start()?;
    pg.batch_execute(&format!("INSERT INTO {name}.t VALUES (0, 0, 'calm')"))
        .await?;
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    check("after a restart").await?;
    let events = read_topic(
        &stack.brokers,
        &format!("{name}.{name}.t"),
        Some(20_001),
        Duration::from_secs(60),
    )?;
    ensure!(
        events.len() == 20_001,
        "every row published: {}",
        events.len()
    );
    ensure!(
        dead_letters(&stack.brokers, &name)?.is_empty(),
        "nothing went to the DLQ"
    );
    d.stop()?;
    Ok(())
}
