//! Gold models (docs/gold.md): SQL over Silver and over other models, refreshed when
//! their inputs change, each version recording the input versions it was computed from;
//! `replay --layer gold` equals the running result; bad models are refused naming them.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use serde_json::Value;
use wal2delta_tests::lake::{delta_version, duckdb, last_commit_info};
use wal2delta_tests::{scenario, Stack};

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
    let (name, pg, d) = scenario(&stack, "gold", TABLES, "", 1).await?;
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
    let (name, _pg, d) = scenario(&stack, "goldbad", TABLES, "", 1).await?;
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
    let (name, pg, d) = scenario(
        &stack,
        "goldqs",
        "CREATE TABLE {s}.accounts (id bigserial PRIMARY KEY, email text NOT NULL, country char(2) NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE {s}.merchants (id bigserial PRIMARY KEY, name text NOT NULL, category text NOT NULL);
         CREATE TABLE {s}.transactions (id bigserial PRIMARY KEY, account_id bigint NOT NULL REFERENCES {s}.accounts, merchant_id bigint NOT NULL REFERENCES {s}.merchants,
           amount numeric(18,2) NOT NULL, currency char(3) NOT NULL, card_number text NOT NULL,
           status text NOT NULL DEFAULT 'pending', created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz);",
        "",
        1,
    )
    .await?;
    let mut d = d;
    let models = d.lake().join("../models");
    std::fs::create_dir_all(&models)?;
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/models");
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
    // The features see the last day only, and a share is a share.
    let f = duckdb(&format!(
        "SELECT count(*), min(declined_share_1d), max(declined_share_1d), sum(payments_1d)::BIGINT FROM delta_scan('{}')",
        gold("account_features").display()
    ))?;
    let in_a_day: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM {name}.transactions WHERE created_at >= now() - INTERVAL '1 day'"),
            &[],
        )
        .await?
        .get(0);
    ensure!(
        f[0][0] == 20
            && f[0][1].as_f64().is_some_and(|v| v >= 0.0)
            && f[0][2].as_f64().is_some_and(|v| v <= 1.0)
            && (f[0][3].as_i64().unwrap_or(0) - in_a_day).abs() <= 20,
        "account_features {f:?}, {in_a_day} payments in the last day"
    );
    ensure!(run.stop()?.success());
    Ok(())
}
