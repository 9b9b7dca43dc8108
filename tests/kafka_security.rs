//! `[kafka.security]` (issue 14, docs/security.md): every client wal2delta makes reaches
//! the brokers over TLS with SASL/SCRAM when configured, and wrong credentials stop capture
//! with the reason instead of retrying for ever.
//!
//! The broker is a private tansu requiring SCRAM-SHA-512 (`tests/support/sasl_broker.rs`);
//! tansu 0.6 does not speak TLS itself, so TLS ends in a terminator in front of it
//! (`tests/support/tls_proxy.rs`) with the stack's server certificate, and the daemon
//! checks it against the stack's CA, host name included. The whole configuration comes
//! through nested environment overrides (`WAL2DELTA__KAFKA__SECURITY__...`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Result};
use wal2delta_tests::lake::{duckdb_i64, scan};
use wal2delta_tests::metrics::free_port;
use wal2delta_tests::sasl_broker::SaslBroker;
use wal2delta_tests::secrets::KAFKA_WRONG_PASSWORD;
use wal2delta_tests::tls_proxy::TlsTerminator;
use wal2delta_tests::{Scenario, Stack};

const PASSWORD_VAR: &str = "WAL2DELTA_TEST_KAFKA_PASSWORD";

fn tls_dir() -> PathBuf {
    PathBuf::from(std::env::var("WAL2DELTA_STACK_TLS_DIR").expect("WAL2DELTA_STACK_TLS_DIR"))
}

/// A SCRAM broker behind a TLS terminator that presents the stack's server certificate.
async fn secure_broker(stack: &Stack) -> Result<(SaslBroker, TlsTerminator)> {
    let tls_port = free_port()?;
    let broker = SaslBroker::start(stack, Some(tls_port))?;
    let tls = TlsTerminator::start(
        tls_port,
        format!("127.0.0.1:{}", broker.port),
        &tls_dir().join("server.crt"),
        &tls_dir().join("server.key"),
    )
    .await?;
    Ok((broker, tls))
}

/// The scenario's daemon pointed at the terminator with SASL_SSL and `password`.
fn secured<'a>(s: Scenario<'a>, tls: &TlsTerminator, user: &str, password: &str) -> Scenario<'a> {
    let ca = tls_dir().join("ca.crt").display().to_string();
    s.env(
        "WAL2DELTA__KAFKA__BROKERS",
        &format!("localhost:{}", tls.port),
    )
    .env("WAL2DELTA__KAFKA__SECURITY__PROTOCOL", "sasl_ssl")
    .env(
        "WAL2DELTA__KAFKA__SECURITY__SASL_MECHANISM",
        "SCRAM-SHA-512",
    )
    .env("WAL2DELTA__KAFKA__SECURITY__USERNAME", user)
    .env("WAL2DELTA__KAFKA__SECURITY__PASSWORD_ENV", PASSWORD_VAR)
    .env("WAL2DELTA__KAFKA__SECURITY__CA_FILE", &ca)
    .env(PASSWORD_VAR, password)
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_and_bronze_reach_a_scram_broker_over_tls() -> Result<()> {
    let stack = Stack::from_env();
    let (broker, tls) = secure_broker(&stack).await?;
    let world = secured(
        Scenario::new(
            &stack,
            "kafkasec",
            "CREATE TABLE {s}.t (id int PRIMARY KEY);",
        ),
        &tls,
        &broker.user,
        &broker.password,
    )
    .build()
    .await?;
    let (name, pg, mut d) = (world.name, world.pg, world.d);
    d.start()?;
    let mut bronze = d.spawn_stage("bronze", "bronze")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT generate_series(1, 500)"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    bronze.wait_rows(&scan(&d.bronze("t")), 500)?;
    let exact = duckdb_i64(&format!(
        "SELECT count(DISTINCT kafka_offset) FROM {}",
        scan(&d.bronze("t"))
    ))?;
    ensure!(
        exact == 500,
        "500 distinct offsets in Bronze, found {exact}"
    );
    // Capture, Bronze and the position log's reader all went through TLS.
    ensure!(
        tls.handshakes() >= 3,
        "TLS handshakes through the terminator: {}",
        tls.handshakes()
    );
    // `status` reads Kafka (Bronze lag, snapshot progress) with the same connection.
    let status = d.command(&["status", "--json"])?;
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    let lag = &doc["stages"]["bronze"];
    ensure!(
        lag["error"].is_null() && lag["tables"].as_array().is_some_and(|t| !t.is_empty()),
        "status reads the broker: {lag}"
    );
    // The Kafka password never reaches a log.
    bronze.stop_cleanly_with(&mut d, &broker.password)
}

/// Starts capture against the secure broker with `password` and the CA file `ca`, and
/// returns its log once it stopped by itself (it must, non-zero, within 90 s).
async fn refused_start(prefix: &str, password: Option<&str>, ca: &str) -> Result<String> {
    let stack = Stack::from_env();
    let (broker, tls) = secure_broker(&stack).await?;
    let world = secured(
        Scenario::new(&stack, prefix, "CREATE TABLE {s}.t (id int PRIMARY KEY);"),
        &tls,
        &broker.user,
        password.unwrap_or(&broker.password),
    )
    .env(
        "WAL2DELTA__KAFKA__SECURITY__CA_FILE",
        &tls_dir().join(ca).display().to_string(),
    )
    .build()
    .await?;
    let mut d = world.d;
    d.start()?;
    let log = d.wait_stopped_by_error(Duration::from_secs(90))?;
    ensure!(
        !log.contains(&broker.password),
        "no password in the log: {log}"
    );
    Ok(log)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_kafka_password_stops_capture_with_the_reason() -> Result<()> {
    let log = refused_start("kafkabad", Some(KAFKA_WRONG_PASSWORD), "ca.crt").await?;
    ensure!(
        log.contains("authentication") && log.contains("[kafka.security] username"),
        "the reason and the keys to fix are named: {log}"
    );
    ensure!(
        !log.contains(KAFKA_WRONG_PASSWORD),
        "no password in the log"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_broker_certificate_stops_capture_with_the_reason() -> Result<()> {
    // The broker's certificate was signed by the stack's CA, not by this one.
    let log = refused_start("kafkaca", None, "other-ca.crt").await?;
    ensure!(
        log.contains("TLS") && log.contains("ca_file"),
        "the reason and the key to fix are named: {log}"
    );
    Ok(())
}
