//! Versioned lake formats (issue 41 item 3, docs/upgrading.md "Format versions"): a lake
//! an earlier release wrote (its commits record no `wal2delta.format`) is refused by the
//! stages with the table and `wal2delta upgrade` named, `upgrade --dry-run` changes
//! nothing, `upgrade` migrates every table and the daemon then goes on exactly; a table of
//! a newer format is refused by the stages and by `upgrade`. `--version` names the commit.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value as Json};
use wal2delta_tests::daemon::wait_log;
use wal2delta_tests::lake::table_rows;
use wal2delta_tests::{source_rows, Scenario, Stack};

const KEY: &str = "wal2delta.format";

/// Every `_delta_log` directory under `root`.
fn logs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if !path.is_dir() {
                continue;
            }
            if path.file_name().is_some_and(|n| n == "_delta_log") {
                found.push(path);
            } else {
                pending.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Per `_delta_log` under `lake`, how many of its commits are `wal2delta upgrade`'s.
fn migrations(lake: &Path) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for log in logs(lake)? {
        let mut n = 0;
        for c in commits(&log)? {
            if std::fs::read_to_string(&c)?.contains("\"wal2delta.upgrade\"") {
                n += 1;
            }
        }
        out.push(n);
    }
    Ok(out)
}

/// The commit files of a `_delta_log`, oldest first.
fn commits(log: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(log)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_stem()
                    .and_then(|s| s.to_str())
                    .is_some_and(|s| s.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Rewrites the `commitInfo` of a commit file with `edit` (the other actions unchanged).
fn edit_commit_info(file: &Path, edit: impl Fn(&mut serde_json::Map<String, Json>)) -> Result<()> {
    let text = std::fs::read_to_string(file)?;
    let mut out = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut action: Json =
            serde_json::from_str(line).with_context(|| format!("a line of {}", file.display()))?;
        if let Some(info) = action.get_mut("commitInfo").and_then(Json::as_object_mut) {
            edit(info);
        }
        out.push_str(&serde_json::to_string(&action)?);
        out.push('\n');
    }
    std::fs::write(file, out)?;
    Ok(())
}

/// What an earlier release left: the same commits, none recording a format.
fn as_written_by_an_earlier_release(lake: &Path) -> Result<usize> {
    let mut edited = 0;
    for log in logs(lake)? {
        for file in commits(&log)? {
            edit_commit_info(&file, |info| {
                info.remove(KEY);
            })?;
            edited += 1;
        }
    }
    Ok(edited)
}

/// The format each commit of `log` records (`None`: none), oldest first.
fn recorded(log: &Path) -> Result<Vec<Option<Json>>> {
    let mut found = Vec::new();
    for file in commits(log)? {
        let text = std::fs::read_to_string(&file)?;
        let info = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Json>(l).ok())
            .find_map(|a| a.get("commitInfo").cloned());
        found.push(info.and_then(|i| i.get(KEY).cloned()));
    }
    Ok(found)
}

fn lake_files(lake: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut all = Vec::new();
    for log in logs(lake)? {
        for entry in std::fs::read_dir(&log)? {
            let path = entry?.path();
            if path.is_file() {
                all.push((path.clone(), std::fs::read(&path)?));
            }
        }
    }
    all.sort();
    Ok(all)
}

fn stdout(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_earlier_releases_lake_is_refused_until_upgraded_then_goes_on_exactly() -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(
        &stack,
        "lakeup",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text);",
    )
    .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
    .build()
    .await?;
    let (s, pg, mut d) = (w.name, w.pg, w.d);
    let silver = d.silver("t");
    let lake = d.lake();

    // Written by this release: every commit records the format.
    let mut run = d.spawn_stage("capture,bronze,silver", "first")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.t SELECT g, 'a' || g FROM generate_series(1, 50) g"
    ))
    .await?;
    let want = source_rows(&pg, &format!("{s}.t"), "id, v", "id").await?;
    run.wait_for("Silver", &want, || table_rows(&silver, "id, v", "id"))
        .await?;
    ensure!(run.stop()?.success(), "{}", run.log_text());
    let silver_log = silver.join("_delta_log");
    let formats = recorded(&silver_log)?;
    ensure!(
        !formats.is_empty() && formats.iter().all(|f| f == &Some(json!(1))),
        "every Silver commit records format 1: {formats:?}"
    );

    // The same lake as an earlier release would have left it.
    let edited = as_written_by_an_earlier_release(&lake)?;
    ensure!(edited >= 2, "commits edited: {edited}");

    // The stages refuse it, naming the table and the fix; nothing is written.
    let before = lake_files(&lake)?;
    pg.batch_execute(&format!(
        "UPDATE {s}.t SET v = 'b' || id WHERE id <= 10; DELETE FROM {s}.t WHERE id > 45"
    ))
    .await?;
    let port = 19_700 + (std::process::id() % 200) as u16;
    d.env.push((
        "WAL2DELTA__METRICS__LISTEN".into(),
        format!("127.0.0.1:{port}"),
    ));
    let mut run = d.spawn_stage("capture,bronze,silver", "refused")?;
    let log = wait_log(
        &d.dir.join("refused.log"),
        &["is in lake format 0", "wal2delta upgrade --dry-run"],
        Duration::from_secs(90),
    )?;
    ensure!(
        log.contains(&format!("bronze/{s}/t")) || log.contains(&format!("{s}.t")),
        "the refusal names the table: {log}"
    );
    // And the daemon is not ready, saying why.
    let start = Instant::now();
    loop {
        let answer = match reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await {
            Ok(r) => Some((r.status().as_u16(), r.text().await?)),
            Err(_) => None,
        };
        if let Some((503, body)) = &answer {
            if body.contains("is in lake format 0") {
                break;
            }
        }
        if start.elapsed() > Duration::from_secs(90) {
            bail!("/readyz does not name the refusal: {answer:?}");
        }
        run.assert_running()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = run.stop();
    let after: Vec<_> = lake_files(&lake)?
        .into_iter()
        .filter(|(p, _)| !p.to_string_lossy().contains("_wal2delta/locks"))
        .collect();
    let before: Vec<_> = before
        .into_iter()
        .filter(|(p, _)| !p.to_string_lossy().contains("_wal2delta/locks"))
        .collect();
    ensure!(after == before, "a refused table is not written");

    // --dry-run lists what it would do and changes nothing.
    let out = d.command(&["upgrade", "--dry-run"])?;
    let text = stdout(&out);
    ensure!(out.status.success(), "upgrade --dry-run: {text}");
    ensure!(
        text.contains(&format!("silver/{s}/t: format 0: migrate to 1"))
            && text.contains("dry run")
            && !text.contains("would migrate 0 table"),
        "the dry run lists the migration: {text}"
    );
    ensure!(lake_files(&lake)? == after, "a dry run changes nothing");

    // A SIGKILL during the upgrade (as soon as one table is migrated, or wherever it
    // lands): each table is one commit, so the tables it migrated stay migrated and a
    // second run migrates the rest, none twice.
    let mut killed = d
        .command_line(&["upgrade"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let start = Instant::now();
    while migrations(&lake)?.iter().all(|&n| n == 0)
        && killed.try_wait()?.is_none()
        && start.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = killed.kill();
    let _ = killed.wait();
    let tables = logs(&lake)?.len();
    let done_before = migrations(&lake)?.iter().filter(|&&n| n > 0).count();
    eprintln!("lake_upgrade: the kill landed after {done_before} of {tables} tables");

    // The upgrade migrates every table left, in one commit each, recording from and to.
    let out = d.command(&["upgrade"])?;
    let text = stdout(&out);
    ensure!(out.status.success(), "upgrade: {text}");
    ensure!(
        text.contains(&format!("migrated {} table(s)", tables - done_before)),
        "the {} tables the killed run left are migrated: {text}",
        tables - done_before
    );
    ensure!(
        migrations(&lake)?.iter().all(|&n| n == 1),
        "every table migrated exactly once: {:?}",
        migrations(&lake)?
    );
    let formats = recorded(&silver_log)?;
    ensure!(
        formats.last() == Some(&Some(json!(1)))
            && formats[..formats.len() - 1].iter().all(Option::is_none),
        "the migration is one commit recording format 1: {formats:?}"
    );
    let last = commits(&silver_log)?.pop().context("a commit")?;
    let migration = std::fs::read_to_string(&last)?;
    ensure!(
        migration.contains(r#""wal2delta.upgrade":{"from":"0","to":1}"#)
            && !migration.contains(r#""add""#),
        "a metadata-only commit that says what it did: {migration}"
    );
    let out = d.command(&["upgrade", "--dry-run"])?;
    ensure!(
        stdout(&out).contains("would migrate 0 table(s)"),
        "a second run finds nothing to do: {}",
        stdout(&out)
    );

    // The daemon goes on, exactly: the changes made while it was refused, and later ones.
    let mut run = d.spawn_stage("capture,bronze,silver", "after")?;
    pg.batch_execute(&format!("INSERT INTO {s}.t VALUES (100, 'late')"))
        .await?;
    let want = source_rows(&pg, &format!("{s}.t"), "id, v", "id").await?;
    run.wait_for("Silver after the upgrade", &want, || {
        table_rows(&silver, "id, v", "id")
    })
    .await?;
    ensure!(run.stop()?.success(), "{}", run.log_text());

    // A table a newer release wrote: refused by the stages and by upgrade.
    let last = commits(&silver_log)?.pop().context("a commit")?;
    edit_commit_info(&last, |info| {
        info.insert(KEY.into(), json!(2));
    })?;
    let out = d.command(&["upgrade", "--dry-run"])?;
    let text = stdout(&out);
    ensure!(
        out.status.code() == Some(1)
            && text.contains(&format!(
                "silver/{s}/t: format 2: written by a newer release"
            )),
        "upgrade refuses a newer table: {text}"
    );
    pg.batch_execute(&format!("INSERT INTO {s}.t VALUES (101, 'newer')"))
        .await?;
    let mut run = d.spawn_stage("capture,bronze,silver", "newer")?;
    wait_log(
        &d.dir.join("newer.log"),
        &["is in lake format 2", "a newer release wrote it"],
        Duration::from_secs(90),
    )?;
    let _ = run.stop();
    ensure!(
        !table_rows(&silver, "id, v", "id")?.contains(&vec![json!(101), json!("newer")]),
        "a newer table is not written"
    );
    Ok(())
}

#[test]
fn the_version_names_the_release_the_commit_and_the_lake_format() -> Result<()> {
    let out = std::process::Command::new(wal2delta_tests::daemon::binary())
        .arg("--version")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(out.status.success(), "{text}");
    let ours = env!("CARGO_PKG_VERSION");
    ensure!(
        text.starts_with(&format!("wal2delta {ours} (commit ")) && text.contains("lake format 1)"),
        "{text}"
    );
    // Built from this checkout: the commit is its HEAD's, not "unknown".
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()?;
    if head.status.success() {
        let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        ensure!(text.contains(&head), "{text} names HEAD {head}");
    }
    Ok(())
}
