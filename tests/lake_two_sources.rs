//! Several source databases in one lake and one Kafka cluster (issue 41 item 2,
//! docs/operations.md "Several databases, one lake"): two databases hold a table of the
//! same name; two daemons, each with its own `[source] name`, share one lake and one
//! broker, and each Silver equals its own source. Two sources configured onto the same
//! tables or topics are refused, naming both.

use std::time::Duration;

use anyhow::{ensure, Result};
use wal2delta_tests::daemon::{psql, wait_log, Daemon};
use wal2delta_tests::lake::table_rows;
use wal2delta_tests::{connect, source_rows, Scenario, Stack};

/// A second database on the stack's server, dropped (after its slots) when the test ends.
struct Database {
    admin_dsn: String,
    name: String,
}

impl Drop for Database {
    fn drop(&mut self) {
        let slots = format!(
            "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE database = '{}' AND NOT active",
            self.name
        );
        // A statement of its own: DROP DATABASE cannot run in a transaction block.
        let database = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        for _ in 0..20 {
            if psql(&self.admin_dsn, &slots).is_some() && psql(&self.admin_dsn, &database).is_some()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!("could not drop database {} after the test", self.name);
    }
}

/// `dsn` with its database replaced by `db` (`postgres://user:pw@host:port/db?...`).
fn in_database(dsn: &str, db: &str) -> String {
    let (base, query) = dsn.split_once('?').unwrap_or((dsn, ""));
    let base = match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{db}"),
        None => base.to_owned(),
    };
    if query.is_empty() {
        base
    } else {
        format!("{base}?{query}")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_databases_share_one_lake_and_one_broker_each_under_its_name() -> Result<()> {
    let stack = Stack::from_env();
    let tables = "CREATE TABLE {s}.orders (id int PRIMARY KEY, v text);";
    let w = Scenario::new(&stack, "srca", tables)
        .toml("[silver]\ninterval_ms = 300\n")
        .env("WAL2DELTA__SOURCE__NAME", "alpha")
        .build()
        .await?;
    let (s, pg_a, mut a) = (w.name, w.pg, w.d);
    let lake = a.lake();

    // The second database: the same schema and table name.
    let db = format!("{s}_b");
    let row = pg_a
        .query_one("SELECT current_user::text, current_database()::text", &[])
        .await?;
    let (role, db_a): (String, String) = (row.get(0), row.get(1));
    ensure!(
        psql(
            &stack.admin_dsn,
            &format!("CREATE DATABASE \"{db}\" OWNER \"{role}\"")
        )
        .is_some(),
        "creating database {db}"
    );
    let _database = Database {
        admin_dsn: stack.admin_dsn.clone(),
        name: db.clone(),
    };
    let dsn_b = in_database(&stack.dsn, &db);
    let pg_b = connect(&dsn_b).await?;
    pg_b.batch_execute(&format!("CREATE SCHEMA {s}; {}", tables.replace("{s}", &s)))
        .await?;
    let mut b = Daemon::new(&stack, &format!("{s}b"), "[silver]\ninterval_ms = 300\n")?;
    for (k, v) in [
        ("WAL2DELTA__SOURCE__DSN", dsn_b.clone()),
        ("WAL2DELTA__SOURCE__TABLES", format!("['{s}.*']")),
        ("WAL2DELTA__SOURCE__NAME", "beta".to_owned()),
        ("WAL2DELTA__LAKE__URI", format!("file://{}", lake.display())),
    ] {
        b.env.push((k.to_owned(), v));
    }
    b.setup()?;

    let mut run_a = a.spawn_stage("capture,bronze,silver", "run")?;
    let mut run_b = b.spawn_stage("capture,bronze,silver", "run")?;
    pg_a.batch_execute(&format!(
        "INSERT INTO {s}.orders SELECT g, 'alpha ' || g FROM generate_series(1, 40) g; UPDATE {s}.orders SET v = 'a!' WHERE id = 3"
    ))
    .await?;
    pg_b.batch_execute(&format!(
        "INSERT INTO {s}.orders SELECT g, 'beta ' || g FROM generate_series(20, 70) g; DELETE FROM {s}.orders WHERE id = 21"
    ))
    .await?;
    let silver_a = lake.join(format!("alpha/silver/{s}/orders"));
    let silver_b = lake.join(format!("beta/silver/{s}/orders"));
    let want_a = source_rows(&pg_a, &format!("{s}.orders"), "id, v", "id").await?;
    run_a
        .wait_for("alpha's Silver equals its source", &want_a, || {
            table_rows(&silver_a, "id, v", "id")
        })
        .await?;
    let want_b = source_rows(&pg_b, &format!("{s}.orders"), "id, v", "id").await?;
    run_b
        .wait_for("beta's Silver equals its source", &want_b, || {
            table_rows(&silver_b, "id, v", "id")
        })
        .await?;
    ensure!(
        !lake.join("bronze").exists() && !lake.join("silver").exists(),
        "nothing at the lake's root: each source under its name"
    );
    ensure!(run_a.stop()?.success(), "{}", run_a.log_text());
    ensure!(run_b.stop()?.success(), "{}", run_b.log_text());

    // Two sources on the same tables: a second lake where alpha's Bronze writes as it
    // would without a name, then beta's, also without a name, onto the same paths.
    let shared = a.dir.join("shared");
    let lake_env = format!("file://{}", shared.display());
    for d in [&mut a, &mut b] {
        d.env.retain(|(k, _)| k != "WAL2DELTA__SOURCE__NAME");
        d.env
            .push(("WAL2DELTA__LAKE__URI".into(), lake_env.clone()));
    }
    let mut first = a.spawn_stage("bronze", "unnamed")?;
    let bronze_a = shared.join(format!("bronze/{s}/orders"));
    first
        .wait_for("alpha's Bronze in the shared lake", &true, || {
            Ok(bronze_a.join("_delta_log").is_dir())
        })
        .await?;
    ensure!(first.stop()?.success(), "{}", first.log_text());
    let _second = b.spawn_stage("bronze", "unnamed")?;
    let log = wait_log(
        &b.dir.join("unnamed.log"),
        &["is written by source", "[source] name"],
        Duration::from_secs(90),
    )?;
    ensure!(
        log.contains(&format!("{db_a}/{}", a.slot)) && log.contains(&format!("{db}/{}", b.slot)),
        "both sources are named: {log}"
    );
    // Refused at start, by the source the lake's root records, before any table.
    ensure!(
        log.contains("the lake at") && shared.join("_wal2delta/source.json").is_file(),
        "the refusal comes from the lake's source marker: {log}"
    );
    drop(_second);
    // A lake shared before the marker existed: each Bronze table's own record refuses.
    std::fs::remove_file(shared.join("_wal2delta/source.json"))?;
    let _again = b.spawn_stage("bronze", "unnamed-2")?;
    let log = wait_log(
        &b.dir.join("unnamed-2.log"),
        &["is written by source", &format!("{db_a}/{}", a.slot)],
        Duration::from_secs(90),
    )?;
    ensure!(
        log.contains(&format!("bronze/{s}/orders")) || log.contains(&format!("{s}.orders")),
        "the table is named: {log}"
    );
    drop(_again);

    // Two sources on the same topics: beta's capture with alpha's topic prefix.
    b.env
        .push(("WAL2DELTA__SOURCE__NAME".into(), "beta".into()));
    b.env
        .push(("WAL2DELTA__KAFKA__TOPIC_PREFIX".into(), a.prefix.clone()));
    let _third = b.spawn_stage("capture", "topics")?;
    wait_log(
        &b.dir.join("topics.log"),
        &[
            "holds positions of source \"alpha\"",
            "this daemon is source \"beta\"",
        ],
        Duration::from_secs(90),
    )?;
    Ok(())
}
