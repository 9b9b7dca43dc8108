//! Restart correctness: capture records each position it confirms in Kafka before telling
//! PostgreSQL, and refuses to start when the slot is ahead of that record (changes in
//! between may never have reached Kafka), unless explicitly overridden.

use std::time::Duration;

use anyhow::{ensure, Result};
use wal2delta_tests::kafka::read_topic;
use wal2delta_tests::{scenario, Stack};

#[tokio::test(flavor = "multi_thread")]
async fn refuses_to_start_when_the_slot_is_ahead_of_kafka() -> Result<()> {
    let stack = Stack::from_env();
    let (name, pg, mut d) = scenario(
        &stack,
        "ahead",
        "CREATE TABLE {s}.t (id int PRIMARY KEY);",
        "",
        1,
    )
    .await?;
    d.start()?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT generate_series(1, 10)"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    ensure!(d.stop()?.success(), "clean stop: {}", d.last_log());
    // A normal restart is accepted.
    d.start()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    d.assert_running()?;
    ensure!(d.stop()?.success());
    let positions = read_topic(
        &stack.brokers,
        &format!("{name}.positions"),
        None,
        Duration::from_secs(3),
    )?;
    ensure!(!positions.is_empty(), "positions are recorded in Kafka");

    // Someone moves the slot past changes capture never saw.
    // (synchronous commit, so the WAL is flushed and the slot can be advanced over it)
    pg.batch_execute(&format!(
        "SET synchronous_commit = on; INSERT INTO {name}.t SELECT generate_series(11, 15)"
    ))
    .await?;
    pg.execute(
        "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
        &[&d.slot],
    )
    .await?;
    d.start()?;
    let status = d.wait_exit(Duration::from_secs(30))?;
    ensure!(
        matches!(status, Some(s) if !s.success()),
        "capture must refuse to start: {}",
        d.last_log()
    );
    let log = d.last_log();
    ensure!(
        log.contains("ahead of the last position") && log.contains("--allow-slot-ahead"),
        "{log}"
    );

    // The explicit override starts, and from then on the position log follows again.
    d.start_with(&["--allow-slot-ahead"])?;
    pg.batch_execute(&format!("INSERT INTO {name}.t VALUES (100)"))
        .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    ensure!(d.stop()?.success());
    d.start()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    d.assert_running()?;
    d.stop()?;
    Ok(())
}
