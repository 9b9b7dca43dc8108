//! Promise 3, the source is protected: heartbeats keep the slot moving on an idle database
//! while another database on the server is busy, and the slot's health is reported by
//! `status` and the metrics endpoint.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use wal2delta_tests::{connect, current_wal_lsn, Scenario, Stack, TempDatabase, World};

async fn metrics_text(port: u16) -> Result<String> {
    Ok(reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await?
        .text()
        .await?)
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeats_keep_an_idle_slot_moving_while_another_database_is_busy() -> Result<()> {
    let stack = Stack::from_env();
    let port = 19_500 + (std::process::id() % 400) as u16;
    let World {
        name, pg, mut d, ..
    } = Scenario::new(&stack, "hb", "CREATE TABLE {s}.t (id int PRIMARY KEY);")
        .toml("[capture]\nheartbeat_interval_ms = 500\n")
        .env("WAL2DELTA__METRICS__LISTEN", &format!("127.0.0.1:{port}"))
        .build()
        .await?;
    let busy_db = TempDatabase::create(&stack, &format!("{name}_busy")).await?;
    let busy = connect(&busy_db.dsn).await?;
    let admin = stack.admin().await?;
    d.start()?;

    // The busy database writes about 100 MB of WAL; the captured one writes nothing.
    let before = current_wal_lsn(&pg).await?;
    busy.batch_execute("CREATE TABLE churn (id int, pad text)")
        .await?;
    for _ in 0..10 {
        busy.batch_execute("INSERT INTO churn SELECT g, repeat('x', 100) FROM generate_series(1, 60000) g; DELETE FROM churn;").await?;
    }
    busy.batch_execute("CHECKPOINT").await.ok();
    let after = current_wal_lsn(&pg).await?;
    let written = after.0 - before.0;
    ensure!(
        written > 50_000_000,
        "the busy database wrote only {written} bytes of WAL"
    );

    // The slot's retained WAL must come back down to a small fraction of what was written.
    let start = Instant::now();
    let retained = loop {
        let r: i64 = pg
            .query_one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", &[&d.slot])
            .await?
            .get(0);
        if (r as u64) < written / 5 {
            break r;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "slot still retains {r} bytes of the {written} the busy database wrote: {}",
                d.last_log()
            );
        }
        // A running-transactions record lets restart_lsn move; PostgreSQL writes one at checkpoints.
        admin.batch_execute("CHECKPOINT").await.ok();
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("busy database wrote {written} bytes of WAL; the idle slot retains {retained}");

    let text = metrics_text(port).await?;
    ensure!(
        metric(&text, "wal2delta_capture_heartbeats_total").unwrap_or(0.0) >= 1.0,
        "no heartbeat counted:\n{text}"
    );
    ensure!(
        metric(&text, "wal2delta_slot_lag_bytes").is_some(),
        "wal2delta_slot_lag_bytes missing:\n{text}"
    );
    ensure!(
        text.contains("wal2delta_slot_wal_status{status=\"reserved\"} 1"),
        "wal_status gauge missing:\n{text}"
    );

    let out = d.command(&["status", "--json"])?;
    ensure!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let slot = &status["slot"];
    ensure!(
        slot["wal_status"] == "reserved" && slot["active"] == true,
        "{status}"
    );
    for key in [
        "lag_bytes",
        "retained_bytes",
        "safe_wal_size",
        "max_slot_wal_keep_size",
        "wal_rate_bytes_per_second",
        "seconds_to_invalidation",
        "spill",
    ] {
        ensure!(
            slot.get(key).is_some(),
            "status --json lacks {key}: {status}"
        );
    }
    let text = String::from_utf8_lossy(&d.command(&["status"])?.stdout).into_owned();
    ensure!(
        text.contains("time to invalidation") && text.contains("retained WAL"),
        "{text}"
    );

    d.stop()?;
    Ok(())
}
