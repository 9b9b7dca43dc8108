//! The rules stage (docs/rules.md) on the real stack: the exact transitions of a scripted
//! history (inserts, updates, a transaction that leaves and re-enters, a key change, a
//! delete, a TRUNCATE); the same transitions when Silver and the rules are rebuilt from
//! Bronze in rounds of two rows; rule edits without a restart (backfill, a removed rule);
//! a bad rules file refused while the running rules go on; hits equal to a fresh
//! evaluation of the rules over the final Silver rows.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use wal2delta_tests::daemon::Daemon;
use wal2delta_tests::lake::{compactions, duckdb, duckdb_pairs, rule_hits};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.payments (id bigint PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL, note text);";

fn rule(id: &str, version: i64, when: &str, s: &str) -> String {
    format!("[[rule]]\nid = \"{id}\"\ntable = \"{s}.payments\"\nwhen = \"{when}\"\nversion = {version}\n\n")
}

/// `(lsn, key, rule, transition)` of the transitions of `origin`, in order.
type Rows = Vec<(i64, String, String, String)>;

fn transitions(lake: &Path, origin: &str) -> Result<Rows> {
    let path = lake.join("rules/transitions");
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let rows = duckdb(&format!(
        "SELECT lsn, key, rule_id, transition FROM delta_scan('{}') WHERE origin = '{origin}' ORDER BY lsn, key, transition DESC, rule_id",
        path.display()
    ))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap_or(-1),
                r[1].as_str().unwrap_or_default().to_owned(),
                r[2].as_str().unwrap_or_default().to_owned(),
                r[3].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

fn without_lsn(rows: &Rows) -> Vec<(String, String, String)> {
    rows.iter()
        .map(|(_, k, r, t)| (k.clone(), r.clone(), t.clone()))
        .collect()
}

fn k(id: i64) -> String {
    format!("{{\"id\":{id}}}")
}

fn tr(key: i64, rule: &str, t: &str) -> (String, String, String) {
    (k(key), rule.to_owned(), t.to_owned())
}

fn rules_file(d: &Daemon) -> PathBuf {
    d.dir.join("rules.toml")
}

#[tokio::test(flavor = "multi_thread")]
async fn transitions_are_exact_replayable_and_rules_change_without_restart() -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "rulesrun", TABLES)
        .env("WAL2DELTA__RULES__FILE", "{dir}/rules.toml")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        // Compacts rules/transitions and rules/hits under the rounds below: the
        // transitions and hits checked after it are read from the compacted files.
        .env("WAL2DELTA__SILVER__MAINTENANCE_INTERVAL_S", "2")
        .without_setup()
        .build()
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    std::fs::write(
        rules_file(&d),
        [
            rule("big", 1, "amount > 1000", &s),
            rule("usd_big", 1, "amount > 500 AND currency = 'USD'", &s),
        ]
        .concat(),
    )?;
    d.setup()?;
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    let history = [
        "INSERT INTO {s}.payments VALUES (1, 2000, 'EUR', 'a')",
        "INSERT INTO {s}.payments VALUES (2, 600, 'USD', 'b')",
        "UPDATE {s}.payments SET amount = 500 WHERE id = 1",
        // Leaves and re-enters inside one transaction: nothing.
        "BEGIN; UPDATE {s}.payments SET amount = 700 WHERE id = 2; UPDATE {s}.payments SET amount = 100 WHERE id = 2; UPDATE {s}.payments SET amount = 800 WHERE id = 2; COMMIT",
        // A key change: the old key leaves, the new one enters.
        "UPDATE {s}.payments SET id = 3 WHERE id = 2",
        "DELETE FROM {s}.payments WHERE id = 3",
        "INSERT INTO {s}.payments VALUES (4, 5000, 'USD', 'c'), (5, 50, 'EUR', 'd')",
        "TRUNCATE {s}.payments",
        "INSERT INTO {s}.payments VALUES (6, 3000, 'EUR', 'e')",
        // Enters and leaves in two transactions that will likely share a round.
        "INSERT INTO {s}.payments VALUES (7, 900, 'USD', 'f')",
        "UPDATE {s}.payments SET currency = 'EUR' WHERE id = 7",
    ];
    for sql in history {
        pg.batch_execute(&sql.replace("{s}", &s)).await?;
    }
    let expected = vec![
        tr(1, "big", "entered"),
        tr(2, "usd_big", "entered"),
        tr(1, "big", "left"),
        tr(2, "usd_big", "left"),
        tr(3, "usd_big", "entered"),
        tr(3, "usd_big", "left"),
        tr(4, "big", "entered"),
        tr(4, "usd_big", "entered"),
        tr(4, "big", "left"),
        tr(4, "usd_big", "left"),
        tr(6, "big", "entered"),
        tr(7, "usd_big", "entered"),
        tr(7, "usd_big", "left"),
    ];
    let lake = d.lake();
    run.wait_for("stream transitions", &expected, || {
        Ok(without_lsn(&transitions(&lake, "stream")?))
    })
    .await?;
    let streamed = transitions(&lake, "stream")?;
    // Each transition carries its transaction's commit LSN: ascending in history order.
    ensure!(
        streamed.windows(2).all(|p| p[0].0 <= p[1].0),
        "{streamed:?}"
    );
    // `rules/hits` follows the transitions within `[rules] hits_interval_ms`.
    run.wait_for("the hits", &vec![(k(6), "big".to_owned())], || {
        rule_hits(&lake)
    })
    .await?;

    // Rule edits, no restart: `big` changes (6 still matches: no transition), `eur` is
    // new (6 and 7 enter by backfill), `usd_big` is removed (no hits: nothing).
    // `rules apply` refuses a file with a bad rule (exit 1, nothing installed) and
    // installs a good one.
    let staged = d.dir.join("staged.toml");
    std::fs::write(&staged, rule("eur", 1, "currency = ", &s))?;
    let out = d.command(&["rules", "apply", &staged.display().to_string()])?;
    ensure!(
        out.status.code() == Some(1),
        "a bad file is refused: {out:?}"
    );
    ensure!(String::from_utf8_lossy(&out.stderr).contains("rule \"eur\""));
    std::fs::write(
        &staged,
        [
            rule("big", 2, "amount > 2500", &s),
            rule("eur", 1, "currency = 'EUR'", &s),
        ]
        .concat(),
    )?;
    let out = d.command(&["rules", "apply", &staged.display().to_string()])?;
    ensure!(out.status.success(), "a good file is installed: {out:?}");
    ensure!(std::fs::read_to_string(rules_file(&d))? == std::fs::read_to_string(&staged)?);
    let backfill = vec![tr(6, "eur", "entered"), tr(7, "eur", "entered")];
    run.wait_for("backfill", &backfill, || {
        Ok(without_lsn(&transitions(&lake, "backfill")?))
    })
    .await?;
    // A file with a bad rule is refused; the running rules go on.
    std::fs::write(
        rules_file(&d),
        [
            rule("big", 3, "amount > ", &s),
            rule("eur", 1, "currency = 'EUR'", &s),
        ]
        .concat(),
    )?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.payments VALUES (8, 9000, 'EUR', 'g'); DELETE FROM {s}.payments WHERE id = 6"
    ))
    .await?;
    // One transaction: ordered by key, then left before entered.
    let mut after = expected.clone();
    after.extend([tr(6, "big", "left"), tr(6, "eur", "left")]);
    after.extend([tr(8, "big", "entered"), tr(8, "eur", "entered")]);
    run.wait_for("stream after the edits", &after, || {
        Ok(without_lsn(&transitions(&lake, "stream")?))
    })
    .await?;
    ensure!(
        run.log_text()
            .contains("the new rules file is not installed"),
        "the bad file is reported: {}",
        run.log_text()
    );
    // The hits are what the running rules say about the final Silver rows (once
    // `rules/hits` caught up with the transitions and Silver committed: wait for it).
    let silver = d.silver("payments");
    let fresh = || {
        duckdb_pairs(&format!(
            "SELECT '{{\"id\":' || id || '}}' AS key, 'big' FROM delta_scan('{p}') WHERE amount > 2500 UNION ALL SELECT '{{\"id\":' || id || '}}', 'eur' FROM delta_scan('{p}') WHERE currency = 'EUR' ORDER BY 1, 2",
            p = silver.display()
        ))
    };
    run.wait_for("fresh evaluation equals the hits", &true, || {
        Ok(rule_hits(&lake)? == fresh()?)
    })
    .await
    .with_context(|| format!("hits {:?}\nfresh {:?}", rule_hits(&lake), fresh()))?;
    let list = d.command(&["rules", "list"])?;
    let text = String::from_utf8_lossy(&list.stdout);
    ensure!(list.status.success(), "{list:?}");
    ensure!(
        text.lines()
            .any(|l| l.starts_with("eur ") && l.trim_end().ends_with(" 2")),
        "rules list shows eur with 2 hits: {text}"
    );
    // The stage's maintenance compacted rules/transitions (an OPTIMIZE commit), and the
    // transitions read from the compacted files are still exactly the history's.
    let compacted = || Ok(compactions(&lake.join("rules/transitions"))? > 0);
    run.wait_for("rules/transitions compacted", &true, compacted)
        .await?;
    ensure!(without_lsn(&transitions(&lake, "stream")?) == after);
    ensure!(
        run.log_text()
            .contains("Rules table compacted and checkpointed"),
        "{}",
        run.log_text()
    );
    ensure!(run.stop()?.success());

    // Rebuilt from Bronze in rounds of at most two rows per partition: the same stream
    // transitions, LSNs included.
    for dir in ["silver", "rules"] {
        std::fs::remove_dir_all(lake.join(dir))?;
    }
    std::fs::write(
        rules_file(&d),
        [
            rule("big", 1, "amount > 1000", &s),
            rule("usd_big", 1, "amount > 500 AND currency = 'USD'", &s),
        ]
        .concat(),
    )?;
    let mut d2 = d;
    d2.env.push((
        "WAL2DELTA__SILVER__MAX_ROWS_PER_PARTITION".into(),
        "2".into(),
    ));
    let mut replay = d2.spawn_stage("silver,rules", "replay")?;
    let mut want = expected.clone();
    want.extend([tr(6, "big", "left"), tr(8, "big", "entered")]);
    replay
        .wait_for("replayed transitions", &want, || {
            Ok(without_lsn(&transitions(&lake, "stream")?))
        })
        .await?;
    let replayed = transitions(&lake, "stream")?;
    ensure!(
        replayed[..streamed.len()] == streamed[..],
        "replayed {replayed:?}\nstreamed {streamed:?}"
    );
    ensure!(replay.stop()?.success());
    Ok(())
}
