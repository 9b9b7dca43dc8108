//! The rules stage under SIGKILL and hostile rows (docs/rules.md): a randomised workload
//! (snapshot rows, inserts, updates that leave a TOASTed column unchanged, updates of it,
//! deletes, key changes, multi-statement transactions) while the Silver + rules process
//! is SIGKILLed at random moments and restarted. Afterwards:
//! - the hits equal the rules evaluated on the source rows (computed by PostgreSQL), so a
//!   rule on the TOASTed column saw its value through updates that did not carry it;
//! - a rule that divides by zero on some rows quarantined those rows under its id and
//!   counted them as no hit, and the other rules went on;
//! - the transitions equal, one for one with their LSNs, those of a run without kills
//!   from the same Bronze: no duplicate, no gap; and no restart emitted a backfill.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::Client;
use wal2delta_tests::chaos::ReadOnlyLake;
use wal2delta_tests::lake::{duckdb, rule_hits};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.acct (id bigint PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL, doc text);
ALTER TABLE {s}.acct ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO {s}.acct SELECT g, (g * 37) % 1000, CASE WHEN g % 3 = 0 THEN 'USD' ELSE 'EUR' END, CASE WHEN g % 2 = 0 THEN repeat(md5(g::text), 120) ELSE 'short' END FROM generate_series(1, 150) g;
INSERT INTO {s}.acct VALUES (1000, 100, 'EUR', 'divides by zero');";

const TOML: &str = r#"[snapshot]
mode = "initial"
[silver]
interval_ms = 300
max_rows_per_partition = 500
"#;

fn rules(s: &str) -> String {
    let rule = |id: &str, when: &str| {
        format!("[[rule]]\nid = \"{id}\"\ntable = \"{s}.acct\"\nwhen = \"{when}\"\n\n")
    };
    [
        rule("big", "amount > 500"),
        rule("usd", "currency = 'USD'"),
        rule("long_doc", "length(doc) > 3000"),
        rule("ratio", "1000 / (amount - 100) > 5"),
        // Over two columns a large transaction changes in different statements, so in
        // different pieces: a key can enter it in one piece and leave it in the next.
        rule("big_usd", "amount > 500 AND currency = 'USD'"),
    ]
    .concat()
}

/// The hits the rules give on the source rows, `(key, rule)` sorted.
async fn expected_hits(pg: &Client, s: &str) -> Result<Vec<(String, String)>> {
    let rows = pg
        .query(
            &format!(
                "SELECT key, r FROM (SELECT '{{\"id\":' || id || '}}' AS key, r FROM (
                   SELECT id, 'big' AS r FROM {s}.acct WHERE amount > 500
                   UNION ALL SELECT id, 'usd' FROM {s}.acct WHERE currency = 'USD'
                   UNION ALL SELECT id, 'long_doc' FROM {s}.acct WHERE length(doc) > 3000
                   UNION ALL SELECT id, 'ratio' FROM {s}.acct WHERE CASE WHEN amount = 100 THEN false ELSE 1000 / (amount - 100) > 5 END
                   UNION ALL SELECT id, 'big_usd' FROM {s}.acct WHERE amount > 500 AND currency = 'USD'
                 ) x) y ORDER BY key COLLATE \"C\", r COLLATE \"C\""
            ),
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Every transition `(lsn, key, rule, transition, origin)`, sorted.
fn transitions(lake: &std::path::Path) -> Result<Vec<Vec<serde_json::Value>>> {
    duckdb(&format!(
        "SELECT lsn, key, rule_id, transition, origin FROM delta_scan('{}') ORDER BY ALL",
        lake.join("rules/transitions").display()
    ))
}

async fn workload(
    pg: &Client,
    s: &str,
    seed: u64,
    transactions: usize,
    large_every: Option<usize>,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_id = 2000;
    for t in 0..transactions {
        if large_every.is_some_and(|every| t % every == every - 1) {
            // Every row changed twice in one transaction, a TOASTed column left unchanged.
            let shift = rng.random_range(1..1200);
            pg.batch_execute(&format!(
                "BEGIN; UPDATE {s}.acct SET amount = (amount + {shift}) % 1200;
                 UPDATE {s}.acct SET currency = CASE currency WHEN 'USD' THEN 'EUR' ELSE 'USD' END WHERE id % 2 = 0;
                 COMMIT;"
            ))
            .await?;
        }
        let n = rng.random_range(1..=3);
        let mut sql = String::from("BEGIN;");
        for _ in 0..n {
            let id = rng.random_range(1..=160);
            let amount = rng.random_range(0..1200);
            sql.push_str(&match rng.random_range(0..10) {
                0..=3 => format!("UPDATE {s}.acct SET amount = {amount} WHERE id = {id};"),
                4 => format!("UPDATE {s}.acct SET currency = CASE currency WHEN 'USD' THEN 'EUR' ELSE 'USD' END WHERE id = {id};"),
                5 => format!("UPDATE {s}.acct SET doc = CASE WHEN length(doc) > 3000 THEN 'short' ELSE repeat(md5(random()::text), 120) END WHERE id = {id};"),
                6 => format!("DELETE FROM {s}.acct WHERE id = {id};"),
                7 => {
                    next_id += 1;
                    format!("UPDATE {s}.acct SET id = {next_id} WHERE id = {id};")
                }
                _ => format!("INSERT INTO {s}.acct VALUES ({id}, {amount}, 'USD', repeat(md5(random()::text), 120)) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount;"),
            });
        }
        sql.push_str("COMMIT;");
        if let Err(e) = pg.batch_execute(&sql).await {
            let detail = e.as_db_error().map(|d| d.message().to_owned());
            bail!("{sql}: {e} {detail:?}");
        }
        // Spread over the kills.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_survive_sigkill_without_duplicate_or_gap() -> Result<()> {
    survive_kills("rulescrash", TOML, 1500, None, Fault::Kill).await
}

/// Silver commits that fail several times in a row (the table's log made immutable for a
/// few seconds, while `rules/transitions` stays writable, so every failed round's
/// transitions are appended): the rounds that apply those changes again tag nothing
/// again, and no round takes the rules for out of sync (issue 38, defect 1: the second
/// failure in a row used to start a backfill at the old watermark and the stream then
/// emitted its transitions again).
#[tokio::test(flavor = "multi_thread")]
async fn rules_exact_after_silver_commits_fail_in_a_row() -> Result<()> {
    // Bronze commits often, so a round retried during a freeze has new changes to tag.
    let toml = format!("{TOML}[bronze]\nmax_batch_ms = 400\n");
    survive_kills("rulesfail", &toml, 1500, None, Fault::FailSilverCommits).await
}

/// The same with transactions over `[silver] max_atomic_transaction_rows` (every row
/// changed twice, applied in pieces of a 10-offset window): a kill between pieces, or
/// between a piece's rules commit and its Silver commit, neither loses nor repeats a
/// transition. The clean run applies every transaction whole, so the transitions must
/// not depend on where the pieces were cut either (issue 38, defect 3: a key that
/// entered `big_usd` in one piece and left it in the next got both).
#[tokio::test(flavor = "multi_thread")]
async fn rules_survive_sigkill_while_a_transaction_is_applied_in_pieces() -> Result<()> {
    let toml = "[snapshot]\nmode = \"initial\"\n[silver]\ninterval_ms = 300\n\
                max_rows_per_partition = 10\nmax_atomic_transaction_rows = 40\n";
    survive_kills("rulespieces", toml, 240, Some(40), Fault::Kill).await
}

/// What breaks the Silver + rules process while the workload runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, then a new process.
    Kill,
    /// The Silver table's log immutable for a few seconds: every Silver commit meanwhile
    /// fails (after the round appended its transitions), the process goes on.
    FailSilverCommits,
}

async fn survive_kills(
    prefix: &str,
    toml: &str,
    transactions: usize,
    large_every: Option<usize>,
    fault: Fault,
) -> Result<()> {
    let stack = Stack::from_env();
    // `rules/hits` committed as often as the commits finish, beside the rounds: the
    // kills land before, during and after them.
    let w = Scenario::new(&stack, prefix, TABLES)
        .toml(toml)
        .env("WAL2DELTA__RULES__HITS_INTERVAL_MS", "0")
        .build_with_rules(rules)
        .await?;
    let (s, pg, mut d) = (w.name, w.pg, w.d);
    let lake = d.lake();
    let mut feed = d.spawn_stage("capture,bronze", "feed")?;
    let mut silver = d.spawn_stage("silver,rules", "silver-0")?;
    let silver_log = lake.join("silver").join(&s).join("acct").join("_delta_log");
    if fault == Fault::FailSilverCommits {
        // The freezes must land while the workload runs: start it once Silver exists.
        let start = Instant::now();
        while !silver_log.exists() {
            silver.assert_running()?;
            ensure!(
                start.elapsed() < Duration::from_secs(120),
                "Silver never created the table: {}",
                silver.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let load = {
        let pg = stack.connect().await?;
        let s = s.clone();
        tokio::spawn(async move { workload(&pg, &s, 11, transactions, large_every).await })
    };
    let mut rng = StdRng::seed_from_u64(7);
    let mut kills = 0;
    // Faults that began while the workload ran (so the rounds had changes to apply).
    let mut loaded = 0;
    while !load.is_finished() || kills < 4 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(700..3000))).await;
        feed.assert_running()?;
        match fault {
            Fault::Kill => {
                silver.kill9();
                silver = d.spawn_stage("silver,rules", &format!("silver-{}", kills + 1))?;
            }
            Fault::FailSilverCommits => {
                if !silver_log.exists() {
                    continue;
                }
                loaded += usize::from(!load.is_finished());
                // Dropped (writable again) even when the test fails.
                let _frozen = ReadOnlyLake::set(silver_log.clone())?;
                tokio::time::sleep(Duration::from_millis(rng.random_range(3500..6000))).await;
                silver.assert_running()?;
            }
        }
        kills += 1;
    }
    load.await??;
    let want = expected_hits(&pg, &s).await?;
    let start = Instant::now();
    loop {
        silver.assert_running()?;
        let got = rule_hits(&lake)?;
        if got == want {
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            // Where it went wrong: the differing keys' rows in the source and in Silver.
            let keys: Vec<String> = want
                .iter()
                .filter(|h| !got.contains(h))
                .chain(got.iter().filter(|h| !want.contains(h)))
                .filter_map(|(k, _)| {
                    k.trim_start_matches("{\"id\":")
                        .trim_end_matches('}')
                        .parse::<i64>()
                        .ok()
                })
                .map(|id| id.to_string())
                .collect();
            let ids = if keys.is_empty() {
                "NULL".to_owned()
            } else {
                keys.join(",")
            };
            let columns = "id, amount, currency, length(doc)";
            let source: Vec<String> = pg
                .query(
                    &format!("SELECT {columns} FROM {s}.acct WHERE id IN ({ids}) ORDER BY id"),
                    &[],
                )
                .await?
                .iter()
                .map(|r| {
                    format!(
                        "{:?} {:?} {:?} {:?}",
                        r.get::<_, i64>(0),
                        r.get::<_, i64>(1),
                        r.get::<_, String>(2),
                        r.get::<_, Option<i32>>(3)
                    )
                })
                .collect();
            let silver_rows = duckdb(&format!(
                "SELECT {columns} FROM delta_scan('{}') WHERE id IN ({ids}) ORDER BY id",
                lake.join("silver").join(&s).join("acct").display()
            ));
            bail!(
                "after {kills} kills the hits are not the rules on the source rows: want {}, got {}\nmissing {:?}\nextra   {:?}\nsource rows {source:?}\nSilver rows {silver_rows:?}\n{}",
                want.len(),
                got.len(),
                want.iter().filter(|h| !got.contains(h)).take(20).collect::<Vec<_>>(),
                got.iter().filter(|h| !want.contains(h)).take(20).collect::<Vec<_>>(),
                silver.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    // Let the round that wrote the last hits commit Silver too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(silver.stop()?.success());
    ensure!(feed.stop()?.success());
    let killed = transitions(&lake)?;
    ensure!(
        killed.iter().all(|t| t[4] == "stream"),
        "no restart emitted a backfill (the state was right each time): {:?}",
        killed
            .iter()
            .filter(|t| t[4] != "stream")
            .take(5)
            .collect::<Vec<_>>()
    );
    // No start backfilled either: the rule set recorded with the transitions matched.
    let (mut backfills, mut pieces) = (0, 0);
    for entry in std::fs::read_dir(&d.dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("silver-"))
        {
            let log = std::fs::read_to_string(&path)?;
            backfills += log.matches("rules installed: backfilled").count();
            pieces += log
                .matches("the last piece of a large source transaction")
                .count();
        }
    }
    ensure!(
        large_every.is_none() || pieces >= 2,
        "the large transactions were applied in pieces ({pieces} last pieces logged)"
    );
    ensure!(
        backfills == 0,
        "{backfills} restarts backfilled the rules again"
    );
    if fault == Fault::FailSilverCommits {
        // The faults did what they are for: rounds failed several times in a row (between
        // two "merging again"), while the workload ran.
        let log = std::fs::read_to_string(d.dir.join("silver-0.log"))?;
        let (mut run, mut longest, mut failed) = (0, 0, 0);
        for line in log.lines() {
            if line.contains("silver round of the table failed") {
                run += 1;
                failed += 1;
            } else if line.contains("Silver table merging again") {
                longest = longest.max(run);
                run = 0;
            }
        }
        ensure!(
            loaded >= 2 && longest >= 2,
            "the freezes failed Silver rounds several times in a row: at most {longest} in a row, {failed} in all, in {kills} freezes ({loaded} under load)"
        );
    }
    // The division by zero went to quarantine under the rule's id, as no hit.
    let quarantined = duckdb(&format!(
        "SELECT count(*) FROM delta_scan('{}') WHERE reason_code = 'rule_failed' AND check_name = 'ratio'",
        lake.join("quarantine/records").display()
    ))?;
    ensure!(
        quarantined[0][0].as_i64().unwrap_or(0) >= 1,
        "the rule's failing row is quarantined: {quarantined:?}"
    );
    ensure!(!want.contains(&("{\"id\":1000}".to_owned(), "ratio".to_owned())));

    // The same Bronze without kills: the same transitions, one for one.
    for dir in ["silver", "rules"] {
        std::fs::remove_dir_all(lake.join(dir))?;
    }
    if large_every.is_some() {
        // Whole transactions, no pieces.
        d.env.push((
            "WAL2DELTA__SILVER__MAX_ATOMIC_TRANSACTION_ROWS".into(),
            "1000000".into(),
        ));
    }
    let mut clean = d.spawn_stage("silver,rules", "clean")?;
    let start = Instant::now();
    while rule_hits(&lake)? != want {
        clean.assert_running()?;
        if start.elapsed() > Duration::from_secs(300) {
            bail!("the clean run did not finish: {}", clean.log_text());
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(clean.stop()?.success());
    let replayed = transitions(&lake)?;
    if replayed != killed {
        let a: std::collections::BTreeSet<_> = killed
            .iter()
            .map(|v| serde_json::Value::from(v.clone()).to_string())
            .collect();
        let b: std::collections::BTreeSet<_> = replayed
            .iter()
            .map(|v| serde_json::Value::from(v.clone()).to_string())
            .collect();
        bail!(
            "killed run: {} transitions, clean run: {}; only killed: {:?}; only clean: {:?}",
            killed.len(),
            replayed.len(),
            a.difference(&b).take(5).collect::<Vec<_>>(),
            b.difference(&a).take(5).collect::<Vec<_>>()
        );
    }
    ensure!(
        killed.len() > 500,
        "a workload worth the name: {}",
        killed.len()
    );
    Ok(())
}
