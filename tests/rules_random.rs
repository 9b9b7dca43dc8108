//! Rule transitions and Gold under random workloads, edits and faults (issue 38, "Must
//! show"; docs/rules.md, "Exactly once" and "Rule changes without restart"), on the real
//! stack.
//!
//! A seeded random workload (`WAL2DELTA_TEST_SEED` repeats one; the seed is printed) of
//! payments and merchants: amounts changed, keys moved to a new id, keys deleted and
//! inserted again in one transaction, transactions larger than
//! `[silver] max_atomic_transaction_rows`, merchants' risk changed (the rules look it up),
//! and rules edited in the rules table at random points (conditions, new rules, removed
//! and deactivated ones; once inside a transaction that changes payments too). Meanwhile
//! the process running Silver, the rules and Gold is hit at random: SIGKILL, Silver commits
//! failing (the payments Silver log immutable), the looked-up table unreadable (its data
//! files gone) and `rules/hits` unwritable.
//!
//! After it: the hits equal PostgreSQL's evaluation of the final rules; Gold equals its
//! model computed by DuckDB over Silver; and a clean run of Bronze, Silver, rules and Gold
//! from the same topics into a fresh lake gives the same `rules/transitions`, one for one
//! (LSNs included), the same `rules/versions` positions, and the same Gold.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::Client;
use wal2delta_tests::chaos::{FilesAway, ReadOnlyLake};
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::lake::{duckdb, exact_transitions, rule_hits, rule_versions, table_rows};
use wal2delta_tests::{source_rows, Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.merchants (id bigint PRIMARY KEY, risk int NOT NULL); \
    CREATE TABLE {s}.payments (id bigint PRIMARY KEY, merchant bigint NOT NULL, amount bigint NOT NULL);";

const MERCHANTS: i64 = 8;
const PAYMENTS: i64 = 240;

/// Rows as DuckDB gives them.
type Rows = Vec<Vec<serde_json::Value>>;

/// Gold's `totals` as DuckDB reads it, and as the model computes it over Silver.
fn gold(lake: &Path, s: &str) -> Result<(Rows, Rows)> {
    let table = lake.join("gold/totals");
    let got = if table.join("_delta_log").is_dir() {
        duckdb(&format!(
            "SELECT merchant, n, total FROM delta_scan('{}') ORDER BY ALL",
            table.display()
        ))?
    } else {
        Vec::new()
    };
    let want = duckdb(&format!(
        "SELECT merchant, count(*) AS n, sum(amount) AS total FROM delta_scan('{}') GROUP BY merchant ORDER BY ALL",
        lake.join("silver").join(s).join("payments").display()
    ))?;
    Ok((got, want))
}

/// The (key, rule) hits PostgreSQL computes for the rules table's active rules.
async fn pg_hits(pg: &Client, s: &str) -> Result<Vec<(String, String)>> {
    let mut hits = BTreeSet::new();
    let rules = pg
        .query(
            &format!("SELECT id, \"when\" FROM {s}.wal2delta_rules WHERE active"),
            &[],
        )
        .await?;
    for r in rules {
        let (id, when): (String, String) = (r.get(0), r.get(1));
        for row in pg
            .query(
                &format!(
                    "SELECT p.id FROM {s}.payments p LEFT JOIN {s}.merchants m ON m.id = p.merchant WHERE {when}"
                ),
                &[],
            )
            .await?
        {
            let key: i64 = row.get(0);
            hits.insert((format!("{{\"id\":{key}}}"), id.clone()));
        }
    }
    Ok(hits.into_iter().collect())
}

/// A random rule condition over `amount` and the merchant's `m.risk`.
fn condition(rng: &mut StdRng) -> String {
    match rng.random_range(0..4) {
        0 => format!("amount > {}", rng.random_range(100..3000)),
        1 => format!("amount % {} = 0", rng.random_range(2..6)),
        2 => format!("m.risk > {}", rng.random_range(0..9)),
        _ => format!(
            "amount BETWEEN {} AND {} AND m.risk >= {}",
            rng.random_range(0..500),
            rng.random_range(500..2500),
            rng.random_range(0..9)
        ),
    }
}

fn lookups(s: &str, when: &str) -> String {
    if when.contains("m.risk") {
        format!("'{{\"m\": {{\"table\": \"{s}.merchants\", \"on\": {{\"merchant\": \"id\"}}}}}}'")
    } else {
        "NULL".into()
    }
}

/// One random rules edit, as SQL statements.
fn rule_edit(rng: &mut StdRng, s: &str, next_id: &mut u32) -> String {
    let id = format!("r{}", rng.random_range(0..*next_id));
    match rng.random_range(0..5) {
        0 | 1 => {
            let when = condition(rng);
            format!(
                "UPDATE {s}.wal2delta_rules SET \"when\" = '{when}', lookups = {}, version = version + 1 WHERE id = '{id}';",
                lookups(s, &when)
            )
        }
        2 => {
            let when = condition(rng);
            let new = format!("r{next_id}");
            *next_id += 1;
            format!(
                "INSERT INTO {s}.wal2delta_rules (id, \"table\", \"when\", lookups) VALUES ('{new}', '{s}.payments', '{when}', {});",
                lookups(s, &when)
            )
        }
        3 => format!("UPDATE {s}.wal2delta_rules SET active = NOT active WHERE id = '{id}';"),
        _ => format!("DELETE FROM {s}.wal2delta_rules WHERE id = '{id}';"),
    }
}

/// The random workload: `n` transactions. Returns how many rule edits it committed.
async fn workload(pg: Client, s: String, seed: u64, n: usize) -> Result<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_id = 3u32;
    let mut moved = 10_000i64;
    let mut edits = 0;
    for i in 0..n {
        let sql = match rng.random_range(0..100) {
            0..=39 => {
                let k = rng.random_range(2..9);
                format!(
                    "UPDATE {s}.payments SET amount = amount + {} WHERE id % {k} = {};",
                    rng.random_range(1..400),
                    rng.random_range(0..k)
                )
            }
            40..=49 => {
                // A key moved to a new id.
                moved += 1;
                format!(
                    "UPDATE {s}.payments SET id = {moved} WHERE id = (SELECT min(id) FROM {s}.payments WHERE id > {});",
                    rng.random_range(0..PAYMENTS)
                )
            }
            50..=59 => {
                // Deleted and inserted again in one transaction, then changed.
                let id = rng.random_range(1..=PAYMENTS);
                format!(
                    "BEGIN; DELETE FROM {s}.payments WHERE id = {id}; \
                     INSERT INTO {s}.payments VALUES ({id}, {}, {}); \
                     UPDATE {s}.payments SET amount = amount + {} WHERE id = {id}; COMMIT;",
                    rng.random_range(1..=MERCHANTS),
                    rng.random_range(1..3000),
                    rng.random_range(1..50)
                )
            }
            60..=66 => {
                // Larger than max_atomic_transaction_rows: applied in pieces.
                format!(
                    "UPDATE {s}.payments SET amount = amount + {}, merchant = 1 + (merchant + {}) % {MERCHANTS};",
                    rng.random_range(1..100),
                    rng.random_range(0..3)
                )
            }
            67..=79 => format!(
                "UPDATE {s}.merchants SET risk = {} WHERE id = {};",
                rng.random_range(0..10),
                rng.random_range(1..=MERCHANTS)
            ),
            80..=91 => {
                edits += 1;
                rule_edit(&mut rng, &s, &mut next_id)
            }
            _ => {
                // An edit inside a transaction that changes payments too.
                edits += 1;
                format!(
                    "BEGIN; UPDATE {s}.payments SET amount = amount + 3 WHERE id % 5 = {}; {} COMMIT;",
                    rng.random_range(0..5),
                    rule_edit(&mut rng, &s, &mut next_id)
                )
            }
        };
        pg.batch_execute(&sql).await?;
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        }
    }
    // Every payment changes once more after the last merchant change, so the hits (a
    // change of a looked-up row alone re-evaluates nothing) are PostgreSQL's evaluation
    // of the final rows.
    pg.batch_execute(&format!("UPDATE {s}.payments SET amount = amount"))
        .await?;
    Ok(edits)
}

/// Waits until `want` equals `get`, the process running.
async fn until<T: PartialEq + std::fmt::Debug>(
    run: &mut StageProcess,
    what: &str,
    want: &T,
    get: impl FnMut() -> Result<T>,
) -> Result<()> {
    run.wait_for_within(what, want, Duration::from_secs(480), get)
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn transitions_and_gold_equal_a_clean_run_under_random_edits_and_faults() -> Result<()> {
    let seed: u64 = std::env::var("WAL2DELTA_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        });
    eprintln!("rules_random: seed {seed} (WAL2DELTA_TEST_SEED={seed} repeats it)");
    run(seed).await.map_err(|e| {
        // The seed again after the failure, where a truncated output still shows it.
        anyhow::anyhow!("{e:#}\nrules_random: seed {seed} (WAL2DELTA_TEST_SEED={seed} repeats it)")
    })
}

async fn run(seed: u64) -> Result<()> {
    let stack = Stack::from_env();
    let ddl = format!(
        "{TABLES} SET search_path TO {{s}}; {} RESET search_path;",
        include_str!("../migrations/rules_table.sql")
    );
    let w = Scenario::new(&stack, "rulesrand", &ddl)
        .env("WAL2DELTA__RULES__TABLE", "{s}.wal2delta_rules")
        .env("WAL2DELTA__RULES__HITS_INTERVAL_MS", "0")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "200")
        .env("WAL2DELTA__SILVER__MAX_ATOMIC_TRANSACTION_ROWS", "70")
        .env("WAL2DELTA__GOLD__INTERVAL_MS", "500")
        .build()
        .await?;
    let (s, pg, mut d) = (w.name, w.pg, w.d);
    let models = d.dir.join("models");
    std::fs::create_dir_all(&models)?;
    std::fs::write(
        models.join("totals.sql"),
        format!(
            "-- key: merchant\n-- key of {s}.payments: merchant\n\
             SELECT merchant, count(*) AS n, sum(amount) AS total FROM {s}.payments GROUP BY merchant\n"
        ),
    )?;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    let lake = d.lake();

    pg.batch_execute(&format!(
        "INSERT INTO {s}.merchants SELECT i, i FROM generate_series(1, {MERCHANTS}) i; \
         INSERT INTO {s}.payments SELECT i, 1 + i % {MERCHANTS}, i * 7 FROM generate_series(1, {PAYMENTS}) i; \
         INSERT INTO {s}.wal2delta_rules (id, \"table\", \"when\", lookups) VALUES \
           ('r0', '{s}.payments', 'amount > 800', NULL), \
           ('r1', '{s}.payments', 'm.risk > 5', {}), \
           ('r2', '{s}.payments', 'amount % 3 = 0', NULL);",
        lookups(&s, "m.risk")
    ))
    .await?;
    let mut feed = d.spawn_stage("capture,bronze", "feed")?;
    let mut worker = d.spawn_stage("silver,rules,gold", "worker-0")?;
    let payments_log = lake
        .join("silver")
        .join(&s)
        .join("payments")
        .join("_delta_log");
    let merchants = lake.join("silver").join(&s).join("merchants");
    let hits_log = lake.join("rules/hits/_delta_log");
    let load = {
        let pg = stack.connect().await?;
        let s = s.clone();
        tokio::spawn(workload(pg, s, seed, 90))
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut faults = [0usize; 4];
    let mut restarts = 0;
    // Every kind of fault is drawn at least once, whatever the seed.
    while !load.is_finished() || faults.iter().sum::<usize>() < 6 || faults.contains(&0) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..2500))).await;
        feed.assert_running()?;
        let hold = Duration::from_millis(rng.random_range(1500..4000));
        let kind = rng.random_range(0..4);
        match kind {
            0 => {
                worker.kill9();
                restarts += 1;
                worker = d.spawn_stage("silver,rules,gold", &format!("worker-{restarts}"))?;
            }
            1 if payments_log.is_dir() => {
                // Silver commits of payments fail (after the rules appended theirs).
                let _frozen = ReadOnlyLake::set(payments_log.clone())?;
                tokio::time::sleep(hold).await;
            }
            2 if merchants.is_dir() => {
                // The looked-up table cannot be read.
                let away = FilesAway::take(&merchants, &d.dir.join("away"));
                tokio::time::sleep(hold).await;
                drop(away);
            }
            3 if hits_log.is_dir() => {
                let _frozen = ReadOnlyLake::set(hits_log.clone())?;
                tokio::time::sleep(hold).await;
            }
            _ => continue,
        }
        faults[kind] += 1;
        worker.assert_running()?;
    }
    let edits = load.await??;
    ensure!(
        faults.iter().all(|&n| n > 0),
        "every fault kind drawn: {faults:?}"
    );
    eprintln!(
        "rules_random: {edits} rule edits; faults: {} kills, {} failed Silver commit spells, {} unreadable lookup spells, {} unwritable hits spells",
        faults[0], faults[1], faults[2], faults[3]
    );
    // Silver first: the model Gold is compared with is computed over Silver, so Silver
    // must hold the source's final rows before it is (the hits alone can be final
    // earlier, when no final rule reads what Silver still has to apply).
    for (table, columns) in [
        ("payments", "id, merchant, amount"),
        ("merchants", "id, risk"),
    ] {
        let want = source_rows(&pg, &format!("{s}.{table}"), columns, "id").await?;
        let silver = lake.join("silver").join(&s).join(table);
        until(&mut worker, &format!("Silver of {table}"), &want, || {
            table_rows(&silver, columns, "id")
        })
        .await?;
    }
    let want = pg_hits(&pg, &s).await?;
    until(&mut worker, "the hits of the final rules", &want, || {
        rule_hits(&lake)
    })
    .await?;
    let (_, model) = gold(&lake, &s)?;
    until(
        &mut worker,
        "Gold equal to its model over Silver",
        &model,
        || Ok(gold(&lake, &s)?.0),
    )
    .await?;
    // The round that wrote the last hits commits Silver too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = exact_transitions(&lake)?;
    let recorded = rule_versions(&lake)?;
    ensure!(
        recorded.len() >= 2,
        "rule edits were recorded: {recorded:?}"
    );
    ensure!(worker.stop()?.success());
    ensure!(feed.stop()?.success());
    // Every lookup was exact: no table was released from a lookup hold, which would let
    // its lookups see the related rows as they are (issue 38; docs/rules.md, "Lookups").
    // The faults last seconds, the timeout 30 s, and a busy merchants table no longer
    // holds payments one change per round.
    for i in 0..=restarts {
        let log = std::fs::read_to_string(d.dir.join(format!("worker-{i}.log")))?;
        ensure!(
            !log.contains("past [rules] lookup_timeout_ms"),
            "worker-{i} released a lookup hold: its lookups were not exact"
        );
    }
    // Each (rule, key) alternates entered/left in LSN order, starting with entered.
    let mut last: std::collections::HashMap<(&str, &str), &str> = Default::default();
    let mut ordered: Vec<_> = first.iter().collect();
    // At an edit's position, its own transaction's changes (stream) come before its backfill.
    ordered.sort_by_key(|t| (t.4, t.5 != "stream"));
    for t in &ordered {
        let prev = last.insert((t.0.as_str(), t.2.as_str()), t.3.as_str());
        ensure!(
            prev != Some(t.3.as_str()) && (prev.is_some() || t.3 == "entered"),
            "transitions of ({}, {}) alternate: {:?} after {prev:?}",
            t.0,
            t.2,
            t
        );
    }

    // The same history from the topics, into a fresh lake, with the default rounds.
    let started = Instant::now();
    let (mut clean, lake2) = d.spawn_clean_run("bronze,silver,rules,gold")?;
    until(&mut clean, "the clean run's hits", &want, || {
        rule_hits(&lake2)
    })
    .await?;
    until(&mut clean, "the clean run's transitions", &first, || {
        exact_transitions(&lake2)
    })
    .await?;
    ensure!(
        rule_versions(&lake2)? == recorded,
        "the same edit positions"
    );
    until(&mut clean, "the clean run's Gold", &model, || {
        Ok(gold(&lake2, &s)?.0)
    })
    .await?;
    eprintln!(
        "rules_random: {} transitions equal one for one; the clean run took {:?}",
        first.len(),
        started.elapsed()
    );
    ensure!(clean.stop()?.success());
    Ok(())
}
