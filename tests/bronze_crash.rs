//! Exactly once into Bronze (promise 2) under SIGKILL: a 200,000-event run during which
//! the bronze writer is killed at random moments and, deliberately, while a data file is
//! written but not yet committed. Afterwards Bronze holds every Kafka offset exactly once,
//! checked with DuckDB, and every source row.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use rand::Rng;
use wal2delta_tests::lake::{duckdb, duckdb_i64, scan, uncommitted_files};
use wal2delta_tests::{Scenario, Stack, World};

const ROWS: i64 = 200_000;

#[tokio::test(flavor = "multi_thread")]
async fn sigkilled_bronze_writer_stores_every_offset_exactly_once() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, mut d, .. } = Scenario::new(&stack, "brzcrash", "CREATE TABLE {s}.t (id bigint PRIMARY KEY, v bigint);")
        .toml("[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 400\nmax_batch_events = 4000\ntopic_refresh_ms = 500\n\
         consumer = { \"session.timeout.ms\" = \"6000\" }\n")
        .partitions(3)
        .build()
        .await?;
    let mut capture = d.spawn_stage("capture", "capture")?;
    let mut bronze = d.spawn_stage("bronze", "bronze-0")?;
    // Every restarted writer joins a consumer group of its own. Positions come from the
    // Bronze table, never from the group, so this changes nothing about what is tested;
    // it avoids tansu 0.6 keeping SIGKILLed members in the group, which can leave the new
    // writer with no partition (docs/bronze.md). Rebalances are tested in bronze_group.
    let restart = |d: &mut wal2delta_tests::daemon::Daemon, n: usize| {
        d.env.retain(|(k, _)| k != "WAL2DELTA__BRONZE__GROUP_ID");
        d.env
            .push(("WAL2DELTA__BRONZE__GROUP_ID".into(), format!("{name}-{n}")));
        d.spawn_stage("bronze", &format!("bronze-{n}"))
    };

    // The workload: 200,000 inserts in transactions of 1 to 5,000 rows, then updates.
    let writer = {
        let pg = stack.connect().await?;
        let name = name.clone();
        tokio::spawn(async move {
            let mut next = 1i64;
            while next <= ROWS {
                let n = rand::rng().random_range(1..=5_000).min(ROWS - next + 1);
                pg.batch_execute(&format!(
                    "INSERT INTO {name}.t SELECT g, g FROM generate_series({next}, {}) g",
                    next + n - 1
                ))
                .await?;
                next += n;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(())
        })
    };

    let table = d.bronze("t");
    let t = scan(&table);
    let started = Instant::now();
    let mut kills = 0;
    let mut kills_mid_commit = 0;
    let mut known_orphans: HashSet<String> = HashSet::new();
    let mut next_random_kill =
        Instant::now() + Duration::from_millis(rand::rng().random_range(2_000..5_000));
    // Kill until at least three random kills and two mid-commit kills happened, then let
    // the writer finish.
    while kills < 3 || kills_mid_commit < 2 {
        if started.elapsed() > Duration::from_secs(300) {
            bail!(
                "only {kills} random and {kills_mid_commit} mid-commit kills in 300 s: {}",
                bronze.log_text()
            );
        }
        bronze.assert_running()?;
        capture.assert_running()?;
        if kills_mid_commit < 2 {
            // A data file no commit references yet: the writer is between writing and
            // committing. Kill it right there.
            let fresh: Vec<String> = uncommitted_files(&table)?
                .into_iter()
                .filter(|f| !known_orphans.contains(f))
                .collect();
            if !fresh.is_empty() {
                bronze.kill9();
                let still: Vec<String> = uncommitted_files(&table)?
                    .into_iter()
                    .filter(|f| fresh.contains(f))
                    .collect();
                if !still.is_empty() {
                    kills_mid_commit += 1;
                    eprintln!(
                        "killed between file write and commit ({} orphan files)",
                        still.len()
                    );
                }
                known_orphans.extend(uncommitted_files(&table)?);
                bronze = restart(&mut d, kills + kills_mid_commit + 1)?;
                continue;
            }
        }
        if kills < 3 && Instant::now() >= next_random_kill {
            bronze.kill9();
            kills += 1;
            known_orphans.extend(uncommitted_files(&table)?);
            eprintln!("random kill {kills} at {:?}", started.elapsed());
            bronze = restart(&mut d, kills + kills_mid_commit + 1)?;
            next_random_kill =
                Instant::now() + Duration::from_millis(rand::rng().random_range(2_000..6_000));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    writer.await??;
    pg.batch_execute(&format!("UPDATE {name}.t SET v = -v WHERE id % 1000 = 0"))
        .await?;
    let expected_events = ROWS + ROWS / 1000;

    // Wait for Bronze to hold everything, then check it against Kafka and the source.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        bronze.assert_running()?;
        capture.assert_running()?;
        let n = duckdb_i64(&format!("SELECT count(*) FROM {t}")).unwrap_or(0);
        if n >= expected_events {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "Bronze holds {n} of {expected_events} events: {}",
                bronze.log_text()
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    std::thread::sleep(Duration::from_secs(2)); // anything more would be a duplicate
    let rows = duckdb(&format!(
        "SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)), count(DISTINCT after.id) FILTER (WHERE op = 'c'),
                sum(after.id) FILTER (WHERE op = 'c'), count(*) FILTER (WHERE op = 'u'),
                min(kafka_offset), count(DISTINCT kafka_partition)
         FROM {t}"
    ))?;
    let r = &rows[0];
    ensure!(
        r[0] == expected_events,
        "Bronze rows {} vs {expected_events} events",
        r[0]
    );
    ensure!(
        r[1] == r[0],
        "each (partition, offset) exactly once: {} distinct of {}",
        r[1],
        r[0]
    );
    ensure!(
        r[2] == ROWS && r[3] == ROWS * (ROWS + 1) / 2,
        "every source row inserted once: {r:?}"
    );
    ensure!(r[4] == ROWS / 1000, "every update: {r:?}");
    ensure!(
        r[5] == 0 && r[6] == 3,
        "offsets from 0 on all partitions: {r:?}"
    );
    // Per partition, the offsets are exactly 0..n (no gap, nothing twice).
    let gaps = duckdb(&format!(
        "SELECT kafka_partition, count(*), max(kafka_offset) FROM {t} GROUP BY 1 HAVING count(*) <> max(kafka_offset) + 1"
    ))?;
    ensure!(
        gaps.is_empty(),
        "offsets contiguous per partition: {gaps:?}"
    );
    let source: i64 = pg
        .query_one(&format!("SELECT count(*) FROM {name}.t"), &[])
        .await?
        .get(0);
    ensure!(source == ROWS, "source rows {source}");
    eprintln!(
        "{kills} random kills, {kills_mid_commit} kills between file write and commit; {} orphan files left for vacuum",
        known_orphans.len()
    );
    ensure!(bronze.stop()?.success(), "clean stop");
    capture.kill9();
    Ok(())
}
