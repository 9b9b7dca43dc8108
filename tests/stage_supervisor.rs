//! One supervisor per stage (docs/operations.md, "Stage health"): a stage stopped by an
//! error that needs an operator stops alone, the others go on, and the daemon reports it
//! on `/readyz` (503, with the reason and the fix) and in `wal2delta_stage_failed`.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use serde_json::Value;
use wal2delta_tests::lake::duckdb_i64;
use wal2delta_tests::{Scenario, Stack, World};

async fn get(port: u16, path: &str) -> Result<(u16, String)> {
    let r = reqwest::get(format!("http://127.0.0.1:{port}{path}")).await?;
    Ok((r.status().as_u16(), r.text().await?))
}

/// Polls `/readyz` until `done` holds for its status and document.
async fn wait_ready(port: u16, what: &str, done: impl Fn(u16, &Value) -> bool) -> Result<Value> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(90) {
        if let Ok((status, body)) = get(port, "/readyz").await {
            let doc: Value = serde_json::from_str(&body)?;
            if done(status, &doc) {
                return Ok(doc);
            }
            last = format!("{status} {body}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    bail!("{what}: /readyz never showed it; last answer: {last}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stage_that_needs_an_operator_stops_alone_and_the_daemon_reports_not_ready() -> Result<()>
{
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "sup",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text);",
    )
    .build()
    .await?;
    let port = 19_100 + (std::process::id() % 300) as u16;
    d.env.push((
        "WAL2DELTA__METRICS__LISTEN".into(),
        format!("127.0.0.1:{port}"),
    ));

    // Capture alone: ready once streaming.
    d.start()?;
    let doc = wait_ready(port, "capture running", |s, doc| {
        s == 200 && doc["stages"]["capture"]["state"] == "running"
    })
    .await?;
    ensure!(doc["ready"] == true, "{doc}");
    ensure!(get(port, "/healthz").await? == (200, "ok\n".into()));
    // A mistyped probe fails instead of passing on the metrics text.
    let (status, body) = get(port, "/readyzz").await?;
    ensure!(
        status == 404 && body.contains("/readyz") && !body.contains("# TYPE"),
        "{status} {body}"
    );
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, 'v' || g FROM generate_series(1, 50) g"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    ensure!(d.stop()?.success());

    // The slot is dropped behind capture's back: capture needs an operator. Bronze, run
    // by the same daemon, still stores what Kafka holds.
    pg.execute("SELECT pg_drop_replication_slot($1)", &[&d.slot])
        .await?;
    let mut run = d.spawn_stage("capture,bronze", "run2")?;
    let doc = wait_ready(port, "capture failed", |s, doc| {
        s == 503 && doc["stages"]["capture"]["state"] == "failed"
    })
    .await?;
    let capture = &doc["stages"]["capture"];
    ensure!(
        capture["hint"]
            .as_str()
            .is_some_and(|h| h.contains("on_slot_lost"))
            && capture["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("is gone")),
        "the reason and the fix are reported: {doc}"
    );
    ensure!(
        doc["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("capture: failed")),
        "{doc}"
    );
    let bronze_table = d.bronze("t");
    let start = Instant::now();
    loop {
        let sql = format!(
            "SELECT count(*) FROM delta_scan('{}')",
            bronze_table.display()
        );
        if duckdb_i64(&sql).unwrap_or(0) == 50 {
            break;
        }
        run.assert_running()?;
        if start.elapsed() > Duration::from_secs(90) {
            bail!(
                "Bronze did not store the 50 events while capture was stopped: {}",
                run.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (_, metrics) = get(port, "/metrics").await?;
    ensure!(
        metrics
            .lines()
            .any(|l| l.starts_with("wal2delta_stage_failed{stage=\"capture\"} 1")),
        "wal2delta_stage_failed shows capture: {metrics}"
    );
    ensure!(
        metrics
            .lines()
            .any(|l| l.starts_with("wal2delta_stage_up{stage=\"bronze\"} 1")),
        "bronze is up: {metrics}"
    );
    // `status` reports the missing slot (exit 3) and the daemon's failed stage with its fix.
    let out = d.command(&["status", "--json"])?;
    ensure!(out.status.code() == Some(3), "status exits 3: {out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    ensure!(doc["slot"]["missing"] == true, "{doc}");
    ensure!(
        doc["daemon"]["stages"]["capture"]["state"] == "failed"
            && doc["daemon"]["stages"]["bronze"]["state"] == "running",
        "{doc}"
    );
    let text = String::from_utf8_lossy(&d.command(&["status"])?.stdout).into_owned();
    ensure!(
        text.contains("daemon: NOT READY: capture: failed") && text.contains("on_slot_lost"),
        "{text}"
    );
    // Still running; on shutdown the daemon exits non-zero, naming the stopped stage.
    run.assert_running()?;
    let status = run.stop()?;
    ensure!(!status.success(), "{status}");
    let log = run.log_text();
    ensure!(
        log.contains("a stage stopped; the others go on")
            && log.contains("capture stage stopped, it needs an operator"),
        "{log}"
    );
    Ok(())
}

/// docs/operations.md, "Stage health": a publication dropped (or never created, a plain
/// `up` without `setup`) stops capture with an error that names the publication and the
/// fix, not a hint about the slot.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_publication_is_named_with_its_fix() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "nopub",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text);",
    )
    .build()
    .await?;
    let port = 19_400 + (std::process::id() % 300) as u16;
    d.env.push((
        "WAL2DELTA__METRICS__LISTEN".into(),
        format!("127.0.0.1:{port}"),
    ));
    // pgoutput looks the publication up when it decodes a change: drop it once capture
    // streams (its slot is made at its start), then change a row. Bronze runs beside it,
    // so the process stays up to report the stopped stage.
    let mut run = d.spawn_stage("capture,bronze", "run")?;
    let start = Instant::now();
    while pg
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active",
            &[&d.slot],
        )
        .await?
        .is_none()
    {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "capture never streamed: {}",
            run.log_text()
        );
        run.assert_running()?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    pg.batch_execute(&format!(
        "DROP PUBLICATION \"{}\"; INSERT INTO {name}.t VALUES (1, 'a');",
        d.publication
    ))
    .await?;
    let doc = wait_ready(port, "capture failed", |s, doc| {
        s == 503 && doc["stages"]["capture"]["state"] == "failed"
    })
    .await?;
    let capture = &doc["stages"]["capture"];
    ensure!(
        capture["hint"]
            .as_str()
            .is_some_and(|h| h.contains("publication") && h.contains("wal2delta setup"))
            && capture["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(&d.publication)),
        "the publication and the fix are named: {doc}"
    );
    run.assert_running()?;
    ensure!(!run.stop()?.success());
    Ok(())
}
