//! The initial snapshot: consistent with the slot (the events, applied per key by highest
//! position, give exactly the source's rows even with writes during the snapshot),
//! resumable after SIGKILL without starting over, and run again only for tables added
//! later; a dropped slot is refused, or re-created with a full re-snapshot when configured.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use apache_avro::types::Value;
use wal2delta_tests::daemon::Daemon;
use wal2delta_tests::kafka::{field, long, read_topic_to_end, AvroDecoder};
use wal2delta_tests::{Scenario, Stack, World};

/// One event: (op, id, v, position as (commit LSN, ordinal)).
type Event = (String, i64, Option<i64>, (i64, i64));

/// Every event of the topic as (op, id, v, position).
fn events(stack: &Stack, topic: &str) -> Result<Vec<Event>> {
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut out = Vec::new();
    for r in read_topic_to_end(&stack.brokers, topic)? {
        if r.tombstone {
            continue; // after a delete; not a change
        }
        let v = dec.decode(&r.payload)?;
        let op = match field(&v, "op") {
            Some(Value::String(s)) => s.clone(),
            _ => String::new(),
        };
        let image = if op == "d" {
            field(&v, "before")
        } else {
            field(&v, "after")
        }
        .cloned()
        .unwrap_or(Value::Null);
        let source = field(&v, "source").cloned().unwrap_or(Value::Null);
        let pos = (
            long(field(&source, "commit_lsn")).unwrap_or(0),
            long(field(&v, "ordinal")).unwrap_or(0),
        );
        if let Some(id) = long(field(&image, "id")) {
            out.push((op, id, long(field(&image, "v")), pos));
        }
    }
    Ok(out)
}

/// Applies events per key, highest position wins, deletes remove.
fn final_state(events: &[Event]) -> BTreeMap<i64, i64> {
    let mut best: BTreeMap<i64, ((i64, i64), Option<i64>)> = BTreeMap::new();
    for (op, id, v, pos) in events {
        let entry = best.entry(*id).or_insert((*pos, None));
        if *pos >= entry.0 {
            *entry = (*pos, if op == "d" { None } else { *v });
        }
    }
    best.into_iter()
        .filter_map(|(id, (_, v))| v.map(|v| (id, v)))
        .collect()
}

async fn source_state(pg: &tokio_postgres::Client, table: &str) -> Result<BTreeMap<i64, i64>> {
    Ok(pg
        .query(&format!("SELECT id::bigint, v::bigint FROM {table}"), &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

fn progress(
    stack: &Stack,
    d: &Daemon,
    table: &str,
) -> Result<Option<wal2delta_stream::snapshots::SnapshotProgress>> {
    let all = wal2delta_stream::snapshots::load(
        &wal2delta_stream::connection::KafkaConnection::plain(&stack.brokers),
        &format!("{}.snapshots", d.prefix),
        &d.slot,
    )?;
    Ok(all.get(table).cloned())
}

async fn wait_snapshot_done(stack: &Stack, d: &mut Daemon, table: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        d.assert_running()?;
        if progress(stack, d, table)?.is_some_and(|p| p.is_done()) {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(180) {
            bail!("snapshot of {table} not done: {}", d.last_log());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn initial_snapshot_with_concurrent_writes_matches_the_source() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name,
        pg,
        mut d,
        setup,
    } = Scenario::new(&stack, "snap", "CREATE TABLE {s}.t (id int PRIMARY KEY, v int); INSERT INTO {s}.t SELECT g, 0 FROM generate_series(1, 30000) g;")
        .toml("[snapshot]\nchunk_rows = 1000\n")
        .build()
        .await?;
    let table = format!("{name}.t");
    ensure!(
        setup.contains("will be created by `wal2delta run`"),
        "{setup}"
    );
    d.start()?;
    // Writes while the snapshot runs: updates, inserts and deletes.
    for i in 0..150 {
        pg.batch_execute(&format!(
            "BEGIN; UPDATE {table} SET v = v + 1 WHERE id % 150 = {i}; INSERT INTO {table} VALUES ({}, 7); DELETE FROM {table} WHERE id = {}; COMMIT;",
            40_000 + i,
            1 + i * 97
        ))
        .await?;
    }
    wait_snapshot_done(&stack, &mut d, &table).await?;
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    let evs = events(&stack, &format!("{name}.{table}"))?;
    let reads = evs.iter().filter(|e| e.0 == "r").count();
    ensure!(
        (29_000..=30_150).contains(&reads),
        "one read per row present at the snapshot: {reads}"
    );
    let ours = final_state(&evs);
    let theirs = source_state(&pg, &table).await?;
    ensure!(
        ours.len() == theirs.len(),
        "rows: events give {}, source has {}",
        ours.len(),
        theirs.len()
    );
    ensure!(
        ours == theirs,
        "events applied by position differ from the source"
    );
    d.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_snapshot_resumes_after_the_last_recorded_chunk() -> Result<()> {
    let stack = Stack::from_env();
    const ROWS: i64 = 100_000;
    let World { name, pg, mut d, .. } = Scenario::new(&stack, "resume", &format!("CREATE TABLE {{s}}.t (id int PRIMARY KEY, v int); INSERT INTO {{s}}.t SELECT g, 1 FROM generate_series(1, {ROWS}) g;"))
        .toml("[snapshot]\nchunk_rows = 2000\n")
        .build()
        .await?;
    let table = format!("{name}.t");
    d.start()?;
    let topic = format!("{name}.{table}");
    let start = Instant::now();
    let recorded = loop {
        if let Some(p) = progress(&stack, &d, &table)? {
            if p.rows_done >= 20_000 && !p.is_done() {
                break p.rows_done;
            }
            ensure!(!p.is_done(), "snapshot finished before it could be killed");
        }
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "no snapshot progress: {}",
            d.last_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    d.kill9();
    let recorded = progress(&stack, &d, &table)?.map_or(recorded, |p| p.rows_done);
    let before_kill = events(&stack, &topic)?.len();
    pg.batch_execute(&format!(
        "UPDATE {table} SET v = 2 WHERE id % 1000 = 0; DELETE FROM {table} WHERE id = 99999;"
    ))
    .await?;
    d.start()?;
    wait_snapshot_done(&stack, &mut d, &table).await?;
    d.wait_caught_up(&pg, Duration::from_secs(120)).await?;
    let evs = events(&stack, &topic)?;
    let after_restart = evs.len() - before_kill;
    eprintln!("killed with {recorded} rows recorded and {before_kill} events in Kafka; {after_restart} events after the restart");
    ensure!(
        (after_restart as i64) < ROWS,
        "the snapshot started over: {after_restart} events after the restart"
    );
    ensure!(
        final_state(&evs) == source_state(&pg, &table).await?,
        "events applied by position differ from the source"
    );
    d.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn added_table_is_snapshotted_alone_and_a_dropped_slot_is_refused() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, mut d, .. } = Scenario::new(&stack, "addt", "CREATE TABLE {s}.a (id int PRIMARY KEY, v int); INSERT INTO {s}.a SELECT g, 1 FROM generate_series(1, 100) g;")
        .toml("[snapshot]\nchunk_rows = 50\n")
        .build()
        .await?;
    d.start()?;
    wait_snapshot_done(&stack, &mut d, &format!("{name}.a")).await?;

    // A table added to the capture set later: setup adds it, capture snapshots only it.
    pg.batch_execute(&format!("CREATE TABLE {name}.b (id int PRIMARY KEY, v int); INSERT INTO {name}.b SELECT g, 2 FROM generate_series(1, 500) g;")).await?;
    d.setup()?;
    wait_snapshot_done(&stack, &mut d, &format!("{name}.b")).await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let a = events(&stack, &format!("{name}.{name}.a"))?;
    let b = events(&stack, &format!("{name}.{name}.b"))?;
    ensure!(
        a.iter().filter(|e| e.0 == "r").count() == 100,
        "table a was not snapshotted again"
    );
    ensure!(
        b.iter().filter(|e| e.0 == "r").count() == 500,
        "table b snapshotted once"
    );
    ensure!(final_state(&b) == source_state(&pg, &format!("{name}.b")).await?);
    ensure!(d.stop()?.success());

    // The slot is dropped behind capture's back: refused, never silently re-created.
    pg.execute("SELECT pg_drop_replication_slot($1)", &[&d.slot])
        .await?;
    d.start()?;
    let status = d.wait_exit(Duration::from_secs(30))?;
    ensure!(
        matches!(status, Some(s) if !s.success()),
        "capture must refuse a dropped slot: {}",
        d.last_log()
    );
    ensure!(d.last_log().contains("on_slot_lost"), "{}", d.last_log());
    // Configured to re-create: a new slot and a full re-snapshot.
    d.env
        .push(("WAL2DELTA__SOURCE__ON_SLOT_LOST".into(), "recreate".into()));
    d.start()?;
    let start = Instant::now();
    while events(&stack, &format!("{name}.{name}.a"))?
        .iter()
        .filter(|e| e.0 == "r")
        .count()
        < 200
    {
        d.assert_running()?;
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "no re-snapshot: {}",
            d.last_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    d.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_pauses_while_the_slot_retains_more_wal_than_its_budget() -> Result<()> {
    let stack = Stack::from_env();
    // A budget no slot can meet: the snapshot must wait, never read.
    let World { name, pg: _pg, mut d, .. } = Scenario::new(&stack, "throttle", "CREATE TABLE {s}.t (id int PRIMARY KEY, v int); INSERT INTO {s}.t SELECT g, 1 FROM generate_series(1, 1000) g;")
        .toml("[snapshot]\nchunk_rows = 100\nmax_retained_wal_bytes = 1\n")
        .build()
        .await?;
    let table = format!("{name}.t");
    d.start()?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    d.assert_running()?;
    ensure!(d.last_log().contains("snapshot paused"), "{}", d.last_log());
    ensure!(
        events(&stack, &format!("{name}.{table}"))?.is_empty(),
        "no chunk may be read over budget"
    );
    d.stop()?;
    // With room in the budget it goes on from where it stood.
    d.env.push((
        "WAL2DELTA__SNAPSHOT__MAX_RETAINED_WAL_BYTES".into(),
        "1073741824".into(),
    ));
    d.start()?;
    wait_snapshot_done(&stack, &mut d, &table).await?;
    ensure!(
        events(&stack, &format!("{name}.{table}"))?
            .iter()
            .filter(|e| e.0 == "r")
            .count()
            == 1000
    );
    d.stop()?;
    Ok(())
}

/// A delete whose commit record is already in the WAL but which is not yet visible (here:
/// it waits for a synchronous standby that never comes) while a table added later is
/// snapshotted. A position read before taking the snapshot lies after that commit, so the
/// stale snapshot rows would outrank the delete and the deleted rows would come back;
/// the temporary slot's consistent point lies after every commit the snapshot misses.
#[tokio::test(flavor = "multi_thread")]
async fn fresh_snapshot_rows_never_outrank_a_delete_committing_meanwhile() -> Result<()> {
    let stack = Stack::from_env();
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "snapdel",
        "CREATE TABLE {s}.a (id int PRIMARY KEY, v int);",
    )
    .toml("[snapshot]\nchunk_rows = 50\n")
    // The table is added by setup at the moment the test chooses, not by capture.
    .env("WAL2DELTA__SOURCE__ADD_NEW_TABLES", "false")
    .build()
    .await?;
    let admin = stack.admin().await?;
    d.start()?;
    wait_snapshot_done(&stack, &mut d, &format!("{name}.a")).await?;
    let b = format!("{name}.b");
    pg.batch_execute(&format!(
        "CREATE TABLE {b} (id int PRIMARY KEY, v int); INSERT INTO {b} SELECT g, 2 FROM generate_series(1, 200) g;"
    ))
    .await?;

    // Everything else here commits with synchronous_commit = off and never waits.
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'wal2delta_test_nobody'")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    let held = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let deleter = stack.connect().await?;
        let sql = format!("BEGIN; SET LOCAL synchronous_commit = remote_write; DELETE FROM {b} WHERE id % 10 = 0; COMMIT;");
        let delete = tokio::spawn(async move { deleter.batch_execute(&sql).await });
        let start = Instant::now();
        while admin
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'", &[])
            .await?
            .get::<_, i64>(0)
            == 0
        {
            ensure!(start.elapsed() < Duration::from_secs(20), "the delete never waited");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The delete's commit is in the WAL, invisible. Add the table: capture notices it
        // within 15 s and snapshots it in fresh chunks.
        d.setup()?;
        tokio::time::sleep(Duration::from_secs(20)).await;
        anyhow::Ok(delete)
    }
    .await;
    admin
        .batch_execute("ALTER SYSTEM RESET synchronous_standby_names")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    held?.await??;

    wait_snapshot_done(&stack, &mut d, &b).await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let events = events(&stack, &format!("{name}.{b}"))?;
    let source = source_state(&pg, &b).await?;
    ensure!(source.len() == 180);
    let topic = final_state(&events);
    let back: Vec<i64> = topic
        .keys()
        .filter(|k| !source.contains_key(k))
        .copied()
        .collect();
    ensure!(back.is_empty(), "deleted rows came back: {back:?}");
    ensure!(topic == source);
    d.stop()?;
    Ok(())
}

/// `wal2delta snapshot --table`: a table re-read on demand while capture runs (with no
/// initial snapshot configured). Silver, changed behind the pipeline's back (a row the
/// source does not have, a row missing, a row with another value), equals the source
/// again afterwards: the snapshot-end event at the request's position deletes what the
/// re-snapshot did not read, and the rows read again repair the others.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_of_one_table_on_demand_repairs_silver() -> Result<()> {
    use serde_json::json;
    use wal2delta_tests::lake::{duckdb_i64, scan, tamper};
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "resnap",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v bigint); CREATE TABLE {s}.other (id int PRIMARY KEY);",
    )
    .toml("[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n[capture]\nheartbeat_interval_ms = 500\n")
    .build()
    .await?;
    let mut pipe = d.spawn_stage("capture,bronze", "pipe")?;
    let mut silver = d.spawn_stage("silver", "silver")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, g FROM generate_series(1, 300) g; INSERT INTO {name}.other VALUES (1);"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let t = scan(&d.silver("t"));
    silver
        .wait_for("Silver holds 300 rows", &300, || {
            Ok(duckdb_i64(&format!("SELECT count(*) FROM {t}")).unwrap_or(0))
        })
        .await?;
    ensure!(silver.stop()?.success(), "silver stops cleanly");
    tamper(&json!({
        "path": d.silver("t").display().to_string(),
        "update": [["id = 7", {"v": "-7"}]],
        "delete": ["id = 8"],
        "copy": [[["id", 9], "id", 100_009]],
    }))?;
    let mut silver = d.spawn_stage("silver", "silver-2")?;

    let out = d.command(&["snapshot", "--table", &format!("{name}.t")])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.contains("requested"),
        "snapshot --table: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The stream goes on meanwhile.
    pg.batch_execute(&format!(
        "UPDATE {name}.t SET v = v + 1000 WHERE id <= 20; DELETE FROM {name}.t WHERE id = 300;"
    ))
    .await?;
    let want = format!("SELECT count(*) FILTER (WHERE id = 100009) * 1000000 + count(*) FILTER (WHERE id = 8) * 1000 + count(*) FILTER (WHERE v = -7) FROM {t}");
    silver
        .wait_for_within(
            "the row only Silver had is gone, the missing row is back, the changed value is repaired",
            &1000,
            Duration::from_secs(120),
            || Ok(duckdb_i64(&want).unwrap_or(-1)),
        )
        .await?;
    pipe.assert_running()?;
    let rows = duckdb_i64(&format!("SELECT count(*) FROM {t}"))?;
    ensure!(rows == 299, "Silver holds {rows} rows, the source 299");
    let sum = duckdb_i64(&format!("SELECT sum(v) FROM {t}"))?;
    let source: i64 = pg
        .query_one(&format!("SELECT sum(v)::bigint FROM {name}.t"), &[])
        .await?
        .get(0);
    ensure!(sum == source, "Silver's sum {sum}, the source's {source}");
    // Only the requested table was read again.
    let r_other = duckdb_i64(&format!(
        "SELECT count(*) FROM {} WHERE op = 'r'",
        scan(&d.bronze("other"))
    ))?;
    ensure!(
        r_other == 0,
        "the other table was not snapshotted ({r_other} rows)"
    );
    let out = d.command(&["snapshot", "--table", &format!("{name}.missing")])?;
    ensure!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("not in the publication"),
        "an unpublished table is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(silver.stop()?.success(), "silver stops cleanly");
    ensure!(pipe.stop()?.success(), "pipe stops cleanly");
    Ok(())
}

/// `wal2delta snapshot --table T --where SQL`: only the matching rows are read again,
/// consistent with the stream, and nothing is deleted; a condition that is not one SQL
/// condition on the table is refused before anything is requested.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_of_part_of_a_table_repairs_only_those_rows() -> Result<()> {
    use serde_json::json;
    use wal2delta_tests::lake::{duckdb, duckdb_i64, scan, tamper};
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "partsnap",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v bigint); CREATE TABLE {s}.log (at int, note text);",
    )
    .toml("[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n[capture]\nheartbeat_interval_ms = 500\n")
    .build()
    .await?;
    let mut pipe = d.spawn_stage("capture,bronze", "pipe")?;
    let mut silver = d.spawn_stage("silver", "silver")?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, g FROM generate_series(1, 300) g; \
         INSERT INTO {name}.log SELECT g, 'n' || g FROM generate_series(1, 300) g;"
    ))
    .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let t = scan(&d.silver("t"));
    silver
        .wait_for("Silver holds 300 rows", &300, || {
            Ok(duckdb_i64(&format!("SELECT count(*) FROM {t}")).unwrap_or(0))
        })
        .await?;
    ensure!(silver.stop()?.success(), "silver stops cleanly");
    // Damage inside the condition (ids below 100) and outside it.
    tamper(&json!({
        "path": d.silver("t").display().to_string(),
        "update": [["id = 30", {"v": "-30"}], ["id = 150", {"v": "-150"}]],
        "delete": ["id = 31", "id = 200"],
        "copy": [[["id", 9], "id", 100_009]],
    }))?;
    let mut silver = d.spawn_stage("silver", "silver-2")?;

    for (bad, says) in [
        ("no_such_column > 1", "no_such_column"),
        ("true; DELETE FROM t", "';'"),
        ("true) OR (true", "parenthesis"),
    ] {
        let out = d.command(&["snapshot", "--table", &format!("{name}.t"), "--where", bad])?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains(says) && err.contains("--where"),
            "{bad:?} is refused, saying why: {err}"
        );
    }
    let out = d.command(&[
        "snapshot",
        "--table",
        &format!("{name}.t"),
        "--where",
        "id < 100",
    ])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.contains("nothing is deleted"),
        "snapshot --where: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The stream goes on meanwhile, inside and outside the condition.
    pg.batch_execute(&format!(
        "UPDATE {name}.t SET v = v + 1000 WHERE id <= 20 OR id = 250; DELETE FROM {name}.t WHERE id = 50;"
    ))
    .await?;
    let check = format!(
        "SELECT (SELECT v FROM {t} WHERE id = 30), (SELECT count(*) FROM {t} WHERE id = 31), \
                (SELECT v FROM {t} WHERE id = 150), (SELECT count(*) FROM {t} WHERE id = 200), \
                (SELECT count(*) FROM {t} WHERE id = 100009), (SELECT count(*) FROM {t} WHERE id = 50), \
                (SELECT v FROM {t} WHERE id = 250)"
    );
    // Inside: repaired (30's value, 31 back; the stream does not touch them, so only the
    // snapshot can); outside: untouched (150
    // keeps its damage, 200 stays missing, the copied row stays); the stream's own
    // changes apply everywhere.
    let want = vec![vec![
        json!(30),
        json!(1),
        json!(-150),
        json!(0),
        json!(1),
        json!(0),
        json!(1250),
    ]];
    silver
        .wait_for_within(
            "the rows matching the condition are repaired, the others untouched",
            &want,
            Duration::from_secs(120),
            || Ok(duckdb(&check).unwrap_or_default()),
        )
        .await?;
    // Only matching rows were read: snapshot events of ids 1 to 99 but 50, once each.
    let read = duckdb(&format!(
        "SELECT count(*), count(DISTINCT key.id), max(key.id) FROM {} WHERE op = 'r'",
        scan(&d.bronze("t"))
    ))?;
    ensure!(
        read == vec![vec![json!(98), json!(98), json!(99)]],
        "snapshot rows in Bronze: {read:?}"
    );
    // A table without a primary key (chunked by ctid; Bronze only): the rows matching the
    // condition are read once each, the others not at all.
    let out = d.command(&[
        "snapshot",
        "--table",
        &format!("{name}.log"),
        "--where",
        "at % 10 = 0",
    ])?;
    ensure!(
        out.status.success(),
        "snapshot --where of a keyless table: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = scan(&d.bronze("log"));
    silver
        .wait_for_within(
            "the keyless table's matching rows read again",
            &vec![vec![json!(30), json!(30), json!(0)]],
            Duration::from_secs(120),
            || {
                Ok(duckdb(&format!(
                    "SELECT count(*), count(DISTINCT after.at), count(*) FILTER (WHERE after.at % 10 <> 0) \
                     FROM {log} WHERE op = 'r'"
                ))
                .unwrap_or_default())
            },
        )
        .await?;
    ensure!(silver.stop()?.success(), "silver stops cleanly");
    ensure!(pipe.stop()?.success(), "pipe stops cleanly");
    Ok(())
}
