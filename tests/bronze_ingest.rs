//! Kafka → Bronze on the real stack: every event lands once with its content and Kafka
//! coordinates, readable by DuckDB and the `deltalake` package; schema evolution mid-run;
//! undecodable messages go to quarantine while the stream goes on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use wal2delta_tests::daemon::StageProcess;
use wal2delta_tests::kafka::{field, long, read_topic_to_end, string, AvroDecoder};
use wal2delta_tests::lake::{deltalake_info, duckdb, duckdb_i64, scan};
use wal2delta_tests::{Scenario, Stack, World};

/// Fast batches and topic discovery, and a consumer group of the test's own.
const BRONZE_TOML: &str =
    "[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n";

/// Waits until `sql` (one integer) returns at least `want`; the process must keep running.
fn wait_for(
    sql: &str,
    want: i64,
    timeout: Duration,
    procs: &mut [&mut StageProcess],
) -> Result<i64> {
    let start = Instant::now();
    let mut last = -1;
    while start.elapsed() < timeout {
        for p in procs.iter_mut() {
            p.assert_running()?;
        }
        // The table may not exist yet.
        if let Ok(n) = duckdb_i64(sql) {
            last = n;
            if n >= want {
                return Ok(n);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let logs: Vec<String> = procs.iter().map(|p| p.log_text()).collect();
    bail!(
        "{sql} reached {last}, wanted {want} within {timeout:?}; logs: {}",
        logs.join("\n---\n")
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn bronze_holds_every_event_once_with_its_content() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "brz",
        "CREATE TABLE {s}.pay (id bigint PRIMARY KEY, amount numeric(12,2), note text,
             at timestamptz, local_at timestamp, day date, tags text[], data jsonb, raw bytea,
             ok boolean, ratio float8);",
    )
    .toml(
        // Compaction and checkpoints run beside ingestion every 2 s here.
        &format!("{BRONZE_TOML}maintenance_interval_s = 2\n"),
    )
    .partitions(3)
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze", "run")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.pay SELECT g, g * 1.25, 'n' || g, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 minute',
             'infinity', '2024-02-29', ARRAY['a', NULL, 'c'], jsonb_build_object('k', g), '\\x00ff'::bytea, g % 2 = 0, g / 3.0
         FROM generate_series(1, 3000) g;
         UPDATE {name}.pay SET note = 'updated' WHERE id <= 300;
         DELETE FROM {name}.pay WHERE id > 2900;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    let topic = format!("{name}.{name}.pay");
    let kafka = read_topic_to_end(&stack.brokers, &topic)?;
    // 3400 change events and a tombstone after each of the 100 deletes, which Bronze
    // passes over: no row, no quarantine record.
    ensure!(
        kafka.len() == 3500 && kafka.iter().filter(|r| r.tombstone).count() == 100,
        "capture published {} messages",
        kafka.len()
    );
    let kafka: Vec<_> = kafka.into_iter().filter(|r| !r.tombstone).collect();
    let table = d.bronze("pay");
    let t = scan(&table);
    wait_for(
        &format!("SELECT count(*) FROM {t}"),
        3400,
        Duration::from_secs(120),
        &mut [&mut run],
    )?;

    // Exactly once: one row per Kafka offset, and nothing else.
    let rows = duckdb(&format!(
        "SELECT kafka_partition, kafka_offset, op, coalesce(after.id, before.id), after.note FROM {t}"
    ))?;
    ensure!(rows.len() == 3400, "Bronze holds {} rows", rows.len());
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut expected = BTreeMap::new();
    for r in &kafka {
        let v = dec.decode(&r.payload)?;
        let present =
            |name| field(&v, name).filter(|i| !matches!(i, apache_avro::types::Value::Null));
        let image = present("after")
            .or_else(|| present("before"))
            .context("no image")?;
        let after_note = present("after").and_then(|a| string(field(a, "note")));
        expected.insert(
            (r.partition as i64, r.offset),
            (
                string(field(&v, "op")).unwrap_or_default(),
                long(field(image, "id")),
                after_note,
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for row in &rows {
        let key = (row[0].as_i64().unwrap_or(-1), row[1].as_i64().unwrap_or(-1));
        ensure!(seen.insert(key), "offset {key:?} is in Bronze twice");
        let got = (
            row[2].as_str().unwrap_or("").to_owned(),
            row[3].as_i64(),
            row[4].as_str().map(str::to_owned),
        );
        ensure!(
            expected.get(&key) == Some(&got),
            "row at {key:?}: Bronze {got:?}, Kafka {:?}",
            expected.get(&key)
        );
    }
    let partitions: BTreeSet<i64> = seen.iter().map(|(p, _)| *p).collect();
    ensure!(
        partitions.len() == 3,
        "events from all 3 partitions: {partitions:?}"
    );

    // Types as promised (docs/types.md), read by DuckDB.
    let typed = duckdb(&format!(
        "SELECT after.amount, after.at::VARCHAR, after.local_at::VARCHAR, after.day::VARCHAR, after.tags,
                after.data, hex(after.raw), after.ok, after.ratio, commit_lsn > 0, lsn > 0, ordinal >= 1,
                tx_id > 0, snapshot, ingest_date = current_date
         FROM {t} WHERE op = 'c' AND after.id = 2"
    ))?;
    let row = typed.first().context("row 2")?;
    ensure!(row[0] == "2.50", "numeric exact as text: {:?}", row[0]);
    ensure!(
        row[1]
            .as_str()
            .is_some_and(|s| s.starts_with("2024-01-01 00:02:00")),
        "timestamptz: {:?}",
        row[1]
    );
    ensure!(row[2] == "infinity", "timestamp infinity: {:?}", row[2]);
    ensure!(row[3] == "2024-02-29", "date: {:?}", row[3]);
    ensure!(
        row[4] == "['a', None, 'c']",
        "array with NULL: {:?}",
        row[4]
    );
    ensure!(row[5] == "{\"k\": 2}", "jsonb text: {:?}", row[5]);
    ensure!(row[6] == "00FF", "bytea: {:?}", row[6]);
    ensure!(
        row[7] == true
            && row[8]
                .as_f64()
                .is_some_and(|r| (r - 2.0 / 3.0).abs() < 1e-12),
        "bool, float8: {row:?}"
    );
    for (i, what) in [
        (9, "commit_lsn"),
        (10, "lsn"),
        (11, "ordinal"),
        (12, "tx_id"),
        (14, "ingest_date"),
    ] {
        ensure!(row[i] == true, "{what} set: {row:?}");
    }
    ensure!(row[13] == false, "not a snapshot row: {row:?}");

    // Maintenance compacts and checkpoints the table beside ingestion, every 2 s here:
    // the rows can land before its next pass, so wait for it (bounded).
    let log_dir = table.join("_delta_log");
    let has_checkpoint = || {
        std::fs::read_dir(&log_dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with(".checkpoint.parquet")
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !has_checkpoint() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure!(
        has_checkpoint(),
        "a checkpoint in {} within 60 s: {}",
        log_dir.display(),
        run.log_text()
    );
    ensure!(
        std::fs::read_to_string(&run.log)?.contains("Bronze table compacted and checkpointed"),
        "maintenance ran: {}",
        run.log_text()
    );

    // The deltalake package reads the same table, partitioned by ingestion date.
    let info = deltalake_info(&table)?;
    ensure!(info["rows"] == 3400, "deltalake reads {info}");
    ensure!(
        info["partition_columns"] == serde_json::json!(["ingest_date"]),
        "partitioned by ingest_date: {info}"
    );

    // status reports the table with no lag.
    let out = d.command(&["status", "--json"])?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let tables = doc["stages"]["bronze"]["tables"]
        .as_array()
        .context("bronze status")?
        .clone();
    ensure!(
        tables
            .iter()
            .any(|t| t["table"] == format!("{name}.pay") && t["lag_events"] == 0),
        "status shows the table caught up: {tables:?}"
    );
    ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn schema_evolution_mid_run_merges_columns_widens_types_and_quarantines_other_changes(
) -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "brzevo",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, a int, b text);",
    )
    .toml(BRONZE_TOML)
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze", "run")?;
    let t = scan(&d.bronze("t"));
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, g, 'b' FROM generate_series(1, 100) g;"
    ))
    .await?;
    wait_for(
        &format!("SELECT count(*) FROM {t}"),
        100,
        Duration::from_secs(90),
        &mut [&mut run],
    )?;
    // Added and dropped columns merge without a restart.
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.t ADD COLUMN c boolean; INSERT INTO {name}.t VALUES (101, 101, 'b', true);
         ALTER TABLE {name}.t DROP COLUMN b; INSERT INTO {name}.t VALUES (102, 102, false);"
    ))
    .await?;
    wait_for(
        &format!("SELECT count(*) FROM {t}"),
        102,
        Duration::from_secs(60),
        &mut [&mut run],
    )?;
    let rows = duckdb(&format!(
        "SELECT after.id, after.b, after.c FROM {t} WHERE after.id IN (1, 101, 102) ORDER BY 1"
    ))?;
    ensure!(
        rows == vec![
            vec![1.into(), "b".into(), serde_json::Value::Null],
            vec![101.into(), "b".into(), true.into()],
            vec![102.into(), serde_json::Value::Null, false.into()],
        ],
        "old rows read NULL for the new column, new rows NULL for the dropped one: {rows:?}"
    );
    // A widening (int → bigint) is taken: the table is rewritten under the wider type and
    // the event holding a value only bigint holds is stored, the old rows cast.
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.t ALTER COLUMN a TYPE bigint; INSERT INTO {name}.t VALUES (103, 3000000000, true);"
    ))
    .await?;
    wait_for(
        &format!("SELECT count(*) FROM {t} WHERE after.a = 3000000000"),
        1,
        Duration::from_secs(60),
        &mut [&mut run],
    )?;
    ensure!(
        duckdb_i64(&format!("SELECT count(*) FROM {t}"))? == 103
            && duckdb_i64(&format!(
                "SELECT sum(after.a) FROM {t} WHERE after.id <= 100"
            ))? == 5050,
        "every event once, the old values cast"
    );
    // Any other type change the registry lets through (Avro promotes long to double)
    // cannot be merged: its events are quarantined, the stream goes on.
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.t ALTER COLUMN a TYPE double precision; INSERT INTO {name}.t VALUES (104, 4.5, true);"
    ))
    .await?;
    let q = scan(&d.lake().join("quarantine/records"));
    wait_for(
        &format!("SELECT count(*) FROM {q} WHERE reason_code = 'schema_conflict' AND table_name = '{name}.t'"),
        1,
        Duration::from_secs(60),
        &mut [&mut run],
    )?;
    let detail = duckdb(&format!(
        "SELECT detail, raw IS NOT NULL, kafka_offset FROM {q} WHERE table_name = '{name}.t'"
    ))?;
    ensure!(detail.len() == 1, "one record quarantined: {detail:?}");
    ensure!(
        detail[0][0]
            .as_str()
            .is_some_and(|s| s.contains(".a is Int64 in the table but Float64")),
        "reason names the column: {detail:?}"
    );
    ensure!(
        detail[0][1] == true && detail[0][2] == 103,
        "raw bytes and offset kept: {detail:?}"
    );
    ensure!(
        duckdb_i64(&format!("SELECT count(*) FROM {t}"))? == 103,
        "the conflicting event is not in Bronze"
    );
    run.assert_running()?;
    run.kill9(); // the slot must be inactive to be dropped
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_messages_go_to_quarantine_and_the_stream_goes_on() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } =
        Scenario::new(&stack, "brzq", "CREATE TABLE {s}.t (id int PRIMARY KEY);")
            .toml(BRONZE_TOML)
            .build()
            .await?;
    let mut run = d.spawn_stage("capture,bronze", "run")?;
    let t = scan(&d.bronze("t"));
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT generate_series(1, 10);"
    ))
    .await?;
    wait_for(
        &format!("SELECT count(*) FROM {t}"),
        10,
        Duration::from_secs(90),
        &mut [&mut run],
    )?;

    // Garbage, a frame naming a schema id the registry never issued, and a truncated datum.
    let topic = format!("{name}.{name}.t");
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .create()?;
    let good = read_topic_to_end(&stack.brokers, &topic)?.remove(0).payload;
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("not_framed", b"definitely not avro".to_vec()),
        ("unknown_schema", vec![0, 0x7f, 0xff, 0xff, 0xf0, 2, 4]),
        ("corrupt_payload", good[..good.len() / 2].to_vec()),
    ];
    for (_, payload) in &bad {
        producer
            .send(BaseRecord::<(), Vec<u8>>::to(&topic).payload(payload))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(10))?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT generate_series(11, 20);"
    ))
    .await?;
    wait_for(
        &format!("SELECT count(*) FROM {t}"),
        20,
        Duration::from_secs(60),
        &mut [&mut run],
    )?;
    let q = scan(&d.lake().join("quarantine/records"));
    let rows = duckdb(&format!(
        "SELECT reason_code, hex(raw), stage, kafka_topic FROM {q} WHERE kafka_topic = '{topic}' ORDER BY kafka_offset"
    ))?;
    let codes: Vec<&str> = rows.iter().filter_map(|r| r[0].as_str()).collect();
    ensure!(
        codes == ["not_framed", "unknown_schema", "corrupt_payload"],
        "quarantined with reasons: {rows:?}"
    );
    for (row, (_, payload)) in rows.iter().zip(&bad) {
        let hex: String = payload.iter().map(|b| format!("{b:02X}")).collect();
        ensure!(
            row[1] == hex.as_str() && row[2] == "bronze",
            "raw bytes kept as they arrived: {row:?}"
        );
    }
    // A restart re-reads nothing twice: Bronze and the quarantine hold what they held.
    // (Stopped, not killed: a killed member keeps its partition until the broker evicts it;
    // bronze_crash covers SIGKILL.)
    ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    let mut run = d.spawn_stage("capture,bronze", "run2")?;
    pg.batch_execute(&format!("INSERT INTO {name}.t VALUES (21);"))
        .await?;
    wait_for(
        &format!("SELECT count(*) FROM {t}"),
        21,
        Duration::from_secs(60),
        &mut [&mut run],
    )?;
    ensure!(
        duckdb_i64(&format!("SELECT count(*) FROM {t}"))? == 21,
        "no duplicates after restart"
    );
    ensure!(
        duckdb_i64(&format!(
            "SELECT count(*) FROM {q} WHERE kafka_topic = '{topic}'"
        ))? == 3,
        "quarantine unchanged"
    );
    let out = d.command(&["status"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains("bronze/not_framed: 1"),
        "status shows quarantine counts: {text}"
    );
    // Operators list and inspect the records.
    let out = d.command(&["quarantine", "list"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let id = format!("bronze/{topic}/0/10");
    ensure!(
        text.contains(&id) && text.contains("3 records"),
        "quarantine list: {text}"
    );
    let out = d.command(&["quarantine", "show", &id])?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let hex: String = bad[0].1.iter().map(|b| format!("{b:02x}")).collect();
    ensure!(
        doc["raw_hex"] == hex.as_str() && doc["reason_code"] == "not_framed",
        "quarantine show: {doc}"
    );
    run.kill9(); // the slot must be inactive to be dropped
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_registry_stalls_bronze_without_quarantining_anything() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(&stack, "brzreg", "CREATE TABLE {s}.t (id int PRIMARY KEY);")
        .toml(BRONZE_TOML)
        .build()
        .await?;
    let mut capture = d.spawn_stage("capture", "capture")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT generate_series(1, 50);"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    // The bronze writer alone sees a registry nobody listens on.
    d.env.push((
        "WAL2DELTA__SCHEMA_REGISTRY__URL".into(),
        "http://127.0.0.1:9".into(),
    ));
    let mut bronze = d.spawn_stage("bronze", "bronze-noregistry")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&bronze.log)?.contains("restarting from the offsets stored") {
        bronze.assert_running()?;
        ensure!(
            Instant::now() < deadline,
            "no restart on an unreachable registry: {}",
            bronze.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    bronze.assert_running()?;
    ensure!(
        !d.bronze("t").join("_delta_log").exists(),
        "nothing stored without the registry"
    );
    ensure!(
        !d.lake().join("quarantine/records/_delta_log").exists(),
        "a registry outage is not a record problem: nothing quarantined"
    );
    // The registry is back: everything lands, once.
    ensure!(
        bronze.stop()?.success(),
        "a stage retrying a registry outage stops cleanly: {}",
        bronze.log_text()
    );
    d.env.pop();
    let mut bronze = d.spawn_stage("bronze", "bronze")?;
    let t = scan(&d.bronze("t"));
    wait_for(
        &format!("SELECT count(*) FROM {t}"),
        50,
        Duration::from_secs(60),
        &mut [&mut bronze],
    )?;
    ensure!(
        duckdb_i64(&format!("SELECT count(DISTINCT kafka_offset) FROM {t}"))? == 50,
        "each event once"
    );
    capture.kill9(); // the slot must be inactive to be dropped
    Ok(())
}
