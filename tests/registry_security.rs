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

/// Refused registry credentials are an operator's problem, not the events': when the
/// registry's password is rotated under a running Bronze, Bronze stops with the reason and
/// the keys to fix at the first schema it must fetch, and quarantines none of the events
/// (it used to quarantine every one of them as `registry_refused`).
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_registry_password_stops_bronze_and_quarantines_nothing() -> Result<()> {
    let stack = Stack::from_env();
    let (mut registry, _tls, w) = world(&stack, "regbronze", None).await?;
    let (name, pg, mut d) = (w.name, w.pg, w.d);
    // Bronze starts (and checks the registry) before any event exists.
    let mut bronze = d.spawn_stage("bronze", "bronze")?;
    std::thread::sleep(Duration::from_secs(5));
    bronze.assert_running()?;
    // The password is rotated; capture starts with the new one and registers the table.
    let rotated = "registry-Rotated-7qP";
    registry.rotate_password(rotated)?;
    d.env.retain(|(k, _)| k != PASSWORD_VAR);
    d.env.push((PASSWORD_VAR.to_owned(), rotated.to_owned()));
    d.start()?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, 'v' || g FROM generate_series(1, 50) g"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let status = bronze.wait_exit(Duration::from_secs(90))?;
    let log = bronze.log_text();
    ensure!(status.is_some(), "Bronze stops: {log}");
    ensure!(
        log.contains("[schema_registry] username"),
        "the keys to fix are named: {log}"
    );
    let quarantine = d.lake().join("quarantine/records");
    ensure!(
        !quarantine.join("_delta_log").exists()
            || duckdb_i64(&format!("SELECT count(*) FROM {}", scan(&quarantine)))? == 0,
        "nothing quarantined"
    );
    Ok(())
}
