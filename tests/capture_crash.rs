//! Crash safety (promise 1): capture is SIGKILLed at random points while a workload of
//! 100,000+ changes runs; afterwards every committed change is in Kafka, and at every kill
//! the slot had not been confirmed past anything Kafka did not hold.
//!
//! Why the final check also proves "the slot never got ahead": a restarted capture streams
//! only transactions that end after the slot's confirmed position. A transaction the slot
//! had been confirmed past without Kafka holding it would never be sent again and would be
//! missing at the end.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Result};
use apache_avro::types::Value;
use rand::Rng;
use wal2delta_model::Lsn;
use wal2delta_tests::kafka::{field, long, read_topic_to_end, AvroDecoder};
use wal2delta_tests::{slot_confirmed, Scenario, Stack, World};

const TARGET_CHANGES: usize = 100_000;

/// (id, v) of every event's after image, and the number of events.
/// What a topic holds: (id, v) of every after image, the event count, the partitions used.
struct InKafka {
    changes: HashSet<(i64, i64)>,
    events: usize,
    partitions: usize,
}

fn kafka_changes(stack: &Stack, topic: &str) -> Result<InKafka> {
    // Everything in the topic, every partition to its end: an idle timeout could stop
    // before a slow partition's first fetch on a loaded machine.
    let recs = read_topic_to_end(&stack.brokers, topic)?;
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut set = HashSet::new();
    for r in &recs {
        let v = dec.decode(&r.payload)?;
        let after = field(&v, "after").cloned().unwrap_or(Value::Null);
        if let (Some(id), Some(val)) = (long(field(&after, "id")), long(field(&after, "v"))) {
            set.insert((id, val));
        }
    }
    let partitions = recs
        .iter()
        .map(|r| r.partition)
        .collect::<HashSet<_>>()
        .len();
    Ok(InKafka {
        changes: set,
        events: recs.len(),
        partitions,
    })
}

/// A committed transaction of the workload.
struct Tx {
    /// An LSN at or after the transaction's commit record ended.
    committed_by: Lsn,
    changes: Vec<(i64, i64)>,
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_at_random_points_loses_nothing() -> Result<()> {
    let stack = Stack::from_env();
    // Three partitions: acknowledgements of one transaction arrive out of order.
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "crash",
        "CREATE TABLE {s}.t (id bigint PRIMARY KEY, v bigint NOT NULL, pad text);",
    )
    .toml("[capture]\nmax_in_flight = 20000\n")
    .partitions(3)
    .build()
    .await?;
    d.start()?;

    // The workload: transactions of 1..2000 changes, inserts and updates, each change a
    // unique (id, v). After each COMMIT it records the changes and an LSN at or after the
    // commit's end (pg_current_wal_insert_lsn read after COMMIT returned).
    let committed: Arc<Mutex<Vec<Tx>>> = Arc::default();
    let log = committed.clone();
    let workload_dsn = stack.dsn.clone();
    let table = format!("{name}.t");
    let workload = tokio::spawn(async move {
        let pg = wal2delta_tests::connect(&workload_dsn).await?;
        let mut total = 0usize;
        let mut next_id: i64 = 1;
        let mut versions: HashMap<i64, i64> = HashMap::new();
        while total < TARGET_CHANGES {
            let (size, updates) = {
                let mut rng = rand::rng();
                let size: i64 = rng.random_range(1..=2000);
                let upd: i64 = if next_id > 100 {
                    rng.random_range(0..=size.min(200))
                } else {
                    0
                };
                (size, upd)
            };
            pg.batch_execute("BEGIN").await?;
            let first = next_id;
            pg.execute(
                &format!("INSERT INTO {table} SELECT g, 0, repeat('x', 40) FROM generate_series($1::bigint, $2::bigint) g"),
                &[&first, &(first + size - 1)],
            )
            .await?;
            let mut changes: Vec<(i64, i64)> = (first..first + size).map(|id| (id, 0)).collect();
            next_id += size;
            let upd_ids: Vec<i64> = {
                let mut rng = rand::rng();
                (0..updates)
                    .map(|_| rng.random_range(1..first.max(2)))
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect()
            };
            if !upd_ids.is_empty() {
                pg.execute(
                    &format!("UPDATE {table} SET v = v + 1 WHERE id = ANY($1)"),
                    &[&upd_ids],
                )
                .await?;
                for id in upd_ids {
                    let v = versions.entry(id).or_insert(0);
                    *v += 1;
                    changes.push((id, *v));
                }
            }
            pg.batch_execute("COMMIT").await?;
            let after: String = pg
                .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
                .await?
                .get(0);
            total += changes.len();
            log.lock().unwrap().push(Tx {
                committed_by: after.parse()?,
                changes,
            });
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        anyhow::Ok(())
    });

    let topic = format!("{name}.{name}.t");
    let mut checked_at_kills = 0usize;
    for kill in 0..3 {
        // Each kill comes after the daemon has confirmed something since it (re)started,
        // so every kill checks real progress even on a loaded machine, at a random point.
        let before = slot_confirmed(&pg, &d.slot).await?.unwrap_or_default();
        let started = std::time::Instant::now();
        while slot_confirmed(&pg, &d.slot).await?.unwrap_or_default() <= before {
            d.assert_running()?;
            ensure!(
                started.elapsed() < Duration::from_secs(180),
                "the slot did not move for 180 s after start: {}",
                d.last_log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let wait_ms = rand::rng().random_range(0..2500);
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        d.assert_running()?;
        d.kill9();
        // The slot is inactive now. Every transaction that certainly ended before its
        // confirmed position must be in Kafka in full.
        let confirmed = slot_confirmed(&pg, &d.slot).await?.unwrap_or_default();
        let InKafka {
            changes: in_kafka,
            events: n,
            ..
        } = kafka_changes(&stack, &topic)?;
        let covered: Vec<(i64, i64)> = committed
            .lock()
            .unwrap()
            .iter()
            .filter(|t| t.committed_by <= confirmed)
            .flat_map(|t| t.changes.iter().copied())
            .collect();
        let missing = covered.iter().filter(|c| !in_kafka.contains(c)).count();
        eprintln!("kill {kill}: slot confirmed {confirmed}, {n} events in Kafka, {} changes certainly before it, {missing} missing", covered.len());
        ensure!(
            missing == 0,
            "slot confirmed {confirmed} past {missing} changes Kafka does not hold"
        );
        checked_at_kills += covered.len();
        d.start()?;
    }
    ensure!(
        checked_at_kills > 0,
        "the kills happened before any progress; the check proved nothing"
    );

    workload.await??;
    let expected: Vec<(i64, i64)> = committed
        .lock()
        .unwrap()
        .iter()
        .flat_map(|t| t.changes.iter().copied())
        .collect();
    ensure!(expected.len() >= TARGET_CHANGES);
    d.wait_caught_up(&pg, Duration::from_secs(600)).await?;
    d.assert_running()?;
    let InKafka {
        changes: in_kafka,
        events: n,
        partitions,
    } = kafka_changes(&stack, &topic)?;
    ensure!(
        partitions == 3,
        "events should spread over the topic's 3 partitions, saw {partitions}"
    );
    let missing: Vec<&(i64, i64)> = expected.iter().filter(|c| !in_kafka.contains(c)).collect();
    eprintln!(
        "{} committed changes, {} events in Kafka ({} duplicates from restarts), {} missing",
        expected.len(),
        n,
        n.saturating_sub(expected.len()),
        missing.len()
    );
    ensure!(
        missing.is_empty(),
        "{} committed changes missing from Kafka, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    d.stop()?;
    Ok(())
}
