//! Large transactions: one transaction of 5,000,000 row changes passes with the daemon's
//! memory bounded, because PostgreSQL streams it while in progress (pgoutput protocol 2)
//! and capture buffers it on disk until the commit; an aborted large transaction
//! publishes nothing.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use wal2delta_tests::daemon::peak_rss_kib;
use wal2delta_tests::{current_wal_lsn, streamed_transactions, Scenario, Stack, World};

const ROWS: i64 = 5_000_000;
/// The bound the daemon's peak RSS must stay under: the stream buffer's memory limit
/// (16 MiB here) plus at most `max_in_flight` (20,000) events waiting for Kafka, plus the
/// process's fixed footprint (librdkafka queues, runtime). Far below the transaction's
/// size (~700 MB of events).
const RSS_BOUND_MIB: u64 = 256;

fn messages_in(brokers: &str, topic: &str) -> Result<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "w2d-count")
        .create()?;
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut n = 0;
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            let (lo, hi) = c.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            n += hi - lo;
        }
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread")]
async fn five_million_row_transaction_with_bounded_memory() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "big",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v int);",
    )
    .toml("[capture]\nmax_in_flight = 20000\nstream_memory_bytes = 16777216\n")
    .env("WAL2DELTA__CAPTURE__SPILL_DIR", "\"{dir}/spill\"")
    .build()
    .await?;
    d.start()?;
    let topic = format!("{name}.{name}.t");

    // An aborted large transaction first: streamed to capture, then dropped.
    pg.batch_execute(&format!(
        "BEGIN; INSERT INTO {name}.t SELECT g, 0 FROM generate_series(1, 1000000) g; ROLLBACK;"
    ))
    .await?;
    // Then the big one, in a single statement and transaction.
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, 1 FROM generate_series(1, {ROWS}) g"
    ))
    .await?;
    let target = current_wal_lsn(&pg).await?;

    let pid = d
        .pid()
        .ok_or_else(|| anyhow::anyhow!("daemon not running"))?;
    let start = Instant::now();
    let mut peak = 0;
    loop {
        d.assert_running()?;
        peak = peak.max(peak_rss_kib(pid)?);
        let c: Option<String> = pg
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&d.slot],
            )
            .await?
            .get(0);
        if c.and_then(|c| c.parse::<wal2delta_model::Lsn>().ok())
            .is_some_and(|c| c >= target)
        {
            break;
        }
        if start.elapsed() > Duration::from_secs(1500) {
            bail!(
                "not confirmed after {:?}: {}",
                start.elapsed(),
                d.last_log()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    peak = peak.max(peak_rss_kib(pid)?);
    let streamed = streamed_transactions(&pg, &d.slot).await?;
    let published = messages_in(&stack.brokers, &topic)?;
    eprintln!(
        "{ROWS} rows in one transaction: {published} events in {:.0} s, peak RSS {} MiB (bound {RSS_BOUND_MIB} MiB), {streamed} streamed transactions",
        start.elapsed().as_secs_f64(),
        peak / 1024
    );
    ensure!(
        streamed >= 2,
        "PostgreSQL should have streamed both large transactions, streamed {streamed}"
    );
    ensure!(published == ROWS, "exactly the committed transaction's {ROWS} events, nothing of the aborted one: {published}");
    ensure!(
        peak / 1024 < RSS_BOUND_MIB,
        "peak RSS {} MiB over the {RSS_BOUND_MIB} MiB bound",
        peak / 1024
    );
    d.stop()?;
    Ok(())
}
