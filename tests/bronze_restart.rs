//! A bronze writer SIGKILLed mid-stream and restarted at once, as a user's first crash test
//! on the quickstart stack does it: same config, same group id. With direct assignment (the
//! default) the new process reads every partition at once, whatever the broker's group
//! bookkeeping says (tansu keeps the killed member in the group, which used to leave the
//! new writer with no partitions for good). `status` calls a table with waiting events
//! and no writer stalled.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use wal2delta_tests::daemon::{Daemon, StageProcess};
use wal2delta_tests::kafka::read_topic_to_end;
use wal2delta_tests::lake::{duckdb, duckdb_i64, scan};
use wal2delta_tests::{Scenario, Stack, World};

const ROWS: i64 = 20_000;

/// The writer's settings; `WAL2DELTA_TEST_BRONZE_ASSIGNMENT=group` runs the test the way
/// the stage worked before direct assignment (to see it fail on tansu).
fn bronze_toml() -> String {
    let assignment =
        std::env::var("WAL2DELTA_TEST_BRONZE_ASSIGNMENT").unwrap_or_else(|_| "direct".into());
    format!(
        "[bronze]\nassignment = \"{assignment}\"\ngroup_id = \"{{s}}\"\nmax_batch_ms = 300\nmax_batch_events = 2000\ntopic_refresh_ms = 500\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_writer_restarted_at_once_stores_every_event_once() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "brzrestart",
        "CREATE TABLE {s}.t (id bigint PRIMARY KEY, v bigint);",
    )
    .toml(&bronze_toml())
    .partitions(3)
    .build()
    .await?;
    let mut capture = d.spawn_stage("capture", "capture")?;
    let mut bronze = d.spawn_stage("bronze", "bronze-0")?;
    let result = restarts(&stack, &name, &pg, &d, &mut capture, &mut bronze).await;
    if result.is_ok() {
        ensure!(
            bronze.stop()?.success(),
            "clean stop: {}",
            bronze.log_text()
        );
    }
    drop(bronze);
    capture.kill9();
    result
}

/// Waits until the Bronze table holds `want` rows, within `timeout`.
fn wait_rows(t: &str, want: i64, timeout: Duration, bronze: &mut StageProcess) -> Result<()> {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < timeout {
        bronze.assert_running()?;
        n = duckdb_i64(&format!("SELECT count(*) FROM {t}")).unwrap_or(0);
        if n >= want {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!(
        "Bronze holds {n} of {want} events {timeout:?} after the restart: {}",
        bronze.log_text()
    )
}

fn stalled(d: &Daemon, table: &str) -> Result<Option<u64>> {
    let out = d.command(&["status", "--json"])?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let tables = doc["stages"]["bronze"]["tables"]
        .as_array()
        .context("bronze status")?
        .clone();
    let t = tables
        .iter()
        .find(|t| t["table"] == table)
        .with_context(|| format!("{table} in {tables:?}"))?;
    Ok(t["stalled_s"].as_u64())
}

async fn restarts(
    stack: &Stack,
    name: &str,
    pg: &tokio_postgres::Client,
    d: &Daemon,
    capture: &mut StageProcess,
    bronze: &mut StageProcess,
) -> Result<()> {
    let writer = {
        let pg = stack.connect().await?;
        let name = name.to_owned();
        tokio::spawn(async move {
            for chunk in 0..(ROWS / 500) {
                let from = chunk * 500 + 1;
                pg.batch_execute(&format!(
                    "INSERT INTO {name}.t SELECT g, g FROM generate_series({from}, {}) g",
                    from + 499
                ))
                .await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    let t = scan(&d.bronze("t"));
    // Two kills mid-stream, each followed at once by a writer with the same config.
    for kill in 1..=2 {
        let since = Instant::now();
        let floor = kill * 2_000;
        while duckdb_i64(&format!("SELECT count(*) FROM {t}")).unwrap_or(0) < floor {
            bronze.assert_running()?;
            capture.assert_running()?;
            if since.elapsed() > Duration::from_secs(90) {
                bail!("Bronze never reached {floor} rows: {}", bronze.log_text());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bronze.kill9();
        *bronze = d.spawn_stage("bronze", &format!("bronze-{kill}"))?;
    }
    writer.await??;
    d.wait_caught_up(pg, Duration::from_secs(60)).await?;
    // Bounded: the restarted writer catches up within a minute of the last event.
    wait_rows(&t, ROWS, Duration::from_secs(60), bronze)?;
    std::thread::sleep(Duration::from_secs(2)); // anything more would be a duplicate
    let kafka = read_topic_to_end(&stack.brokers, &format!("{name}.{name}.t"))?;
    let r = &duckdb(&format!(
        "SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)), count(DISTINCT after.id)
         FROM {t}"
    ))?[0];
    ensure!(
        r[0] == ROWS && r[1] == ROWS && r[2] == ROWS && kafka.len() as i64 == ROWS,
        "every event exactly once: Bronze {r:?}, Kafka {}",
        kafka.len()
    );

    // No writer while events wait: status calls the table stalled (after 30 s), and a new
    // writer clears it.
    let table = format!("{name}.t");
    ensure!(stalled(d, &table)?.is_none(), "not stalled while caught up");
    bronze.kill9();
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, g FROM generate_series({}, {}) g",
        ROWS + 1,
        ROWS + 100
    ))
    .await?;
    d.wait_caught_up(pg, Duration::from_secs(60)).await?;
    let since = Instant::now();
    loop {
        if let Some(s) = stalled(d, &table)? {
            ensure!(s >= 30, "stalled after 30 s: {s}");
            break;
        }
        if since.elapsed() > Duration::from_secs(60) {
            bail!("status never called {table} stalled");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let text = d.command(&["status"])?;
    ensure!(
        String::from_utf8_lossy(&text.stdout).contains("STALLED: no Bronze commit for"),
        "status text: {}",
        String::from_utf8_lossy(&text.stdout)
    );
    *bronze = d.spawn_stage("bronze", "bronze-3")?;
    wait_rows(&t, ROWS + 100, Duration::from_secs(60), bronze)?;
    ensure!(stalled(d, &table)?.is_none(), "no longer stalled");
    Ok(())
}
