//! Shared helpers for the end-to-end tests. They run against the stack that `ops/test`
//! starts (its addresses arrive as the `WAL2DELTA__…` variables of `ops/stack env`).
//!
//! Every test works in its own PostgreSQL schema, slot, publication and topic prefix, so
//! tests never see each other's data.

pub mod chaos;
pub mod daemon;
pub mod kafka;
pub mod lake;
pub mod proxy;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio_postgres::{Client, NoTls};
use wal2delta_model::Lsn;

/// Addresses of the running stack.
#[derive(Debug, Clone)]
pub struct Stack {
    pub dsn: String,
    pub admin_dsn: String,
    pub brokers: String,
    pub registry: String,
    pub stack_dir: String,
}

impl Stack {
    /// Reads the stack's addresses; fails with a hint when the stack is not up.
    pub fn from_env() -> Stack {
        let var = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run the tests through ops/test (it starts the stack)")
            })
        };
        Stack {
            dsn: var("WAL2DELTA__SOURCE__DSN"),
            admin_dsn: var("WAL2DELTA_STACK_ADMIN_DSN"),
            brokers: var("WAL2DELTA__KAFKA__BROKERS"),
            registry: var("WAL2DELTA__SCHEMA_REGISTRY__URL"),
            stack_dir: var("WAL2DELTA_STACK_DIR"),
        }
    }

    /// A connection as the capture role (owner of the app database).
    pub async fn connect(&self) -> Result<Client> {
        connect(&self.dsn).await
    }

    /// A superuser connection.
    pub async fn admin(&self) -> Result<Client> {
        connect(&self.admin_dsn).await
    }
}

pub async fn connect(dsn: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(dsn, NoTls)
        .await
        .context("connecting to the test PostgreSQL")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute("SET DateStyle = 'ISO, MDY'; SET IntervalStyle = iso_8601; SET TimeZone = 'UTC'; SET extra_float_digits = 3")
        .await?;
    Ok(client)
}

/// One test's world: a schema of its own holding `tables` (SQL where `{s}` stands for the
/// schema), a daemon config capturing it (`extra_toml` may use `{s}` too, e.g. for a
/// consumer group id), topics with `partitions` partitions, and `wal2delta setup` done.
pub async fn scenario(
    stack: &Stack,
    prefix: &str,
    tables: &str,
    extra_toml: &str,
    partitions: u32,
) -> Result<(String, Client, daemon::Daemon)> {
    let name = unique(prefix);
    let pg = stack.connect().await?;
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name}; {}",
        tables.replace("{s}", &name)
    ))
    .await?;
    let mut d = daemon::Daemon::new(stack, &name, &extra_toml.replace("{s}", &name))?;
    d.env.push((
        "WAL2DELTA__KAFKA__TOPIC_PARTITIONS".into(),
        partitions.to_string(),
    ));
    d.setup()?;
    Ok((name, pg, d))
}

/// A name unique to this test run, usable as schema, slot, publication and topic prefix.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}_{}_{}", std::process::id(), nanos % 100_000)
}

/// The WAL insert position: at or after the end of everything committed so far (the
/// stack runs with synchronous_commit = off, so the *write* position may lag behind).
pub async fn current_wal_lsn(client: &Client) -> Result<Lsn> {
    let s: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    Ok(s.parse()?)
}

/// Transactions PostgreSQL streamed to `slot` while still in progress
/// (`pg_stat_replication_slots`).
pub async fn streamed_transactions(client: &Client, slot: &str) -> Result<i64> {
    Ok(client
        .query_one(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0))
}

pub async fn slot_confirmed(client: &Client, slot: &str) -> Result<Option<Lsn>> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row
        .and_then(|r| r.get::<_, Option<String>>(0))
        .and_then(|s| s.parse().ok()))
}

/// Waits until the slot's confirmed flush LSN reaches `target`.
pub async fn wait_confirmed(
    client: &Client,
    slot: &str,
    target: Lsn,
    timeout: Duration,
) -> Result<Lsn> {
    let start = Instant::now();
    loop {
        let c = slot_confirmed(client, slot).await?.unwrap_or_default();
        if c >= target {
            return Ok(c);
        }
        if start.elapsed() > timeout {
            bail!("slot {slot} confirmed {c}, still short of {target} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Drops the slot and publication a test created (best effort).
pub async fn cleanup(client: &Client, slot: &str, publication: &str) {
    let _ = client.execute("SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", &[&slot]).await;
    let _ = client
        .batch_execute(&format!("DROP PUBLICATION IF EXISTS \"{publication}\""))
        .await;
}
