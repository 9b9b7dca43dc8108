//! The operator's kit (docs/operations.md) holds together:
//!
//! - `promtool check rules` accepts ops/prometheus/alerts.yml and `promtool test rules`
//!   passes its unit tests (ops/prometheus/alerts.test.yml); promtool comes from
//!   `ops/promtool` (Debian's package, unpacked, on a machine that has none);
//! - every alert's `runbook_url` is its entry in docs/operations.md, and every entry there
//!   is an alert;
//! - on the real stack, every metric an alert or a dashboard panel names is exported by a
//!   daemon running every stage (capture, bronze, silver, gold, rules) on a small workload
//!   that also meets the events those alerts watch for: a dead letter, a schema the
//!   registry refuses, a row failing a quality check, a row a rule cannot be evaluated on;
//! - with capture down (its broker unreachable) the slot is still watched: the daemon
//!   exports it as inactive, with its lag.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use wal2delta_tests::daemon::psql;
use wal2delta_tests::metrics::{self, free_port};
use wal2delta_tests::{repo_root, Scenario, Stack};

/// The path of promtool: `$WAL2DELTA_PROMTOOL`, else what `ops/promtool` provides.
fn promtool() -> Result<String> {
    if let Ok(p) = std::env::var("WAL2DELTA_PROMTOOL") {
        return Ok(p);
    }
    let out = Command::new(repo_root().join("ops/promtool"))
        .output()
        .context("running ops/promtool")?;
    ensure!(
        out.status.success(),
        "ops/promtool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn run_promtool(args: &[&str]) -> Result<String> {
    let out = Command::new(promtool()?)
        .args(args)
        .current_dir(repo_root())
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "promtool {args:?} failed:\n{text}");
    Ok(text)
}

#[test]
fn promtool_accepts_the_alert_rules_and_their_unit_tests() -> Result<()> {
    let checked = run_promtool(&["check", "rules", "ops/prometheus/alerts.yml"])?;
    // promtool counts the rules it read: all of them, not an empty file.
    let alerts = alerts()?.len();
    ensure!(
        checked.contains(&format!("SUCCESS: {alerts} rules found")),
        "promtool should find the {alerts} alerts: {checked}"
    );
    run_promtool(&["test", "rules", "ops/prometheus/alerts.test.yml"])?;
    Ok(())
}

/// `(alert name, runbook_url)` of every alert in alerts.yml, in order (the file keeps one
/// `- alert:` line per rule and its annotations below it).
fn alerts() -> Result<Vec<(String, Option<String>)>> {
    let text = std::fs::read_to_string(repo_root().join("ops/prometheus/alerts.yml"))?;
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert:") {
            out.push((name.trim().to_owned(), None));
        } else if let Some(url) = line.strip_prefix("runbook_url:") {
            let last = out.last_mut().context("runbook_url before any alert")?;
            ensure!(last.1.is_none(), "{} has two runbook_url", last.0);
            last.1 = Some(url.trim().trim_matches('"').to_owned());
        }
    }
    Ok(out)
}

#[test]
fn every_alert_links_to_its_runbook_entry() -> Result<()> {
    let doc = std::fs::read_to_string(repo_root().join("docs/operations.md"))?;
    // An entry is a `### AlertName` heading; GitHub's anchor for it is the name lowercased.
    let entries: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("### Wal2delta"))
        .map(|rest| format!("Wal2delta{}", rest.trim()))
        .collect();
    let alerts = alerts()?;
    ensure!(alerts.len() >= 20, "only {} alerts found", alerts.len());
    let mut wrong = Vec::new();
    for (name, url) in &alerts {
        let want = format!("docs/operations.md#{}", name.to_lowercase());
        if url.as_deref() != Some(want.as_str()) {
            wrong.push(format!("{name}: runbook_url {url:?}, want {want:?}"));
        }
        if !entries.contains(name) {
            wrong.push(format!(
                "{name}: no `### {name}` entry in docs/operations.md"
            ));
        }
    }
    let names: BTreeSet<&String> = alerts.iter().map(|(n, _)| n).collect();
    for entry in &entries {
        if !names.contains(entry) {
            wrong.push(format!(
                "docs/operations.md has an entry for {entry}, which alerts.yml does not define"
            ));
        }
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}

/// Every `wal2delta_…` metric name in `text`.
fn metric_names(text: &str, into: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(at) = rest.find("wal2delta_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            into.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
}

/// Every metric named by alerts.yml (outside comments) and by the dashboard's queries.
fn referenced_metrics() -> Result<BTreeSet<String>> {
    let root = repo_root();
    let mut names = BTreeSet::new();
    let alerts = std::fs::read_to_string(root.join("ops/prometheus/alerts.yml"))?;
    for line in alerts.lines().filter(|l| !l.trim_start().starts_with('#')) {
        metric_names(line, &mut names);
    }
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        root.join("ops/prometheus/dashboard.json"),
    )?)?;
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    ensure!(exprs.len() > 30, "only {} dashboard queries", exprs.len());
    for e in exprs {
        metric_names(&e, &mut names);
    }
    Ok(names)
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The series names `/metrics` shows (histograms are rendered as summaries: `name` with
/// quantiles, `name_sum`, `name_count`).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Sets `max_slot_wal_keep_size` on the stack's server for the test (the slot then has a
/// `safe_wal_size` and a time to invalidation) and resets it when dropped, also when the
/// test fails.
struct WalKeepLimit {
    admin_dsn: String,
}

impl WalKeepLimit {
    fn set(stack: &Stack) -> Result<WalKeepLimit> {
        let guard = WalKeepLimit {
            admin_dsn: stack.admin_dsn.clone(),
        };
        // ALTER SYSTEM cannot share a transaction with the reload: two commands.
        for sql in [
            "ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'",
            "SELECT pg_reload_conf()",
        ] {
            psql(&guard.admin_dsn, sql).with_context(|| format!("{sql} failed"))?;
        }
        Ok(guard)
    }
}

impl Drop for WalKeepLimit {
    fn drop(&mut self) {
        for sql in [
            "ALTER SYSTEM RESET max_slot_wal_keep_size",
            "SELECT pg_reload_conf()",
        ] {
            if psql(&self.admin_dsn, sql).is_none() {
                eprintln!("could not reset max_slot_wal_keep_size: {sql} failed");
            }
        }
    }
}

const TABLES: &str =
    "CREATE TABLE {s}.payments (id bigint PRIMARY KEY, amount numeric, currency text);
CREATE TABLE {s}.oddities (id bigint PRIMARY KEY, grid int[]);
CREATE TABLE {s}.evolving (id bigint PRIMARY KEY, v text);";

const TOML: &str = r#"[silver]
interval_ms = 300
[[silver.checks]]
name = "currency_present"
table = "{s}.payments"
not_null = "currency"
[gold]
interval_ms = 300
[bronze]
maintenance_interval_s = 2
"#;

fn rules(s: &str) -> String {
    format!(
        "[[rule]]\nid = \"big\"\ntable = \"{s}.payments\"\nwhen = \"CAST(amount AS DECIMAL(20, 2)) > 100\"\n"
    )
}

fn write_models(dir: &Path, s: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("totals.sql"),
        format!("SELECT currency, count(*) AS payments FROM {s}.payments GROUP BY currency"),
    )?;
    Ok(())
}

/// How long the metrics may take to appear (the slot's time to invalidation needs two
/// health samples 10 s apart; Bronze maintenance runs every 2 s once a table exists).
const METRICS_WITHIN: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_an_alert_or_panel_uses_is_exported() -> Result<()> {
    let wanted = referenced_metrics()?;
    ensure!(
        wanted.len() > 40,
        "only {} metric names found in alerts.yml and dashboard.json",
        wanted.len()
    );
    let stack = Stack::from_env();
    let _limit = WalKeepLimit::set(&stack)?;
    let port = free_port()?;
    let w = Scenario::new(&stack, "opsalerts", TABLES)
        .toml(TOML)
        .env("WAL2DELTA__METRICS__LISTEN", &format!("127.0.0.1:{port}"))
        .build_with_rules(rules)
        .await?;
    let (s, pg, mut d) = (w.name, w.pg, w.d);
    let models = d.dir.join("models");
    write_models(&models, &s)?;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    let mut run = d.spawn_stage("capture,bronze,silver,gold,rules", "run")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.payments VALUES (1, 150, 'EUR'), (2, 20, 'USD');
         -- fails the quality check: quarantined by Silver
         INSERT INTO {s}.payments VALUES (3, 10, NULL);
         -- no DECIMAL(20, 2) holds NaN: the rule cannot be evaluated on it
         INSERT INTO {s}.payments VALUES (4, 'NaN', 'EUR');
         -- a multi-dimensional array: a dead letter
         INSERT INTO {s}.oddities VALUES (1, '{{{{1,2}},{{3,4}}}}');
         INSERT INTO {s}.evolving VALUES (1, 'a');"
    ))
    .await?;
    // A column turned from text into bigint: the registry refuses the new schema (a long
    // reader cannot read the strings written before).
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.batch_execute(&format!(
        "ALTER TABLE {s}.evolving ALTER COLUMN v TYPE bigint USING 0;
         INSERT INTO {s}.evolving VALUES (2, 7);"
    ))
    .await?;

    let start = Instant::now();
    loop {
        run.assert_running()?;
        let text = metrics::text(port).await.unwrap_or_default();
        let have = exported(&text);
        let missing: Vec<&String> = wanted.iter().filter(|n| !have.contains(*n)).collect();
        if missing.is_empty() {
            ensure!(
                metric(&text, "wal2delta_slot_active") == Some(1.0),
                "capture reads the slot, yet it is exported as inactive"
            );
            break;
        }
        if start.elapsed() > METRICS_WITHIN {
            bail!(
                "metrics named by ops/prometheus/alerts.yml or dashboard.json that the daemon does not export: {missing:?}\n{}",
                run.log_text()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    run.stop()?;

    // Capture cannot reach its broker: no session reads the slot, which the daemon still
    // watches and exports as inactive, with its lag.
    let port = free_port()?;
    let dead_broker = format!("127.0.0.1:{}", free_port()?);
    d.env
        .push(("WAL2DELTA__KAFKA__BROKERS".into(), dead_broker));
    d.env.push((
        "WAL2DELTA__METRICS__LISTEN".into(),
        format!("127.0.0.1:{port}"),
    ));
    let mut down = d.spawn_stage("capture", "down")?;
    pg.batch_execute(&format!("INSERT INTO {s}.payments VALUES (5, 1, 'EUR')"))
        .await?;
    let start = Instant::now();
    loop {
        down.assert_running()?;
        let text = metrics::text(port).await.unwrap_or_default();
        let active = metric(&text, "wal2delta_slot_active");
        let lag = metric(&text, "wal2delta_slot_lag_bytes");
        if active == Some(0.0) && lag.is_some_and(|l| l > 0.0) {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "with capture down the slot should be exported as inactive, with its lag: active {active:?}, lag {lag:?}\n{}",
                down.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // SIGKILL, not SIGTERM: a capture session setting up against an unreachable broker
    // notices shutdown only when its topic request times out (up to a minute), which is
    // not what this test is about.
    down.kill9();
    Ok(())
}

/// The value of the unlabelled series `name`.
fn metric(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}
