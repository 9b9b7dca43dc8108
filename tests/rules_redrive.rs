//! A row re-driven from quarantine (`wal2delta quarantine replay`, docs/silver.md) goes
//! through the rules like any other (issue 38, defect 4): its hits and transitions appear
//! at the rules' next round, each once, and later changes of it are tagged from there.

use std::time::Duration;

use anyhow::{ensure, Result};
use wal2delta_tests::lake::{duckdb, rule_hits, scan, transitions};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.payments (id bigint PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL);";

const CHECK: &str =
    "[[silver.checks]]\nname = \"positive\"\ntable = \"{s}.payments\"\nsql = \"amount >= 0\"\n";

fn rules(s: &str) -> String {
    format!(
        "[[rule]]\nid = \"negative\"\ntable = \"{s}.payments\"\nwhen = \"amount < 0\"\n\n\
         [[rule]]\nid = \"big\"\ntable = \"{s}.payments\"\nwhen = \"amount > 1000\"\n"
    )
}

fn hit(id: i64, rule: &str) -> (String, String) {
    (format!("{{\"id\":{id}}}"), rule.to_owned())
}

fn entered(id: i64, rule: &str) -> (String, String, String) {
    let (k, r) = hit(id, rule);
    (k, r, "entered".to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_re_driven_from_quarantine_is_tagged_once() -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "rulesredrive", TABLES)
        .toml(CHECK)
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .build_with_rules(rules)
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let lake = d.lake();
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.payments SELECT g, g * 100, 'EUR' FROM generate_series(1, 5) g;
         INSERT INTO {s}.payments VALUES (6, 2000, 'USD');
         UPDATE {s}.payments SET amount = -5 WHERE id BETWEEN 1 AND 3;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let records = lake.join("quarantine").join("records");
    run.wait_for("the three negative changes quarantined", &3, || {
        if !records.join("_delta_log").is_dir() {
            return Ok(0);
        }
        let n = duckdb(&format!(
            "SELECT count(*) FROM {} WHERE stage = 'silver' AND check_name = 'positive'",
            scan(&records)
        ))?;
        Ok(n[0][0].as_i64().unwrap_or(-1))
    })
    .await?;
    run.wait_for("the hit of id 6", &vec![hit(6, "big")], || rule_hits(&lake))
        .await?;
    run.stop()?;

    // The check is dropped; the stage stopped, as docs/silver.md asks, the rows re-driven.
    let config = d.dir.join("wal2delta.toml");
    let text = std::fs::read_to_string(&config)?;
    let check = text.find("[[silver.checks]]").expect("the check");
    std::fs::write(&config, &text[..check])?;
    let out = d.command(&["quarantine", "replay"])?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success() && stdout.contains("3 re-driven, 0 still open"),
        "quarantine replay: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The rules' next round tags the re-driven rows: once each, nothing else moves.
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run2")?;
    let want = vec![
        hit(1, "negative"),
        hit(2, "negative"),
        hit(3, "negative"),
        hit(6, "big"),
    ];
    run.wait_for("the re-driven rows' hits", &want, || rule_hits(&lake))
        .await?;
    let backfill = transitions(&lake, "backfill")?;
    let stream = transitions(&lake, "stream")?;
    let tagged: Vec<_> = backfill.iter().chain(&stream).cloned().collect();
    let mut sorted = tagged.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![
            entered(1, "negative"),
            entered(2, "negative"),
            entered(3, "negative"),
            entered(6, "big"),
        ],
        "each hit entered once"
    );

    // A later change of a re-driven row leaves from the tagged state, and the hits equal
    // the rules evaluated by PostgreSQL on the source rows.
    pg.batch_execute(&format!("UPDATE {s}.payments SET amount = 50 WHERE id = 1"))
        .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let mut expected = Vec::new();
    for row in pg
        .query(
            &format!("SELECT id, amount < 0, amount > 1000 FROM {s}.payments ORDER BY id"),
            &[],
        )
        .await?
    {
        let id: i64 = row.get(0);
        if row.get::<_, bool>(1) {
            expected.push(hit(id, "negative"));
        }
        if row.get::<_, bool>(2) {
            expected.push(hit(id, "big"));
        }
    }
    expected.sort();
    run.wait_for("the hits of the source rows", &expected, || {
        rule_hits(&lake)
    })
    .await?;
    let left: Vec<_> = transitions(&lake, "stream")?
        .into_iter()
        .filter(|t| t.2 == "left")
        .collect();
    assert_eq!(
        left,
        vec![(
            hit(1, "negative").0,
            "negative".to_owned(),
            "left".to_owned()
        )]
    );
    run.stop()?;
    Ok(())
}
