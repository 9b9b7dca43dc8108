//! Tables created while the daemon runs are captured without re-running setup (issue 41
//! item 1, docs/capture.md "Tables created later"): capture adds a table matching
//! `[source] tables` to the publication, snapshots the rows committed before the add
//! (the creating transaction's among them) and streams every change after it; a table
//! created again under a captured name replaces the old one's rows; a table matching
//! `[source] exclude_tables` is left out; a dropped table is said to be gone; a table
//! that no longer matches after a config change is removed from the publication.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use wal2delta_model::TableName;
use wal2delta_tests::daemon::{psql, wait_log, StageProcess};
use wal2delta_tests::lake::table_rows;
use wal2delta_tests::{source_rows, Scenario, Stack};

/// A table name with a space, quotes, capitals and non-ASCII, as PostgreSQL spells it and
/// quoted for SQL.
const ODD_NAME: &str = "Pay \"Me\" ü";
const ODD: &str = "\"Pay \"\"Me\"\" ü\"";

async fn published(pg: &tokio_postgres::Client, publication: &str) -> Result<Vec<String>> {
    Ok(pg
        .query(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1",
            &[&publication],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Waits up to 60 s, `run` running, until `table` is in the publication (`present`) or
/// out of it.
async fn wait_published(
    pg: &tokio_postgres::Client,
    publication: &str,
    table: &str,
    present: bool,
    run: &mut StageProcess,
) -> Result<()> {
    let start = Instant::now();
    while published(pg, publication).await?.iter().any(|t| t == table) != present {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "{table} not {} the publication within 60 s: {}",
            if present { "added to" } else { "removed from" },
            run.log_text()
        );
        run.assert_running()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_created_while_the_daemon_runs_is_captured_without_setup() -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(
        &stack,
        "newtab",
        "CREATE TABLE {s}.a (id int PRIMARY KEY, v text);",
    )
    .toml(
        "[snapshot]\nmode = \"initial\"\nchunk_rows = 100\n[bronze]\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n[silver]\ninterval_ms = 300\n",
    )
    .env("WAL2DELTA__SOURCE__EXCLUDE_TABLES", "['{s}.skip_*']")
    .build()
    .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    pg.batch_execute(&format!("INSERT INTO {s}.a VALUES (1, 'one')"))
        .await?;
    let a = d.silver("a");
    let want = source_rows(&pg, &format!("{s}.a"), "id, v", "id").await?;
    run.wait_for("Silver of a", &want, || table_rows(&a, "id, v", "id"))
        .await?;

    // Created and written in one transaction, written again before capture can have
    // noticed it (it looks every 15 s), and a table the exclusion leaves out.
    pg.batch_execute(&format!(
        "BEGIN;
         CREATE TABLE {s}.b (id int PRIMARY KEY, v text);
         INSERT INTO {s}.b SELECT g, 'b' || g FROM generate_series(1, 250) g;
         COMMIT;
         UPDATE {s}.b SET v = 'early' WHERE id % 7 = 0;
         DELETE FROM {s}.b WHERE id > 240;
         CREATE TABLE {s}.skip_me (id int PRIMARY KEY, v text);
         INSERT INTO {s}.skip_me VALUES (1, 'no');
         CREATE TABLE {s}.c (id int PRIMARY KEY, v text);
         CREATE TABLE {s}.nokey (id int, v text);
         INSERT INTO {s}.nokey VALUES (1, 'no key');
         CREATE TABLE {s}.{ODD} (id int PRIMARY KEY, v text);
         INSERT INTO {s}.{ODD} VALUES (1, 'odd'), (2, 'odder');"
    ))
    .await?;
    let publication = d.publication.clone();
    let start = Instant::now();
    // Writes keep coming while capture adds the table and snapshots it.
    let mut n = 1000;
    loop {
        pg.batch_execute(&format!(
            "INSERT INTO {s}.b VALUES ({n}, 'during'); UPDATE {s}.b SET v = 'moved {n}' WHERE id = {}",
            n % 200 + 1
        ))
        .await?;
        n += 1;
        let now = published(&pg, &publication).await?;
        if now.contains(&format!("{s}.b"))
            && now.contains(&format!("{s}.c"))
            && now.contains(&format!("{s}.{ODD_NAME}"))
        {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "b and c not published within 60 s: {now:?}\n{}",
                run.log_text()
            );
        }
        run.assert_running()?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // After the add: streamed, in the same transactions as changes of a; then its key
    // widened (int to bigint) right after capture added it, and a value only bigint holds.
    pg.batch_execute(&format!(
        "BEGIN; INSERT INTO {s}.b VALUES (5000, 'late'); UPDATE {s}.a SET v = 'with b'; COMMIT;
         DELETE FROM {s}.b WHERE id = 3; UPDATE {s}.b SET v = NULL WHERE id = 1000;
         ALTER TABLE {s}.b ALTER COLUMN id TYPE bigint;
         INSERT INTO {s}.b VALUES (5000000000, 'wide'); UPDATE {s}.b SET v = 'after widening' WHERE id = 5"
    ))
    .await?;

    let b = d.silver("b");
    let want = source_rows(&pg, &format!("{s}.b"), "id, v", "id").await?;
    run.wait_for("Silver of b equals the source", &want, || {
        table_rows(&b, "id, v", "id")
    })
    .await?;
    let want = source_rows(&pg, &format!("{s}.a"), "id, v", "id").await?;
    run.wait_for("Silver of a", &want, || table_rows(&a, "id, v", "id"))
        .await?;
    // A name with a space, quotes, capitals and non-ASCII is added and captured too.
    let odd = d.silver(&TableName::new(&s, ODD_NAME).ident_parts().1);
    let want = source_rows(&pg, &format!("{s}.{ODD}"), "id, v", "id").await?;
    run.wait_for("Silver of the odd name", &want, || {
        table_rows(&odd, "id, v", "id")
    })
    .await?;

    let now = published(&pg, &publication).await?;
    ensure!(
        !now.contains(&format!("{s}.skip_me")),
        "an excluded table is not added: {now:?}"
    );
    ensure!(
        !d.lake().join(format!("bronze/{s}/skip_me")).exists(),
        "nothing of an excluded table reaches the lake"
    );
    // A table without a primary key or replica identity is not published, so that the
    // application's UPDATEs on it keep working; once it has an identity it is added.
    let now = published(&pg, &publication).await?;
    ensure!(
        !now.contains(&format!("{s}.nokey")),
        "a table without a replica identity is not added: {now:?}"
    );
    pg.batch_execute(&format!(
        "UPDATE {s}.nokey SET v = 'updated'; ALTER TABLE {s}.nokey REPLICA IDENTITY FULL"
    ))
    .await?;
    wait_published(&pg, &publication, &format!("{s}.nokey"), true, &mut run).await?;
    pg.batch_execute(&format!("UPDATE {s}.nokey SET v = 'captured'"))
        .await?;

    // A table the capture role does not own cannot be added (ALTER PUBLICATION fails):
    // warned with the statement to run, tried again at every look, added once the role
    // owns it, and nothing of it is lost.
    let admin = &stack.admin_dsn;
    ensure!(
        psql(
            admin,
            &format!(
                "CREATE TABLE {s}.theirs (id int PRIMARY KEY, v text); \
                 INSERT INTO {s}.theirs VALUES (1, 'before'), (2, 'before')"
            )
        )
        .is_some(),
        "the admin creates a table it owns"
    );
    wait_log(
        &d.dir.join("run.log"),
        &["the capture role may not add it", &format!("{s}.theirs")],
        Duration::from_secs(60),
    )?;
    ensure!(
        !published(&pg, &publication)
            .await?
            .contains(&format!("{s}.theirs")),
        "a table the role does not own is not published"
    );
    ensure!(
        psql(
            admin,
            &format!("UPDATE {s}.theirs SET v = 'changed' WHERE id = 2; ALTER TABLE {s}.theirs OWNER TO replicator")
        )
        .is_some(),
        "the owner hands the table over"
    );
    let theirs = d.silver("theirs");
    let want = source_rows(&pg, &format!("{s}.theirs"), "id, v", "id").await?;
    run.wait_for("Silver of the table added once owned", &want, || {
        table_rows(&theirs, "id, v", "id")
    })
    .await?;
    let full_log = || std::fs::read_to_string(d.dir.join("run.log")).unwrap_or_default();
    let log = full_log();
    ensure!(
        log.contains("added to the publication") && log.contains(&format!("{s}.b")),
        "the log says which table was added: {log}"
    );
    ensure!(
        log.contains("not captured") && log.contains("REPLICA IDENTITY FULL"),
        "the log says why the keyless table waited and what to do: {log}"
    );

    // Dropped and created again under the same name: the new table's rows and none of
    // the old one's, whatever was written before capture added it again.
    pg.batch_execute(&format!(
        "DROP TABLE {s}.a; CREATE TABLE {s}.a (id int PRIMARY KEY, v text);
         INSERT INTO {s}.a VALUES (10, 'new'), (11, 'new too')"
    ))
    .await?;
    let want = source_rows(&pg, &format!("{s}.a"), "id, v", "id").await?;
    run.wait_for("Silver of a, created again", &want, || {
        table_rows(&a, "id, v", "id")
    })
    .await?;

    // A dropped table is said to be gone; the daemon goes on.
    pg.batch_execute(&format!(
        "DROP TABLE {s}.c; INSERT INTO {s}.a VALUES (2, 'after drop')"
    ))
    .await?;
    let want = source_rows(&pg, &format!("{s}.a"), "id, v", "id").await?;
    run.wait_for("Silver of a after the drop", &want, || {
        table_rows(&a, "id, v", "id")
    })
    .await?;
    let start = Instant::now();
    while !full_log().contains("left the publication") {
        ensure!(
            start.elapsed() < Duration::from_secs(40),
            "the drop is not told: {}",
            run.log_text()
        );
        run.assert_running()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(run.stop()?.success(), "{}", run.log_text());

    // The config changes: b is excluded now. At its next look capture removes b from the
    // publication, as `setup` would; b's later changes stay out of the lake, a's go on.
    let mut d = d;
    d.env.push((
        "WAL2DELTA__SOURCE__EXCLUDE_TABLES".into(),
        format!("['{s}.skip_*', '{s}.b']"),
    ));
    let mut run = d.spawn_stage("capture,bronze,silver", "run-2")?;
    wait_published(&pg, &publication, &format!("{s}.b"), false, &mut run).await?;
    let before = table_rows(&b, "id, v", "id")?;
    pg.batch_execute(&format!(
        "INSERT INTO {s}.b VALUES (7000, 'not captured'); INSERT INTO {s}.a VALUES (3, 'after removal')"
    ))
    .await?;
    let want = source_rows(&pg, &format!("{s}.a"), "id, v", "id").await?;
    run.wait_for("Silver of a after b's removal", &want, || {
        table_rows(&a, "id, v", "id")
    })
    .await?;
    ensure!(
        table_rows(&b, "id, v", "id")? == before,
        "nothing of b after its removal reaches the lake"
    );
    let log = std::fs::read_to_string(d.dir.join("run-2.log")).unwrap_or_default();
    ensure!(
        log.contains("removed from the publication") && log.contains(&format!("{s}.b")),
        "the log says which table was removed and why: {}",
        run.log_text()
    );
    ensure!(run.stop()?.success(), "{}", run.log_text());
    Ok(())
}

/// A table created and filled with 1,000,000 rows in one transaction while the daemon
/// runs: capture adds it and reads the rows in chunks (the creating transaction is not
/// streamed: the table was not published at its commit). Every row reaches Bronze once
/// and Silver equals the source; a change after the add streams on top.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_created_with_a_million_rows_in_one_transaction_is_captured_whole() -> Result<()> {
    use wal2delta_tests::lake::{duckdb_i64, scan};
    const ROWS: i64 = 1_000_000;
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "newbig", "CREATE TABLE {s}.a (id int PRIMARY KEY);")
        .toml("[snapshot]\nmode = \"initial\"\nchunk_rows = 50000\n[silver]\ninterval_ms = 500\n")
        .build()
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let mut run = d.spawn_stage("capture,bronze,silver", "run")?;
    pg.batch_execute(&format!("INSERT INTO {s}.a VALUES (1)"))
        .await?;
    let a = d.silver("a");
    run.wait_for("Silver of a", &vec![vec![serde_json::json!(1)]], || {
        table_rows(&a, "id", "id")
    })
    .await?;
    pg.batch_execute(&format!(
        "BEGIN;
         CREATE TABLE {s}.big (id bigint PRIMARY KEY, v text);
         INSERT INTO {s}.big SELECT g, 'row ' || g FROM generate_series(1, {ROWS}) g;
         COMMIT;"
    ))
    .await?;
    wait_published(&pg, &d.publication, &format!("{s}.big"), true, &mut run).await?;
    pg.batch_execute(&format!(
        "UPDATE {s}.big SET v = 'changed' WHERE id % 100000 = 0; DELETE FROM {s}.big WHERE id = 7"
    ))
    .await?;
    let big = d.silver("big");
    let check = format!(
        "SELECT count(*), sum(id), count(*) FILTER (WHERE v = 'changed') FROM {}",
        scan(&big)
    );
    let want: Vec<i64> = {
        let r = pg
            .query_one(
                &format!("SELECT count(*), sum(id)::bigint, count(*) FILTER (WHERE v = 'changed') FROM {s}.big"),
                &[],
            )
            .await?;
        vec![r.get(0), r.get(1), r.get(2)]
    };
    run.wait_for_within(
        "Silver of the million-row table equals the source",
        &want,
        Duration::from_secs(900),
        || {
            let rows = wal2delta_tests::lake::duckdb(&check).unwrap_or_default();
            Ok(rows
                .first()
                .map(|r| r.iter().map(|v| v.as_i64().unwrap_or(-1)).collect())
                .unwrap_or_default())
        },
    )
    .await?;
    let snapshot_rows = duckdb_i64(&format!(
        "SELECT count(DISTINCT after.id) - count(*) FROM {} WHERE op = 'r'",
        scan(&d.bronze("big"))
    ))?;
    ensure!(snapshot_rows == 0, "each row read once into Bronze");
    ensure!(run.stop()?.success(), "{}", run.log_text());
    Ok(())
}
