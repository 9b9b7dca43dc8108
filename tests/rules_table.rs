//! Rules from a rules table in the source database (`[rules] table`, docs/rules.md) on the
//! real stack. The table is created with `migrations/rules_table.sql` and captured like
//! any other; the daemon (capture, bronze, silver, rules in one process) reads the rules
//! from its Silver table. Checked, against PostgreSQL's own evaluation of the conditions:
//! - the daemon starts before the rules table reaches Silver and loads the rules when it
//!   does; the stream's transitions of a workload are exactly the changes of the rule hits
//!   PostgreSQL computes after each transaction;
//! - a committed change of a rule (UPDATE of a condition) and a new rule (INSERT) are
//!   backfilled without a restart;
//! - a rule set with an invalid rule (unknown column) is refused, logged and counted
//!   once; the running set (not the valid part of the new one) goes on tagging changes;
//!   `rules validate` names the bad rule and `rules apply` refuses (the rules live in the
//!   table);
//! - deleting a rule makes its hits leave; the final hits equal PostgreSQL's evaluation.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use tokio_postgres::Client;
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::lake::{rule_hits, transitions};
use wal2delta_tests::metrics::{free_port, text};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.payments (id bigint PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL, note text);";

/// A rule as the rules table holds it and PostgreSQL evaluates it: id, condition.
type Rule = (&'static str, &'static str);

/// `(key, rule)` pairs.
type Hits = BTreeSet<(String, String)>;

/// `(key, rule, transition)`.
type Transition = (String, String, String);

fn key(id: i64) -> String {
    format!("{{\"id\":{id}}}")
}

/// The hits of `rules` over the current rows, as PostgreSQL evaluates the conditions.
async fn pg_hits(pg: &Client, s: &str, rules: &[Rule]) -> Result<Hits> {
    let mut hits = Hits::new();
    for (id, when) in rules {
        for row in pg
            .query(&format!("SELECT id FROM {s}.payments WHERE {when}"), &[])
            .await?
        {
            hits.insert((key(row.get(0)), (*id).to_owned()));
        }
    }
    Ok(hits)
}

/// The transitions from `before` to `after`, ordered as the lake's query orders one
/// transaction's: by key, `left` before `entered`, by rule.
fn diff(before: &Hits, after: &Hits) -> Vec<Transition> {
    let mut out: Vec<Transition> = before
        .difference(after)
        .map(|(k, r)| (k.clone(), r.clone(), "left".to_owned()))
        .chain(
            after
                .difference(before)
                .map(|(k, r)| (k.clone(), r.clone(), "entered".to_owned())),
        )
        .collect();
    out.sort_by(|a, b| (&a.0, &b.2, &a.1).cmp(&(&b.0, &a.2, &b.1)));
    out
}

/// Runs `sqls`, one transaction each, and returns the transitions PostgreSQL's evaluation
/// of `rules` expects, transaction by transaction.
async fn workload(pg: &Client, s: &str, rules: &[Rule], sqls: &[&str]) -> Result<Vec<Transition>> {
    let mut want = Vec::new();
    let mut before = pg_hits(pg, s, rules).await?;
    for sql in sqls {
        pg.batch_execute(&sql.replace("{s}", s)).await?;
        let after = pg_hits(pg, s, rules).await?;
        want.extend(diff(&before, &after));
        before = after;
    }
    Ok(want)
}

fn sorted(mut v: Vec<Transition>) -> Vec<Transition> {
    v.sort();
    v
}

/// `wal2delta_rules_reload_failures_total`, 0 while absent.
async fn reload_failures(port: u16) -> Result<f64> {
    Ok(text(port)
        .await?
        .lines()
        .find_map(|l| l.strip_prefix("wal2delta_rules_reload_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// The versions `rules/versions` records.
fn versions_recorded(lake: &std::path::Path) -> Result<usize> {
    let path = lake.join("rules/versions");
    if !path.join("_delta_log").is_dir() {
        return Ok(0);
    }
    Ok(wal2delta_tests::lake::duckdb_i64(&format!(
        "SELECT count(*) FROM delta_scan('{}')",
        path.display()
    ))? as usize)
}

fn full_log(run: &StageProcess) -> String {
    std::fs::read_to_string(&run.log).unwrap_or_default()
}

async fn wait_log(run: &mut StageProcess, what: &str, needle: &str) -> Result<()> {
    let log = run.log.clone();
    run.wait_for(what, &true, || {
        Ok(std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(needle))
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_come_from_a_captured_table_and_change_by_committed_changes() -> Result<()> {
    let stack = Stack::from_env();
    let port = free_port()?;
    let ddl = format!(
        "{TABLES} SET search_path TO {{s}}; {} RESET search_path;",
        include_str!("../migrations/rules_table.sql")
    );
    let w = Scenario::new(&stack, "rulestab", &ddl)
        .env("WAL2DELTA__RULES__TABLE", "{s}.wal2delta_rules")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .env("WAL2DELTA__METRICS__LISTEN", &format!("127.0.0.1:{port}"))
        .build()
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let lake = d.lake();
    let payments = format!("{s}.payments");

    // Two rules, committed after setup (no snapshot): the daemon starts before the rules
    // table has a Silver table, and loads the rules when it appears.
    pg.batch_execute(&format!(
        "INSERT INTO {s}.wal2delta_rules (id, \"table\", \"when\") VALUES ('big', '{payments}', 'amount > 1000'), ('usd', '{payments}', 'currency = ''USD''')"
    ))
    .await?;
    let mut running: Vec<Rule> = vec![("big", "amount > 1000"), ("usd", "currency = 'USD'")];
    let out = d.command(&["rules", "validate"])?;
    ensure!(
        out.status.code() == Some(2)
            && String::from_utf8_lossy(&out.stderr).contains("has no Silver table yet"),
        "validate before the rules table reaches Silver: {out:?}"
    );
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    wait_log(
        &mut run,
        "rules installed from the table",
        "new rules installed from the rules table",
    )
    .await?;
    let log = full_log(&run);
    ensure!(
        log.contains("the rules table has no Silver table yet"),
        "the start without the rules table is logged: {log}"
    );

    // The stream, against PostgreSQL's evaluation after each transaction.
    let mut stream = workload(
        &pg,
        &s,
        &running,
        &[
            "INSERT INTO {s}.payments VALUES (1, 2000, 'EUR', 'a')",
            "INSERT INTO {s}.payments VALUES (2, 50, 'USD', 'b'), (3, 70, 'EUR', NULL)",
            "UPDATE {s}.payments SET amount = 5000 WHERE id = 2",
            "UPDATE {s}.payments SET amount = 10 WHERE id = 1",
            "BEGIN; UPDATE {s}.payments SET currency = 'GBP' WHERE id = 2; UPDATE {s}.payments SET currency = 'USD' WHERE id = 2; COMMIT",
            "INSERT INTO {s}.payments VALUES (4, 3000, 'USD', 'c')",
            "DELETE FROM {s}.payments WHERE id = 4",
            "INSERT INTO {s}.payments VALUES (5, 20, 'EUR', 'd')",
        ],
    )
    .await?;
    ensure!(
        stream.len() >= 6,
        "the workload makes transitions: {stream:?}"
    );
    run.wait_for("stream transitions", &stream, || {
        transitions(&lake, "stream")
    })
    .await?;

    // A committed change of a condition and a new rule: backfilled, no restart.
    let before = pg_hits(&pg, &s, &running).await?;
    let edited = Instant::now();
    pg.batch_execute(&format!(
        "BEGIN; UPDATE {s}.wal2delta_rules SET \"when\" = 'currency = ''EUR''', version = 2 WHERE id = 'usd'; INSERT INTO {s}.wal2delta_rules VALUES ('small', '{payments}', 'amount < 100', 1, true); COMMIT"
    ))
    .await?;
    running = vec![
        ("big", "amount > 1000"),
        ("usd", "currency = 'EUR'"),
        ("small", "amount < 100"),
    ];
    let mut backfill = diff(&before, &pg_hits(&pg, &s, &running).await?);
    ensure!(
        backfill.iter().any(|t| t.2 == "left") && backfill.iter().any(|t| t.2 == "entered"),
        "the edit makes rows enter and leave: {backfill:?}"
    );
    backfill = sorted(backfill);
    run.wait_for("backfill of the edit", &backfill, || {
        transitions(&lake, "backfill")
    })
    .await?;
    eprintln!(
        "a committed rule edit is backfilled in the lake {:?} after its commit",
        edited.elapsed()
    );
    ensure!(reload_failures(port).await? == 0.0);

    // An invalid rule (unknown column), committed with a change of a valid one: the whole
    // new set is refused and the running set goes on (`small` keeps `amount < 100`).
    pg.batch_execute(&format!(
        "BEGIN; INSERT INTO {s}.wal2delta_rules VALUES ('bad', '{payments}', 'colour = ''red''', 1, true); UPDATE {s}.wal2delta_rules SET \"when\" = 'amount < 50', version = 2 WHERE id = 'small'; COMMIT"
    ))
    .await?;
    wait_log(
        &mut run,
        "the refusal",
        "the new rules of the rules table are not installed",
    )
    .await?;
    let log = full_log(&run);
    ensure!(
        log.contains("rule \\\"bad\\\"") || log.contains("rule \"bad\""),
        "the refusal names the bad rule: {log}"
    );
    ensure!(
        reload_failures(port).await? == 1.0,
        "one refusal counted once"
    );
    let out = d.command(&["rules", "validate"])?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "validate: {out:?}");
    ensure!(
        err.contains("rule \"bad\"") && err.contains("colour"),
        "{err}"
    );
    let staged = d.dir.join("staged.toml");
    std::fs::write(&staged, "")?;
    let out = d.command(&["rules", "apply", &staged.display().to_string()])?;
    ensure!(out.status.code() == Some(2), "apply: {out:?}");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("change them there"));
    let changed = Instant::now();
    stream.extend(
        workload(
            &pg,
            &s,
            &running,
            &[
                // 70: `small` under the running set, not under the refused one.
                "INSERT INTO {s}.payments VALUES (6, 70, 'GBP', 'e')",
                "UPDATE {s}.payments SET amount = 9000 WHERE id = 3",
            ],
        )
        .await?,
    );
    ensure!(
        stream.contains(&(key(6), "small".into(), "entered".into())),
        "{stream:?}"
    );
    run.wait_for("stream under the running set", &stream, || {
        transitions(&lake, "stream")
    })
    .await?;
    eprintln!(
        "for comparison, data changes are tagged in the lake {:?} after their commits",
        changed.elapsed()
    );

    // A restart with the invalid rule still in the table does not stop the start (its
    // fix comes through the daemon), and changes nothing: the rules recorded in
    // rules/versions stay in effect (`small` keeps `amount < 100`, nothing is
    // backfilled), and the refused set is logged and counted again.
    ensure!(run.stop()?.success());
    ensure!(
        versions_recorded(&lake)? == 3,
        "none at the first start, the first set and the edit are recorded, the refused set is not"
    );
    run = d.spawn_stage("capture,bronze,silver,rules", "run2")?;
    wait_log(
        &mut run,
        "the refusal after the restart",
        "the new rules of the rules table are not installed",
    )
    .await?;
    let log = full_log(&run);
    ensure!(
        log.contains("rules loaded from rules/versions") && log.contains("rule \"bad\""),
        "the start loads the recorded rules and names the invalid rule: {log}"
    );
    let counted = Instant::now();
    while reload_failures(port).await.unwrap_or(0.0) != 1.0 {
        ensure!(
            counted.elapsed() < Duration::from_secs(30),
            "the refusal after the start is counted"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let stream_now = stream.clone();
    stream.extend(
        workload(
            &pg,
            &s,
            &running,
            &["UPDATE {s}.payments SET amount = 80 WHERE id = 3"],
        )
        .await?,
    );
    ensure!(
        stream.len() > stream_now.len(),
        "the update makes transitions under the recorded rules: {stream:?}"
    );
    run.wait_for("stream after the restart", &stream, || {
        transitions(&lake, "stream")
    })
    .await?;
    ensure!(
        transitions(&lake, "backfill")? == backfill,
        "the restart backfilled nothing"
    );

    // Deleting `big` (and the bad rule) installs the rest: big's hits leave.
    let before = pg_hits(&pg, &s, &running).await?;
    let deleted = Instant::now();
    pg.batch_execute(&format!(
        "DELETE FROM {s}.wal2delta_rules WHERE id IN ('big', 'bad')"
    ))
    .await?;
    running = vec![("usd", "currency = 'EUR'"), ("small", "amount < 50")];
    let removal = diff(&before, &pg_hits(&pg, &s, &running).await?);
    ensure!(
        removal.iter().any(|t| t.1 == "big" && t.2 == "left"),
        "{removal:?}"
    );
    backfill.extend(removal);
    let backfill = sorted(backfill);
    run.wait_for("backfill of the removal", &backfill, || {
        transitions(&lake, "backfill")
    })
    .await?;
    eprintln!(
        "a deleted rule's hits leave in the lake {:?} after the commit",
        deleted.elapsed()
    );
    let want_hits: Vec<(String, String)> = pg_hits(&pg, &s, &running).await?.into_iter().collect();
    run.wait_for("hits equal PostgreSQL's evaluation", &want_hits, || {
        rule_hits(&lake)
    })
    .await?;
    let list = d.command(&["rules", "list"])?;
    let text = String::from_utf8_lossy(&list.stdout);
    ensure!(list.status.success(), "{list:?}");
    ensure!(
        text.lines()
            .any(|l| l.starts_with("usd ") && l.contains(" 2 ") && l.contains("active")),
        "rules list shows the table's rules: {text}"
    );
    ensure!(!text.lines().any(|l| l.starts_with("big ")), "{text}");
    ensure!(reload_failures(port).await? == 1.0);
    ensure!(run.stop()?.success());
    Ok(())
}
