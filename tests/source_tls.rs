//! TLS to PostgreSQL on the real stack (`ops/stack` runs it with `ssl=on` and certificates
//! it made): capture end to end with `sslmode=verify-full` over both connections, a client
//! certificate login, libpq's sslmode semantics, and refusals that say what to fix.
//!
//! TLS is proven, not assumed: the roles used here are refused without TLS by the stack's
//! pg_hba.conf (`hostnossl ... reject`), and `pg_stat_ssl` shows every session of the
//! daemon (walsender included) encrypted.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio_postgres::Client;
use wal2delta_cdc::replication::{ConnectParams, ReplicationConnection};
use wal2delta_tests::daemon::psql;
use wal2delta_tests::kafka::read_topic;
use wal2delta_tests::{Scenario, Stack, World};

/// The role the stack refuses without TLS; logs in with SCRAM.
const TLS_ROLE: &str = "wal2delta_tls";
/// The role the stack logs in by client certificate (CN = role name), TLS only.
const CERT_ROLE: &str = "wal2delta_cert";
/// Distinctive, so a leak into any log or error is found.
const PASSWORD: &str = wal2delta_tests::secrets::TLS_PASSWORD;

fn tls_dir() -> String {
    std::env::var("WAL2DELTA_STACK_TLS_DIR")
        .unwrap_or_else(|_| format!("{}/tls", Stack::from_env().stack_dir))
}

fn pg_port(stack: &Stack) -> u16 {
    let cfg: tokio_postgres::Config = stack.admin_dsn.parse().expect("admin DSN");
    cfg.get_ports().first().copied().unwrap_or(5432)
}

/// The TLS-only roles, members of the stack's capture role (so they may publish its
/// tables), with REPLICATION.
async fn ensure_roles(admin: &Client) -> Result<()> {
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{TLS_ROLE}') THEN
                 CREATE ROLE {TLS_ROLE} LOGIN REPLICATION IN ROLE replicator;
               END IF;
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{CERT_ROLE}') THEN
                 CREATE ROLE {CERT_ROLE} LOGIN REPLICATION IN ROLE replicator;
               END IF;
             END $$;
             ALTER ROLE {TLS_ROLE} PASSWORD '{PASSWORD}';"
        ))
        .await?;
    Ok(())
}

/// `verify-full` as the TLS role, SCRAM with channel binding required.
fn verify_full_url(stack: &Stack) -> String {
    format!(
        "postgres://{TLS_ROLE}:{PASSWORD}@localhost:{}/app?sslmode=verify-full&sslrootcert={}/ca.crt&channel_binding=require",
        pg_port(stack),
        tls_dir()
    )
}

/// Waits for the daemon's walsender (as `role`), then returns `(backend_type, ssl)` of
/// every session of that role.
async fn sessions_of(admin: &Client, role: &str) -> Result<Vec<(String, bool)>> {
    let start = Instant::now();
    loop {
        let rows = admin
            .query(
                "SELECT a.backend_type::text, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.usename = $1 ORDER BY 1",
                &[&role],
            )
            .await?;
        let got: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if got.iter().any(|(t, _)| t == "walsender")
            && got.iter().any(|(t, _)| t == "client backend")
        {
            return Ok(got);
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("no walsender and client backend of {role} after 60 s: {got:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs capture with `dsn` and checks rows arrive in Kafka over TLS-only sessions.
async fn capture_over_tls(prefix: &str, dsn: &str, role: &str) -> Result<()> {
    let stack = Stack::from_env();
    let admin = stack.admin().await?;
    ensure_roles(&admin).await?;
    let World {
        name, pg, mut d, ..
    } = Scenario::new(
        &stack,
        prefix,
        "CREATE TABLE {s}.t (id int PRIMARY KEY, v text);",
    )
    .env("WAL2DELTA__SOURCE__DSN", dsn)
    .build()
    .await
    .context("setup over TLS")?;
    d.start()?;
    let sessions = sessions_of(&admin, role).await?;
    assert!(
        sessions.iter().all(|(_, ssl)| *ssl),
        "every session of the daemon is encrypted: {sessions:?}"
    );
    pg.batch_execute(&format!(
        "INSERT INTO {name}.t SELECT g, 'row ' || g FROM generate_series(1, 5) g"
    ))
    .await?;
    let topic = format!("{name}.{name}.t");
    let recs = read_topic(&stack.brokers, &topic, Some(5), Duration::from_secs(30))?;
    assert_eq!(recs.len(), 5, "five inserts captured over TLS");
    d.assert_running()?;
    // The password reached no log or file the test wrote.
    for entry in std::fs::read_dir(&d.dir)? {
        let path = entry?.path();
        if path.is_file() {
            let text = String::from_utf8_lossy(&std::fs::read(&path)?).into_owned();
            assert!(
                !text.contains(PASSWORD),
                "{} holds the password",
                path.display()
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_with_verify_full_and_scram_channel_binding() -> Result<()> {
    let stack = Stack::from_env();
    capture_over_tls("tlsfull", &verify_full_url(&stack), TLS_ROLE).await
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_with_a_client_certificate() -> Result<()> {
    let stack = Stack::from_env();
    let t = tls_dir();
    // key=value form, IP address host (the certificate's subjectAltName lists 127.0.0.1).
    let dsn = format!(
        "host=127.0.0.1 port={} dbname=app user={CERT_ROLE} sslmode=verify-full sslrootcert={t}/ca.crt sslcert={t}/client.crt sslkey={t}/client.key",
        pg_port(&stack)
    );
    capture_over_tls("tlscert", &dsn, CERT_ROLE).await
}

/// The error of both connections for `dsn`; both must fail.
async fn both_refused(dsn: &str) -> Result<[String; 2]> {
    let query = match wal2delta_cdc::source::connect(dsn).await {
        Ok(_) => bail!("the query connection was allowed"),
        Err(e) => e.to_string(),
    };
    let params = ConnectParams::from_dsn(dsn)?;
    let replication = match ReplicationConnection::connect(&params).await {
        Ok(_) => bail!("the replication connection was allowed"),
        Err(e) => e.to_string(),
    };
    for e in [&query, &replication] {
        assert!(!e.contains(PASSWORD), "the error shows the password: {e}");
    }
    Ok([query, replication])
}

/// `ssl` of each connection's own session, from inside it.
async fn ssl_in_use(dsn: &str) -> Result<[bool; 2]> {
    let client = wal2delta_cdc::source::connect(dsn).await?;
    let query: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?
        .get(0);
    let mut repl = ReplicationConnection::connect(&ConnectParams::from_dsn(dsn)?).await?;
    let rows = repl
        .simple_query("SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .await?;
    let replication = rows.first().and_then(|r| r.first()).cloned().flatten();
    Ok([query, replication.as_deref() == Some("true")])
}

#[tokio::test(flavor = "multi_thread")]
async fn sslmodes_mean_what_they_mean_to_libpq() -> Result<()> {
    let stack = Stack::from_env();
    ensure_roles(&stack.admin().await?).await?;
    let port = pg_port(&stack);
    let t = tls_dir();
    let base = format!("host=localhost port={port} dbname=app user=replicator password=replicator");
    assert_eq!(
        ssl_in_use(&format!("{base} sslmode=disable")).await?,
        [false, false]
    );
    // prefer is the default, as in libpq: TLS when the server offers it.
    assert_eq!(ssl_in_use(&base).await?, [true, true]);
    assert_eq!(
        ssl_in_use(&format!("{base} sslmode=require")).await?,
        [true, true]
    );
    assert_eq!(
        ssl_in_use(&format!("{base} sslmode=verify-ca sslrootcert={t}/ca.crt")).await?,
        [true, true]
    );
    // As in libpq, require with an sslrootcert checks the chain (it is verify-ca).
    let [q, r] = both_refused(&format!(
        "{base} sslmode=require sslrootcert={t}/other-ca.crt"
    ))
    .await?;
    for e in [q, r] {
        assert!(e.contains("not signed by a CA in sslrootcert="), "{e}");
    }
    // verify-ca checks the CA, not the name: a host name the certificate does not list.
    assert_eq!(
        ssl_in_use(&format!(
            "host=wrong.example hostaddr=127.0.0.1 port={port} dbname=app user=replicator password=replicator sslmode=verify-ca sslrootcert={t}/ca.crt"
        ))
        .await?,
        [true, true]
    );
    // A TLS-only role without TLS: refused by the server, which proves the pg_hba rule
    // the other tests rely on.
    let plain = format!(
        "host=localhost port={port} dbname=app user={TLS_ROLE} password={PASSWORD} sslmode=disable"
    );
    let [q, r] = both_refused(&plain).await?;
    assert!(
        q.contains("no encryption") && r.contains("no encryption"),
        "{q}\n{r}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_host_name_or_ca_is_refused_with_the_fix() -> Result<()> {
    let stack = Stack::from_env();
    ensure_roles(&stack.admin().await?).await?;
    let port = pg_port(&stack);
    let t = tls_dir();
    // The certificate names localhost and 127.0.0.1, not wrong.example.
    let wrong_host = format!(
        "host=wrong.example hostaddr=127.0.0.1 port={port} dbname=app user={TLS_ROLE} password={PASSWORD} sslmode=verify-full sslrootcert={t}/ca.crt"
    );
    for e in both_refused(&wrong_host).await? {
        assert!(e.contains("TLS to PostgreSQL at wrong.example"), "{e}");
        assert!(e.contains("hostname mismatch"), "{e}");
        assert!(e.contains("does not name host \"wrong.example\""), "{e}");
        assert!(e.contains("sslmode=verify-ca"), "the fix is named: {e}");
    }
    // A CA that did not sign the server's certificate.
    let wrong_ca = verify_full_url(&stack).replace("/ca.crt", "/other-ca.crt");
    for e in both_refused(&wrong_ca).await? {
        assert!(e.contains("not signed by a CA in sslrootcert="), "{e}");
        assert!(e.contains("other-ca.crt"), "{e}");
        assert!(e.contains("sslmode=verify-full"), "{e}");
    }
    // The same through the CLI, as an operator meets it: setup exits non-zero and says so.
    let World { d, .. } =
        Scenario::new(&stack, "tlsca", "CREATE TABLE {s}.t (id int PRIMARY KEY);")
            .without_setup()
            .env("WAL2DELTA__SOURCE__DSN", &wrong_ca)
            .build()
            .await?;
    let out = d.command(&["setup"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "setup succeeded with a wrong CA");
    assert!(
        stderr.contains("sslrootcert=") && stderr.contains("other-ca.crt"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    Ok(())
}

/// Turns the server's `ssl` off for its lifetime; back on in `Drop`, also on failure.
struct SslOff {
    admin_dsn: String,
}

impl SslOff {
    async fn new(admin: &Client, admin_dsn: &str) -> Result<SslOff> {
        // ALTER SYSTEM runs outside a transaction block: one statement per call.
        admin.batch_execute("ALTER SYSTEM SET ssl = off").await?;
        let guard = SslOff {
            admin_dsn: admin_dsn.to_owned(),
        };
        admin.batch_execute("SELECT pg_reload_conf()").await?;
        // The reload reaches new backends a moment later.
        let start = Instant::now();
        while psql(admin_dsn, "SHOW ssl").as_deref() != Some("off") {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("ssl still on 10 s after the reload");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(guard)
    }
}

impl Drop for SslOff {
    fn drop(&mut self) {
        let reset = psql(&self.admin_dsn, "ALTER SYSTEM RESET ssl").is_some();
        if !reset || psql(&self.admin_dsn, "SELECT pg_reload_conf()").is_none() {
            eprintln!("could not turn ssl back on: run ALTER SYSTEM RESET ssl on the stack");
        }
        for _ in 0..100 {
            if psql(&self.admin_dsn, "SHOW ssl").as_deref() == Some("on") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn require_refuses_a_server_without_tls_and_prefer_falls_back() -> Result<()> {
    let stack = Stack::from_env();
    let admin = stack.admin().await?;
    let _off = SslOff::new(&admin, &stack.admin_dsn).await?;
    let port = pg_port(&stack);
    let base = format!("host=localhost port={port} dbname=app user=replicator password={PASSWORD}");
    for e in both_refused(&format!("{base} sslmode=require")).await? {
        assert!(e.contains("does not accept TLS"), "{e}");
        assert!(e.contains("sslmode=require requires TLS"), "{e}");
    }
    let prefer =
        format!("host=localhost port={port} dbname=app user=replicator password=replicator");
    assert_eq!(
        ssl_in_use(&prefer).await?,
        [false, false],
        "prefer falls back to plain"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_never_answers_times_out_on_both_connections() -> Result<()> {
    // Accepts TCP, then says nothing: neither the SSLRequest nor the handshake is answered.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let dsn = format!(
        "host=127.0.0.1 port={port} dbname=app user=u password={PASSWORD} sslmode=require connect_timeout=1"
    );
    let started = Instant::now();
    for e in both_refused(&dsn).await? {
        assert!(
            e.contains("Cannot connect to PostgreSQL at 127.0.0.1"),
            "{e}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    holder.abort();
    Ok(())
}
