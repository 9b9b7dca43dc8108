//! A rules-table edit takes effect at its own commit position (issue 38, defect 8;
//! docs/rules.md, "Rule changes without restart"), on the real stack.
//!
//! One history, computed twice: a run with small rounds (`max_atomic_transaction_rows`
//! cuts a large transaction into pieces, a short interval), a rule edited right after a
//! large transaction and again inside a transaction that changes the data too, and a
//! SIGKILL; then a clean run of Bronze, Silver and rules from the same Kafka topics into a
//! fresh lake, with the defaults. `rules/transitions` of both are equal one for one, LSNs
//! included; `rules/versions` records each edit at the same position in both; the
//! backfill of an edit carries the edit's position; the final hits equal PostgreSQL's
//! evaluation of the final rules.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{ensure, Result};
use tokio_postgres::Client;
use wal2delta_tests::lake::{duckdb, rule_hits};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.payments (id bigint PRIMARY KEY, amount bigint NOT NULL);";

/// (rule_id, rule_version, key, transition, lsn, origin), sorted.
type Exact = Vec<(String, i64, String, String, i64, String)>;

fn exact(lake: &std::path::Path) -> Result<Exact> {
    let path = lake.join("rules/transitions");
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let rows = duckdb(&format!(
        "SELECT rule_id, rule_version, key, transition, lsn, origin FROM delta_scan('{}') ORDER BY ALL",
        path.display()
    ))?;
    Ok(rows
        .iter()
        .map(|r| {
            let s = |i: usize| r[i].as_str().unwrap_or_default().to_owned();
            let n = |i: usize| r[i].as_i64().unwrap_or(i64::MIN);
            (s(0), n(1), s(2), s(3), n(4), s(5))
        })
        .collect())
}

/// The positions `rules/versions` records, in order.
fn versions(lake: &std::path::Path) -> Result<Vec<i64>> {
    let path = lake.join("rules/versions");
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let rows = duckdb(&format!(
        "SELECT position FROM delta_scan('{}') ORDER BY seq",
        path.display()
    ))?;
    Ok(rows.iter().filter_map(|r| r[0].as_i64()).collect())
}

/// The (key, rule) hits PostgreSQL computes for `rules` (id, condition).
async fn pg_hits(pg: &Client, s: &str, rules: &[(&str, &str)]) -> Result<Vec<(String, String)>> {
    let mut hits = BTreeSet::new();
    for (id, when) in rules {
        for row in pg
            .query(&format!("SELECT id FROM {s}.payments WHERE {when}"), &[])
            .await?
        {
            let key: i64 = row.get(0);
            hits.insert((format!("{{\"id\":{key}}}"), (*id).to_owned()));
        }
    }
    Ok(hits.into_iter().collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_edit_takes_effect_at_its_commit_position_whatever_the_rounds() -> Result<()> {
    let stack = Stack::from_env();
    let ddl = format!(
        "{TABLES} SET search_path TO {{s}}; {} RESET search_path;",
        include_str!("../migrations/rules_table.sql")
    );
    let w = Scenario::new(&stack, "ruleedit", &ddl)
        .env("WAL2DELTA__RULES__TABLE", "{s}.wal2delta_rules")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "150")
        .env("WAL2DELTA__SILVER__MAX_ATOMIC_TRANSACTION_ROWS", "60")
        .build()
        .await?;
    let (s, pg, mut d) = (w.name, w.pg, w.d);
    let payments = format!("{s}.payments");
    let run_sql = |sql: String| {
        let pg = &pg;
        async move { pg.batch_execute(&sql).await }
    };

    run_sql(format!(
        "INSERT INTO {s}.wal2delta_rules (id, \"table\", \"when\") VALUES ('big', '{payments}', 'amount > 1000'), ('odd', '{payments}', 'amount % 2 = 1')"
    ))
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    // 300 rows in one transaction: applied in pieces of 60.
    run_sql(format!(
        "INSERT INTO {s}.payments SELECT i, i * 5 FROM generate_series(1, 300) i"
    ))
    .await?;
    for k in 0..12 {
        run_sql(format!(
            "UPDATE {s}.payments SET amount = amount + {} WHERE id % 13 = {}",
            7 * k + 3,
            k % 13
        ))
        .await?;
        if k == 6 {
            // A large transaction, then at once the edit: rounds are still applying
            // the pieces when the edit commits.
            run_sql(format!("UPDATE {s}.payments SET amount = amount * 2 + 1")).await?;
            run_sql(format!(
                "BEGIN; UPDATE {s}.wal2delta_rules SET \"when\" = 'amount > 500', version = 2 WHERE id = 'big'; \
                 INSERT INTO {s}.wal2delta_rules VALUES ('mid', '{payments}', 'amount BETWEEN 100 AND 400', 1, true); COMMIT"
            ))
            .await?;
        }
        if k == 8 {
            // A key deleted and inserted again in one transaction.
            run_sql(format!(
                "BEGIN; DELETE FROM {s}.payments WHERE id = 5; INSERT INTO {s}.payments VALUES (5, 2001); UPDATE {s}.payments SET amount = 150 WHERE id = 5; COMMIT"
            ))
            .await?;
            run.kill9();
            run = d.spawn_stage("capture,bronze,silver,rules", "run2")?;
        }
    }
    // An edit in a transaction that changes the data too: its own changes are tagged under
    // the rules before it.
    run_sql(format!(
        "BEGIN; UPDATE {s}.payments SET amount = amount + 1 WHERE id < 50; \
         UPDATE {s}.wal2delta_rules SET \"when\" = 'amount % 3 = 0', version = 2 WHERE id = 'odd'; COMMIT"
    ))
    .await?;
    for k in 0..4 {
        run_sql(format!(
            "UPDATE {s}.payments SET amount = amount - {} WHERE id % 7 = {k}",
            11 * k + 2
        ))
        .await?;
    }
    let rules = [
        ("big", "amount > 500"),
        ("odd", "amount % 3 = 0"),
        ("mid", "amount BETWEEN 100 AND 400"),
    ];
    let want = pg_hits(&pg, &s, &rules).await?;
    let lake = d.lake();
    run.wait_for_within(
        "the hits of the final rules",
        &want,
        Duration::from_secs(240),
        || rule_hits(&lake),
    )
    .await?;
    let first = exact(&lake)?;
    let recorded = versions(&lake)?;
    ensure!(recorded.len() == 3, "three versions recorded: {recorded:?}");
    // Each edit's backfill carries the edit's position.
    for (i, at) in recorded.iter().enumerate().skip(1) {
        let n = first
            .iter()
            .filter(|t| t.5 == "backfill" && t.4 == *at)
            .count();
        ensure!(
            n > 0,
            "edit {i} at {at} makes backfill transitions: {first:?}"
        );
    }
    ensure!(
        first
            .iter()
            .filter(|t| t.5 == "backfill")
            .all(|t| recorded.contains(&t.4)),
        "every backfill transition is at an edit's position"
    );
    run.stop()?;

    // The same history from the topics, in a fresh lake, with the default rounds.
    let lake2 = d.dir.join("lake2");
    d.env.retain(|(k, _)| !k.starts_with("WAL2DELTA__SILVER__"));
    d.env.push((
        "WAL2DELTA__LAKE__URI".into(),
        format!("file://{}", lake2.display()),
    ));
    d.env
        .push(("WAL2DELTA__BRONZE__GROUP_ID".into(), format!("{s}-clean")));
    let mut clean = d.spawn_stage("bronze,silver,rules", "clean")?;
    clean
        .wait_for_within(
            "the clean run's hits",
            &want,
            Duration::from_secs(240),
            || rule_hits(&lake2),
        )
        .await?;
    clean
        .wait_for_within(
            "the clean run's transitions",
            &first,
            Duration::from_secs(60),
            || exact(&lake2),
        )
        .await?;
    ensure!(versions(&lake2)? == recorded, "the same edit positions");
    clean.stop()?;
    Ok(())
}
