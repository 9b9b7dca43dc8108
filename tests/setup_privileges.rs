//! The least-privilege capture role on the real stack: `migrations/least_privilege.sql`
//! grants enough for setup, the initial snapshot and streaming; and `wal2delta setup`
//! names each privilege a role lacks (REPLICATION, USAGE, SELECT on a published table,
//! ownership to create or change the publication) with the statement that grants it.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Result;
use wal2delta_tests::daemon::{psql, Daemon};
use wal2delta_tests::kafka::read_topic;
use wal2delta_tests::roles::TempRole;
use wal2delta_tests::{Scenario, Stack, World};

const PASSWORD: &str = wal2delta_tests::secrets::LEAST_PRIVILEGE_PASSWORD;

/// `wal2delta setup`'s exit status and stderr.
fn setup(d: &Daemon) -> Result<(bool, String)> {
    let out = d.command(&["setup"])?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains(PASSWORD),
        "setup printed the password: {stderr}"
    );
    Ok((out.status.success(), stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_migration_grants_enough_to_snapshot_and_stream() -> Result<()> {
    let stack = Stack::from_env();
    let role = TempRole::new(&stack, "lp", "", PASSWORD)?;
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        "lpmig",
        "CREATE TABLE {s}.a (id int PRIMARY KEY, v text); CREATE TABLE {s}.b (id int PRIMARY KEY);",
    )
    .toml("[snapshot]\nmode = \"initial\"")
    .env("WAL2DELTA__SOURCE__DSN", &role.dsn(&stack, "127.0.0.1", ""))
    .without_setup()
    .build()
    .await?;
    pg.batch_execute(&format!(
        "INSERT INTO {name}.a VALUES (1, 'x'), (2, 'y'), (3, 'z')"
    ))
    .await?;
    // The migration, as the operator runs it: psql, as a superuser.
    let migration = wal2delta_tests::repo_root().join("migrations/least_privilege.sql");
    // Applied twice: idempotent, the second run changes nothing and fails on nothing.
    for _ in 0..2 {
        let out = Command::new("psql")
            .args(["-X", "-q", "-d", &stack.admin_dsn])
            .args(["-v", &format!("role={}", role.name)])
            .args(["-v", &format!("schema={name}")])
            .args(["-v", &format!("publication={name}")])
            .arg("-f")
            .arg(&migration)
            .stdin(Stdio::null())
            .output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Exactly the privileges the migration promises: no write, no ownership, no superuser.
    let facts = psql(
        &stack.admin_dsn,
        &format!(
            "SELECT r.rolreplication, r.rolsuper, \
                    has_table_privilege('{r}', '{name}.a', 'SELECT'), has_table_privilege('{r}', '{name}.b', 'SELECT'), \
                    has_table_privilege('{r}', '{name}.a', 'INSERT,UPDATE,DELETE,TRUNCATE'), \
                    (SELECT count(*) FROM pg_class WHERE relowner = r.oid) \
             FROM pg_roles r WHERE rolname = '{r}'",
            r = role.name
        ),
    );
    assert_eq!(facts.as_deref(), Some("t|f|t|t|f|0"));
    let (ok, stderr) = setup(&d)?;
    assert!(ok, "setup as the least-privilege role: {stderr}");
    d.start()?;
    pg.batch_execute(&format!("INSERT INTO {name}.a VALUES (4, 'w'), (5, 'v')"))
        .await?;
    let recs = read_topic(
        &stack.brokers,
        &format!("{name}.{name}.a"),
        Some(5),
        Duration::from_secs(60),
    )?;
    assert_eq!(
        recs.len(),
        5,
        "three snapshot rows and two streamed inserts"
    );
    d.assert_running()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_names_each_missing_privilege_and_the_grant() -> Result<()> {
    let stack = Stack::from_env();
    let role = TempRole::new(&stack, "np", "", PASSWORD)?;
    let r = &role.name;
    let World { name: s, d, .. } = Scenario::new(
        &stack,
        "lpmiss",
        "CREATE TABLE {s}.t1 (id int PRIMARY KEY); CREATE TABLE {s}.t2 (id int PRIMARY KEY);",
    )
    .env("WAL2DELTA__SOURCE__DSN", &role.dsn(&stack, "127.0.0.1", ""))
    .without_setup()
    .build()
    .await?;

    // Nothing granted: every problem at once, each with its fix.
    let (ok, e) = setup(&d)?;
    assert!(!ok, "setup succeeded without privileges");
    for needle in [
        format!("role \"{r}\" lacks the REPLICATION attribute"),
        format!("ALTER ROLE \"{r}\" REPLICATION"),
        format!("GRANT rds_replication TO \"{r}\""),
        format!("role \"{r}\" has no USAGE on schema \"{s}\""),
        format!("GRANT USAGE ON SCHEMA \"{s}\" TO \"{r}\""),
        format!("role \"{r}\" has no SELECT on table {s}.t1"),
        format!("GRANT SELECT ON \"{s}\".\"t1\" TO \"{r}\""),
        format!("GRANT SELECT ON \"{s}\".\"t2\" TO \"{r}\""),
        format!("role \"{r}\" cannot create publication \"{s}\""),
        format!("does not own {s}.t1 (owner replicator), {s}.t2 (owner replicator)"),
        format!("CREATE PUBLICATION \"{s}\" FOR TABLE \"{s}\".\"t1\", \"{s}\".\"t2\""),
        "migrations/least_privilege.sql".to_owned(),
    ] {
        assert!(e.contains(&needle), "missing {needle:?} in:\n{e}");
    }

    // REPLICATION and USAGE granted, SELECT on t1 only; the owner made the publication.
    role.admin(&format!(
        "ALTER ROLE {r} REPLICATION; GRANT USAGE ON SCHEMA {s} TO {r}; GRANT SELECT ON {s}.t1 TO {r}; \
         CREATE PUBLICATION {s} FOR TABLE {s}.t1, {s}.t2 WITH (publish_via_partition_root = true)"
    ))?;
    let (ok, e) = setup(&d)?;
    assert!(!ok, "setup succeeded without SELECT on t2");
    assert!(e.contains(&format!("no SELECT on table {s}.t2")), "{e}");
    assert!(!e.contains(&format!("{s}.t1")), "t1 is fine now: {e}");
    assert!(
        !e.contains("REPLICATION attribute") && !e.contains("publication"),
        "{e}"
    );

    // All granted: setup succeeds, with the publication the owner made.
    role.admin(&format!("GRANT SELECT ON {s}.t2 TO {r}"))?;
    let (ok, e) = setup(&d)?;
    assert!(ok, "{e}");

    // A new table in the schema: the publication must change, which only its owner (and
    // the table's) may do.
    role.admin(&format!(
        "CREATE TABLE {s}.t3 (id int PRIMARY KEY); ALTER TABLE {s}.t3 OWNER TO replicator"
    ))?;
    let (ok, e) = setup(&d)?;
    assert!(!ok, "setup changed a publication it does not own");
    assert!(
        e.contains(&format!("role \"{r}\" cannot change publication \"{s}\"")),
        "{e}"
    );
    assert!(e.contains(&format!("{s}.t3 (owner replicator)")), "{e}");
    assert!(
        e.contains(&format!(
            "only the owner of publication \"{s}\" may change it"
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!("ALTER PUBLICATION \"{s}\" SET TABLE")),
        "{e}"
    );
    assert!(
        e.contains(&format!("GRANT SELECT ON \"{s}\".\"t3\" TO \"{r}\"")),
        "{e}"
    );
    drop(d);
    Ok(())
}
