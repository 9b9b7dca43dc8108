//! `[schema_registry]` username, password and ca_file (issue 14, docs/security.md): capture
//! registers and Bronze reads schemas from a registry that requires HTTP basic
//! authentication over TLS, and a wrong password stops capture with the reason instead of
//! sending every event to the DLQ.
//!
//! The registry is a private development registry started with `--basic-auth-file`
//! (`tests/support/registry.rs`) behind the tests' TLS terminator with the stack's server
//! certificate; the daemon trusts the stack's CA through `ca_file`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Result};
use wal2delta_tests::lake::{duckdb_i64, scan};
use wal2delta_tests::metrics::free_port;
use wal2delta_tests::registry::AuthRegistry;
use wal2delta_tests::tls_proxy::TlsTerminator;
use wal2delta_tests::{Scenario, Stack, World};

const PASSWORD_VAR: &str = "WAL2DELTA_TEST_REGISTRY_PASSWORD";

fn tls_dir() -> PathBuf {
    PathBuf::from(std::env::var("WAL2DELTA_STACK_TLS_DIR").expect("WAL2DELTA_STACK_TLS_DIR"))
}

/// A scenario whose daemon reaches the registry over TLS with `password`.
async fn world(
    stack: &Stack,
    prefix: &str,
    password: Option<&str>,
) -> Result<(AuthRegistry, TlsTerminator, World)> {
    let registry = AuthRegistry::start(stack)?;
    let tls = TlsTerminator::start(
        free_port()?,
        format!("127.0.0.1:{}", registry.port),
        &tls_dir().join("server.crt"),
        &tls_dir().join("server.key"),
    )
    .await?;
    let w = Scenario::new(
        stack,
        prefix,
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text);",
    )
    .env(
        "WAL2DELTA__SCHEMA_REGISTRY__URL",
        &format!("https://localhost:{}", tls.port),
    )
    .env("WAL2DELTA__SCHEMA_REGISTRY__USERNAME", &registry.user)
    .env("WAL2DELTA__SCHEMA_REGISTRY__PASSWORD_ENV", PASSWORD_VAR)
    .env(
        "WAL2DELTA__SCHEMA_REGISTRY__CA_FILE",
        &tls_dir().join("ca.crt").display().to_string(),
    )
    .env(PASSWORD_VAR, password.unwrap_or(&registry.password))
    .build()
    .await?;
    Ok((registry, tls, w))
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_and_bronze_use_an_authenticated_registry_over_tls() -> Result<()> {
    let stack = Stack::from_env();
    let (registry, tls, w) = world(&stack, "regsec", None).await?;
    let (name, pg, mut d) = (w.name, w.pg, w.d);
    d.start()?;
    let mut bronze = d.spawn_stage("bronze", "bronze")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, 'v' || g FROM generate_series(1, 200) g"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let table = scan(&d.bronze("t"));
    bronze.wait_rows(&table, 200)?;
    let n = duckdb_i64(&format!("SELECT count(*) FROM {table}"))?;
    ensure!(n == 200, "Bronze holds exactly the 200 events: {n}");
    ensure!(tls.handshakes() >= 2, "capture and Bronze went through TLS");
    bronze.stop_cleanly_with(&mut d, &registry.password)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_registry_password_stops_capture_with_the_reason() -> Result<()> {
    let stack = Stack::from_env();
    let (_registry, _tls, w) = world(&stack, "regbad", Some("registry-Wrong-2xV")).await?;
    let mut d = w.d;
    d.start()?;
    let log = d.wait_stopped_by_error(Duration::from_secs(90))?;
    ensure!(
        log.contains("registry authentication") && log.contains("[schema_registry] username"),
        "the reason and the keys to fix: {log}"
    );
    ensure!(
        !log.contains("registry-Wrong-2xV"),
        "no password in the log"
    );
    Ok(())
}
