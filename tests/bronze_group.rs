//! Scale-out: two bronze writers in one consumer group share the partitions; a second
//! writer joining and the first leaving mid-run move partitions between them, and Bronze
//! still holds every Kafka offset exactly once.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::lake::{duckdb, duckdb_i64, scan};
use wal2delta_tests::{Scenario, Stack, World};

const ROWS: i64 = 60_000;

/// Time until the process logged its `n`-th "partitions assigned".
fn wait_assigned(
    p: &mut StageProcess,
    n: usize,
    since: Instant,
    timeout: Duration,
) -> Result<Duration> {
    while since.elapsed() < timeout {
        p.assert_running()?;
        let text = std::fs::read_to_string(&p.log).unwrap_or_default();
        if text.matches("partitions assigned").count() >= n {
            return Ok(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "no partition assignment within {timeout:?}: {}",
        p.log_text()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn two_writers_in_one_group_store_every_offset_once_across_rebalances() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(&stack, "brzgrp", "CREATE TABLE {s}.t (id bigint PRIMARY KEY, v bigint);")
        .toml("[bronze]\nassignment = \"group\"\ngroup_id = \"{s}\"\nmax_batch_ms = 300\nmax_batch_events = 3000\ntopic_refresh_ms = 500\n")
        .partitions(4)
        .build()
        .await?;
    let mut capture = d.spawn_stage("capture", "capture")?;
    // The topic must exist before the writers subscribe for the join timing to mean much.
    pg.batch_execute(&format!("INSERT INTO {name}.t VALUES (0, 0)"))
        .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;

    let writer = {
        let pg = stack.connect().await?;
        let name = name.clone();
        tokio::spawn(async move {
            for chunk in 0..60 {
                let from = chunk * 1_000 + 1;
                pg.batch_execute(&format!(
                    "INSERT INTO {name}.t SELECT g, g FROM generate_series({from}, {}) g",
                    from + 999
                ))
                .await?;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            anyhow::Ok(())
        })
    };
    let a_started = Instant::now();
    let mut a = d.spawn_stage("bronze", "writer-a")?;
    let a_join = wait_assigned(&mut a, 1, a_started, Duration::from_secs(60))?;
    let t = scan(&d.bronze("t"));
    // Let A commit some of the stream alone.
    let deadline = Instant::now() + Duration::from_secs(60);
    while duckdb_i64(&format!("SELECT count(*) FROM {t}")).unwrap_or(0) < 5_000 {
        a.assert_running()?;
        ensure!(
            Instant::now() < deadline,
            "writer A stored nothing: {}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // B joins: the group rebalances and both own partitions.
    let b_started = Instant::now();
    let mut b = d.spawn_stage("bronze", "writer-b")?;
    let b_join = wait_assigned(&mut b, 1, b_started, Duration::from_secs(60))?;
    std::thread::sleep(Duration::from_secs(3));
    // A leaves mid-run: B takes over A's partitions from the offsets in the table.
    ensure!(a.stop()?.success(), "A stops cleanly: {}", a.log_text());
    writer.await??;
    let expected = ROWS + 1;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        b.assert_running()?;
        capture.assert_running()?;
        let n = duckdb_i64(&format!("SELECT count(*) FROM {t}")).unwrap_or(0);
        if n >= expected {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "Bronze holds {n} of {expected}: {}",
            b.log_text()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(2));
    let r = &duckdb(&format!(
        "SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)), count(DISTINCT after.id), count(DISTINCT kafka_partition) FROM {t}"
    ))?[0];
    ensure!(
        r[0] == expected && r[1] == expected && r[2] == expected,
        "every offset exactly once: {r:?}"
    );
    ensure!(r[3] == 4, "all partitions: {r:?}");
    let b_log = std::fs::read_to_string(&b.log)?;
    ensure!(
        b_log.matches("partitions assigned").count() >= 2,
        "B was reassigned when A left: {}",
        b.log_text()
    );
    eprintln!("group join: first writer {a_join:?} from process start, second writer {b_join:?} from process start (includes the rebalance with the first)");
    ensure!(b.stop()?.success(), "B stops cleanly");
    capture.kill9();
    Ok(())
}
