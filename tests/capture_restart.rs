//! Restart correctness: capture records each position it confirms in Kafka before telling
//! PostgreSQL, and refuses to start when the slot is ahead of that record (changes in
//! between may never have reached Kafka), unless explicitly overridden.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use wal2delta_tests::kafka::{read_topic, read_topic_to_end};
use wal2delta_tests::{ops_stack, slot_confirmed, Scenario, Stack, World};

#[tokio::test(flavor = "multi_thread")]
async fn refuses_to_start_when_the_slot_is_ahead_of_kafka() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(&stack, "ahead", "CREATE TABLE {s}.t (id int PRIMARY KEY);")
        .build()
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

/// PostgreSQL 15 writes a slot's confirmed position to disk only when its `restart_lsn`
/// or `catalog_xmin` moves too, so a restart rewinds the slot. Capture resumes from the
/// position log instead, which it writes only once Kafka holds everything before it: a
/// transaction Kafka already has is not published again.
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_restart_does_not_publish_again_what_kafka_holds() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "rewind",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, note text);",
    )
    .build()
    .await?;
    // A checkpoint between the stop and the crash (the timed one, or one forced by WAL
    // volume on a busy server) may save the slot's latest position if its restart_lsn
    // moved meanwhile: then there is no rewind to show, and the round is tried again.
    let mut inserted = 0;
    let mut pg = pg;
    for round in 1..=3 {
        d.start()?;
        pg.batch_execute(&format!(
            "INSERT INTO {name}.t SELECT g, 'n' || g FROM generate_series({}, {}) g",
            inserted + 1,
            inserted + 500
        ))
        .await?;
        inserted += 500;
        d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
        ensure!(d.stop()?.success(), "clean stop: {}", d.last_log());
        let before = slot_confirmed(&pg, &d.slot).await?.context("slot")?;
        drop(pg);

        // A crash of PostgreSQL: no shutdown checkpoint, the slot is read back from disk.
        ops_stack(&["restart-pg", "immediate"])?;
        pg = stack.connect().await?;
        let rewound = slot_confirmed(&pg, &d.slot).await?.context("slot")?;
        if rewound < before {
            break;
        }
        ensure!(
            round < 3,
            "the restart was meant to rewind the slot (it is at {rewound}, was {before}), three times in a row; \
             without a rewind this test shows nothing"
        );
        eprintln!("round {round}: no rewind (a checkpoint saved the slot); again");
    }

    d.start()?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t VALUES ({}, 'after')",
        inserted + 1
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let log = d.last_log();
    ensure!(d.stop()?.success(), "clean stop: {log}");
    ensure!(
        log.contains("resuming at the recorded position"),
        "capture resumed from the position log: {log}"
    );
    let events = read_topic_to_end(&stack.brokers, &format!("{name}.{name}.t"))?;
    ensure!(
        events.len() == inserted + 1,
        "each of the {} inserts published once, not {} events (the last 500 again after the restart?)",
        inserted + 1,
        events.len()
    );
    Ok(())
}
