//! The rules and Gold in a chaos run: a rules table with a rule on `acct` and a rule on
//! `"Order Items"` that looks up `doc`, edited twice while the faults go on; a keyed Gold
//! model over `acct`. After the drain: the hits equal PostgreSQL's evaluation of the
//! final rules, every (rule, key)'s transitions alternate and none repeats, and Gold
//! equals its model computed by DuckDB over Silver.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::checks::Report;
use crate::daemon::Daemon;
use crate::lake::{duckdb, rule_hits};
use crate::Stack;

/// The rules table, as `migrations/rules_table.sql` makes it (created before `setup`, so
/// it is published).
pub(super) fn ddl(s: &str) -> String {
    format!(
        r#"CREATE TABLE {s}.wal2delta_rules (id text PRIMARY KEY, "table" text NOT NULL, "when" text NOT NULL,
             version integer NOT NULL DEFAULT 1, active boolean NOT NULL DEFAULT true, lookups jsonb);"#
    )
}

/// The first rules (committed after `setup`, so they are streamed).
pub(super) fn first_rules(s: &str) -> String {
    format!(
        r#"INSERT INTO {s}.wal2delta_rules (id, "table", "when", lookups) VALUES
             ('rich', '{s}.acct', 'balance > 500', NULL),
             ('busy', '{s}."Order Items"', 'qty > 4 AND d.title LIKE ''%+%''', '{lookup}');"#,
        lookup = lookup(s)
    )
}

fn lookup(s: &str) -> String {
    format!(r#"{{"d": {{"table": "{s}.doc", "on": {{"order_id": "id"}}}}}}"#)
}

/// The rule edits of a run, each with the share of the run's duration it is due at.
pub(super) fn edits(s: &str) -> Vec<(f64, String)> {
    vec![
        (
            0.4,
            format!(
                "UPDATE {s}.wal2delta_rules SET \"when\" = 'balance > 700', version = 2 WHERE id = 'rich'"
            ),
        ),
        (
            0.75,
            format!(
                "BEGIN; INSERT INTO {s}.wal2delta_rules (id, \"table\", \"when\") VALUES ('low', '{s}.acct', 'balance < 50'); \
                 UPDATE {s}.wal2delta_rules SET \"when\" = 'qty > 6 AND d.title LIKE ''%+%''', version = 2 WHERE id = 'busy'; COMMIT"
            ),
        ),
    ]
}

/// The Gold model: accounts per bucket of ids, keyed by the bucket.
pub(super) fn models(dir: &Path, s: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("acct_buckets.sql"),
        format!(
            "-- key: bucket\n-- key of {s}.acct: id % 10\n\
             SELECT id % 10 AS bucket, count(*) AS n, sum(balance) AS total FROM {s}.acct GROUP BY id % 10\n"
        ),
    )?;
    Ok(())
}

/// The hits PostgreSQL computes for the rules table's active rules.
async fn pg_hits(stack: &Stack, s: &str) -> Result<Vec<(String, String)>> {
    let pg = stack.connect().await?;
    let mut hits = BTreeSet::new();
    for r in pg
        .query(
            &format!("SELECT id, \"table\", \"when\" FROM {s}.wal2delta_rules WHERE active"),
            &[],
        )
        .await?
    {
        let (id, table, when): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        if table.ends_with(".acct") {
            for row in pg
                .query(&format!("SELECT id FROM {s}.acct WHERE {when}"), &[])
                .await?
            {
                let k: i64 = row.get(0);
                hits.insert((format!("{{\"id\":{k}}}"), id.clone()));
            }
        } else {
            for row in pg
                .query(
                    &format!(
                        "SELECT o.order_id, o.line FROM {s}.\"Order Items\" o LEFT JOIN {s}.doc d ON d.id = o.order_id WHERE {when}"
                    ),
                    &[],
                )
                .await?
            {
                let (o, l): (i32, i32) = (row.get(0), row.get(1));
                hits.insert((format!("{{\"order_id\":{o},\"line\":{l}}}"), id.clone()));
            }
        }
    }
    Ok(hits.into_iter().collect())
}

/// Rows as DuckDB gives them.
type Rows = Vec<Vec<serde_json::Value>>;

/// Gold's table as DuckDB reads it, and the model computed over Silver.
fn gold(lake: &Path, s: &str) -> Result<(Rows, Rows)> {
    let table = lake.join("gold/acct_buckets");
    let got = if table.join("_delta_log").is_dir() {
        duckdb(&format!(
            "SELECT bucket, n, total FROM delta_scan('{}') ORDER BY ALL",
            table.display()
        ))?
    } else {
        Vec::new()
    };
    let want = duckdb(&format!(
        "SELECT id % 10 AS bucket, count(*) AS n, sum(balance) AS total FROM delta_scan('{}') GROUP BY id % 10 ORDER BY ALL",
        lake.join("silver").join(s).join("acct").display()
    ))?;
    Ok((got, want))
}

/// Polls `get` until it returns `true` or `limit` passed; the last value's description.
async fn until(limit: Duration, mut get: impl FnMut() -> Result<(bool, String)>) -> (bool, String) {
    let start = Instant::now();
    loop {
        let (ok, last) = match get() {
            Ok(v) => v,
            Err(e) => (false, format!("{e:#}")),
        };
        if ok || start.elapsed() > limit {
            return (ok, last);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The rules and Gold checks (after the drain, the pipeline running).
pub(super) async fn checks(stack: &Stack, d: &Daemon, s: &str, report: &mut Report) -> Result<()> {
    let lake = d.lake();
    let want = pg_hits(stack, s).await?;
    let (ok, last) = until(Duration::from_secs(600), || {
        let got = rule_hits(&lake)?;
        let missing = want.iter().filter(|h| !got.contains(h)).count();
        let extra = got.iter().filter(|h| !want.contains(h)).count();
        Ok((
            got == want,
            format!("{missing} hits missing, {extra} extra"),
        ))
    })
    .await;
    report.rule_hits = want.len();
    if !ok {
        report.fail(format!(
            "rules: the hits are not the final rules evaluated by PostgreSQL ({} hits): {last}",
            want.len()
        ));
    }
    let (ok, last) = until(Duration::from_secs(600), || {
        let (got, want) = gold(&lake, s)?;
        Ok((
            got == want,
            format!("gold {got:?}, model over Silver {want:?}"),
        ))
    })
    .await;
    report.gold_rows = gold(&lake, s).map_or(0, |(g, _)| g.len());
    if !ok {
        report.fail(format!(
            "gold: acct_buckets is not its model over Silver: {last}"
        ));
    }
    // Each (rule, key) alternates entered/left in LSN order (at an edit's position, its
    // own transaction's changes before its backfill), and no transition repeats.
    let path = lake.join("rules/transitions");
    let rows = duckdb(&format!(
        "SELECT rule_id, key, transition, lsn, origin FROM delta_scan('{}') ORDER BY lsn, origin = 'backfill', rule_id, key",
        path.display()
    ))?;
    report.transitions = rows.len();
    let mut last: HashMap<(String, String), String> = HashMap::new();
    let mut seen: BTreeSet<(String, String, i64, String)> = BTreeSet::new();
    let (mut repeats, mut broken) = (Vec::new(), Vec::new());
    for r in &rows {
        let t = |i: usize| r[i].as_str().unwrap_or_default().to_owned();
        let (rule, key, what, lsn) = (t(0), t(1), t(2), r[3].as_i64().unwrap_or(-1));
        if !seen.insert((rule.clone(), key.clone(), lsn, what.clone())) {
            repeats.push(format!("{rule} {key} {what} at {lsn}"));
            continue;
        }
        let prev = last.insert((rule.clone(), key.clone()), what.clone());
        if prev.as_deref() == Some(what.as_str()) || (prev.is_none() && what != "entered") {
            broken.push(format!("{rule} {key} {what} at {lsn} after {prev:?}"));
        }
    }
    for (what, v) in [
        ("repeated transitions", repeats),
        ("transitions out of order", broken),
    ] {
        if !v.is_empty() {
            report.fail(format!(
                "rules: {} {what}, e.g. {:?}",
                v.len(),
                &v[..v.len().min(5)]
            ));
        }
    }
    Ok(())
}
