//! Promise 5: sensitive columns are tokenized before events leave capture; no raw value of
//! a sensitive column appears in any topic capture writes (keys and values, dead letters,
//! position log and snapshot progress included), while equal values still get equal tokens.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use apache_avro::types::Value;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use wal2delta_tests::kafka::{field, read_topic, read_topic_to_end, string, AvroDecoder};
use wal2delta_tests::{Scenario, Stack, World};

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread")]
async fn no_raw_sensitive_value_reaches_kafka() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "tok",
        "CREATE TABLE {s}.tx (id int PRIMARY KEY, card_number text, email text, amount numeric(10,2), tags int[]);",
    )
    .toml("[tokenize]\ncolumns = [\"{s}.tx.card_number:last4\", \"{s}.tx.email\"]\nkey_env = \"W2D_TEST_TOKEN_KEY\"\nkey_id = \"test-1\"\n")
    .env("W2D_TEST_TOKEN_KEY", "a secret key for the test, 32b!")
    .build()
    .await?;
    d.start()?;

    let cards = ["4111111111119871", "5500000000006543", "4111111111119871"];
    let emails = ["alice@example.com", "bob@example.org", "carol@example.net"];
    for (i, (c, e)) in cards.iter().zip(emails).enumerate() {
        pg.execute(
            &format!("INSERT INTO {name}.tx VALUES ($1, $2, $3, 12.50, '{{1}}')"),
            &[&(i as i32 + 1), c, &e],
        )
        .await?;
    }
    pg.execute(
        &format!("UPDATE {name}.tx SET email = 'dave@example.com' WHERE id = 2"),
        &[],
    )
    .await?;
    // An undecodable row (two-dimensional array) of the same table: its dead letter
    // carries the raw row, which must be tokenized too.
    pg.execute(&format!("INSERT INTO {name}.tx VALUES (9, '3714496353984312', 'erin@example.com', 1, '{{{{1}},{{2}}}}')"), &[]).await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    d.assert_running()?;

    // Events: tokens, deterministic, with the last four digits of the card and the key id.
    let recs = read_topic(
        &stack.brokers,
        &format!("{name}.{name}.tx"),
        Some(4),
        Duration::from_secs(20),
    )?;
    ensure!(recs.len() == 4, "expected 4 events, got {}", recs.len());
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut tokens = Vec::new();
    for r in &recs {
        let v = dec.decode(&r.payload)?;
        let after = field(&v, "after").cloned().unwrap_or(Value::Null);
        tokens.push(string(field(&after, "card_number")).unwrap_or_default());
        ensure!(
            string(field(&v, "token_key_id")).as_deref() == Some("test-1"),
            "token_key_id missing"
        );
        ensure!(string(field(&after, "email"))
            .unwrap_or_default()
            .starts_with("tok1:test-1:"));
    }
    ensure!(
        tokens[0].starts_with("tok1:test-1:") && tokens[0].ends_with(":9871"),
        "{}",
        tokens[0]
    );
    ensure!(tokens[0] == tokens[2], "equal cards must give equal tokens");
    ensure!(tokens[0] != tokens[1]);
    let dlq = read_topic(
        &stack.brokers,
        &format!("{name}.dlq"),
        Some(1),
        Duration::from_secs(10),
    )?;
    ensure!(
        dlq.len() == 1,
        "the undecodable row should be a dead letter"
    );
    ensure!(
        contains(&dlq[0].payload, ":4312"),
        "dead letter keeps the tokenized last four"
    );

    // Nothing raw anywhere: every message of every topic this capture writes.
    let secrets = [
        "4111111111119871",
        "5500000000006543",
        "3714496353984312",
        "alice@example.com",
        "bob@example.org",
        "carol@example.net",
        "dave@example.com",
        "erin@example.com",
    ];
    let names = assert_no_topic_holds(&stack, &name, &secrets)?;
    for suffix in ["dlq", "positions", "snapshots"] {
        ensure!(
            names.contains(&format!("{name}.{suffix}")),
            "topic {name}.{suffix} missing from {names:?}"
        );
    }
    d.stop()?;
    Ok(())
}

/// Reads every message of every topic capture `name` writes (they carry its prefix:
/// events, DLQ, position log, snapshot progress; other tests' topics are not read) and
/// fails when a key or payload holds one of `needles`. The topics' names.
fn assert_no_topic_holds(stack: &Stack, name: &str, needles: &[&str]) -> Result<Vec<String>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .set("group.id", format!("w2d-scan-{name}"))
        .create()?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    let mut names = Vec::new();
    let mut scanned = 0;
    for t in md
        .topics()
        .iter()
        .filter(|t| t.name().starts_with(&format!("{name}.")))
    {
        for r in read_topic_to_end(&stack.brokers, t.name())? {
            for s in needles {
                ensure!(!contains(&r.payload, s), "{s} found in topic {}", t.name());
                ensure!(
                    !r.key.as_deref().is_some_and(|k| contains(k, s)),
                    "{s} found in a key of {}",
                    t.name()
                );
            }
            scanned += 1;
        }
        names.push(t.name().to_owned());
    }
    ensure!(scanned >= 5, "scanned only {scanned} messages");
    Ok(names)
}

/// Snapshot progress of a table whose primary key is tokenized: the snapshots topic holds
/// the last key sealed, never a raw key value, and a killed snapshot still resumes after
/// the last recorded chunk (the sealed key opens again).
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_progress_never_holds_a_raw_tokenized_key() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "toksnap",
        "CREATE TABLE {s}.cards (card_number text PRIMARY KEY, v int);
         INSERT INTO {s}.cards SELECT 'card-' || lpad(g::text, 6, '0'), g FROM generate_series(1, 2000) g;",
    )
    .toml("[tokenize]\ncolumns = [\"{s}.cards.card_number\"]\nkey_env = \"W2D_TEST_TOKEN_KEY\"\nkey_id = \"test-1\"\n[snapshot]\nchunk_rows = 10\n")
    .env("W2D_TEST_TOKEN_KEY", "a secret key for the test, 32b!")
    .build()
    .await?;
    d.start()?;
    // Wait for a first recorded chunk, kill, restart: the resume must open the sealed key.
    let topic = format!("{name}.snapshots");
    let start = std::time::Instant::now();
    while read_topic_to_end(&stack.brokers, &topic)
        .unwrap_or_default()
        .is_empty()
    {
        d.assert_running()?;
        ensure!(
            start.elapsed() < Duration::from_secs(90),
            "no progress: {}",
            d.last_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.kill9();
    d.start()?;
    let start = std::time::Instant::now();
    loop {
        d.assert_running()?;
        let recs = read_topic_to_end(&stack.brokers, &topic)?;
        if recs.iter().any(|r| contains(&r.payload, "\"done\"")) {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "not done: {}",
            d.last_log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let recs = read_topic_to_end(&stack.brokers, &topic)?;
    ensure!(recs.len() >= 2, "progress records: {}", recs.len());
    for r in &recs {
        ensure!(
            !contains(&r.payload, "card-"),
            "raw key in the snapshots topic: {}",
            String::from_utf8_lossy(&r.payload)
        );
        let p: serde_json::Value = serde_json::from_slice(&r.payload)?;
        ensure!(p["last_key"].is_null(), "{p}");
    }
    // The restarted run resumed after a sealed key instead of starting over.
    ensure!(
        !d.last_log()
            .contains("cannot open the sealed snapshot position")
            && !d.last_log().contains("resume_after_rows=0"),
        "{}",
        d.last_log()
    );
    // Every row is in the topic (none skipped by the resume).
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let events = read_topic_to_end(&stack.brokers, &format!("{name}.{name}.cards"))?;
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut keys = std::collections::BTreeSet::new();
    for r in &events {
        let v = dec.decode(&r.payload)?;
        let after = field(&v, "after").cloned().unwrap_or(Value::Null);
        keys.insert(string(field(&after, "card_number")).unwrap_or_default());
        ensure!(!contains(&r.payload, "card-"), "raw key in an event");
    }
    ensure!(
        keys.len() == 2000,
        "distinct rows in the topic: {}",
        keys.len()
    );
    d.stop()?;
    Ok(())
}

/// `[source] exclude_columns`: the columns never leave capture. Snapshot rows, streamed
/// changes (before images included) and a dead letter carry no value of theirs, no
/// registered schema names them, and Bronze and Silver have no such column; a primary-key
/// column cannot be excluded, and an entry naming no published column is refused at start.
#[tokio::test(flavor = "multi_thread")]
async fn excluded_columns_never_leave_capture() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "excl",
        "CREATE TABLE {s}.x (id int PRIMARY KEY, \"Secret Note\" text, ssn text, amount int, tags int[]);
         ALTER TABLE {s}.x REPLICA IDENTITY FULL;
         INSERT INTO {s}.x VALUES (1, 'snapshot-secret-1', '900-11-0001', 10, '{1}');",
    )
    .toml(
        "[snapshot]\nmode = \"initial\"\n[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n",
    )
    .env(
        "WAL2DELTA__SOURCE__EXCLUDE_COLUMNS",
        "['{s}.x.\"Secret Note\"', '{s}.x.ssn']",
    )
    .build()
    .await?;
    let mut pipe = d.spawn_stage("capture,bronze,silver", "pipe")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.x VALUES (2, 'stream-secret-2', '900-11-0002', 20, '{{2}}');
         UPDATE {name}.x SET \"Secret Note\" = 'stream-secret-3', amount = 21 WHERE id = 2;
         DELETE FROM {name}.x WHERE id = 1;
         INSERT INTO {name}.x VALUES (9, 'dlq-secret-9', '900-11-0009', 90, '{{{{1}},{{2}}}}');"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let silver = d.silver("x");
    pipe.wait_for(
        "Silver holds the row with id 2",
        &vec![vec![serde_json::json!(21)]],
        || {
            Ok(wal2delta_tests::lake::duckdb(&format!(
                "SELECT amount FROM {} WHERE id = 2",
                wal2delta_tests::lake::scan(&silver)
            ))
            .unwrap_or_default())
        },
    )
    .await?;
    // Bronze's row images are structs; Silver's columns are the row's.
    for (layer, columns) in [(d.bronze("x"), "after.*"), (silver, "*")] {
        let cols = wal2delta_tests::lake::duckdb(&format!(
            "SELECT string_agg(column_name, ',') FROM (DESCRIBE SELECT {columns} FROM {})",
            wal2delta_tests::lake::scan(&layer)
        ))?;
        let cols = cols[0][0].as_str().unwrap_or_default().to_owned();
        ensure!(
            cols.contains("amount") && !cols.contains("Secret") && !cols.contains("ssn"),
            "{}: {cols}",
            layer.display()
        );
    }
    let secrets = [
        "snapshot-secret-1",
        "stream-secret-2",
        "stream-secret-3",
        "dlq-secret-9",
        "900-11-000",
        "Secret Note",
    ];
    assert_no_topic_holds(&stack, &name, &secrets)?;
    let dlq = read_topic(
        &stack.brokers,
        &format!("{name}.dlq"),
        Some(1),
        Duration::from_secs(10),
    )?;
    ensure!(
        dlq.len() == 1 && contains(&dlq[0].payload, "amount"),
        "the dead letter keeps the other columns"
    );
    let subjects = reqwest::get(format!("{}/subjects", stack.registry))
        .await?
        .text()
        .await?;
    for subject in serde_json::from_str::<Vec<String>>(&subjects)?
        .iter()
        .filter(|s| s.starts_with(&format!("{name}.")))
    {
        let schema = reqwest::get(format!(
            "{}/subjects/{subject}/versions/latest",
            stack.registry
        ))
        .await?
        .text()
        .await?;
        ensure!(
            !schema.contains("Secret") && !schema.contains("ssn"),
            "{subject} names an excluded column"
        );
    }
    // reconcile compares the columns capture publishes: the excluded ones are named as
    // such, not counted as missing from Silver (which made every reconcile fail).
    let out = d.command(&["reconcile", "--json"])?;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let table = &report["tables"][0];
    ensure!(
        out.status.code() == Some(0)
            && table["equal"] == true
            && table["columns_excluded"] == serde_json::json!(["Secret Note", "ssn"])
            && table["columns_only_in_source"] == serde_json::json!([]),
        "reconcile: {report}"
    );
    let text = d.command(&["reconcile"])?;
    ensure!(
        String::from_utf8_lossy(&text.stdout).contains(
            "columns kept out of capture ([source] exclude_columns or include_columns, not compared): Secret Note, ssn"
        ),
        "reconcile text: {}",
        String::from_utf8_lossy(&text.stdout)
    );
    ensure!(pipe.stop()?.success(), "clean stop: {}", pipe.log_text());

    // A typo: refused at start, naming the setting.
    let mut typo = d.command_line(&["run", "--stage", "capture"]);
    typo.env(
        "WAL2DELTA__SOURCE__EXCLUDE_COLUMNS",
        format!("['{name}.x.snn']"),
    );
    let out = typo.output()?;
    let text = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && text.contains("source.exclude_columns"),
        "a column the table lacks is refused: {text}"
    );
    // A primary-key column: capture stops with the fix once it meets the table.
    d.env.push((
        "WAL2DELTA__SOURCE__EXCLUDE_COLUMNS".into(),
        format!("['{name}.x.id']"),
    ));
    d.start()?;
    pg.batch_execute(&format!("UPDATE {name}.x SET amount = 22 WHERE id = 2"))
        .await?;
    let log = d.wait_stopped_by_error(Duration::from_secs(60))?;
    ensure!(
        log.contains("primary-key column") && log.contains("exclude_columns"),
        "{log}"
    );
    Ok(())
}

/// `[source] include_columns`: only the columns named and the primary key leave capture,
/// in snapshot rows and streamed changes; a column added later stays out; reconcile
/// compares what is captured; a table named in both lists is refused at start.
#[tokio::test(flavor = "multi_thread")]
async fn only_included_columns_leave_capture() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "incl",
        "CREATE TABLE {s}.y (id int PRIMARY KEY, card text, amount int, \"Holder Name\" text);
         INSERT INTO {s}.y VALUES (1, 'card-secret-1', 10, 'holder-secret-1');",
    )
    .toml(
        "[snapshot]\nmode = \"initial\"\n[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n",
    )
    .env("WAL2DELTA__SOURCE__INCLUDE_COLUMNS", "['{s}.y.amount']")
    .build()
    .await?;
    let mut pipe = d.spawn_stage("capture,bronze,silver", "pipe")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.y VALUES (2, 'card-secret-2', 20, 'holder-secret-2');
         UPDATE {name}.y SET card = 'card-secret-3', amount = 21 WHERE id = 2;
         ALTER TABLE {name}.y ADD COLUMN extra text;
         INSERT INTO {name}.y VALUES (3, 'card-secret-4', 30, 'holder-secret-4', 'extra-secret-4');
         DELETE FROM {name}.y WHERE id = 1;"
    ))
    .await?;
    let silver = d.silver("y");
    let want = vec![
        vec![serde_json::json!(2), serde_json::json!(21)],
        vec![serde_json::json!(3), serde_json::json!(30)],
    ];
    pipe.wait_for("Silver holds id and amount", &want, || {
        Ok(wal2delta_tests::lake::duckdb(&format!(
            "SELECT id, amount FROM {} ORDER BY id",
            wal2delta_tests::lake::scan(&silver)
        ))
        .unwrap_or_default())
    })
    .await?;
    for (layer, columns) in [(d.bronze("y"), "after.*"), (silver, "*")] {
        let cols = wal2delta_tests::lake::duckdb(&format!(
            "SELECT string_agg(column_name, ',') FROM (DESCRIBE SELECT {columns} FROM {})",
            wal2delta_tests::lake::scan(&layer)
        ))?;
        let cols = cols[0][0].as_str().unwrap_or_default().to_owned();
        ensure!(
            cols.contains("amount")
                && cols.contains("id")
                && !cols.contains("card")
                && !cols.contains("Holder")
                && !cols.contains("extra"),
            "{}: {cols}",
            layer.display()
        );
    }
    assert_no_topic_holds(
        &stack,
        &name,
        &[
            "card-secret",
            "holder-secret",
            "extra-secret",
            "Holder Name",
        ],
    )?;
    let out = d.command(&["reconcile", "--json"])?;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let table = &report["tables"][0];
    ensure!(
        out.status.code() == Some(0)
            && table["equal"] == true
            && table["columns_excluded"] == serde_json::json!(["card", "Holder Name", "extra"]),
        "reconcile: {report}"
    );
    ensure!(pipe.stop()?.success(), "clean stop: {}", pipe.log_text());

    // One table in both lists: refused at start, naming the setting.
    let mut both = d.command_line(&["run", "--stage", "capture"]);
    both.env(
        "WAL2DELTA__SOURCE__EXCLUDE_COLUMNS",
        format!("['{name}.y.card']"),
    );
    let out = both.output()?;
    let text = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && text.contains("source.include_columns"),
        "a table in both lists is refused: {text}"
    );
    Ok(())
}
