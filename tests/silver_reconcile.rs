//! `wal2delta reconcile` on the real stack (docs/architecture.md, promise 6): after a workload over
//! many types, with masked and tokenized columns, snapshot rows and a row capture cannot
//! decode, the source and Silver compare equal — also while the source keeps changing
//! during the run. A Silver that cannot reach the snapshot's LSN is an error (exit 2), and
//! rows changed behind Silver's back are found (exit 1) and named by key without printing
//! a value.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio_postgres::Client;
use wal2delta_tests::daemon::{Daemon, StageProcess};
use wal2delta_tests::lake::{duckdb_i64, scan, tamper};
use wal2delta_tests::{Scenario, Stack, World};

const TABLE: &str = "CREATE TABLE {s}.pay (
    id int PRIMARY KEY, owner text, amount numeric(12,2), big numeric, at timestamptz,
    doc jsonb, card text, email text, ssn text, flag boolean, day date, uid uuid,
    raw bytea, tags int[], span interval, ratio double precision, n bigint);
  INSERT INTO {s}.pay SELECT g,
    CASE WHEN g % 10 = 0 THEN NULL ELSE 'o' || g END,
    (g * 1.25)::numeric(12,2),
    CASE WHEN g % 50 = 0 THEN 'NaN'::numeric ELSE (g::numeric ^ 3) / 7 END,
    CASE WHEN g % 97 = 0 THEN 'infinity'::timestamptz
         ELSE '2024-01-01 00:00:00.123456+00'::timestamptz + g * interval '1 hour 1 second' END,
    jsonb_build_object('g', g, 'tags', jsonb_build_array('a', g), 'x', g * 0.5),
    '4111' || lpad(g::text, 12, '0'),
    'user' || g || '@example.com',
    lpad((g * 7)::text, 9, '0'),
    g % 2 = 0,
    date '2020-02-29' + g,
    md5(g::text)::uuid,
    decode(md5(g::text), 'hex'),
    ARRAY[g, NULL, g + 1],
    make_interval(months => g % 13, days => g % 31, secs => g * 1.5),
    g / 3.0,
    g::bigint * 1000000007
  FROM generate_series(1, 300) g;";

const TOML: &str = r#"[bronze]
group_id = "{s}"
max_batch_ms = 300
topic_refresh_ms = 500
[silver]
interval_ms = 300
mask_key_env = "W2D_TEST_MASK_KEY"
[silver.mask]
"{s}.pay.card" = "keep_last:4"
"{s}.pay.email" = "hash"
[[silver.checks]]
name = "amount_not_negative"
table = "{s}.pay"
column = "amount"
min = 0
[tokenize]
columns = ["{s}.pay.ssn:last4"]
key_env = "W2D_TEST_TOKEN_KEY"
[capture]
heartbeat_interval_ms = 500
[snapshot]
mode = "initial"
"#;

/// One random change: an insert, an update of several columns, or a delete.
fn change(s: &str, rng: &mut StdRng, next_id: &mut i32) -> String {
    let id = rng.random_range(1..*next_id);
    match rng.random_range(0..10) {
        0..=2 => {
            *next_id += 1;
            let n = *next_id;
            format!(
                "INSERT INTO {s}.pay (id, owner, amount, big, at, doc, card, email, ssn, flag, day, tags, span, ratio, n)
                 VALUES ({n}, 'new{n}', {n}.5, '-{n}.000100', now(), '{{\"n\": {n}, \"s\": \"é ü\"}}', '5500{n:012}',
                         'x{n}@example.com', '{n:09}', NULL, date '2020-02-29' + {n}, '{{}}', '-1 day', 'NaN', NULL)
                 ON CONFLICT DO NOTHING;"
            )
        }
        3..=7 => format!(
            "UPDATE {s}.pay SET owner = 'u' || {id} || 'é', amount = amount + 1, at = at - interval '1 day',
               doc = doc || '{{\"u\": true}}', card = '3714{id:012}', flag = NOT flag, tags = tags || {id}
             WHERE id = {id};"
        ),
        _ => format!("DELETE FROM {s}.pay WHERE id = {id};"),
    }
}

async fn count(pg: &Client, s: &str) -> Result<i64> {
    Ok(pg
        .query_one(&format!("SELECT count(*) FROM {s}.pay"), &[])
        .await?
        .get(0))
}

/// Waits until Silver holds `want` rows (the pipeline has caught up).
async fn wait_rows(d: &Daemon, want: i64, procs: &mut [&mut StageProcess]) -> Result<()> {
    let start = Instant::now();
    let silver = d.silver("pay");
    let mut have = -1;
    while start.elapsed() < Duration::from_secs(180) {
        for p in procs.iter_mut() {
            p.assert_running()?;
        }
        if let Ok(n) = duckdb_i64(&format!("SELECT count(*) FROM {}", scan(&silver))) {
            if n == want {
                return Ok(());
            }
            have = n;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("Silver holds {have} rows, never {want}")
}

/// Runs `reconcile` with `args`; its exit code, stdout (parsed when `--json`) and stderr.
fn reconcile(d: &Daemon, args: &[&str]) -> Result<(i32, String, String)> {
    let mut all = vec!["reconcile"];
    all.extend_from_slice(args);
    let out = d.command(&all)?;
    Ok(outcome(out))
}

fn outcome(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// No raw value of a masked or tokenized column (nor any e-mail) in the output.
fn assert_no_sensitive_values(text: &str) {
    assert!(
        !text.contains("@example.com"),
        "an e-mail reached the output"
    );
    for raw in ["41110000", "55000000", "37140000", "000000007"] {
        assert!(!text.contains(raw), "a raw card or ssn reached the output");
    }
}

fn table_report(stdout: &str) -> Result<Value> {
    let doc: Value = serde_json::from_str(stdout).context("reconcile --json printed no JSON")?;
    let tables = doc["tables"].as_array().context("no tables")?;
    ensure!(tables.len() == 1, "one table expected: {doc}");
    Ok(tables[0].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn reconcile_finds_silver_equal_and_names_what_differs() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(&stack, "rec", TABLE)
        .toml(TOML)
        .partitions(3)
        .env("W2D_TEST_MASK_KEY", "masking key of the reconcile test")
        .env("W2D_TEST_TOKEN_KEY", "token key of the reconcile test!")
        .build()
        .await?;
    // Capture and bronze in one process, silver in another, so Silver can be stopped alone.
    let mut pipe = d.spawn_stage("capture,bronze", "pipe")?;
    let mut silver = d.spawn_stage("silver", "silver")?;
    // The initial snapshot first, so that what follows is streamed.
    wait_rows(&d, 300, &mut [&mut pipe, &mut silver]).await?;

    // Streamed changes on top of the snapshot rows; a row capture cannot decode (a
    // two-dimensional array goes to the DLQ); an insert and an update that fail Silver's
    // check (quarantined: Silver holds no row, or the row before the update). Reconcile
    // must leave those three keys out.
    let mut rng = StdRng::seed_from_u64(11);
    let mut next_id = 300;
    for _ in 0..60 {
        let mut sql = String::from("BEGIN;");
        for _ in 0..rng.random_range(1..5) {
            sql.push_str(&change(&name, &mut rng, &mut next_id));
        }
        sql.push_str("COMMIT;");
        pg.batch_execute(&sql).await?;
    }
    pg.batch_execute(&format!(
        "INSERT INTO {name}.pay (id, owner, tags) VALUES (5000, 'bad', '{{{{1}},{{2}}}}');
         INSERT INTO {name}.pay (id, owner, amount) VALUES (6000, 'negative', -5);
         UPDATE {name}.pay SET amount = -1 WHERE id = (SELECT max(id) FROM {name}.pay WHERE id < 300);"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    let rows = count(&pg, &name).await?;
    wait_rows(&d, rows - 2, &mut [&mut pipe, &mut silver]).await?;
    // Silver really masks (so "equal" below means reconcile masked the source the same way).
    let first = pg
        .query_one(
            &format!("SELECT id, card FROM {name}.pay ORDER BY id LIMIT 1"),
            &[],
        )
        .await?;
    let (id, card): (i32, String) = (first.get(0), first.get(1));
    let masked = wal2delta_tests::lake::duckdb(&format!(
        "SELECT card, email, ssn FROM {} WHERE id = {id}",
        scan(&d.silver("pay"))
    ))?;
    let row = masked.first().context("no first row in Silver")?;
    assert_eq!(
        row[0],
        json!(format!("****{}", &card[card.len() - 4..])),
        "card keeps its last 4 only"
    );
    assert!(row[1]
        .as_str()
        .is_some_and(|e| e.len() == 32 && !e.contains('@')));
    assert!(row[2].as_str().is_some_and(|s| s.starts_with("tok1:")));

    // 1. Equal.
    let (code, stdout, stderr) = reconcile(&d, &["--json"])?;
    assert_no_sensitive_values(&stdout);
    assert_no_sensitive_values(&stderr);
    ensure!(code == 0, "reconcile exited {code}: {stdout}\n{stderr}");
    let t = table_report(&stdout)?;
    assert_eq!(t["name"], json!(format!("{name}.pay")));
    assert_eq!(t["equal"], json!(true), "{t}");
    assert_eq!(t["source_rows"], json!(rows - 3), "{t}");
    assert_eq!(t["silver_rows"], json!(rows - 3), "{t}");
    assert_eq!(t["source_checksum"], t["silver_checksum"]);
    assert_eq!(t["excluded"]["undecodable"], json!(1), "{t}");
    assert_eq!(t["excluded"]["quarantined"], json!(2), "{t}");
    assert_eq!(
        t["excluded"]["quarantine_records_without_key"],
        json!(0),
        "{t}"
    );
    assert_eq!(t["excluded"]["changed_after_snapshot"], json!(0), "{t}");
    assert_eq!(t["columns"].as_array().map(Vec::len), Some(17), "{t}");
    assert_eq!(t["differing_keys"], json!([]));
    let (code, text, _) = reconcile(&d, &[])?;
    ensure!(code == 0 && text.contains(": equal"), "{text}");

    // 2. Equal while the source keeps changing: changes after the snapshot are left out.
    let child = d
        .command_line(&["reconcile", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiter = {
        let done = done.clone();
        std::thread::spawn(move || {
            let out = child.wait_with_output();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            out
        })
    };
    let started = Instant::now();
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        if started.elapsed() > Duration::from_secs(300) {
            bail!("reconcile did not finish within 300 s");
        }
        pg.batch_execute(&change(&name, &mut rng, &mut next_id))
            .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, stdout, stderr) = outcome(waiter.join().expect("waiter")?);
    ensure!(code == 0, "reconcile exited {code}: {stdout}\n{stderr}");
    let t = table_report(&stdout)?;
    assert_eq!(t["equal"], json!(true), "{t}");
    assert!(
        t["excluded"]["changed_after_snapshot"].as_u64() > Some(0),
        "changes were written during the run: {t}"
    );

    // 3. Silver stopped: its watermark cannot reach a new snapshot. (Once the writes have
    // stopped, a run that ends equal says Silver has applied all of them.)
    let (code, stdout, stderr) = reconcile(&d, &["--json"])?;
    ensure!(code == 0, "reconcile exited {code}: {stdout}\n{stderr}");
    silver.stop()?;
    let ids: Vec<i32> = pg
        .query(
            &format!("SELECT id FROM {name}.pay WHERE id < 5000 ORDER BY id LIMIT 5"),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let [k1, k2, k3, k4, k5] = ids[..] else {
        bail!("fewer than 5 rows left: {ids:?}")
    };
    pg.batch_execute(&format!(
        "UPDATE {name}.pay SET owner = 'late' WHERE id = {k5}"
    ))
    .await?;
    let (code, stdout, stderr) = reconcile(&d, &["--json", "--wait-secs", "5"])?;
    ensure!(code == 2, "expected exit 2, got {code}: {stdout}\n{stderr}");
    assert!(
        stderr.contains("short of the snapshot LSN"),
        "the error says why: {stderr}"
    );
    let t = table_report(&stdout)?;
    assert!(
        t["error"].as_str().is_some_and(|e| e.contains("watermark")),
        "{t}"
    );

    // 4. Silver changed behind its back: one row's owner, one row's masked card, one row
    // deleted, one row copied under a key the source does not have.
    let path = d.silver("pay").display().to_string();
    tamper(&json!({
        "path": path,
        "update": [[format!("id = {k1}"), {"owner": "'tampered'"}],
                   [format!("id = {k2}"), {"card": "'****0000'"}]],
        "delete": [format!("id = {k3}")],
        "copy": [[["id", k4], "id", 999_999]],
    }))?;
    let mut silver = d.spawn_stage("silver", "silver-2")?;
    let (code, stdout, stderr) = reconcile(&d, &["--json"])?;
    assert_no_sensitive_values(&stdout);
    assert_no_sensitive_values(&stderr);
    ensure!(code == 1, "expected exit 1, got {code}: {stdout}\n{stderr}");
    let t = table_report(&stdout)?;
    assert_eq!(t["equal"], json!(false));
    assert_eq!(
        t["differences"],
        json!({"missing_in_silver": 1, "extra_in_silver": 1, "values_differ": 2}),
        "{t}"
    );
    assert_ne!(t["source_checksum"], t["silver_checksum"]);
    assert_eq!(
        t["differing_keys"],
        json!([
            {"key": {"id": k1}, "difference": "values_differ", "columns": ["owner"]},
            {"key": {"id": k2}, "difference": "values_differ", "columns": ["card"]},
            {"key": {"id": k3}, "difference": "missing_in_silver", "columns": []},
            {"key": {"id": 999_999}, "difference": "extra_in_silver", "columns": []},
        ]),
        "{t}"
    );
    let (code, text, _) = reconcile(&d, &["--max-keys", "1"])?;
    ensure!(code == 1, "{text}");
    assert!(
        text.contains(&format!("key {{\"id\":{k1}}}: values differ in owner")),
        "{text}"
    );
    assert!(
        !text.contains(&format!("{{\"id\":{k2}}}")),
        "one key only: {text}"
    );

    // 5. --table: the table itself, or a clear error.
    let (code, _, _) = reconcile(&d, &["--table", &format!("{name}.pay")])?;
    ensure!(code == 1, "--table {name}.pay exited {code}");
    let (code, _, stderr) = reconcile(&d, &["--table", &format!("{name}.nope")])?;
    ensure!(
        code == 2 && stderr.contains("not captured"),
        "{code}: {stderr}"
    );
    // A config it cannot use is exit 2 too (1 only ever means "different").
    let (code, _, stderr) = outcome(
        d.command_line(&["reconcile"])
            .env_remove("W2D_TEST_MASK_KEY")
            .output()?,
    );
    ensure!(
        code == 2 && stderr.contains("silver.mask_key_env"),
        "{code}: {stderr}"
    );

    silver.stop()?;
    pipe.stop()?;
    Ok(())
}
