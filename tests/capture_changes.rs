//! Capture of every kind of change, end to end: PostgreSQL → wal2delta → tansu, decoded
//! through the development registry.

use std::time::Duration;

use anyhow::Result;
use apache_avro::types::Value;
use wal2delta_tests::kafka::{field, long, read_topic, string, unwrap_union, AvroDecoder};
use wal2delta_tests::{Scenario, Stack, World};

fn is_null(v: Option<&Value>) -> bool {
    matches!(v.map(unwrap_union), Some(Value::Null))
}

struct Event {
    /// The envelope's `op`, or `T` for a tombstone (a key with a null value).
    op: String,
    before: Value,
    after: Value,
    toast: Vec<String>,
    commit_lsn: i64,
    ordinal: i64,
    key: Option<Vec<u8>>,
    /// The `__debezium.oldkey` header, when present.
    old_key: Option<Vec<u8>>,
}

fn events(stack: &Stack, topic: &str, expect: usize) -> Result<Vec<Event>> {
    let recs = read_topic(&stack.brokers, topic, Some(expect), Duration::from_secs(20))?;
    let mut dec = AvroDecoder::new(&stack.registry);
    recs.iter()
        .map(|r| {
            let old_key = r
                .headers
                .iter()
                .find(|(k, _)| k == "__debezium.oldkey")
                .map(|(_, v)| v.clone());
            if r.tombstone {
                return Ok(Event {
                    op: "T".into(),
                    before: Value::Null,
                    after: Value::Null,
                    toast: vec![],
                    commit_lsn: -1,
                    ordinal: -1,
                    key: r.key.clone(),
                    old_key,
                });
            }
            let v = dec.decode(&r.payload)?;
            let toast = match field(&v, "unchanged_toast_columns") {
                Some(Value::Array(a)) => a.iter().filter_map(|x| string(Some(x))).collect(),
                _ => vec![],
            };
            let source = field(&v, "source").cloned().unwrap_or(Value::Null);
            Ok(Event {
                op: string(field(&v, "op")).unwrap_or_default(),
                before: field(&v, "before").cloned().unwrap_or(Value::Null),
                after: field(&v, "after").cloned().unwrap_or(Value::Null),
                toast,
                commit_lsn: long(field(&source, "commit_lsn")).unwrap_or(-1),
                ordinal: long(field(&v, "ordinal")).unwrap_or(-1),
                key: r.key.clone(),
                old_key,
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn inserts_updates_deletes_truncates_and_toast() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name,
        pg,
        mut d,
        setup,
    } = Scenario::new(
        &stack,
        "chg",
        "CREATE TABLE {s}.dflt (id int PRIMARY KEY, v text, doc text);
         CREATE TABLE {s}.full (id int PRIMARY KEY, v text);
         ALTER TABLE {s}.full REPLICA IDENTITY FULL;
         ALTER TABLE {s}.dflt ALTER COLUMN doc SET STORAGE EXTERNAL;",
    )
    .build()
    .await?;
    assert!(setup.contains("created replication slot"), "{setup}");
    assert!(setup.contains("created publication"), "{setup}");
    // Idempotent: a second run changes nothing.
    assert!(d.setup()?.contains("nothing to change"));
    d.start()?;

    let big: String = (0..20_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    pg.batch_execute(&format!(
        "INSERT INTO {name}.dflt VALUES (1, 'one', '{big}'), (2, 'two', 'small');
         UPDATE {name}.dflt SET v = 'uno' WHERE id = 1;
         UPDATE {name}.dflt SET id = 10 WHERE id = 1;
         DELETE FROM {name}.dflt WHERE id = 2;
         INSERT INTO {name}.full VALUES (1, 'a');
         UPDATE {name}.full SET v = 'b' WHERE id = 1;
         UPDATE {name}.full SET id = 2 WHERE id = 1;
         DELETE FROM {name}.full WHERE id = 2;
         BEGIN; INSERT INTO {name}.dflt VALUES (3, 'x', 'y'); TRUNCATE {name}.dflt; COMMIT;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;

    let dflt = events(&stack, &format!("{name}.{name}.dflt"), 10)?;
    let ops: Vec<&str> = dflt.iter().map(|e| e.op.as_str()).collect();
    // A key change is a delete of the old key, its tombstone, and a create of the new key;
    // every delete is followed by a tombstone (`T`).
    assert_eq!(ops, ["c", "c", "u", "d", "T", "c", "d", "T", "c", "t"]);
    // Insert carries the whole TOASTed value.
    assert_eq!(
        string(field(&dflt[0].after, "doc")).map(|s| s.len()),
        Some(20_000)
    );
    // Update that leaves the TOASTed column alone: marked unchanged, never filled.
    assert_eq!(dflt[2].toast, vec!["doc".to_string()]);
    assert!(is_null(field(&dflt[2].after, "doc")));
    assert_eq!(string(field(&dflt[2].after, "v")).as_deref(), Some("uno"));
    // Key change 1 -> 10: the delete names the old key (DEFAULT identity logs the old key
    // only), the tombstone has its key, the create has the new row, the old key in
    // `before` and in the `__debezium.oldkey` header, and the doc marked unchanged.
    assert_eq!(long(field(&dflt[3].before, "id")), Some(1));
    assert!(is_null(field(&dflt[3].after, "id")) || dflt[3].after == Value::Null);
    assert_eq!(dflt[4].key, dflt[3].key);
    assert!(dflt[4].key.is_some());
    assert_eq!(long(field(&dflt[5].after, "id")), Some(10));
    assert_eq!(long(field(&dflt[5].before, "id")), Some(1));
    assert_eq!(dflt[5].old_key, dflt[3].key, "the create names the old key");
    assert_ne!(dflt[5].key, dflt[3].key);
    assert_eq!(dflt[5].toast, vec!["doc".to_string()]);
    assert_eq!(string(field(&dflt[5].after, "v")).as_deref(), Some("uno"));
    // Two changes of one transaction, the delete first.
    assert_eq!(dflt[3].commit_lsn, dflt[5].commit_lsn);
    assert_eq!(dflt[3].ordinal + 1, dflt[5].ordinal);
    // Delete under DEFAULT identity: key only; then its tombstone.
    assert_eq!(long(field(&dflt[6].before, "id")), Some(2));
    assert!(is_null(field(&dflt[6].before, "v")));
    assert_eq!(dflt[7].key, dflt[6].key);
    // Only creates that move a row carry the header.
    for (i, e) in dflt.iter().enumerate() {
        assert_eq!(
            e.old_key.is_some(),
            i == 5,
            "header on event {i} ({})",
            e.op
        );
    }
    // Insert and truncate in one transaction: same commit LSN, ordered by ordinal.
    assert_eq!(dflt[8].commit_lsn, dflt[9].commit_lsn);
    assert!(dflt[8].ordinal < dflt[9].ordinal);

    let full = events(&stack, &format!("{name}.{name}.full"), 7)?;
    assert_eq!(
        full.iter().map(|e| e.op.as_str()).collect::<Vec<_>>(),
        ["c", "u", "d", "T", "c", "d", "T"]
    );
    // FULL identity: the whole old row is there for updates, deletes and the create of a
    // key change.
    assert_eq!(string(field(&full[1].before, "v")).as_deref(), Some("a"));
    assert_eq!(string(field(&full[2].before, "v")).as_deref(), Some("b"));
    assert_eq!(long(field(&full[4].before, "id")), Some(1));
    assert_eq!(string(field(&full[4].before, "v")).as_deref(), Some("b"));
    assert_eq!(long(field(&full[4].after, "id")), Some(2));
    assert_eq!(full[4].old_key, full[2].key);
    assert_eq!(string(field(&full[5].before, "v")).as_deref(), Some("b"));

    assert!(
        d.stop()?.success(),
        "clean exit on SIGTERM: {}",
        d.last_log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn add_column_mid_stream_registers_a_new_version_without_restart() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "ddl",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text);",
    )
    .build()
    .await?;
    d.start()?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t VALUES (1, 'a');
         ALTER TABLE {name}.t ADD COLUMN extra int DEFAULT 7;
         INSERT INTO {name}.t VALUES (2, 'b', 8);"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    d.assert_running()?;
    let evs = events(&stack, &format!("{name}.{name}.t"), 2)?;
    assert_eq!(evs.len(), 2);
    assert!(
        field(&evs[0].after, "extra").is_none(),
        "first event has the old schema"
    );
    assert_eq!(long(field(&evs[1].after, "extra")), Some(8));
    let versions: Vec<i64> = reqwest::get(format!(
        "{}/subjects/{name}.{name}.t-value/versions",
        stack.registry
    ))
    .await?
    .json()
    .await?;
    assert_eq!(versions, vec![1, 2]);
    d.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_value_goes_to_the_dlq_and_capture_goes_on() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "dlq",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, a int[]);",
    )
    .build()
    .await?;
    d.start()?;
    // A two-dimensional array has no exact mapping to the column's Avro array type.
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t VALUES (1, '{{1,2}}'); INSERT INTO {name}.t VALUES (2, '{{{{1,2}},{{3,4}}}}'); INSERT INTO {name}.t VALUES (3, '{{3}}');"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    d.assert_running()?;
    let good = events(&stack, &format!("{name}.{name}.t"), 2)?;
    assert_eq!(
        good.iter()
            .filter_map(|e| long(field(&e.after, "id")))
            .collect::<Vec<_>>(),
        vec![1, 3]
    );
    let dlq = read_topic(
        &stack.brokers,
        &format!("{name}.dlq"),
        Some(1),
        Duration::from_secs(10),
    )?;
    assert_eq!(dlq.len(), 1);
    let letter: serde_json::Value = serde_json::from_slice(&dlq[0].payload)?;
    assert_eq!(letter["reason_kind"], "undecodable_value");
    assert_eq!(letter["table"], format!("{name}.t"));
    assert!(
        letter["raw"]
            .as_str()
            .unwrap_or("")
            .contains("{{1,2},{3,4}}"),
        "{letter}"
    );
    assert!(letter["lsn"].as_str().unwrap_or("").contains('/'));
    d.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn schema_the_registry_refuses_sends_events_to_the_dlq() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "refuse",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v int);",
    )
    .build()
    .await?;
    d.start()?;
    // int → text is not BACKWARD compatible: the registry refuses the new value schema.
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t VALUES (1, 1);
         ALTER TABLE {name}.t ALTER COLUMN v TYPE text USING v::text;
         INSERT INTO {name}.t VALUES (2, 'two');"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    d.assert_running()?;
    let good = events(&stack, &format!("{name}.{name}.t"), 1)?;
    assert_eq!(good.len(), 1);
    let dlq = read_topic(
        &stack.brokers,
        &format!("{name}.dlq"),
        Some(1),
        Duration::from_secs(10),
    )?;
    assert_eq!(dlq.len(), 1);
    let letter: serde_json::Value = serde_json::from_slice(&dlq[0].payload)?;
    assert_eq!(letter["reason_kind"], "schema_refused");
    assert!(
        letter["reason"].as_str().unwrap_or("").contains("409"),
        "{letter}"
    );
    d.stop()?;
    Ok(())
}

/// Every source transaction that touched a captured table has one END record on
/// `{prefix}.transactions` with its per-table event counts, matching what the table topics
/// hold for its commit LSN (a TRUNCATE counts once per partition).
#[tokio::test(flavor = "multi_thread")]
async fn transaction_end_records_count_each_tables_events() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "txend",
        "CREATE TABLE {s}.a (id int PRIMARY KEY); CREATE TABLE {s}.b (id int PRIMARY KEY);",
    )
    .partitions(3)
    .build()
    .await?;
    d.start()?;
    // Three transactions (one simple query of several statements would be one).
    pg.batch_execute(&format!(
        "BEGIN; INSERT INTO {name}.a SELECT generate_series(1, 7); INSERT INTO {name}.b VALUES (1), (2); COMMIT;"
    ))
    .await?;
    pg.batch_execute(&format!("UPDATE {name}.b SET id = id + 10"))
        .await?;
    pg.batch_execute(&format!("TRUNCATE {name}.a")).await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let recs = read_topic(
        &stack.brokers,
        &format!("{name}.transactions"),
        Some(3),
        Duration::from_secs(10),
    )?;
    let ends: Vec<serde_json::Value> = recs
        .iter()
        .map(|r| serde_json::from_slice(&r.payload))
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(ends.len() == 3, "one END per transaction: {ends:?}");
    let counts = |e: &serde_json::Value| -> Vec<(String, u64)> {
        e["data_collections"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["data_collection"].as_str().unwrap_or("").to_owned(),
                    c["event_count"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    let (a, b) = (format!("{name}.a"), format!("{name}.b"));
    anyhow::ensure!(
        counts(&ends[0]) == vec![(a.clone(), 7), (b.clone(), 2)] && ends[0]["event_count"] == 9,
        "{:?}",
        ends[0]
    );
    // Two key changes: a delete and a create each; their tombstones are not counted.
    anyhow::ensure!(counts(&ends[1]) == vec![(b.clone(), 4)], "{:?}", ends[1]);
    anyhow::ensure!(
        counts(&ends[2]) == vec![(a.clone(), 3)],
        "TRUNCATE on 3 partitions: {:?}",
        ends[2]
    );
    // The counts match the table topics, transaction by transaction.
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut per_tx = std::collections::BTreeMap::<(i64, String), u64>::new();
    // b: 2 inserts, 2 key changes (a delete, its tombstone and a create each).
    for (table, n) in [(&a, 10), (&b, 8)] {
        for r in read_topic(
            &stack.brokers,
            &format!("{name}.{table}"),
            Some(n),
            Duration::from_secs(10),
        )? {
            if r.tombstone {
                continue; // not a change event: not counted
            }
            let v = dec.decode(&r.payload)?;
            let lsn = long(field(
                field(&v, "source").unwrap_or(&Value::Null),
                "commit_lsn",
            ))
            .unwrap_or(-1);
            *per_tx.entry((lsn, table.to_string())).or_default() += 1;
        }
    }
    for e in &ends {
        let lsn = e["commit_lsn"].as_i64().unwrap_or(-2);
        for (table, n) in counts(e) {
            anyhow::ensure!(
                per_tx.get(&(lsn, table.clone())) == Some(&n),
                "{table} at {lsn}: {per_tx:?}"
            );
        }
        anyhow::ensure!(
            e["id"] == format!("{}:{lsn}", e["tx_id"]),
            "Debezium-style id: {e}"
        );
    }
    d.stop()?;
    Ok(())
}

/// `[capture] skip_truncate`: no `t` event reaches the topic, the END records count only
/// what was published (a TRUNCATE alone yields no END), each skip is logged, and the
/// changes around it flow as usual.
#[tokio::test(flavor = "multi_thread")]
async fn skip_truncate_publishes_everything_but_the_truncate() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "skiptrunc",
        "CREATE TABLE {s}.a (id int PRIMARY KEY);",
    )
    .toml("[capture]\nskip_truncate = true\n")
    .partitions(2)
    .build()
    .await?;
    d.start()?;
    pg.batch_execute(&format!("INSERT INTO {name}.a VALUES (1), (2)"))
        .await?;
    pg.batch_execute(&format!("TRUNCATE {name}.a")).await?;
    pg.batch_execute(&format!(
        "BEGIN; INSERT INTO {name}.a VALUES (3); TRUNCATE {name}.a; INSERT INTO {name}.a VALUES (4); COMMIT;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let got = events(&stack, &format!("{name}.{name}.a"), 4)?;
    let ops: Vec<&str> = got.iter().map(|e| e.op.as_str()).collect();
    anyhow::ensure!(ops == ["c", "c", "c", "c"], "no t event: {ops:?}");
    let ends = read_topic(
        &stack.brokers,
        &format!("{name}.transactions"),
        Some(2),
        Duration::from_secs(10),
    )?;
    let counts: Vec<u64> = ends
        .iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.payload))
        .collect::<Result<Vec<_>, _>>()?
        .iter()
        .map(|e| e["event_count"].as_u64().unwrap_or(0))
        .collect();
    anyhow::ensure!(
        counts == [2, 2],
        "END records count published events: {counts:?}"
    );
    let log = d.last_log();
    anyhow::ensure!(
        log.matches("TRUNCATE not published").count() == 2,
        "each skip is logged: {log}"
    );
    d.stop()?;
    Ok(())
}

/// A value over the Kafka message size (a 2 MB jsonb against librdkafka's 1 MB default)
/// goes to the DLQ with its key, columns and sizes; the rows around it, in the same
/// transaction and after it, reach the topic; the END record counts only what the topic
/// holds; the slot moves past it without a restart.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_event_goes_to_the_dlq_and_the_end_record_does_not_count_it() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "big",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, doc jsonb);",
    )
    .build()
    .await?;
    d.start()?;
    // About 2.1 MB of jsonb text that does not compress to nothing.
    let big = "(SELECT jsonb_agg(md5(i::text)) FROM generate_series(1, 60000) i)";
    // Separate calls: one simple query of several statements would be one transaction.
    pg.batch_execute(&format!("INSERT INTO {name}.t VALUES (1, '{{\"a\": 1}}')"))
        .await?;
    pg.batch_execute(&format!(
        "BEGIN;
         INSERT INTO {name}.t VALUES (2, '[2]');
         INSERT INTO {name}.t VALUES (3, {big});
         INSERT INTO {name}.t VALUES (4, '[4]');
         COMMIT;"
    ))
    .await?;
    pg.batch_execute(&format!("INSERT INTO {name}.t VALUES (5, '[5]')"))
        .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    d.assert_running()?;

    let good = events(&stack, &format!("{name}.{name}.t"), 4)?;
    assert_eq!(
        good.iter()
            .filter_map(|e| long(field(&e.after, "id")))
            .collect::<Vec<_>>(),
        vec![1, 2, 4, 5]
    );
    let dlq = read_topic(
        &stack.brokers,
        &format!("{name}.dlq"),
        Some(1),
        Duration::from_secs(10),
    )?;
    assert_eq!(dlq.len(), 1);
    let letter: serde_json::Value = serde_json::from_slice(&dlq[0].payload)?;
    assert_eq!(letter["reason_kind"], "message_too_large", "{letter}");
    assert_eq!(letter["table"], format!("{name}.t"));
    assert_eq!(letter["op"], "c");
    assert_eq!(letter["key"], serde_json::json!({"id": "3"}), "{letter}");
    assert_eq!(letter["columns"], serde_json::json!(["id", "doc"]));
    let bytes = letter["encoded_bytes"].as_u64().unwrap_or(0);
    let limit = letter["limit_bytes"].as_u64().unwrap_or(0);
    assert!(bytes > 2_000_000 && limit < 1_000_000, "{letter}");
    assert!(
        letter["reason"]
            .as_str()
            .unwrap_or("")
            .contains("message_max_bytes"),
        "{letter}"
    );
    assert_eq!(letter["raw"], "", "no value in the letter");

    // The END record of the transaction counts the two rows on the topic, not the third.
    let tx_lsn = good[1].commit_lsn;
    assert_eq!(good[2].commit_lsn, tx_lsn);
    let ends = read_topic(
        &stack.brokers,
        &format!("{name}.transactions"),
        Some(3),
        Duration::from_secs(10),
    )?;
    let end = ends
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.payload).ok())
        .find(|e| e["commit_lsn"].as_i64() == Some(tx_lsn))
        .ok_or_else(|| anyhow::anyhow!("no END record at {tx_lsn}"))?;
    assert_eq!(end["event_count"], 2, "{end}");
    assert_eq!(end["data_collections"][0]["event_count"], 2, "{end}");

    // No restart loop: the session never ended.
    let log = d.last_log();
    assert!(!log.contains("capture session ended"), "{log}");
    d.stop()?;
    Ok(())
}

/// `REPLICA IDENTITY USING INDEX` on an index without the primary key: PostgreSQL logs
/// only the index's columns for a deleted row, so the delete names no key. `setup`
/// refuses such a table, naming the index and the fix; a table altered while capture runs
/// has its deletes sent to the DLQ with that reason and the old row's index columns,
/// never dropped silently, and the stream goes on.
#[tokio::test(flavor = "multi_thread")]
async fn replica_identity_index_without_the_key_is_refused_and_never_loses_deletes() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "ident",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, u int NOT NULL, v text);
         CREATE UNIQUE INDEX t_u ON {s}.t (u);
         ALTER TABLE {s}.t REPLICA IDENTITY USING INDEX t_u;",
    )
    .without_setup()
    .build()
    .await?;
    let out = d.command(&["setup"])?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "setup must refuse: {text}");
    assert!(text.contains(&format!("{name}.t")), "{text}");
    assert!(text.contains("t_u"), "{text}");
    assert!(text.contains("REPLICA IDENTITY DEFAULT"), "{text}");

    // Fixed: setup passes. Then the identity is changed back while capture runs.
    pg.batch_execute(&format!("ALTER TABLE {name}.t REPLICA IDENTITY DEFAULT"))
        .await?;
    d.setup()?;
    d.start()?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t VALUES (1, 11, 'a'), (2, 22, 'b');
         ALTER TABLE {name}.t REPLICA IDENTITY USING INDEX t_u;
         DELETE FROM {name}.t WHERE id = 2;
         INSERT INTO {name}.t VALUES (3, 33, 'c');"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    d.assert_running()?;
    let good = events(&stack, &format!("{name}.{name}.t"), 3)?;
    assert_eq!(
        good.iter()
            .map(|e| (e.op.clone(), long(field(&e.after, "id"))))
            .collect::<Vec<_>>(),
        vec![
            ("c".to_string(), Some(1)),
            ("c".to_string(), Some(2)),
            ("c".to_string(), Some(3))
        ]
    );
    let dlq = read_topic(
        &stack.brokers,
        &format!("{name}.dlq"),
        Some(1),
        Duration::from_secs(10),
    )?;
    assert_eq!(dlq.len(), 1);
    let letter: serde_json::Value = serde_json::from_slice(&dlq[0].payload)?;
    assert_eq!(letter["reason_kind"], "identity_without_key", "{letter}");
    assert_eq!(letter["op"], "d");
    let reason = letter["reason"].as_str().unwrap_or("");
    assert!(reason.contains("REPLICA IDENTITY DEFAULT"), "{letter}");
    assert!(
        letter["raw"].as_str().unwrap_or("").contains("u=22"),
        "{letter}"
    );
    assert!(
        d.last_log()
            .contains("replica identity index does not contain the primary key"),
        "{}",
        d.last_log()
    );
    d.stop()?;
    Ok(())
}
