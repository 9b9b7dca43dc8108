//! Gold models (docs/gold.md): SQL over Silver and over other models, refreshed when
//! their inputs change, each version recording the input versions it was computed from;
//! `replay --layer gold` equals the running result; bad models are refused naming them.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use serde_json::Value;
use wal2delta_tests::lake::{delta_version, duckdb, last_commit_info};
use wal2delta_tests::{Scenario, Stack, World};

const TABLES: &str = "CREATE TABLE {s}.transactions (id bigint PRIMARY KEY, merchant_id int NOT NULL, currency text NOT NULL, status text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());";

/// Settlement per merchant and currency (declined payments left out), and each merchant's
/// total over currencies (a model reading a model).
fn write_models(dir: &Path, s: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("settlement.sql"),
        format!("SELECT merchant_id, currency, sum(amount_cents) AS settled_cents, count(*) AS payments\nFROM {s}.transactions WHERE status <> 'declined'\nGROUP BY merchant_id, currency"),
    )?;
    std::fs::write(
        dir.join("merchant_totals.sql"),
        "-- reads another model\nSELECT merchant_id, sum(payments) AS payments FROM settlement GROUP BY merchant_id",
    )?;
    Ok(())
}

/// The settlement keyed by merchant and currency (refreshed incrementally) in `dir`.
fn write_keyed_settlement(dir: &Path, s: &str) -> Result<()> {
    std::fs::write(
        dir.join("settlement.sql"),
        format!("-- key: merchant_id, currency\n-- key of {s}.transactions: merchant_id, currency\nSELECT merchant_id, currency, sum(amount_cents) AS settled_cents, count(*) AS payments\nFROM {s}.transactions WHERE status <> 'declined'\nGROUP BY merchant_id, currency"),
    )?;
    Ok(())
}

/// The settlement as the source says it is, sorted.
async fn expected(pg: &tokio_postgres::Client, s: &str) -> Result<Vec<(i64, String, i64, i64)>> {
    let rows = pg
        .query(
            &format!("SELECT merchant_id::bigint, currency, sum(amount_cents)::bigint, count(*) FROM {s}.transactions WHERE status <> 'declined' GROUP BY 1, 2 ORDER BY 1, 2"),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect())
}

fn gold_rows(table: &Path) -> Result<Vec<(i64, String, i64, i64)>> {
    let rows = duckdb(&format!(
        "SELECT merchant_id::BIGINT, currency, settled_cents::BIGINT, payments::BIGINT FROM delta_scan('{}') ORDER BY 1, 2",
        table.display()
    ))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap_or(-1),
                r[1].as_str().unwrap_or_default().to_owned(),
                r[2].as_i64().unwrap_or(-1),
                r[3].as_i64().unwrap_or(-1),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn gold_follows_silver_records_its_inputs_and_replay_equals_it() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(&stack, "gold", TABLES).build().await?;
    let models = d.lake().join("../models");
    write_models(&models, &name)?;
    let mut d = d;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    d.env
        .push(("WAL2DELTA__GOLD__INTERVAL_MS".into(), "300".into()));
    d.env
        .push(("WAL2DELTA__SILVER__INTERVAL_MS".into(), "300".into()));
    pg.batch_execute(&format!(
        "INSERT INTO {name}.transactions (id, merchant_id, currency, status, amount_cents)
         SELECT g, g % 7, CASE WHEN g % 3 = 0 THEN 'EUR' ELSE 'USD' END,
                CASE WHEN g % 10 = 0 THEN 'declined' ELSE 'settled' END, g * 10
         FROM generate_series(1, 2000) g"
    ))
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver,gold", "run")?;
    let settlement = d.lake().join("gold/settlement");
    let totals = d.lake().join("gold/merchant_totals");
    let wait_equal = |what: &'static str| {
        let (pg, name, settlement) = (&pg, &name, &settlement);
        async move {
            let start = Instant::now();
            loop {
                let want = expected(pg, name).await?;
                if gold_rows(settlement).unwrap_or_default() == want {
                    return Ok::<_, anyhow::Error>(want);
                }
                if start.elapsed() > Duration::from_secs(120) {
                    bail!("{what}: gold/settlement never equalled the source");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    wait_equal("initial load")
        .await
        .map_err(|e| e.context(run.log_text()))?;

    // Updates, deletes, a declined payment, a new currency: Gold follows.
    pg.batch_execute(&format!(
        "UPDATE {name}.transactions SET amount_cents = amount_cents + 1 WHERE id % 5 = 0;
         DELETE FROM {name}.transactions WHERE id % 11 = 0;
         UPDATE {name}.transactions SET status = 'declined' WHERE id = 7;
         INSERT INTO {name}.transactions (id, merchant_id, currency, status, amount_cents) VALUES (5000, 3, 'GBP', 'settled', 999);"
    ))
    .await?;
    let want = wait_equal("after changes")
        .await
        .map_err(|e| e.context(run.log_text()))?;

    // The model over the model follows too.
    let start = Instant::now();
    loop {
        let rows = duckdb(&format!(
            "SELECT sum(payments)::BIGINT FROM delta_scan('{}')",
            totals.display()
        ))
        .unwrap_or_default();
        let total: i64 = want.iter().map(|r| r.3).sum();
        if rows.first().and_then(|r| r[0].as_i64()) == Some(total) {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "merchant_totals never followed settlement: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Each version says what it was computed from: Silver's current version, and the SQL.
    let info = last_commit_info(&settlement)?;
    let recorded = &info["wal2delta.gold"];
    let silver_version = delta_version(&d.silver("transactions")).unwrap_or(-1);
    ensure!(
        recorded["inputs"][format!("{name}.transactions")] == silver_version,
        "recorded {recorded}, Silver is at {silver_version}"
    );
    ensure!(
        recorded["sql_sha256"]
            .as_str()
            .is_some_and(|h| h.len() == 64),
        "{recorded}"
    );

    // Nothing changes: no new version, also across a restart.
    let before = delta_version(&settlement);
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(run.stop()?.success());
    let mut run = d.spawn_stage("capture,bronze,silver,gold", "run2")?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    run.assert_running()?;
    ensure!(
        delta_version(&settlement) == before,
        "an unchanged model was written again"
    );
    ensure!(run.stop()?.success());

    // replay --layer gold writes the same rows again, as a new version.
    let out = d.command(&["replay", "--layer", "gold", "--table", "settlement"])?;
    ensure!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains("settlement: rebuilt") && text.contains("merchant_totals: rebuilt"),
        "a replayed model rebuilds what reads it: {text}"
    );
    ensure!(delta_version(&settlement) > before);
    ensure!(gold_rows(&settlement)? == want);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn models_that_cannot_run_are_refused_at_startup_naming_the_model() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg: _pg, d, ..
    } = Scenario::new(&stack, "goldbad", TABLES).build().await?;
    let mut d = d;
    let models = d.lake().join("../models");
    std::fs::create_dir_all(&models)?;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    for (files, needle) in [
        (
            vec![("typo", format!("SELECT * FROM {name}.transaction"))],
            format!("gold model typo: it reads {name}.transaction, which is not a captured table"),
        ),
        (
            vec![
                ("a", "SELECT * FROM b".to_owned()),
                ("b", "SELECT * FROM a".to_owned()),
            ],
            "the models a, b read each other in a cycle".to_owned(),
        ),
        (
            vec![("Bad", format!("SELECT * FROM {name}.transactions"))],
            "lowercase SQL name".to_owned(),
        ),
    ] {
        for e in std::fs::read_dir(&models)? {
            std::fs::remove_file(e?.path())?;
        }
        for (f, sql) in &files {
            std::fs::write(models.join(format!("{f}.sql")), sql)?;
        }
        let out = d.command(&["run", "--stage", "gold"])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "{files:?} started");
        ensure!(stderr.contains(&needle), "expected {needle:?}: {stderr}");
    }
    Ok(())
}

/// The quickstart's models (ops/models), on the quickstart's payments schema.
#[tokio::test(flavor = "multi_thread")]
async fn the_quickstart_models_run_on_the_payments_schema() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(&stack, "goldqs", "CREATE TABLE {s}.accounts (id bigserial PRIMARY KEY, email text NOT NULL, country char(2) NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE {s}.merchants (id bigserial PRIMARY KEY, name text NOT NULL, category text NOT NULL);
         CREATE TABLE {s}.transactions (id bigserial PRIMARY KEY, account_id bigint NOT NULL REFERENCES {s}.accounts, merchant_id bigint NOT NULL REFERENCES {s}.merchants,
           amount numeric(18,2) NOT NULL, currency char(3) NOT NULL, card_number text NOT NULL,
           status text NOT NULL DEFAULT 'pending', created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz);")
        .build()
        .await?;
    let mut d = d;
    let models = d.lake().join("../models");
    std::fs::create_dir_all(&models)?;
    let shipped = wal2delta_tests::repo_root().join("ops/models");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&shipped)? {
        let path = e?.path();
        let sql = std::fs::read_to_string(&path)?.replace("public.", &format!("{name}."));
        std::fs::write(models.join(path.file_name().unwrap_or_default()), sql)?;
        names.push(
            path.file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        );
    }
    ensure!(names.len() >= 4, "{names:?}");
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    d.env
        .push(("WAL2DELTA__GOLD__INTERVAL_MS".into(), "500".into()));
    pg.batch_execute(&format!(
        "INSERT INTO {name}.accounts (email, country) SELECT 'u' || g, 'DE' FROM generate_series(1, 20) g;
         INSERT INTO {name}.merchants (name, category) SELECT 'm' || g, (ARRAY['grocery','travel','games'])[1 + g % 3] FROM generate_series(1, 5) g;
         INSERT INTO {name}.transactions (account_id, merchant_id, amount, currency, card_number, status, created_at)
           SELECT 1 + g % 20, 1 + g % 5, (g % 997) + 0.25, (ARRAY['EUR','USD','GBP'])[1 + g % 3], 'x',
                  (ARRAY['pending','settled','settled','declined'])[1 + g % 4], now() - (g % 48) * INTERVAL '1 hour'
           FROM generate_series(1, 3000) g;"
    ))
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver,gold", "run")?;
    let gold = |m: &str| d.lake().join("gold").join(m);
    let want: Vec<Vec<Value>> = pg
        .query(
            &format!("SELECT merchant_id, currency::text, created_at::date::text, sum(amount)::text, count(*) FROM {name}.transactions WHERE status = 'settled' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"),
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            vec![
                Value::from(r.get::<_, i64>(0)),
                Value::from(r.get::<_, String>(1)),
                Value::from(r.get::<_, String>(2)),
                Value::from(r.get::<_, String>(3)),
                Value::from(r.get::<_, i64>(4)),
            ]
        })
        .collect();
    let start = Instant::now();
    loop {
        let all_there = names.iter().all(|m| delta_version(&gold(m)).is_some());
        let got = duckdb(&format!(
            "SELECT merchant_id::BIGINT, currency, CAST(day AS VARCHAR), CAST(settled_amount AS VARCHAR), payments::BIGINT FROM delta_scan('{}') ORDER BY 1, 2, 3",
            gold("daily_settlement").display()
        ))
        .unwrap_or_default();
        if all_there && got == want {
            break;
        }
        run.assert_running()?;
        if start.elapsed() > Duration::from_secs(120) {
            bail!(
                "the quickstart models did not all reach the source's state ({} settlement rows, {} expected): {}",
                got.len(),
                want.len(),
                run.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The features see the last day only, and a share is a share. Each model is
    // refreshed on its own (one may be retrying while another is written): wait for it.
    let in_a_day: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM {name}.transactions WHERE created_at >= now() - INTERVAL '1 day'"),
            &[],
        )
        .await?
        .get(0);
    let start = Instant::now();
    loop {
        let f = duckdb(&format!(
            "SELECT count(*), min(declined_share_1d), max(declined_share_1d), sum(payments_1d)::BIGINT FROM delta_scan('{}')",
            gold("account_features").display()
        ))?;
        if f[0][0] == 20
            && f[0][1].as_f64().is_some_and(|v| v >= 0.0)
            && f[0][2].as_f64().is_some_and(|v| v <= 1.0)
            && (f[0][3].as_i64().unwrap_or(0) - in_a_day).abs() <= 20
        {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "account_features {f:?}, {in_a_day} payments in the last day: {}",
                run.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(run.stop()?.success());
    Ok(())
}

/// Per merchant and day (UTC): the category and the amount, as the source says.
async fn daily_expected(
    pg: &tokio_postgres::Client,
    s: &str,
) -> Result<Vec<(i64, String, String, i64)>> {
    let rows = pg
        .query(
            &format!("SELECT t.merchant_id::bigint, (t.created_at AT TIME ZONE 'UTC')::date::text, max(m.category), sum(t.amount_cents)::bigint FROM {s}.transactions t JOIN {s}.merchants m ON m.id = t.merchant_id GROUP BY 1, 2 ORDER BY 1, 2"),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect())
}

/// The operations of every commit of a Delta table, oldest first.
fn operations(table: &Path) -> Result<Vec<String>> {
    let mut logs: Vec<_> = std::fs::read_dir(table.join("_delta_log"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    logs.sort();
    let mut ops = Vec::new();
    for log in logs {
        for line in std::fs::read_to_string(&log)?.lines() {
            let v: Value = serde_json::from_str(line)?;
            if let Some(op) = v["commitInfo"]["operation"].as_str() {
                ops.push(op.to_owned());
            }
        }
    }
    Ok(ops)
}

/// Every row of a Gold table as text, sorted: two tables are equal when these are.
fn all_rows(table: &Path, order: &str) -> Result<Vec<Vec<Value>>> {
    duckdb(&format!(
        "SELECT * FROM delta_scan('{}') ORDER BY {order}",
        table.display()
    ))
}

/// Keyed models are refreshed by MERGE of the keys whose rows changed (a payment moving
/// to another merchant recomputes both), follow a random workload exactly as the source
/// says, fall back to a whole rewrite when an input without a key changes, and equal a
/// full rebuild (`replay --layer gold`). A keyed model whose result has two rows for one
/// key fails alone, with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn keyed_models_merge_the_changed_keys_and_equal_a_full_rebuild() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(&stack, "goldinc", "CREATE TABLE {s}.transactions (id bigint PRIMARY KEY, merchant_id int NOT NULL, currency text NOT NULL, status text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL);
         CREATE TABLE {s}.merchants (id int PRIMARY KEY, category text NOT NULL);")
        .build()
        .await?;
    let mut d = d;
    let models = d.lake().join("../models");
    std::fs::create_dir_all(&models)?;
    write_keyed_settlement(&models, &name)?;
    // A key computed from an input's column, and an input without a key (merchants).
    std::fs::write(
        models.join("daily.sql"),
        format!("-- key: merchant_id, day\n-- key of {name}.transactions: merchant_id, CAST(created_at AS DATE)\nSELECT t.merchant_id, CAST(t.created_at AS DATE) AS day, max(m.category) AS category, sum(t.amount_cents) AS cents\nFROM {name}.transactions t JOIN {name}.merchants m ON m.id = t.merchant_id\nGROUP BY t.merchant_id, CAST(t.created_at AS DATE)"),
    )?;
    // Declares a key its result does not hold.
    std::fs::write(
        models.join("wrong_key.sql"),
        format!("-- key: currency\n-- key of {name}.transactions: currency\nSELECT merchant_id, currency, count(*) AS n FROM {name}.transactions GROUP BY merchant_id, currency"),
    )?;
    // Fails on a row's value: its error must not quote the value (issue 38, defect 10).
    std::fs::write(
        models.join("leaky.sql"),
        format!("SELECT id, CAST(status AS BIGINT) AS n FROM {name}.transactions WHERE status LIKE 'leak%'"),
    )?;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    d.env
        .push(("WAL2DELTA__GOLD__INTERVAL_MS".into(), "400".into()));
    d.env
        .push(("WAL2DELTA__SILVER__INTERVAL_MS".into(), "300".into()));
    let port = wal2delta_tests::metrics::free_port()?;
    d.env.push((
        "WAL2DELTA__METRICS__LISTEN".into(),
        format!("127.0.0.1:{port}"),
    ));
    pg.batch_execute(&format!(
        "INSERT INTO {name}.transactions VALUES (9999, 1, 'EUR', 'leak-7f3a9c', 1, timestamptz '2026-11-02 12:00:00+00');
         INSERT INTO {name}.merchants SELECT g, 'c' || (g % 3) FROM generate_series(0, 39) g;
         INSERT INTO {name}.transactions (id, merchant_id, currency, status, amount_cents, created_at)
         SELECT g, g % 40, (ARRAY['EUR','USD','GBP'])[1 + g % 3],
                CASE WHEN g % 10 = 0 THEN 'declined' ELSE 'settled' END, g * 10,
                timestamptz '2026-11-01 12:00:00+00' + (g % 9) * INTERVAL '1 day'
         FROM generate_series(1, 3000) g"
    ))
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver,gold", "run")?;
    let settlement = d.lake().join("gold/settlement");
    let daily = d.lake().join("gold/daily");
    let daily_got = |t: &Path| -> Result<Vec<(i64, String, String, i64)>> {
        Ok(duckdb(&format!(
            "SELECT merchant_id::BIGINT, CAST(day AS VARCHAR), category, cents::BIGINT FROM delta_scan('{}') ORDER BY 1, 2",
            t.display()
        ))?
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap_or(-1),
                r[1].as_str().unwrap_or_default().to_owned(),
                r[2].as_str().unwrap_or_default().to_owned(),
                r[3].as_i64().unwrap_or(-1),
            )
        })
        .collect())
    };
    let wait_equal = |what: String| {
        let (pg, name, settlement, daily) = (&pg, &name, &settlement, &daily);
        let daily_got = &daily_got;
        async move {
            let start = Instant::now();
            loop {
                let want = expected(pg, name).await?;
                let dwant = daily_expected(pg, name).await?;
                if gold_rows(settlement).unwrap_or_default() == want
                    && daily_got(daily).unwrap_or_default() == dwant
                {
                    return Ok::<_, anyhow::Error>(());
                }
                if start.elapsed() > Duration::from_secs(120) {
                    bail!("{what}: the gold models never equalled the source");
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        }
    };
    wait_equal("initial load".into())
        .await
        .map_err(|e| e.context(run.log_text()))?;

    // The model that fails on a value is reported by name, its reason without the value,
    // in the log, on /readyz and by `status`.
    let readyz = || async {
        let r = reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await?;
        Ok::<_, anyhow::Error>(r.text().await?)
    };
    let start = Instant::now();
    while !readyz().await.unwrap_or_default().contains("leaky") {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "/readyz never named the failing model: {}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let status = d.command(&["status", "--json"])?;
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    let log = run.log_text();
    ensure!(
        log.contains("leaky") && log.to_lowercase().contains("cast"),
        "the failing model is logged with what failed: {log}"
    );
    for (what, text) in [
        ("log", &log),
        ("/readyz", &readyz().await?),
        ("status", &status),
    ] {
        ensure!(
            !text.contains("7f3a9c"),
            "a row value reached the {what}: {text}"
        );
    }

    // A random workload in steps, each followed by a refresh: updates that move payments
    // to other merchants, currencies and days, status changes, deletes, inserts.
    let mut seed: u64 = 0x5eed_2026;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..8 {
        let mut sql = String::from("BEGIN;");
        for _ in 0..25 {
            let id = 1 + next(3200);
            sql.push_str(&match next(6) {
                0 => format!("UPDATE {name}.transactions SET merchant_id = {} WHERE id = {id};", next(40)),
                1 => format!("UPDATE {name}.transactions SET currency = 'CHF' WHERE id = {id};"),
                2 => format!("UPDATE {name}.transactions SET status = 'declined' WHERE id = {id};"),
                3 => format!("UPDATE {name}.transactions SET created_at = created_at + INTERVAL '3 days', amount_cents = amount_cents + 7 WHERE id = {id};"),
                4 => format!("DELETE FROM {name}.transactions WHERE id = {id};"),
                _ => format!("INSERT INTO {name}.transactions VALUES ({id}, {}, 'EUR', 'settled', {}, timestamptz '2026-11-20 08:00:00+00') ON CONFLICT (id) DO UPDATE SET amount_cents = EXCLUDED.amount_cents;", next(40), next(10_000)),
            });
        }
        sql.push_str("COMMIT;");
        pg.batch_execute(&sql).await?;
        wait_equal(format!("step {step}"))
            .await
            .map_err(|e| e.context(run.log_text()))?;
    }
    let ops = operations(&settlement)?;
    let merges = ops.iter().filter(|o| o.as_str() == "MERGE").count();
    ensure!(
        merges >= 6 && ops.iter().filter(|o| o.as_str() == "WRITE").count() == 1,
        "settlement should be written once, then merged at each step: {ops:?}"
    );
    // The merge records the Silver version it reflects: every later Silver commit only
    // recorded progress (no file added or removed).
    let info = last_commit_info(&settlement)?;
    let recorded = info["wal2delta.gold"]["inputs"][format!("{name}.transactions")]
        .as_i64()
        .unwrap_or(-1);
    let silver = d.silver("transactions");
    let now = delta_version(&silver).unwrap_or(-1);
    ensure!(
        recorded > 0 && recorded <= now,
        "recorded {recorded}, Silver at {now}"
    );
    for v in recorded + 1..=now {
        let log = std::fs::read_to_string(silver.join(format!("_delta_log/{v:020}.json")))?;
        ensure!(
            !log.contains("\"add\"") && !log.contains("\"remove\""),
            "Silver version {v} changed data after the recorded {recorded}"
        );
    }

    // A change of the input without a key (a merchant's category) rewrites daily whole.
    let writes_before = operations(&daily)?
        .iter()
        .filter(|o| o.as_str() == "WRITE")
        .count();
    pg.batch_execute(&format!(
        "UPDATE {name}.merchants SET category = 'moved' WHERE id = 5"
    ))
    .await?;
    wait_equal("category change".into())
        .await
        .map_err(|e| e.context(run.log_text()))?;
    let writes_after = operations(&daily)?
        .iter()
        .filter(|o| o.as_str() == "WRITE")
        .count();
    ensure!(
        writes_after == writes_before + 1,
        "daily: {writes_before} whole writes before, {writes_after} after"
    );

    // The model whose key does not hold failed alone, saying why, and wrote nothing.
    let log = run.log_text();
    ensure!(
        log.contains("wrong_key") && log.contains("more than one row for"),
        "the wrong key is reported: {log}"
    );
    ensure!(delta_version(&d.lake().join("gold/wrong_key")).is_none());
    run.assert_running()?;
    ensure!(run.stop()?.success());

    // The incremental result equals a full rebuild.
    let incremental_s = all_rows(&settlement, "merchant_id, currency")?;
    let incremental_d = all_rows(&daily, "merchant_id, day")?;
    std::fs::remove_file(models.join("wrong_key.sql"))?;
    std::fs::remove_file(models.join("leaky.sql"))?;
    let out = d.command(&["replay", "--layer", "gold"])?;
    ensure!(out.status.success(), "{out:?}");
    ensure!(
        operations(&settlement)?.last().map(String::as_str) == Some("WRITE"),
        "replay rewrites whole"
    );
    ensure!(all_rows(&settlement, "merchant_id, currency")? == incremental_s);
    ensure!(all_rows(&daily, "merchant_id, day")? == incremental_d);
    Ok(())
}

/// Silver and Gold compacted and checkpointed on schedule while a keyed model refreshes
/// incrementally: compaction changes files, not rows, so the model stays equal to the
/// source and keeps merging (a compaction hiding the model's recorded inputs would make it
/// rewrite whole), and Silver keeps its masking record (no rebuild).
#[tokio::test(flavor = "multi_thread")]
async fn scheduled_compaction_of_silver_and_gold_keeps_incremental_refresh_exact() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, mut d, .. } = Scenario::new(&stack, "goldopt", "CREATE TABLE {s}.transactions (id bigint PRIMARY KEY, merchant_id int NOT NULL, currency text NOT NULL, status text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL);")
        .build()
        .await?;
    let models = d.lake().join("../models-opt");
    std::fs::create_dir_all(&models)?;
    write_keyed_settlement(&models, &name)?;
    for (k, v) in [
        ("WAL2DELTA__GOLD__MODELS_DIR", models.display().to_string()),
        ("WAL2DELTA__GOLD__INTERVAL_MS", "400".into()),
        ("WAL2DELTA__GOLD__MAINTENANCE_INTERVAL_S", "2".into()),
        ("WAL2DELTA__SILVER__INTERVAL_MS", "300".into()),
        ("WAL2DELTA__SILVER__MAINTENANCE_INTERVAL_S", "2".into()),
    ] {
        d.env.push((k.into(), v));
    }
    pg.batch_execute(&format!(
        "INSERT INTO {name}.transactions SELECT g, g % 20, (ARRAY['EUR','USD'])[1 + g % 2], 'settled', g, now() FROM generate_series(1, 500) g"
    ))
    .await?;
    let mut run = d.spawn_stage("capture,bronze,silver,gold", "run")?;
    let settlement = d.lake().join("gold/settlement");
    for step in 0..10 {
        // First new keys only (each MERGE of Silver and of the model adds a file and
        // rewrites none, so small files accumulate for compaction), then changes of
        // existing keys across those files, after compactions.
        let sql = if step < 6 {
            format!(
                "INSERT INTO {name}.transactions SELECT 10000 + {step} * 100 + g, 100 + {step}, 'EUR', 'settled', g, now() FROM generate_series(1, 20) g;"
            )
        } else {
            format!(
                "UPDATE {name}.transactions SET amount_cents = amount_cents + {step}, merchant_id = (merchant_id + 1) % 20 WHERE id % 37 = {step};
                 UPDATE {name}.transactions SET status = 'declined' WHERE id = 10000 + {} + 1;",
                (step - 6) * 100
            )
        };
        pg.batch_execute(&sql).await?;
        let want = expected(&pg, &name).await?;
        run.wait_for(&format!("step {step}"), &want, || {
            Ok(gold_rows(&settlement).unwrap_or_default())
        })
        .await?;
        // Time for a maintenance pass of each stage between some steps.
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let log = std::fs::read_to_string(&run.log)?;
    for what in [
        "Gold table compacted and checkpointed",
        "Silver table compacted and checkpointed",
    ] {
        ensure!(log.contains(what), "{what} missing: {}", run.log_text());
    }
    ensure!(
        !log.contains("rebuilt under the new masking policy"),
        "Silver was rebuilt: its masking record was hidden"
    );
    let ops = operations(&settlement)?;
    ensure!(
        ops.iter().any(|o| o == "OPTIMIZE"),
        "settlement was compacted: {ops:?}"
    );
    ensure!(
        ops.iter().filter(|o| o.as_str() == "WRITE").count() == 1
            && ops.iter().filter(|o| o.as_str() == "MERGE").count() >= 5,
        "written once, then merged, compaction or not: {ops:?}"
    );
    ensure!(
        operations(&d.silver("transactions"))?
            .iter()
            .any(|o| o == "OPTIMIZE"),
        "Silver was compacted"
    );
    let info = last_commit_info(&settlement)?;
    ensure!(
        info.get("wal2delta.gold").is_some(),
        "the latest commit carries the model's record: {info}"
    );
    run.assert_running()?;
    ensure!(run.stop()?.success());
    Ok(())
}

/// A keyed model over a table of at least 10,000 rows: changes of new keys (Silver adds
/// files, rewrites none) are merged for the affected keys; a change that makes Silver
/// rewrite the table's file is rebuilt from instead (finding the keys would read the
/// table twice), and says why. Exact either way.
#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_model_is_rebuilt_when_silver_rewrote_more_rows_than_its_input_holds() -> Result<()>
{
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(&stack, "goldcost", TABLES).build().await?;
    let models = d.lake().join("../models-cost");
    std::fs::create_dir_all(&models)?;
    write_keyed_settlement(&models, &name)?;
    for (k, v) in [
        ("WAL2DELTA__GOLD__MODELS_DIR", models.display().to_string()),
        ("WAL2DELTA__GOLD__INTERVAL_MS", "300".into()),
        ("WAL2DELTA__SILVER__INTERVAL_MS", "300".into()),
    ] {
        d.env.push((k.into(), v));
    }
    let mut run = d.spawn_stage("capture,bronze,silver,gold", "run")?;
    let settlement = d.lake().join("gold/settlement");
    let steps = [
        // One Silver file of 12,000 rows; the model's first version is written whole.
        ("preload", format!("INSERT INTO {name}.transactions SELECT g, g % 50, (ARRAY['EUR','USD'])[1 + g % 2], 'settled', g, now() FROM generate_series(1, 12000) g")),
        // New keys only: Silver adds a file and rewrites none.
        ("new keys", format!("INSERT INTO {name}.transactions SELECT g, 100 + g % 3, 'EUR', 'settled', g, now() FROM generate_series(20001, 20010) g")),
        // One row of the big file: Silver rewrites its 12,000 rows.
        ("update", format!("UPDATE {name}.transactions SET amount_cents = amount_cents + 7, status = 'declined' WHERE id = 4321")),
    ];
    let mut ops_after = Vec::new();
    for (what, sql) in &steps {
        pg.batch_execute(sql).await?;
        let want = expected(&pg, &name).await?;
        run.wait_for(what, &want, || {
            Ok(gold_rows(&settlement).unwrap_or_default())
        })
        .await?;
        ops_after.push(operations(&settlement)?);
    }
    let last_op = |i: usize| ops_after[i].last().cloned().unwrap_or_default();
    ensure!(
        last_op(1) == "MERGE",
        "new keys are merged: {:?}",
        ops_after[1]
    );
    ensure!(
        last_op(2) == "WRITE",
        "the update's rewrite of Silver's file rebuilds the model: {:?}",
        ops_after[2]
    );
    let log = std::fs::read_to_string(&run.log)?;
    ensure!(
        log.contains("a rebuild reads less"),
        "the rebuild says why: {}",
        run.log_text()
    );
    run.assert_running()?;
    ensure!(run.stop()?.success());
    Ok(())
}
