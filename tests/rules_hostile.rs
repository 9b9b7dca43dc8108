//! The rules stage on hostile input (docs/rules.md), on the real stack. The chain keeps
//! moving, every hit is right, and what a rule cannot evaluate is quarantined under the
//! rule's id with the other rules and rows going on:
//!
//! - tables and columns whose names need escaping: `"Order Items"` with `"Item ID"`,
//!   `"Amount €"`, `"quo""te"`, `"Größe"`; a lookup of `"Mérchants ü"` on `"Merchant Id"`;
//!   two tables whose names look alike (`"a b"` under `REPLICA IDENTITY FULL`, `a_b`)
//!   tagged separately, through a TRUNCATE of one of them;
//! - values at the edges: `numeric` `NaN`, `Infinity`, 1e30 and 1,000 digits (a cast to a
//!   decimal fails on them: quarantined for each rule that casts, the other rules tag the
//!   row), dates and timestamps at ±infinity and in year 300000 (compared in the order
//!   PostgreSQL gives them);
//! - a table that gains its primary key after rows were captured: its rule tags the rows
//!   once Silver holds the table, old rows included;
//! - a single transaction of 1,000,000 inserts and a single UPDATE of all of them (far
//!   larger than Silver's read window): every transition, none twice, one LSN each, in a
//!   silver process whose peak memory stays bounded.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use wal2delta_tests::daemon::peak_rss_kib;
use wal2delta_tests::lake::duckdb;
use wal2delta_tests::metrics::{self, free_port};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = r#"CREATE TABLE {s}."Mérchants ü" ("ID" bigint PRIMARY KEY, "Kategorie" text NOT NULL);
CREATE TABLE {s}."Order Items" ("Item ID" bigint PRIMARY KEY, "Amount €" numeric, "quo""te" text, "Größe" text, d date, ts timestamptz, "Merchant Id" bigint);
CREATE TABLE {s}."a b" (id bigint PRIMARY KEY, v int);
ALTER TABLE {s}."a b" REPLICA IDENTITY FULL;
CREATE TABLE {s}.a_b (id bigint PRIMARY KEY, v int);
CREATE TABLE {s}.late (id bigint NOT NULL, n int);"#;

/// The rules, over Silver's column names (the Avro field names: `"Amount €"` is
/// `Amount__`, `"quo""te"` is `quo_te`, `"Größe"` is `Gr__e`, `"Item ID"` is `Item_ID`;
/// quoted where they hold capitals, as in PostgreSQL). `forever` compares with a
/// nanosecond literal, which DataFusion alone would fail on the infinite timestamps.
fn rules(s: &str) -> String {
    let items = format!(r#"'{s}."Order Items"'"#);
    let rule = |id: &str, table: &str, when: &str| {
        format!("[[rule]]\nid = \"{id}\"\ntable = {table}\nwhen = '''{when}'''\n\n")
    };
    [
        rule("big", &items, r#"CAST("Amount__" AS DECIMAL(20, 2)) > 100"#),
        rule("negative", &items, r#"CAST("Amount__" AS DECIMAL(20, 2)) < 0"#),
        rule("quoted", &items, r#"quo_te = 'it''s' AND "Gr__e" = 'XL'"#),
        rule("future", &items, "d > DATE '2100-01-01'"),
        rule("past", &items, "d < DATE '1900-01-01'"),
        rule("forever", &items, "ts > CAST('2100-01-01T00:00:00Z' AS TIMESTAMP)"),
        format!(
            "{}\nlookup.m = {{ table = '{s}.\"Mérchants ü\"', on = {{ \"Merchant_Id\" = \"ID\" }} }}\n\n",
            rule(
                "risky",
                &items,
                r#"CAST("Amount__" AS DECIMAL(20, 2)) > 100 AND m."Kategorie" = 'glücksspiel'"#
            )
            .trim_end()
        ),
        rule("space", &format!(r#"'{s}."a b"'"#), "v > 5"),
        rule("underscore", &format!("'{s}.a_b'"), "v > 5"),
        rule("late", &format!("'{s}.late'"), "n > 10"),
    ]
    .concat()
}

const TOML: &str = "[silver]\ninterval_ms = 300\n";

/// `(table, key, rule)` of `rules/hits`, sorted.
fn hits(lake: &Path) -> Result<BTreeSet<(String, String, String)>> {
    let path = lake.join("rules/hits");
    if !path.join("_delta_log").is_dir() {
        return Ok(BTreeSet::new());
    }
    let rows = duckdb(&format!(
        "SELECT \"table\", key, rule_id FROM delta_scan('{}')",
        path.display()
    ))?;
    Ok(rows
        .iter()
        .map(|r| (text(&r[0]), text(&r[1]), text(&r[2])))
        .collect())
}

fn text(v: &serde_json::Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// `(key, rule)` of the rows a rule could not be evaluated on, from the quarantine; and
/// whether any record's detail holds one of the values the casts failed on.
fn failed(lake: &Path) -> Result<BTreeSet<(String, String)>> {
    let path = lake.join("quarantine/records");
    if !path.join("_delta_log").is_dir() {
        return Ok(BTreeSet::new());
    }
    let rows = duckdb(&format!(
        "SELECT decode(key), check_name FROM delta_scan('{}') WHERE reason_code = 'rule_failed'",
        path.display()
    ))?;
    Ok(rows.iter().map(|r| (text(&r[0]), text(&r[1]))).collect())
}

fn hit(table: &str, key: &str, rule: &str) -> (String, String, String) {
    (table.to_owned(), key.to_owned(), rule.to_owned())
}

/// How long a step may take (the key added to `late` is noticed within a minute).
const STEP: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn rules_tag_hostile_names_and_values_and_a_key_added_later() -> Result<()> {
    let stack = Stack::from_env();
    let port = free_port()?;
    let w = Scenario::new(&stack, "ruleshostile", TABLES)
        .toml(TOML)
        .env("WAL2DELTA__METRICS__LISTEN", &format!("127.0.0.1:{port}"))
        .build_with_rules(rules)
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let lake = d.lake();
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    let digits = "9".repeat(1000);
    pg.batch_execute(
        &r#"INSERT INTO {s}."Mérchants ü" VALUES (1, 'glücksspiel'), (2, 'bücher');
        INSERT INTO {s}."Order Items" VALUES
          (1, 150.00, 'it''s', 'XL', '2020-01-01', '2020-01-01', 1),
          (2, 'NaN', 'x', 'S', 'infinity', 'infinity', 2),
          (3, 'Infinity', 'x', 'S', '-infinity', '-infinity', 2),
          (4, 1e30, 'x', 'S', '300000-01-01', '2020-01-01', 2),
          (5, -5.5, NULL, NULL, NULL, NULL, NULL),
          (6, 999999999999999999.99, 'x', 'XL', '1899-12-31', '2200-01-01', 1),
          (7, 200, 'it''s', 'XL', '0044-03-15 BC', '2020-01-01', 99),
          (8, {digits}, 'x', 'S', '2020-01-01', '2020-01-01', 1);
        INSERT INTO {s}."a b" VALUES (1, 10), (2, 1);
        INSERT INTO {s}.a_b VALUES (1, 1), (2, 10);
        INSERT INTO {s}.late VALUES (1, 5), (2, 20);"#
            .replace("{s}", &s)
            .replace("{digits}", &digits),
    )
    .await?;

    let items = format!("{s}.-4frder-20-49tems");
    let space = format!("{s}.a-20b");
    let under = format!("{s}.a_b");
    let late = format!("{s}.late");
    let item = |id: i64| format!("{{\"Item_ID\":{id}}}");
    let id = |id: i64| format!("{{\"id\":{id}}}");
    let mut want: BTreeSet<_> = [
        hit(&items, &item(1), "big"),
        hit(&items, &item(1), "quoted"),
        hit(&items, &item(1), "risky"),
        // infinity is after every date and time; the -infinity row is before 1900.
        hit(&items, &item(2), "future"),
        hit(&items, &item(2), "forever"),
        hit(&items, &item(3), "past"),
        hit(&items, &item(4), "future"),
        hit(&items, &item(5), "negative"),
        hit(&items, &item(6), "big"),
        hit(&items, &item(6), "risky"),
        hit(&items, &item(6), "past"),
        hit(&items, &item(6), "forever"),
        // Merchant 99 does not exist: not risky.
        hit(&items, &item(7), "big"),
        hit(&items, &item(7), "quoted"),
        hit(&items, &item(7), "past"),
        hit(&space, &id(1), "space"),
        hit(&under, &id(2), "underscore"),
    ]
    .into_iter()
    .collect();
    run.wait_for_within("the first hits", &want, STEP, || hits(&lake))
        .await?;
    // Rows 2, 3, 4 and 8 hold amounts no DECIMAL(20, 2) holds: each rule that casts the
    // amount failed on them (risky in its first phase), the other rules tagged them.
    let casts = ["big", "negative", "risky"];
    let want_failed: BTreeSet<_> = [2, 3, 4, 8]
        .into_iter()
        .flat_map(|i| casts.map(|r| (item(i), r.to_owned())))
        .collect();
    run.wait_for_within(
        "the rows the casts fail on, per rule",
        &want_failed,
        STEP,
        || failed(&lake),
    )
    .await?;
    // Per-rule metrics: evaluations, transitions, errors, time; the table's rules lag.
    let m = metrics::text(port).await?;
    ensure!(
        metrics::of(&m, "wal2delta_rules_errors_total", "rule", "big") == Some(4.0),
        "four rows failed `big`: {m}"
    );
    ensure!(
        metrics::of(&m, "wal2delta_rules_rule_evaluations_total", "rule", "big")
            .is_some_and(|n| n >= 8.0),
        "`big` was evaluated on the eight rows: {m}"
    );
    ensure!(
        m.lines()
            .any(|l| l.starts_with("wal2delta_rules_transitions_total{")
                && l.contains("rule=\"big\"")
                && l.contains("origin=\"stream\"")
                && l.ends_with(" 3")),
        "`big` entered three rows: {m}"
    );
    ensure!(
        m.contains("wal2delta_rules_rule_evaluation_seconds"),
        "the rules' evaluation time is exported: {m}"
    );
    ensure!(
        metrics::of_table(&m, "wal2delta_rules_lag_seconds", &items).is_some_and(|s| s >= 0.0),
        "the rules lag of the table is exported: {m}"
    );
    // The reasons say what failed, never with the values.
    let details = duckdb(&format!(
        "SELECT detail FROM delta_scan('{}') WHERE reason_code = 'rule_failed'",
        lake.join("quarantine/records").display()
    ))?;
    let log = std::fs::read_to_string(&run.log)?;
    for value in [
        "'NaN'",
        "'Infinity'",
        "1000000000000000000",
        "999999999999999999999",
    ] {
        ensure!(
            !log.contains(value) && details.iter().all(|d| !text(&d[0]).contains(value)),
            "a row value ({value}) in the log or in a quarantine record: {details:?}"
        );
    }
    ensure!(
        details
            .iter()
            .any(|d| text(&d[0]).contains("to value of Decimal128(")),
        "the reason names the type the cast failed to: {details:?}"
    );

    // The key arrives; lookalike tables change apart; a lookup's related row changes in
    // the order's own transaction, then an older order changes; a delete, a key change, a
    // TRUNCATE. One transaction each.
    for sql in [
        "ALTER TABLE {s}.late ADD PRIMARY KEY (id)",
        "INSERT INTO {s}.late VALUES (3, 30)",
        "UPDATE {s}.late SET n = 50 WHERE id = 1",
        r#"BEGIN; UPDATE {s}."Mérchants ü" SET "Kategorie" = 'glücksspiel' WHERE "ID" = 2;
           INSERT INTO {s}."Order Items" VALUES (9, 500, 'x', 'S', '2020-01-01', '2020-01-01', 2); COMMIT"#,
        r#"UPDATE {s}."Order Items" SET "Amount €" = 200 WHERE "Item ID" = 2"#,
        r#"UPDATE {s}."Order Items" SET "Größe" = 'M' WHERE "Item ID" = 1"#,
        r#"DELETE FROM {s}."Order Items" WHERE "Item ID" = 6"#,
        r#"UPDATE {s}."Order Items" SET "Item ID" = 70 WHERE "Item ID" = 7"#,
        r#"TRUNCATE {s}."a b""#,
        "UPDATE {s}.a_b SET v = 20 WHERE id = 1",
    ] {
        pg.batch_execute(&sql.replace("{s}", &s)).await?;
    }
    for gone in [
        hit(&items, &item(1), "quoted"),
        hit(&items, &item(6), "big"),
        hit(&items, &item(6), "risky"),
        hit(&items, &item(6), "past"),
        hit(&items, &item(6), "forever"),
        hit(&items, &item(7), "big"),
        hit(&items, &item(7), "quoted"),
        hit(&items, &item(7), "past"),
        hit(&space, &id(1), "space"),
    ] {
        ensure!(want.remove(&gone), "{gone:?} was expected");
    }
    want.extend([
        // Amount 200 now casts, and merchant 2 became a gambling one in an earlier
        // transaction than this update's.
        hit(&items, &item(2), "big"),
        hit(&items, &item(2), "risky"),
        hit(&items, &item(70), "big"),
        hit(&items, &item(70), "quoted"),
        hit(&items, &item(70), "past"),
        hit(&items, &item(9), "big"),
        hit(&items, &item(9), "risky"),
        hit(&under, &id(1), "underscore"),
        // The late table: its rule tags what Silver holds once the key exists.
        hit(&late, &id(1), "late"),
        hit(&late, &id(2), "late"),
        hit(&late, &id(3), "late"),
    ]);
    run.wait_for_within("the hits after the changes", &want, STEP, || hits(&lake))
        .await?;
    // The key schema of `late` went from no field to `id`, which the registry's BACKWARD
    // check refuses: capture relaxed that key subject instead of sending the table's
    // events to the DLQ.
    ensure!(
        std::fs::read_to_string(&run.log)?.contains("the key subject's compatibility is now NONE"),
        "capture says why the key subject changed: {}",
        run.log_text()
    );
    ensure!(run.stop()?.success());
    Ok(())
}

const BIG: &str =
    "CREATE TABLE {s}.big (id bigint PRIMARY KEY, status text NOT NULL, amount bigint NOT NULL);";

#[tokio::test(flavor = "multi_thread")]
async fn a_million_row_transaction_and_update_are_tagged_whole() -> Result<()> {
    const ROWS: i64 = 1_000_000;
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "rulesmillion", BIG)
        .toml(TOML)
        .build_with_rules(|s| {
            format!(
                "[[rule]]\nid = \"flagged\"\ntable = \"{s}.big\"\nwhen = \"status = 'flagged'\"\n\n\
                 [[rule]]\nid = \"large\"\ntable = \"{s}.big\"\nwhen = \"amount > 900\"\n"
            )
        })
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let lake = d.lake();
    let mut feed = d.spawn_stage("capture,bronze", "feed")?;
    let mut silver = d.spawn_stage("silver,rules", "silver")?;
    // One transaction of a million inserts: a quarter flagged, 99 in 1,000 large.
    pg.batch_execute(&format!(
        "INSERT INTO {s}.big SELECT g, CASE WHEN g % 4 = 0 THEN 'flagged' ELSE 'ok' END, g % 1000 FROM generate_series(1, {ROWS}) g"
    ))
    .await?;
    // One UPDATE of every row: the flagged quarter leaves, another quarter enters, the
    // amounts (and so `large`) do not change.
    pg.batch_execute(&format!(
        "UPDATE {s}.big SET status = CASE WHEN id % 4 = 0 THEN 'ok' WHEN id % 4 = 2 THEN 'flagged' ELSE status END"
    ))
    .await?;
    let path = lake.join("rules/transitions");
    let groups = || -> Result<Vec<Vec<serde_json::Value>>> {
        if !path.join("_delta_log").is_dir() {
            return Ok(Vec::new());
        }
        // Per transaction (ranked by LSN), rule and transition: transitions and keys.
        duckdb(&format!(
            "SELECT dense_rank() OVER (ORDER BY lsn) AS tx, rule_id, transition, count(*), count(DISTINCT key) \
             FROM delta_scan('{}') GROUP BY lsn, rule_id, transition ORDER BY 1, 2, 3",
            path.display()
        ))
    };
    let q = ROWS / 4;
    let want: Vec<Vec<serde_json::Value>> = [
        (1, "flagged", "entered", q),
        (1, "large", "entered", ROWS / 1000 * 99),
        (2, "flagged", "entered", q),
        (2, "flagged", "left", q),
    ]
    .iter()
    .map(|(tx, r, t, n)| {
        vec![
            (*tx).into(),
            (*r).into(),
            (*t).into(),
            (*n).into(),
            (*n).into(),
        ]
    })
    .collect();
    let start = std::time::Instant::now();
    loop {
        feed.assert_running()?;
        silver.assert_running()?;
        let got = groups()?;
        if got == want {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(900),
            "the transitions of the two transactions:\nwant {want:?}\ngot  {got:?}\n{}",
            silver.log_text()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let pid = silver.pid().context("the silver process runs")?;
    let peak = peak_rss_kib(pid)? / 1024;
    eprintln!("silver + rules over a 1,000,000-row transaction and update: peak RSS {peak} MiB");
    // The hits: exactly the rows the source says, read from the lake.
    let hits = lake.join("rules/hits");
    let wrong = || -> Result<Vec<Vec<serde_json::Value>>> {
        duckdb(&format!(
            "SELECT rule_id, count(*), count(*) FILTER (WHERE CASE rule_id WHEN 'flagged' THEN id % 4 <> 2 ELSE id % 1000 <= 900 END) \
             FROM (SELECT rule_id, CAST(json_extract(key, '$.id') AS BIGINT) AS id FROM delta_scan('{}')) GROUP BY 1 ORDER BY 1",
            hits.display()
        ))
    };
    let want_hits = vec![
        vec!["flagged".into(), q.into(), 0.into()],
        vec!["large".into(), (ROWS / 1000 * 99).into(), 0.into()],
    ];
    silver
        .wait_for_within("the hits after the update", &want_hits, STEP, wrong)
        .await?;
    let source: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM {s}.big WHERE status = 'flagged'"),
            &[],
        )
        .await?
        .get(0);
    ensure!(source == q);
    ensure!(
        peak < 2048,
        "the silver process stays bounded through a million-row transaction: {peak} MiB"
    );
    ensure!(silver.stop()?.success());
    ensure!(feed.stop()?.success());
    Ok(())
}

const COSTLY: &str =
    "CREATE TABLE {s}.costly (id bigint PRIMARY KEY, amount bigint NOT NULL, note text NOT NULL);";

/// Issue 38, defect 11: a rule whose condition costs more than `[rules]
/// max_eval_us_per_row` is disabled with its reason, the other rules and the stage go on,
/// its hits stay as they were, and a start with a larger budget enables it again: its
/// backfill brings its hits in line with the source.
#[tokio::test(flavor = "multi_thread")]
async fn a_rule_past_its_budget_is_disabled_and_the_stage_goes_on() -> Result<()> {
    const ROWS: i64 = 50_000;
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "rulesbudget", COSTLY)
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .env("WAL2DELTA__RULES__MAX_EVAL_US_PER_ROW", "1")
        .build_with_rules(|s| {
            format!(
                "[[rule]]\nid = \"slow\"\ntable = \"{s}.costly\"\nwhen = \"regexp_like(repeat(note, 50), '^((a|b)*z)+$')\"\n\n\
                 [[rule]]\nid = \"cheap\"\ntable = \"{s}.costly\"\nwhen = \"amount > 10\"\n"
            )
        })
        .await?;
    let (s, pg, mut d) = (w.name, w.pg, w.d);
    let lake = d.lake();
    // Rows of the rules table `table` (`hits`, `transitions`) of `rule`.
    let rows_of = |table: &str, rule: &str| -> Result<i64> {
        let path = lake.join("rules").join(table);
        if !path.join("_delta_log").is_dir() {
            return Ok(0);
        }
        let hit = if table == "hits" { " AND hit" } else { "" };
        let n = duckdb(&format!(
            "SELECT count(*) FROM delta_scan('{}') WHERE rule_id = '{rule}'{hit}",
            path.display()
        ))?;
        Ok(n[0][0].as_i64().unwrap_or(-1))
    };
    let count_of = |rule: &str| rows_of("hits", rule);
    let transitions_of = |rule: &str| rows_of("transitions", rule);
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    // Every row matches `slow`, whose regular expression runs over 10,050 characters a
    // row (about 10 µs with optimised dependencies: the budget is judged only in rounds of
    // at least 100 ms, and 200 characters took well under 1 µs and 100 ms); none matches
    // `cheap`.
    pg.batch_execute(&format!(
        "INSERT INTO {s}.costly SELECT g, 1, repeat('ab', 100) || 'z' FROM generate_series(1, {ROWS}) g"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    run.wait_for("the rule disabled", &true, || {
        Ok(run_log_has(
            &d,
            "run",
            "past its evaluation budget is disabled",
        ))
    })
    .await?;
    // The stage goes on: `cheap` tags the next changes, `slow` (disabled) emits nothing,
    // although ids 1..10 no longer match it.
    // The round that disabled it committed its transitions before saying so.
    let slow_before = transitions_of("slow")?;
    ensure!(
        slow_before > 0,
        "the round that disabled slow tagged its rows"
    );
    pg.batch_execute(&format!(
        "UPDATE {s}.costly SET amount = 100, note = 'q' WHERE id <= 10"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    run.wait_for("cheap's hits", &10, || count_of("cheap"))
        .await?;
    ensure!(
        transitions_of("slow")? == slow_before,
        "a disabled rule emitted transitions"
    );
    run.stop()?;

    // A start with a budget the rule fits: it is enabled again, and its backfill makes the
    // hits those PostgreSQL gives.
    d.env
        .retain(|(k, _)| k != "WAL2DELTA__RULES__MAX_EVAL_US_PER_ROW");
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run2")?;
    let want: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM {s}.costly WHERE repeat(note, 50) ~ '^((a|b)*z)+$'"),
            &[],
        )
        .await?
        .get(0);
    run.wait_for("slow's hits equal to the source", &want, || {
        count_of("slow")
    })
    .await?;
    ensure!(count_of("cheap")? == 10);
    ensure!(!run_log_has(&d, "run2", "is disabled"), "disabled again");
    run.stop()?;
    Ok(())
}

/// Whether the log of the stage process spawned as `log` holds `text`.
fn run_log_has(d: &wal2delta_tests::daemon::Daemon, log: &str, text: &str) -> bool {
    std::fs::read_to_string(d.dir.join(format!("{log}.log"))).is_ok_and(|l| l.contains(text))
}
