//! Fairness between tables in the bronze stage (docs/bronze.md, "Fairness between
//! tables"): a table with a few events is committed promptly while another table's deep
//! backlog is being worked off. Found by the chaos suite (seed 20261201, docs/reliability.md):
//! small tables had no Bronze commit for 500-570 s behind a backlog of `bulk`, because
//! librdkafka's prefetched backlog sat ahead of their events in one consumer queue.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use wal2delta_tests::lake::{duckdb_i64, scan};
use wal2delta_tests::{Scenario, Stack, World};

/// Rows of the backlog on `big`.
const BACKLOG: i64 = 200_000;
/// Rows of `big` in Bronze before the small table's events are sent.
const STEADY: i64 = 10_000;
/// How long the small table's events may take to reach Bronze while `big` is behind:
/// well above the bound docs/bronze.md gives (one round of the consumer's quotas, the
/// queue to the stage, one micro-batch and its commit) on a loaded debug build, and well
/// below the time the backlog takes.
const BOUND: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_table_is_committed_while_another_has_a_deep_backlog() -> Result<()> {
    let stack = Stack::from_env();
    // Small micro-batches: the backlog takes many commits to work off, as in the chaos
    // run where the machine was slow.
    let tables = "CREATE TABLE {s}.big (id bigint PRIMARY KEY, v int);
         CREATE TABLE {s}.small (id int PRIMARY KEY, v text);";
    let World { name, pg, d, .. } = Scenario::new(&stack, "fair", tables)
        .toml("[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 500\nmax_batch_events = 2000\ntopic_refresh_ms = 500\n")
        .partitions(3)
        .build()
        .await?;
    let mut capture = d.spawn_stage("capture", "capture")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.small VALUES (0, 'first');
         INSERT INTO {name}.big SELECT g, g % 1000 FROM generate_series(1, {BACKLOG}) g;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(600)).await?;
    capture.assert_running()?;

    let mut bronze = d.spawn_stage("bronze", "bronze")?;
    let big = format!("SELECT count(*) FROM {}", scan(&d.bronze("big")));
    let small = format!("SELECT count(*) FROM {}", scan(&d.bronze("small")));
    // Wait until the backlog is being worked off steadily (the consumer has prefetched
    // it, the tables exist).
    let start = Instant::now();
    loop {
        bronze.assert_running()?;
        if duckdb_i64(&big).unwrap_or(0) >= STEADY {
            break;
        }
        if start.elapsed() > Duration::from_secs(180) {
            bail!(
                "Bronze stored fewer than {STEADY} rows of big in 180 s: {}",
                bronze.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    pg.batch_execute(&format!(
        "INSERT INTO {name}.small SELECT g, 'v' || g FROM generate_series(1, 5) g"
    ))
    .await?;
    let sent = Instant::now();
    let big_when_sent = duckdb_i64(&big).unwrap_or(0);
    ensure!(
        big_when_sent < BACKLOG / 2,
        "the backlog was mostly stored ({big_when_sent} of {BACKLOG}) before the small table's events were sent; the test needs a deeper backlog"
    );
    loop {
        bronze.assert_running()?;
        let n = duckdb_i64(&small).unwrap_or(0);
        if n >= 6 {
            break;
        }
        if sent.elapsed() > BOUND {
            let big_now = duckdb_i64(&big).unwrap_or(0);
            bail!(
                "small has {n} of 6 events in Bronze {:?} after its last 5 were sent; big went from {big_when_sent} to {big_now} of {BACKLOG} meanwhile (the small table starves behind the backlog)",
                sent.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let latency = sent.elapsed();
    let big_then = duckdb_i64(&big).unwrap_or(0);
    eprintln!(
        "small's events in Bronze after {latency:?}; big had {big_when_sent} then {big_then} of {BACKLOG} rows"
    );
    // What Bronze holds so far: each partition's offsets once, from 0 with no hole (the
    // partition queues deliver each partition in order; a reordering would skip offsets).
    bronze.stop()?;
    for t in ["big", "small"] {
        let gaps = duckdb_i64(&format!(
            "SELECT count(*) FROM (SELECT kafka_partition p, count(*) n, count(DISTINCT kafka_offset) d, min(kafka_offset) lo, max(kafka_offset) hi FROM {} GROUP BY 1) WHERE n <> d OR lo <> 0 OR hi + 1 <> n",
            scan(&d.bronze(t))
        ))?;
        ensure!(
            gaps == 0,
            "{t}: {gaps} partitions with duplicated or missing offsets"
        );
    }
    capture.stop()?;
    Ok(())
}
