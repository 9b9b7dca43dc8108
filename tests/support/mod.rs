//! Shared helpers for the end-to-end tests. They run against the stack that `ops/test`
//! starts (its addresses arrive as the `WAL2DELTA__…` variables of `ops/stack env`).
//!
//! Every test works in its own PostgreSQL schema, slot, publication and topic prefix, so
//! tests never see each other's data.

pub mod chaos;
pub mod daemon;
pub mod kafka;
pub mod lake;
pub mod metrics;
pub mod proxy;
pub mod registry;
pub mod roles;
pub mod s3;
pub mod sasl_broker;
pub mod secrets;
pub mod tls_proxy;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio_postgres::{Client, NoTls};
use wal2delta_model::Lsn;

/// The `tests/` directory of the checkout being tested. Read at run time (`cargo test`
/// sets `CARGO_MANIFEST_DIR` for the test binaries it runs): with a build cache shared
/// between checkouts (`CARGO_TARGET_DIR` under the home directory, as CI and ops/test use
/// it), cargo reuses a test binary built from another checkout with the same sources,
/// and a path compiled in with `env!` would point at that other checkout's scripts.
pub fn tests_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The root of the checkout being tested (see [`tests_dir`]).
pub fn repo_root() -> PathBuf {
    tests_dir().join("..")
}

/// The daemon's `RUST_LOG` in tests: `info`, or `WAL2DELTA_TEST_LOG` when set (for
/// example `info,wal2delta::silver=debug` to see why a table is held).
pub fn daemon_log_filter() -> String {
    std::env::var("WAL2DELTA_TEST_LOG").unwrap_or_else(|_| "info".to_owned())
}

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

/// One test's world, built step by step: a schema of its own holding `tables` (SQL where
/// `{s}` stands for the schema), a daemon config capturing it ([`Scenario::toml`] may use
/// `{s}` too, e.g. for a consumer group id), topics with [`Scenario::partitions`]
/// partitions, and `wal2delta setup` done (unless [`Scenario::without_setup`]). The daemon
/// is the guard: its `Drop` stops it and drops the slot, publication and schema, also when
/// the test fails.
pub struct Scenario<'a> {
    stack: &'a Stack,
    prefix: &'a str,
    tables: &'a str,
    toml: &'a str,
    partitions: Option<u32>,
    env: Vec<(String, String)>,
    setup: bool,
}

/// What [`Scenario::build`] made: the unique name (schema, slot, publication and topic
/// prefix), a connection as the capture role, the daemon (the guard) and what `wal2delta
/// setup` printed (empty without setup).
pub struct World {
    pub name: String,
    pub pg: Client,
    pub d: daemon::Daemon,
    pub setup: String,
}

impl<'a> Scenario<'a> {
    /// A schema named after `prefix` holding `tables` (`{s}` stands for the schema).
    pub fn new(stack: &'a Stack, prefix: &'a str, tables: &'a str) -> Scenario<'a> {
        Scenario {
            stack,
            prefix,
            tables,
            toml: "",
            partitions: None,
            env: Vec::new(),
            setup: true,
        }
    }

    /// Config added to the daemon's (`{s}` stands for the schema).
    pub fn toml(mut self, extra: &'a str) -> Self {
        self.toml = extra;
        self
    }

    /// Partitions of the topics setup creates (the config's default, 1, otherwise).
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = Some(n);
        self
    }

    /// An environment variable of the daemon's; in the value `{s}` stands for the schema
    /// and `{dir}` for the test's directory.
    pub fn env(mut self, var: &str, value: &str) -> Self {
        self.env.push((var.to_owned(), value.to_owned()));
        self
    }

    /// Leaves `wal2delta setup` to the test.
    pub fn without_setup(mut self) -> Self {
        self.setup = false;
        self
    }

    pub async fn build(self) -> Result<World> {
        let name = unique(self.prefix);
        let pg = self.stack.connect().await?;
        pg.batch_execute(&format!(
            "CREATE SCHEMA {name}; {}",
            self.tables.replace("{s}", &name)
        ))
        .await?;
        let mut d = daemon::Daemon::new(self.stack, &name, &self.toml.replace("{s}", &name))?;
        if let Some(n) = self.partitions {
            d.env
                .push(("WAL2DELTA__KAFKA__TOPIC_PARTITIONS".into(), n.to_string()));
        }
        let dir = d.dir.display().to_string();
        for (var, value) in self.env {
            let value = value.replace("{s}", &name).replace("{dir}", &dir);
            d.env.push((var, value));
        }
        let setup = if self.setup {
            d.setup()?
        } else {
            String::new()
        };
        Ok(World { name, pg, d, setup })
    }

    /// [`Self::build`] for a rules test: `[rules] file` is `rules.toml` in the daemon's
    /// directory, holding `rules(schema)`, written before `wal2delta setup`.
    pub async fn build_with_rules(self, rules: impl FnOnce(&str) -> String) -> Result<World> {
        let setup = self.setup;
        let mut w = self
            .env("WAL2DELTA__RULES__FILE", "{dir}/rules.toml")
            .without_setup()
            .build()
            .await?;
        std::fs::write(w.d.dir.join("rules.toml"), rules(&w.name))?;
        if setup {
            w.setup = w.d.setup()?;
        }
        Ok(w)
    }
}

/// A database of a test's own (e.g. one that writes WAL the test's slot must not see),
/// dropped by the guard's `Drop`, also when the test fails.
pub struct TempDatabase {
    pub name: String,
    pub dsn: String,
    admin_dsn: String,
}

impl TempDatabase {
    pub async fn create(stack: &Stack, name: &str) -> Result<TempDatabase> {
        stack
            .admin()
            .await?
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        Ok(TempDatabase {
            name: name.to_owned(),
            dsn: stack.admin_dsn.replace("/app", &format!("/{name}")),
            admin_dsn: stack.admin_dsn.clone(),
        })
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if !daemon::retry(|| daemon::psql(&self.admin_dsn, &sql).is_some()) {
            eprintln!("could not drop database {} after the test", self.name);
        }
    }
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
/// Runs `ops/stack ARGS` (e.g. `restart-pg immediate`) on the stack the tests use.
pub fn ops_stack(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new(repo_root().join("ops/stack"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        anyhow::bail!(
            "ops/stack {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

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

/// `columns` of the source table `table` in order of `order`, as JSON values (as PostgreSQL
/// renders them with `json_build_array`): the rows to compare with a lake table's.
pub async fn source_rows(
    pg: &Client,
    table: &str,
    columns: &str,
    order: &str,
) -> Result<Vec<Vec<serde_json::Value>>> {
    let rows = pg
        .query(
            &format!("SELECT json_build_array({columns})::text FROM {table} ORDER BY {order}"),
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| Ok(serde_json::from_str(r.get::<_, &str>(0))?))
        .collect()
}
