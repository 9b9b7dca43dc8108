//! Rules with lookups (docs/rules.md, "Lookups") on the real stack: a rule on `orders`
//! reads the order's shop's `category` through a lookup of `shops`.
//!
//! - Two phases: the rule's own conditions (`amount > 100`) first, the shop looked up only
//!   for the order versions that pass; the lookups made and avoided are counted exactly.
//! - As of the change's commit: a shop changed in the same transaction as an order of it
//!   decides that order's tag, whichever way (the table names are chosen so that `orders`
//!   comes before `shops` in the lake's own order: only the silver stage applying the
//!   looked-up table first makes this pass).
//! - A related row missing, a rule leaving by its own condition without a lookup.
//! - Invalid lookups and a cycle of lookups are refused by `rules validate`, naming the
//!   rule.
//! - A looked-up table changing in every transaction costs no round per change: its
//!   unapplied changes are looked up over its Silver rows.
//! - `[rules] lookup_timeout_ms`: a related table whose changes Bronze cannot hold holds
//!   the changes that look it up for the timeout and no longer, counted as timeouts and
//!   stale lookups.

use anyhow::{ensure, Result};
use wal2delta_tests::chaos::{FilesAway, ReadOnlyLake};
use wal2delta_tests::lake::{duckdb, transitions};
use wal2delta_tests::metrics::{free_port, of, of_table, text};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.shops (id bigint PRIMARY KEY, category text NOT NULL);
CREATE TABLE {s}.orders (id bigint PRIMARY KEY, shop_id bigint, amount numeric(12, 2) NOT NULL);";

fn rules(s: &str) -> String {
    format!(
        r#"[[rule]]
id = "risky"
table = "{s}.orders"
when = "CAST(amount AS DECIMAL(12, 2)) > 100 AND shop.category = 'gambling'"
lookup.shop = {{ table = "{s}.shops", on = {{ shop_id = "id" }} }}

[[rule]]
id = "big"
table = "{s}.orders"
when = "CAST(amount AS DECIMAL(12, 2)) > 1000"
"#
    )
}

/// The rows of the Delta table at `path` (0 before it exists).
fn rows_of(path: &std::path::Path) -> Result<i64> {
    if !path.join("_delta_log").is_dir() {
        return Ok(0);
    }
    Ok(duckdb(&format!(
        "SELECT count(*) FROM delta_scan('{}')",
        path.display()
    ))?[0][0]
        .as_i64()
        .unwrap_or(0))
}

fn tr(id: i64, rule: &str, t: &str) -> (String, String, String) {
    (format!("{{\"id\":{id}}}"), rule.to_owned(), t.to_owned())
}

/// The running chain with [`rules`] for a new scenario (`env`: more variables), and the
/// shops in `shops_sql` (`{s}` is the schema) already in Silver, `shops` rows of them.
struct Running {
    s: String,
    pg: tokio_postgres::Client,
    d: wal2delta_tests::daemon::Daemon,
    run: wal2delta_tests::daemon::StageProcess,
    lake: std::path::PathBuf,
    port: u16,
}

async fn running(
    prefix: &str,
    env: &[(&str, &str)],
    shops_sql: &str,
    shops: i64,
) -> Result<Running> {
    let stack = Stack::from_env();
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let mut scenario = Scenario::new(&stack, prefix, TABLES)
        .env("WAL2DELTA__RULES__FILE", "{dir}/rules.toml")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .env("WAL2DELTA__METRICS__LISTEN", &listen)
        .without_setup();
    for (k, v) in env {
        scenario = scenario.env(k, v);
    }
    let w = scenario.build().await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    std::fs::write(d.dir.join("rules.toml"), rules(&s))?;
    d.setup()?;
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    let lake = d.lake();
    pg.batch_execute(&shops_sql.replace("{s}", &s)).await?;
    let table = lake.join(format!("silver/{s}/shops"));
    run.wait_for("shops in Silver", &shops, || rows_of(&table))
        .await?;
    Ok(Running {
        s,
        pg,
        d,
        run,
        lake,
        port,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_run_in_two_phases_and_see_the_related_row_as_of_the_commit() -> Result<()> {
    // The shops first, in Silver before any order: the rule compiles from the first
    // round of `orders` on (no backfill), so every count below is exact.
    let Running {
        s,
        pg,
        d,
        mut run,
        lake,
        port,
    } = running(
        "ruleslookup",
        &[],
        "INSERT INTO {s}.shops VALUES (1, 'gambling'), (2, 'books')",
        2,
    )
    .await?;

    let workload = [
        // Passes phase one, shop 1 is gambling: enters.
        "INSERT INTO {s}.orders VALUES (10, 1, 500)",
        // Passes phase one, shop 2 is books: no hit.
        "INSERT INTO {s}.orders VALUES (11, 2, 500)",
        // Fails phase one: no lookup.
        "INSERT INTO {s}.orders VALUES (12, 1, 50)",
        // Both rules.
        "INSERT INTO {s}.orders VALUES (13, 1, 5000)",
        // The shop becomes gambling in the order's own transaction: enters.
        "BEGIN; UPDATE {s}.shops SET category = 'gambling' WHERE id = 2; INSERT INTO {s}.orders VALUES (14, 2, 700); COMMIT",
        // The shop stops being gambling in the order's own transaction: no hit.
        "BEGIN; INSERT INTO {s}.orders VALUES (15, 1, 800); UPDATE {s}.shops SET category = 'books' WHERE id = 1; COMMIT",
        // No such shop: no hit.
        "INSERT INTO {s}.orders VALUES (16, 99, 900)",
        // Fails phase one: leaves without a lookup.
        "UPDATE {s}.orders SET amount = 20 WHERE id = 10",
    ];
    // One step at a time: each order is in Silver before the next change, so no lookup
    // sees a shop changed after the order's commit (checked below: none is "newer").
    let orders = lake.join(format!("silver/{s}/orders"));
    for (n, sql) in workload.iter().enumerate() {
        pg.batch_execute(&sql.replace("{s}", &s)).await?;
        let want = (n + 1).min(7) as i64;
        run.wait_for(&format!("step {n} in Silver"), &want, || rows_of(&orders))
            .await?;
    }
    let expected = vec![
        tr(10, "risky", "entered"),
        tr(13, "big", "entered"),
        tr(13, "risky", "entered"),
        tr(14, "risky", "entered"),
        tr(10, "risky", "left"),
    ];
    run.wait_for("transitions", &expected, || transitions(&lake, "stream"))
        .await?;

    // Order versions evaluated: 8; phase one passed by 6 (10, 11, 13, 14, 15, 16), failed
    // by 2 (12, and 10's update).
    let table = format!("{s}.orders");
    // (The counters move after the round's Silver commit, a moment after the transitions.)
    let mut body = String::new();
    for _ in 0..60 {
        body = text(port).await?;
        if of_table(&body, "wal2delta_rules_lookups_avoided_total", &table) == Some(2.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let counts = |m: &str| of_table(&body, m, &table);
    let lookups = counts("wal2delta_rules_lookups_total");
    let avoided = counts("wal2delta_rules_lookups_avoided_total");
    ensure!(
        lookups == Some(6.0) && avoided == Some(2.0),
        "lookups {lookups:?} (want 6), avoided {avoided:?} (want 2)\n{}",
        run.log_text()
    );
    // Per rule: both evaluated on the 8 order versions.
    for rule in ["risky", "big"] {
        let n = of(
            &body,
            "wal2delta_rules_rule_evaluations_total",
            "rule",
            rule,
        );
        ensure!(n == Some(8.0), "{rule} evaluated on {n:?} versions, want 8");
    }
    ensure!(
        counts("wal2delta_rules_lookups_stale_total").is_none()
            && counts("wal2delta_rules_lookups_newer_total").is_none(),
        "no lookup saw a related table behind or past its commit: {}",
        body.lines()
            .filter(|l| l.contains("lookup"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Validation: bad lookups and a cycle are refused, naming the rule.
    let bad = format!(
        r#"{good}
[[rule]]
id = "no_column"
table = "{s}.orders"
when = "shop.nope = 'x'"
lookup.shop = {{ table = "{s}.shops", on = {{ shop_id = "id" }} }}

[[rule]]
id = "bad_on"
table = "{s}.orders"
when = "shop.category = 'x'"
lookup.shop = {{ table = "{s}.shops", on = {{ missing = "id" }} }}

[[rule]]
id = "self"
table = "{s}.orders"
when = "other.amount IS NULL"
lookup.other = {{ table = "{s}.orders", on = {{ id = "id" }} }}

[[rule]]
id = "back"
table = "{s}.shops"
when = "o.id IS NULL"
lookup.o = {{ table = "{s}.orders", on = {{ id = "shop_id" }} }}
"#,
        good = rules(&s)
    );
    let file = d.dir.join("bad-rules.toml");
    std::fs::write(&file, bad)?;
    let out = d.command(&["rules", "validate", &file.display().to_string()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "exit 1: {stderr}");
    for needle in [
        "rule \"no_column\"",
        "rule \"bad_on\": lookup `shop`",
        "rule \"self\": lookup `other`: a rule cannot look up its own table",
        "rule \"back\": lookup `o`",
        "a cycle of lookups",
    ] {
        ensure!(stderr.contains(needle), "{needle:?} in: {stderr}");
    }
    // `risky` is valid alone, but `back` closes a cycle with it: either may be named.
    ensure!(
        !stderr.contains("rule \"big\""),
        "a valid rule is not named: {stderr}"
    );
    run.assert_running()?;
    Ok(())
}

/// `[rules] lookup_timeout_ms`: a related table whose Silver cannot commit (its log made
/// immutable) holds the changes of the table that looks it up, for the timeout and no
/// longer; then they are tagged against the related rows as they are, counted as stale.
/// The commits of the Delta table at `path` that added data files (progress-only commits
/// add none).
fn data_commits(path: &std::path::Path) -> Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(path.join("_delta_log"))? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "json")
            && std::fs::read_to_string(&p)?.contains("\"add\":")
        {
            n += 1;
        }
    }
    Ok(n)
}

/// A looked-up table that changes in every transaction of the table looking it up costs
/// no round per change (issue 38): `orders` applies the looked-up `shops`' unapplied
/// changes over its Silver rows, and every lookup is still as of its own commit. Each of
/// 300 transactions flips shop 1's category and inserts an order of it; the orders
/// inserted with `gambling` enter `risky`, the others do not. In lock-step this took one
/// `orders` round (a data commit) per transaction.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_looked_up_table_costs_no_round_per_change() -> Result<()> {
    const TRANSACTIONS: i64 = 300;
    let Running {
        s,
        pg,
        d: _d,
        mut run,
        lake,
        port: _,
    } = running(
        "rulesbusy",
        &[],
        "INSERT INTO {s}.shops VALUES (1, 'toys')",
        1,
    )
    .await?;
    let orders = lake.join(format!("silver/{s}/orders"));
    for i in 1..=TRANSACTIONS {
        let category = if i % 2 == 0 { "gambling" } else { "toys" };
        pg.batch_execute(&format!(
            "BEGIN; UPDATE {s}.shops SET category = '{category}' WHERE id = 1; \
             INSERT INTO {s}.orders VALUES ({i}, 1, 500); COMMIT"
        ))
        .await?;
    }
    let want: Vec<_> = (1..=TRANSACTIONS)
        .filter(|i| i % 2 == 0)
        .map(|i| tr(i, "risky", "entered"))
        .collect();
    run.wait_for("every order tagged as of its own commit", &want, || {
        transitions(&lake, "stream")
    })
    .await?;
    run.wait_for("every order in Silver", &TRANSACTIONS, || rows_of(&orders))
        .await?;
    let commits = data_commits(&orders)?;
    ensure!(
        commits < TRANSACTIONS as usize / 3,
        "orders took {commits} data commits for {TRANSACTIONS} transactions: one round per change of shops"
    );
    ensure!(
        !run.log_text().contains("lookup_timeout_ms"),
        "no hold released: {}",
        run.log_text()
    );
    run.assert_running()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_waits_for_a_related_table_behind_at_most_the_timeout() -> Result<()> {
    const TIMEOUT_MS: u64 = 4_000;
    let timeout = TIMEOUT_MS.to_string();
    let Running {
        s,
        pg,
        d: _d,
        mut run,
        lake,
        port,
    } = running(
        "rulestimeout",
        // Bronze commits often, so the times below measure the hold, not Bronze's batch.
        &[
            ("WAL2DELTA__RULES__LOOKUP_TIMEOUT_MS", &timeout),
            ("WAL2DELTA__BRONZE__MAX_BATCH_MS", "300"),
        ],
        "INSERT INTO {s}.shops VALUES (1, 'gambling')",
        1,
    )
    .await?;
    let shops = lake.join(format!("silver/{s}/shops"));
    pg.batch_execute(&format!("INSERT INTO {s}.orders VALUES (10, 1, 500)"))
        .await?;
    let first = vec![tr(10, "risky", "entered")];
    run.wait_for("the first order tagged", &first, || {
        transitions(&lake, "stream")
    })
    .await?;

    // From here shops' changes cannot reach Bronze (its Bronze table cannot commit). A
    // change of it comes first: the orders after it must wait until it is known, or a
    // lookup would not see shops as of the order's commit (docs/rules.md, "Lookups"). A
    // shops that merely cannot commit its Silver rows holds nothing: its unapplied
    // changes are read from Bronze.
    let frozen = ReadOnlyLake::set(lake.join(format!("bronze/{s}/shops/_delta_log")))?;
    pg.batch_execute(&format!("INSERT INTO {s}.shops VALUES (3, 'toys')"))
        .await?;
    let started = std::time::Instant::now();
    pg.batch_execute(&format!("INSERT INTO {s}.orders VALUES (11, 1, 600)"))
        .await?;
    tokio::time::sleep(std::time::Duration::from_millis(TIMEOUT_MS / 2)).await;
    ensure!(
        transitions(&lake, "stream")? == first,
        "the order is held while shops is behind\n{}",
        run.log_text()
    );
    let both = vec![tr(10, "risky", "entered"), tr(11, "risky", "entered")];
    run.wait_for("the held order tagged after the timeout", &both, || {
        transitions(&lake, "stream")
    })
    .await?;
    let waited = started.elapsed();
    ensure!(
        waited >= std::time::Duration::from_millis(TIMEOUT_MS),
        "tagged after {waited:?}, before the {TIMEOUT_MS} ms timeout"
    );
    let table = format!("{s}.orders");
    let mut body = String::new();
    for _ in 0..60 {
        body = text(port).await?;
        if of_table(&body, "wal2delta_rules_lookups_stale_total", &table).is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let timeouts = of_table(&body, "wal2delta_rules_lookup_timeouts_total", &table);
    let stale = of_table(&body, "wal2delta_rules_lookups_stale_total", &table);
    ensure!(
        timeouts.is_some_and(|n| n >= 1.0) && stale == Some(1.0),
        "timeouts {timeouts:?} (want at least 1), stale lookups {stale:?} (want 1)\n{}",
        run.log_text()
    );
    ensure!(
        run.log_text().contains("lookup_timeout_ms"),
        "the hold past the timeout is logged"
    );

    // Shops still behind: the hold was released once, so a later order is tagged in the
    // next rounds, not held for another whole timeout (issue 38, defect 7: each release
    // used to last one round, and the table fell one timeout behind per change).
    let released = std::time::Instant::now();
    pg.batch_execute(&format!("INSERT INTO {s}.orders VALUES (12, 1, 800)"))
        .await?;
    let three = vec![
        tr(10, "risky", "entered"),
        tr(11, "risky", "entered"),
        tr(12, "risky", "entered"),
    ];
    run.wait_for("the next order tagged while released", &three, || {
        transitions(&lake, "stream")
    })
    .await?;
    let waited = released.elapsed();
    ensure!(
        waited < std::time::Duration::from_millis(TIMEOUT_MS),
        "the next order waited {waited:?}: held for another {TIMEOUT_MS} ms timeout"
    );
    ensure!(
        run.log_text()
            .matches("past [rules] lookup_timeout_ms")
            .count()
            == 1,
        "one release is logged once: {}",
        run.log_text()
    );

    // Unfrozen, shops catches up (until then orders stays released: its changes would see
    // shops as it is), and the chain goes on as before: held for shops again.
    drop(frozen);
    pg.batch_execute(&format!("INSERT INTO {s}.shops VALUES (2, 'books')"))
        .await?;
    run.wait_for("shops caught up", &3, || rows_of(&shops))
        .await?;
    pg.batch_execute(&format!(
        "BEGIN; UPDATE {s}.shops SET category = 'books' WHERE id = 1; UPDATE {s}.orders SET amount = 700 WHERE id = 11; COMMIT"
    ))
    .await?;
    let after = vec![
        tr(10, "risky", "entered"),
        tr(11, "risky", "entered"),
        tr(12, "risky", "entered"),
        tr(11, "risky", "left"),
    ];
    run.wait_for("the chain after shops caught up", &after, || {
        transitions(&lake, "stream")
    })
    .await?;
    run.assert_running()?;
    Ok(())
}

/// Issue 38, defect 2: the looked-up table cannot be read for a while (its data files
/// gone). The rounds of the table that looks it up fail and are retried; none takes the
/// failed read for "no related row", so the order's hit stays, no `left` is committed and
/// nothing is quarantined, and once the files are back the change is tagged as it should.
#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_that_cannot_read_the_related_table_fails_the_round_and_tags_nothing() -> Result<()>
{
    let Running {
        s,
        pg,
        d,
        mut run,
        lake,
        ..
    } = running(
        "rulesreaderr",
        &[],
        "INSERT INTO {s}.shops VALUES (1, 'gambling')",
        1,
    )
    .await?;
    pg.batch_execute(&format!("INSERT INTO {s}.orders VALUES (10, 1, 500)"))
        .await?;
    let entered = vec![tr(10, "risky", "entered")];
    run.wait_for("order 10 entered", &entered, || {
        transitions(&lake, "stream")
    })
    .await?;
    let failures = |log: &str| {
        log.lines()
            .filter(|l| l.contains("silver round of the table failed") && l.contains(".orders"))
            .count()
    };
    let before = failures(&run.log_text());
    {
        let _away = FilesAway::take(&lake.join(format!("silver/{s}/shops")), &d.dir.join("away"))?;
        // Still passes phase one, so the shop is looked up.
        pg.batch_execute(&format!("UPDATE {s}.orders SET amount = 600 WHERE id = 10"))
            .await?;
        let start = std::time::Instant::now();
        while failures(&run.log_text()) < before + 2 {
            run.assert_running()?;
            ensure!(
                start.elapsed() < std::time::Duration::from_secs(60),
                "the orders rounds never failed on the unreadable shops: {}",
                run.log_text()
            );
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
        ensure!(
            transitions(&lake, "stream")? == entered,
            "a failed read committed no transition"
        );
    }
    // The files back: the update is applied and tagged, the hit stays.
    let orders = lake.join(format!("silver/{s}/orders"));
    run.wait_for("the update in Silver", &1, || {
        Ok(duckdb(&format!(
            "SELECT count(*) FROM delta_scan('{}') WHERE amount = '600.00'",
            orders.display()
        ))?[0][0]
            .as_i64()
            .unwrap_or(0))
    })
    .await?;
    ensure!(
        transitions(&lake, "stream")? == entered,
        "the order never left its rule"
    );
    let hits = wal2delta_tests::lake::rule_hits(&lake)?;
    ensure!(
        hits.contains(&("{\"id\":10}".to_owned(), "risky".to_owned())),
        "the hit stays: {hits:?}"
    );
    let q = lake.join("quarantine/records");
    ensure!(
        rows_of(&q)? == 0,
        "nothing quarantined: {:?}",
        duckdb(&format!(
            "SELECT reason_code, detail FROM delta_scan('{}')",
            q.display()
        ))
    );
    ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    Ok(())
}
