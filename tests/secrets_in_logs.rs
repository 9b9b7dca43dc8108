//! Secrets (the source password, token and mask keys) come from the environment and never
//! reach a log, `status` or an error.
//!
//! One test runs the daemon (capture, bronze, silver at debug level), `setup`, `status`
//! and `status --json`, and the commands' failures (a wrong password, an unreachable
//! server, a bad DSN, a missing key), and looks for each secret in everything they wrote.
//! The other, ignored in the ordinary pass, is run by `ops/test` after the whole suite: it
//! greps every log the suite left under the stack directory for every secret in
//! `tests/support/secrets.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{bail, Result};
use wal2delta_tests::daemon::Daemon;
use wal2delta_tests::kafka::read_topic;
use wal2delta_tests::roles::TempRole;
use wal2delta_tests::secrets::{ALL, REDACTION_MASK_KEY, REDACTION_PASSWORD, REDACTION_TOKEN_KEY};
use wal2delta_tests::{Scenario, Stack, World};

const SECRETS: [&str; 3] = [REDACTION_PASSWORD, REDACTION_TOKEN_KEY, REDACTION_MASK_KEY];

/// A daemon process at debug level, SIGKILLed in `Drop`.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn assert_clean(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows a secret ({s:?}):\n{text}");
    }
}

/// A command's stdout and stderr, checked for secrets; whether it succeeded.
fn run(d: &Daemon, what: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(bool, String)> {
    let mut cmd = d.command_line(args);
    cmd.envs(env.iter().copied());
    let out = cmd.stdin(Stdio::null()).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_clean(what, &text);
    Ok((out.status.success(), text))
}

#[tokio::test(flavor = "multi_thread")]
async fn daemon_status_setup_and_errors_never_show_secrets() -> Result<()> {
    let stack = Stack::from_env();
    let role = TempRole::new(
        &stack,
        "redact",
        "REPLICATION IN ROLE replicator",
        REDACTION_PASSWORD,
    )?;
    let dsn = role.dsn(&stack, "localhost", "?sslmode=require");
    let World { name, pg, d, setup } = Scenario::new(
        &stack,
        "redact",
        "CREATE TABLE {s}.pay (id int PRIMARY KEY, card text, email text);",
    )
    .toml(
        "[tokenize]\ncolumns = [\"{s}.pay.card:last4\"]\nkey_env = \"W2D_REDACT_TOKEN_KEY\"\nkey_id = \"r1\"\n\
         [silver]\ninterval_ms = 300\nmask_key_env = \"W2D_REDACT_MASK_KEY\"\n[silver.mask]\n\"{s}.pay.email\" = \"hash\"\n\
         [bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\n",
    )
    .env("WAL2DELTA__SOURCE__DSN", &dsn)
    .env("W2D_REDACT_TOKEN_KEY", REDACTION_TOKEN_KEY)
    .env("W2D_REDACT_MASK_KEY", REDACTION_MASK_KEY)
    .build()
    .await?;
    assert_clean("setup", &setup);

    // The daemon at debug level, every stage that holds a secret.
    let log_path = d.dir.join("redaction-debug.log");
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = d.command_line(&["run", "--stage", "capture,bronze,silver"]);
    cmd.env(
        "RUST_LOG",
        "wal2delta=debug,wal2delta_cdc=debug,wal2delta_stream=debug,wal2delta_lake=debug,info",
    )
    .stdin(Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log);
    let daemon = Running(cmd.spawn()?);
    pg.batch_execute(&format!(
        "INSERT INTO {name}.pay SELECT g, '4111111111111111', 'u' || g || '@example.com' FROM generate_series(1, 5) g"
    ))
    .await?;
    let recs = read_topic(
        &stack.brokers,
        &format!("{name}.{name}.pay"),
        Some(5),
        Duration::from_secs(60),
    )?;
    assert_eq!(recs.len(), 5);
    let (ok, status) = run(&d, "status", &["status"], &[])?;
    assert!(ok, "{status}");
    let (ok, json) = run(&d, "status --json", &["status", "--json"], &[])?;
    assert!(ok, "{json}");
    drop(daemon);

    // Failures: each error is about the secret's owner, never the secret.
    let wrong = dsn.replace(REDACTION_PASSWORD, &format!("{REDACTION_PASSWORD}x"));
    let (ok, e) = run(
        &d,
        "a wrong password",
        &["status"],
        &[("WAL2DELTA__SOURCE__DSN", &wrong)],
    )?;
    assert!(!ok && e.contains("password authentication failed"), "{e}");
    let unreachable = format!(
        "postgres://{}:{REDACTION_PASSWORD}@127.0.0.1:1/app",
        role.name
    );
    let (ok, e) = run(
        &d,
        "an unreachable server",
        &["setup"],
        &[("WAL2DELTA__SOURCE__DSN", &unreachable)],
    )?;
    assert!(!ok && e.contains("127.0.0.1:1"), "{e}");
    let bad = format!("{dsn}&sslmode=sometimes");
    let (ok, e) = run(
        &d,
        "a bad DSN",
        &["status"],
        &[("WAL2DELTA__SOURCE__DSN", &bad)],
    )?;
    assert!(!ok && e.contains("source.dsn"), "{e}");
    let (ok, e) = run(
        &d,
        "a short key",
        &["run", "--stage", "capture"],
        &[("W2D_REDACT_TOKEN_KEY", "short")],
    )?;
    assert!(!ok && e.contains("tokenize.key_env"), "{e}");

    // Everything the daemon and the commands wrote in the test's directory.
    let files = scan(&d.dir, &SECRETS)?;
    assert!(files > 0, "no log was written");
    Ok(())
}

/// Text files under `dir` (lake tables left out: they hold data, not logs), each checked
/// for every secret; how many were read.
fn scan(dir: &Path, secrets: &[&str]) -> Result<usize> {
    let mut stack: Vec<PathBuf> = vec![dir.to_owned()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                if path.file_name().is_some_and(|n| n != "lake") {
                    stack.push(path);
                }
                continue;
            }
            if !meta.is_file() || meta.len() > 256 * 1024 * 1024 {
                continue;
            }
            let bytes = std::fs::read(&path)?;
            files += 1;
            for s in secrets {
                if bytes.windows(s.len()).any(|w| w == s.as_bytes()) {
                    bail!("{} holds the secret {s:?}", path.display());
                }
            }
        }
    }
    Ok(files)
}

/// Run by `ops/test` after every other test (`-- --ignored`): no file the suite's daemons
/// and commands wrote under the stack's test directories holds a secret of the suite.
#[test]
#[ignore = "run by ops/test after the whole suite"]
fn no_log_of_the_suite_holds_a_secret() -> Result<()> {
    let stack = Stack::from_env();
    let files = scan(&Path::new(&stack.stack_dir).join("tests"), ALL)?;
    assert!(
        files > 0,
        "no log of the suite found under {}",
        stack.stack_dir
    );
    eprintln!(
        "{files} files of the suite hold none of {} secrets",
        ALL.len()
    );
    Ok(())
}
