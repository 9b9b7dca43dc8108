//! `[lake] log_retention_s` on the real stack: the stages' maintenance removes the Delta
//! log entries older than it from Bronze and Silver, and a Silver stage that looked away
//! while the Bronze commits it would read next were removed loads Bronze again and goes
//! on, ending equal to the source.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use tokio_postgres::Client;
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::lake::{duckdb, scan};
use wal2delta_tests::{Scenario, Stack};

/// Fast batches and rounds, maintenance every 2 s.
const TOML: &str = "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 200\ntopic_refresh_ms = 500\nmaintenance_interval_s = 2\n[silver]\ninterval_ms = 300\nmaintenance_interval_s = 2\n";

/// The versions of the commit files in a table's `_delta_log`.
fn commit_versions(table: &Path) -> BTreeSet<u64> {
    std::fs::read_dir(table.join("_delta_log"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_suffix(".json")?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// SIGSTOP until dropped (SIGCONT), also when the test fails.
struct Paused(u32);

impl Paused {
    fn new(p: &StageProcess) -> Result<Paused> {
        let Some(pid) = p.pid() else {
            bail!("no process to pause")
        };
        ensure!(Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()?
            .success());
        Ok(Paused(pid))
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

async fn source_rows(pg: &Client, schema: &str) -> Result<Vec<(i64, i64)>> {
    let rows = pg
        .query(
            &format!("SELECT id::int8, balance FROM {schema}.acct ORDER BY id"),
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

fn silver_rows(path: &Path) -> Result<Vec<(i64, i64)>> {
    Ok(duckdb(&format!(
        "SELECT id::BIGINT, balance FROM {} ORDER BY id",
        scan(path)
    ))?
    .iter()
    .map(|r| (r[0].as_i64().unwrap_or(-1), r[1].as_i64().unwrap_or(-1)))
    .collect())
}

/// Waits (up to 2 minutes) until Silver equals the source; the processes must keep running.
async fn wait_equal(
    pg: &Client,
    schema: &str,
    silver: &Path,
    procs: &mut [&mut StageProcess],
) -> Result<()> {
    let want = source_rows(pg, schema).await?;
    let start = Instant::now();
    let mut last = Vec::new();
    while start.elapsed() < Duration::from_secs(120) {
        for p in procs.iter_mut() {
            p.assert_running()?;
        }
        if let Ok(have) = silver_rows(silver) {
            if have == want {
                return Ok(());
            }
            last = have;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let logs: Vec<String> = procs.iter().map(|p| p.log_text()).collect();
    bail!(
        "Silver ({} rows) never equalled the source ({} rows); logs: {}",
        last.len(),
        want.len(),
        logs.join("\n---\n")
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_keeps_the_log_short_and_silver_follows_past_removed_commits() -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(
        &stack,
        "logret",
        "CREATE TABLE {s}.acct (id int PRIMARY KEY, balance bigint NOT NULL);",
    )
    .toml(TOML)
    .env("WAL2DELTA__LAKE__LOG_RETENTION_S", "1")
    .build()
    .await?;
    let (name, pg, d) = (w.name, w.pg, w.d);
    let mut ingest = d.spawn_stage("capture,bronze", "ingest")?;
    let mut silver_run = d.spawn_stage("silver", "silver")?;
    let bronze = d.bronze("acct");
    let silver = d.silver("acct");
    pg.batch_execute(&format!(
        "INSERT INTO {name}.acct SELECT g, 0 FROM generate_series(1, 200) g"
    ))
    .await?;
    wait_equal(&pg, &name, &silver, &mut [&mut ingest, &mut silver_run]).await?;

    // Silver looks away; Bronze goes on committing, and its maintenance removes what is
    // older than a second behind each checkpoint, the commits Silver would read next too.
    let newest_seen = commit_versions(&bronze).last().copied().unwrap_or(0);
    {
        let _paused = Paused::new(&silver_run)?;
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut round = 0;
        loop {
            round += 1;
            pg.batch_execute(&format!(
                "UPDATE {name}.acct SET balance = balance + {round} WHERE id % 7 = {}",
                round % 7
            ))
            .await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let oldest = commit_versions(&bronze).first().copied().unwrap_or(0);
            if oldest > newest_seen + 1 && round >= 10 {
                break;
            }
            ingest.assert_running()?;
            ensure!(
                Instant::now() < deadline,
                "Bronze's log still starts at version {oldest} (Silver saw up to {newest_seen}); log: {}",
                ingest.log_text()
            );
        }
    }
    // Not "nothing new": Silver loads Bronze again and catches up.
    wait_equal(&pg, &name, &silver, &mut [&mut ingest, &mut silver_run]).await?;

    // Silver's own log is kept short too.
    let deadline = Instant::now() + Duration::from_secs(60);
    while commit_versions(&silver).first().copied().unwrap_or(0) == 0 {
        ensure!(
            Instant::now() < deadline,
            "Silver's log still holds version 0; log: {}",
            silver_run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let removed: u64 = std::fs::read_to_string(&ingest.log)?
        .lines()
        .filter_map(|l| {
            let n = l.split("log_entries_removed=").nth(1)?;
            n.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    ensure!(
        removed > 0,
        "Bronze maintenance reports the entries it removed: {}",
        ingest.log_text()
    );
    ensure!(
        ingest.stop()?.success(),
        "clean stop: {}",
        ingest.log_text()
    );
    ensure!(
        silver_run.stop()?.success(),
        "clean stop: {}",
        silver_run.log_text()
    );
    Ok(())
}
