//! `wal2delta rules validate FILE` (docs/rules.md): every rule checked against its table's
//! Silver schema; each bad rule named with the reason, exit 1; a good file exits 0. A
//! bounded numeric is a decimal in Silver, so `amount > 10000` is valid as written
//! (issue 40); comparing a text column with a number is named with the cast to write.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use wal2delta_tests::lake::delta_version;
use wal2delta_tests::{Scenario, Stack, World};

#[tokio::test(flavor = "multi_thread")]
async fn rules_are_checked_against_silver_and_each_bad_one_is_named() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(&stack, "rulesv", "CREATE TABLE {s}.transactions (id bigint PRIMARY KEY, amount numeric(12,2), currency text, score int);
")
        .build()
        .await?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.transactions VALUES (1, 10.5, 'EUR', 3);"
    ))
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    let start = Instant::now();
    while delta_version(&d.silver("transactions")).is_none() {
        run.assert_running()?;
        if start.elapsed() > Duration::from_secs(90) {
            bail!("Silver never created the table: {}", run.log_text());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(run.stop()?.success());

    let dir = d.lake().join("../rules");
    std::fs::create_dir_all(&dir)?;
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[[rule]]\nid = \"big_foreign\"\ntable = \"{name}.transactions\"\nwhen = \"amount > 10000 AND currency <> 'EUR'\"\nversion = 2\n\n\
             [[rule]]\nid = \"risky\"\ntable = \"{name}.transactions\"\nwhen = \"score >= 50 OR currency IN ('XXX', 'YYY')\"\nactive = false\n"
        ),
    )?;
    let out = d.command(&["rules", "validate", &good.display().to_string()])?;
    ensure!(
        out.status.success(),
        "a good file validates: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(String::from_utf8_lossy(&out.stdout).contains("2 rules, all valid"));

    let bad = dir.join("bad.toml");
    let rule = |id: &str, table: &str, when: &str| {
        format!("[[rule]]\nid = \"{id}\"\ntable = \"{table}\"\nwhen = \"{when}\"\n\n")
    };
    let t = format!("{name}.transactions");
    std::fs::write(
        &bad,
        [
            rule("ok", &t, "score > 1"),
            rule("syntax", &t, "score >"),
            rule("unknown_column", &t, "scor > 1"),
            rule("not_boolean", &t, "score + 1"),
            // A text column compared with a number: the mismatch that remains now that a
            // bounded numeric is a decimal (the good file compares amount as written).
            rule("text_vs_number", &t, "currency > 10000"),
            rule("no_silver", &format!("{name}.nope"), "true"),
            rule("ok", &t, "true"),
            rule("bad table", &t, "true"),
        ]
        .concat(),
    )?;
    let out = d.command(&["rules", "validate", &bad.display().to_string()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "exit 1: {out:?}");
    for (id, needle) in [
        ("syntax", ""),
        ("unknown_column", "scor"),
        ("not_boolean", "boolean"),
        ("text_vs_number", "cast it"),
        ("no_silver", "no Silver table"),
        ("ok", "used by another rule"),
        ("bad table", "an id is made of"),
    ] {
        ensure!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("rule \"{id}\": ")) && l.contains(needle)),
            "rule {id} named with {needle:?}: {stderr}"
        );
    }
    ensure!(stderr.contains("7 of 8 rules are not valid"), "{stderr}");
    // A file that is not TOML of rules: exit 2, naming the file.
    let junk = dir.join("junk.toml");
    std::fs::write(&junk, "[[rule]]\nid = 1\n")?;
    let out = d.command(&["rules", "validate", &junk.display().to_string()])?;
    ensure!(out.status.code() == Some(2), "{out:?}");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("junk.toml"));
    Ok(())
}
