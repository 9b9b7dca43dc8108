//! Silver's masking, quality checks, quarantine and replay on the real stack: rows that
//! fail a check go to quarantine (exactly those, once each) and not to Silver; no file
//! under Silver holds a raw value of a masked column; `replay --layer silver` rebuilds the
//! same table; `quarantine replay` re-drives records once the check or the data is fixed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::Value;
use wal2delta_tests::daemon::{Daemon, StageProcess};
use wal2delta_tests::lake::{duckdb, scan};
use wal2delta_tests::{Scenario, Stack, World};

const KEY_FILE: &str = "/tmp/wal2delta-test-mask-key";

const TOML: &str = r#"[bronze]
group_id = "{s}"
max_batch_ms = 300
topic_refresh_ms = 500
[silver]
interval_ms = 300
mask_key_file = "/tmp/wal2delta-test-mask-key"
[silver.mask]
"{s}.pay.card" = "keep_last:4"
"{s}.pay.email" = "hash"
[[silver.checks]]
name = "currency_present"
table = "{s}.pay"
not_null = "currency"
[[silver.checks]]
name = "known_currency"
table = "{s}.pay"
column = "currency"
allowed = ["EUR", "USD"]
[[silver.checks]]
name = "signed"
table = "{s}.pay"
sql = "CAST(amount AS DOUBLE) >= 0 OR note = 'refund'"
"#;

fn silver_rows(d: &Daemon) -> Result<Vec<Vec<Value>>> {
    duckdb(&format!(
        "SELECT id, card, email, amount, currency, note, _commit_lsn, _ordinal FROM {} ORDER BY id",
        scan(&d.silver("pay"))
    ))
}

/// Open Silver quarantine records as (id column of the key, check name).
fn quarantined(d: &Daemon) -> Result<BTreeSet<(i64, String)>> {
    let dir = d.lake().join("quarantine").join("records");
    if !dir.exists() {
        return Ok(BTreeSet::new());
    }
    let rows = duckdb(&format!(
        "SELECT CAST(json_extract_string(decode(key), '$.id') AS BIGINT), check_name FROM {} WHERE stage = 'silver'",
        scan(&dir)
    ))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap_or(-1),
                r[1].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect())
}

async fn wait_for<T: std::fmt::Debug>(
    what: &str,
    run: &mut StageProcess,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < Duration::from_secs(120) {
        run.assert_running()?;
        match probe() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!(
        "{what} never happened (last error {last:?}); log: {}",
        run.log_text()
    )
}

fn ids(rows: &[Vec<Value>]) -> Vec<i64> {
    rows.iter().filter_map(|r| r[0].as_i64()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn checks_quarantine_masking_and_replay() -> Result<()> {
    let stack = Stack::from_env();
    std::fs::write(KEY_FILE, "a test key of at least 16 bytes\n")?;
    let World { name, pg, d, .. } = Scenario::new(&stack, "pol", "CREATE TABLE {s}.pay (id int PRIMARY KEY, card text, email text, amount numeric(12,2), currency text, note text);")
        .toml(TOML)
        .partitions(2)
        .build()
        .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let s = &name;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.pay SELECT g, '41111111' || lpad(g::text, 8, '0'), 'user' || g || '@example.com', g * 1.5, 'EUR', 'n' FROM generate_series(1, 40) g;
         INSERT INTO {s}.pay SELECT g, '41111111' || lpad(g::text, 8, '0'), 'user' || g || '@example.com', 1, NULL, 'n' FROM generate_series(41, 45) g;
         INSERT INTO {s}.pay SELECT g, '41111111' || lpad(g::text, 8, '0'), 'user' || g || '@example.com', 1, 'GBP', 'n' FROM generate_series(46, 48) g;
         UPDATE {s}.pay SET amount = -5 WHERE id BETWEEN 1 AND 5;
         UPDATE {s}.pay SET amount = -1, note = 'refund' WHERE id BETWEEN 6 AND 8;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;

    // Exactly the failing changes are quarantined, each with the first check it failed.
    let mut want: BTreeSet<(i64, String)> = BTreeSet::new();
    want.extend((41..=45).map(|i| (i, "currency_present".to_owned())));
    want.extend((46..=48).map(|i| (i, "known_currency".to_owned())));
    want.extend((1..=5).map(|i| (i, "signed".to_owned())));
    wait_for("the quarantine of 13 rows", &mut run, || {
        let q = quarantined(&d)?;
        Ok((q.len() >= want.len()).then_some(q))
    })
    .await
    .map(|q| assert_eq!(q, want, "quarantine holds exactly the failing rows"))?;

    // Silver: ids 1..40, ids 1..5 still at their passing amount, 6..8 refunds applied.
    let rows = wait_for("Silver with the refunds", &mut run, || {
        let rows = silver_rows(&d)?;
        let refunds = rows.iter().filter(|r| r[5] == "refund").count();
        Ok((rows.len() == 40 && refunds == 3).then_some(rows))
    })
    .await?;
    assert_eq!(ids(&rows), (1..=40).collect::<Vec<_>>());
    for r in &rows {
        let id = r[0].as_i64().unwrap_or_default();
        let amount = r[3].as_str().unwrap_or_default().to_owned();
        if id <= 5 {
            assert_eq!(
                amount,
                format!("{:.2}", id as f64 * 1.5),
                "id {id} kept its passing amount"
            );
        }
        let card = r[1].as_str().unwrap_or_default();
        assert_eq!(card, format!("****{:04}", id), "card keeps only its last 4");
        let email = r[2].as_str().unwrap_or_default();
        assert!(
            email.len() == 32 && email.chars().all(|c| c.is_ascii_hexdigit()),
            "email is hashed: {email}"
        );
    }

    // No file under silver/ or quarantine/ holds a raw card number or e-mail address.
    for dir in [d.lake().join("silver"), d.lake().join("quarantine")] {
        let leaks = duckdb(&format!(
            "SELECT count(*) FROM read_parquet('{}/**/*.parquet', union_by_name = true) t WHERE CAST(t AS VARCHAR) LIKE '%41111111%' OR CAST(t AS VARCHAR) LIKE '%@example.com%'",
            dir.display()
        ))?;
        assert_eq!(
            leaks[0][0],
            Value::from(0),
            "raw values under {}",
            dir.display()
        );
    }

    // Replay equals incremental (the stage stopped so nothing moves meanwhile).
    run.stop()?;
    let incremental = silver_rows(&d)?;
    let out = d.command(&[
        "replay",
        "--layer",
        "silver",
        "--table",
        &format!("{s}.pay"),
    ])?;
    assert!(
        out.status.success(),
        "replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        silver_rows(&d)?,
        incremental,
        "the rebuilt Silver differs from the incremental one"
    );
    assert_eq!(
        quarantined(&d)?.len(),
        13,
        "the replay quarantined rows twice"
    );

    // The data is fixed at the source (currency set), and the check `signed` is dropped
    // from the config: `quarantine replay` re-drives ids 1..5, supersedes 41..45 (the
    // fixed rows arrive as new changes) and leaves 46..48 open.
    let config = d.lake().parent().expect("test dir").join("wal2delta.toml");
    let text = std::fs::read_to_string(&config)?;
    let signed = text
        .find("[[silver.checks]]\nname = \"signed\"")
        .expect("signed check");
    std::fs::write(&config, &text[..signed])?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run2")?;
    pg.batch_execute(&format!(
        "UPDATE {s}.pay SET currency = 'USD' WHERE id BETWEEN 41 AND 45;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    wait_for("the fixed rows in Silver", &mut run, || {
        Ok((silver_rows(&d)?.len() == 45).then_some(()))
    })
    .await?;
    run.stop()?;
    let out = d.command(&["quarantine", "replay"])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "46..48 still fail: {text}");
    assert!(text.contains("10 re-driven, 3 still open"), "{text}");
    let rows = silver_rows(&d)?;
    for r in rows
        .iter()
        .filter(|r| r[0].as_i64().is_some_and(|i| i <= 5))
    {
        assert_eq!(
            r[3],
            Value::from("-5.00"),
            "the re-driven change entered Silver"
        );
    }
    let again = d.command(&["quarantine", "replay"])?;
    assert!(String::from_utf8_lossy(&again.stdout).contains("0 re-driven, 3 still open"));
    let status = d.command(&["status", "--json"])?;
    let doc: Value = serde_json::from_slice(&status.stdout)?;
    assert_eq!(
        doc["quarantine"]["silver/check_failed"],
        Value::from(3),
        "{doc}"
    );
    assert!(
        doc["stages"]["silver"]["tables"][0]["watermark_lsn"].is_string(),
        "{doc}"
    );

    Ok(())
}

/// Issue 11, defect 14: changing a key column's masking to `hash` rebuilds the table and
/// rewrites its tombstones too. They used to keep the raw keys of every delete (the
/// rebuilt tombstones were merged into the old ones), and the old files stayed on disk.
#[tokio::test(flavor = "multi_thread")]
async fn hashing_a_key_column_rewrites_the_tombstones() -> Result<()> {
    let stack = Stack::from_env();
    std::fs::write(KEY_FILE, "a test key of at least 16 bytes\n")?;
    let toml = "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n\
                [silver]\ninterval_ms = 300\nmask_key_file = \"/tmp/wal2delta-test-mask-key\"\n";
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "polkey",
        "CREATE TABLE {s}.acct (id int PRIMARY KEY, v text);",
    )
    .toml(toml)
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let s = &name;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.acct SELECT g, 'v' || g FROM generate_series(1, 20) g;
         DELETE FROM {s}.acct WHERE id <= 5;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let tombs = d
        .lake()
        .join("silver/_wal2delta/tombstones")
        .join(s)
        .join("acct");
    let all_files = format!("read_parquet('{}/*.parquet')", tombs.display());
    wait_for("15 rows and 5 raw tombstones", &mut run, || {
        let rows = duckdb(&format!("SELECT count(*) FROM {}", scan(&d.silver("acct"))))?;
        let raw = duckdb(&format!(
            "SELECT count(*) FROM {} WHERE CAST(id AS BIGINT) <= 5",
            scan(&tombs)
        ))
        .unwrap_or_default();
        Ok(
            (rows == vec![vec![serde_json::json!(15)]] && raw == vec![vec![serde_json::json!(5)]])
                .then_some(()),
        )
    })
    .await?;
    run.stop()?;

    let config = d.lake().parent().expect("test dir").join("wal2delta.toml");
    let mut text = std::fs::read_to_string(&config)?;
    text.push_str(&format!("[silver.mask]\n\"{s}.acct.id\" = \"hash\"\n"));
    std::fs::write(&config, text)?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run2")?;
    wait_for("the rebuilt table", &mut run, || {
        let rows = duckdb(&format!(
            "SELECT count(*) FROM {} WHERE length(CAST(id AS VARCHAR)) = 32",
            scan(&d.silver("acct"))
        ))?;
        Ok((rows == vec![vec![serde_json::json!(15)]]).then_some(()))
    })
    .await?;
    // Every file left under the tombstones, referenced or not, holds the 5 deletes keyed
    // by hash: no raw key.
    let tombstones = duckdb(&format!(
        "SELECT CAST(id AS VARCHAR) FROM {all_files} ORDER BY 1"
    ))?;
    if tombstones.len() != 5
        || tombstones
            .iter()
            .any(|r| r[0].as_str().is_none_or(|id| id.len() != 32))
    {
        bail!("tombstone files after the rebuild: {tombstones:?}");
    }
    run.stop()?;
    Ok(())
}
