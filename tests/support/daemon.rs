//! Running the real `wal2delta` binary as a child process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::Stack;

/// One test's configuration and its daemon process.
pub struct Daemon {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub slot: String,
    pub publication: String,
    pub prefix: String,
    pub schema: String,
    /// Extra environment for the daemon (e.g. `WAL2DELTA__KAFKA__TOPIC_PARTITIONS`).
    pub env: Vec<(String, String)>,
    /// A superuser DSN, to drop the slot and publication when the test ends.
    admin_dsn: String,
    process: Option<StageProcess>,
    runs: u32,
}

/// The binary under test (built by `ops/test`).
pub fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("WAL2DELTA_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| format!("{}/target", crate::repo_root().display()));
    PathBuf::from(target).join("debug/wal2delta")
}

impl Daemon {
    /// A config capturing `{schema}.*` into topics `{name}.{schema}.*`, with its own slot.
    pub fn new(stack: &Stack, name: &str, extra_toml: &str) -> Result<Daemon> {
        let dir = PathBuf::from(&stack.stack_dir).join("tests").join(name);
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("wal2delta.toml");
        let text = format!(
            r#"[source]
dsn = "{dsn}"
slot = "{name}"
publication = "{name}"
tables = ["{name}.*"]
[kafka]
brokers = "{brokers}"
topic_prefix = "{name}"
delivery_timeout_ms = 10000
[schema_registry]
url = "{registry}"
[lake]
uri = "file://{lake}"
[metrics]
listen = "127.0.0.1:0"
{snapshot}
{extra_toml}
"#,
            // Most tests look at streamed changes; snapshot tests configure [snapshot].
            snapshot = if extra_toml.contains("[snapshot]") {
                ""
            } else {
                "[snapshot]\nmode = \"never\""
            },
            dsn = stack.dsn,
            brokers = stack.brokers,
            registry = stack.registry,
            lake = dir.join("lake").display(),
        );
        std::fs::write(&config, text)?;
        Ok(Daemon {
            dir,
            config,
            slot: name.to_owned(),
            publication: name.to_owned(),
            prefix: name.to_owned(),
            schema: name.to_owned(),
            env: Vec::new(),
            admin_dsn: stack.admin_dsn.clone(),
            process: None,
            runs: 0,
        })
    }

    /// Runs a one-shot command (e.g. `setup`) with the test config and no WAL2DELTA__
    /// overrides from the environment.
    pub fn command(&self, args: &[&str]) -> Result<Output> {
        self.command_line(args)
            .output()
            .context("running wal2delta")
    }

    /// The command line of [`Daemon::command`], to run it in the background.
    pub fn command_line(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(binary());
        cmd.arg("--config").arg(&self.config).args(args);
        clear_overrides(&mut cmd);
        // Scratch (the default spill directory, `$TMPDIR/wal2delta-{slot}`) stays in the
        // test's directory under the stack, not in /tmp.
        cmd.env("TMPDIR", &self.dir);
        cmd.envs(self.env.iter().cloned());
        cmd
    }

    /// `wal2delta setup`, which must succeed.
    pub fn setup(&self) -> Result<String> {
        let out = self.command(&["setup"])?;
        if !out.status.success() {
            bail!(
                "setup failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `wal2delta run --stage capture` in the background.
    pub fn start(&mut self) -> Result<()> {
        self.start_with(&[])
    }

    /// Like [`Daemon::start`] with extra `run` arguments.
    pub fn start_with(&mut self, extra: &[&str]) -> Result<()> {
        self.runs += 1;
        let log = self.dir.join(format!("capture-{}.log", self.runs));
        self.process = Some(self.spawn("capture", extra, log)?);
        Ok(())
    }

    /// Starts `wal2delta run --stage {stages}` as a separate process (e.g. a bronze writer
    /// beside the capture daemon); its log is `{log}.log` in the test directory.
    pub fn spawn_stage(&self, stages: &str, log: &str) -> Result<StageProcess> {
        self.spawn(stages, &[], self.dir.join(format!("{log}.log")))
    }

    fn spawn(&self, stages: &str, extra: &[&str], log: PathBuf) -> Result<StageProcess> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut cmd = Command::new(binary());
        cmd.arg("--config")
            .arg(&self.config)
            .args(["run", "--stage", stages])
            .args(extra);
        clear_overrides(&mut cmd);
        cmd.env("TMPDIR", &self.dir);
        cmd.envs(self.env.iter().cloned());
        cmd.env("RUST_LOG", crate::daemon_log_filter())
            .stdout(Stdio::null())
            .stderr(file);
        Ok(StageProcess {
            child: Some(cmd.spawn().context("starting wal2delta")?),
            log,
        })
    }

    /// Starts `stages` (e.g. `bronze,silver,rules`) as a clean run of the same topics into a
    /// fresh lake `{dir}/lake2`, with the default Silver settings and a consumer group of
    /// its own: the same history computed from scratch. Returns the process and the lake.
    pub fn spawn_clean_run(&mut self, stages: &str) -> Result<(StageProcess, PathBuf)> {
        let lake = self.dir.join("lake2");
        self.env
            .retain(|(k, _)| !k.starts_with("WAL2DELTA__SILVER__"));
        self.env.push((
            "WAL2DELTA__LAKE__URI".into(),
            format!("file://{}", lake.display()),
        ));
        self.env.push((
            "WAL2DELTA__BRONZE__GROUP_ID".into(),
            format!("{}-clean", self.prefix),
        ));
        Ok((self.spawn_stage(stages, "clean")?, lake))
    }

    /// The lake directory of this test's config.
    pub fn lake(&self) -> PathBuf {
        self.dir.join("lake")
    }

    /// The Bronze table of `table` in this test's schema.
    pub fn bronze(&self, table: &str) -> PathBuf {
        self.lake().join("bronze").join(&self.schema).join(table)
    }

    /// The Silver table of `table` in this test's schema.
    pub fn silver(&self, table: &str) -> PathBuf {
        self.lake().join("silver").join(&self.schema).join(table)
    }

    /// The running daemon's process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref()?.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no chance to flush or confirm anything.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill9();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        match self.process.take() {
            Some(mut p) => p.stop(),
            None => bail!("not running"),
        }
    }

    /// Waits up to `timeout` for the daemon to exit on its own; its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        match self.process.as_mut() {
            Some(p) => p.wait_exit(timeout),
            None => bail!("not running"),
        }
    }

    /// Waits up to `timeout` for the daemon to stop by itself with a failure (an error that
    /// needs an operator) and returns its log; fails if it keeps running or exits 0.
    pub fn wait_stopped_by_error(&mut self, timeout: Duration) -> Result<String> {
        let Some(status) = self.wait_exit(timeout)? else {
            bail!("the daemon kept running: {}", self.last_log());
        };
        let log = self.last_log();
        if status.success() {
            bail!("the daemon exited 0 instead of stopping with an error: {log}");
        }
        Ok(log)
    }

    /// Waits until the slot is confirmed past everything written so far on `pg`
    /// (failing with the daemon's log after `timeout`).
    pub async fn wait_caught_up(
        &self,
        pg: &tokio_postgres::Client,
        timeout: Duration,
    ) -> Result<wal2delta_model::Lsn> {
        let target = crate::current_wal_lsn(pg).await?;
        crate::wait_confirmed(pg, &self.slot, target, timeout)
            .await
            .map_err(|e| e.context(self.last_log()))
    }

    /// Fails if the daemon exited (with its log) — used while waiting for progress.
    pub fn assert_running(&mut self) -> Result<()> {
        match self.process.as_mut() {
            Some(p) => p.assert_running(),
            None => Ok(()),
        }
    }

    pub fn last_log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("capture-{}.log", self.runs)))
            .unwrap_or_default()
    }
}

/// The peak resident memory of process `pid` (`VmHWM` of `/proc/{pid}/status`), KiB.
pub fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is not running"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no VmHWM in /proc/{pid}/status"))
}

/// A `wal2delta run` process started with [`Daemon::spawn_stage`].
pub struct StageProcess {
    child: Option<Child>,
    pub log: PathBuf,
}

impl StageProcess {
    /// Stops this process and `daemon` cleanly (each must exit 0), after checking that
    /// `secret` appears in neither's log.
    pub fn stop_cleanly_with(&mut self, daemon: &mut Daemon, secret: &str) -> Result<()> {
        let logs = format!("{}{}", daemon.last_log(), self.log_text());
        if logs.contains(secret) {
            bail!("a secret reached a log");
        }
        if !self.stop()?.success() {
            bail!("clean stop: {}", self.log_text());
        }
        if !daemon.stop()?.success() {
            bail!("clean stop: {}", daemon.last_log());
        }
        Ok(())
    }

    /// Waits up to 90 s, while this (Bronze) process keeps running, for the Delta table
    /// `scan` (a DuckDB `delta_scan(...)`) to hold at least `want` rows.
    pub fn wait_rows(&mut self, scan: &str, want: i64) -> Result<()> {
        let start = Instant::now();
        let mut n = 0;
        while start.elapsed() < Duration::from_secs(90) {
            self.assert_running()?;
            n = crate::lake::duckdb_i64(&format!("SELECT count(*) FROM {scan}")).unwrap_or(0);
            if n >= want {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("Bronze holds {n} of {want} events: {}", self.log_text())
    }

    /// Polls `get` every half second until it gives `want` (2 minutes at most), checking
    /// that the process still runs; the failure shows the last value and the log.
    pub async fn wait_for<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: &str,
        want: &T,
        get: impl FnMut() -> Result<T>,
    ) -> Result<()> {
        self.wait_for_within(what, want, Duration::from_secs(120), get)
            .await
    }

    /// [`Self::wait_for`], `timeout` at most.
    pub async fn wait_for_within<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: &str,
        want: &T,
        timeout: Duration,
        mut get: impl FnMut() -> Result<T>,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            self.assert_running()?;
            let got = get()?;
            if &got == want {
                return Ok(());
            }
            if start.elapsed() > timeout {
                // The log first: a failure's output is read from its end.
                bail!(
                    "{}\n{what}: not reached within {timeout:?}\n{}",
                    self.log_text(),
                    first_difference(&format!("{want:?}"), &format!("{got:?}"))
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no chance to flush or commit anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        terminate(self.child.take())
    }

    /// Waits up to `timeout` for the process to exit on its own; its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let Some(c) = self.child.as_mut() else {
            bail!("not running")
        };
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = c.try_wait()? {
                self.child = None;
                return Ok(Some(status));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(None)
    }

    /// Fails (with the log) if the process exited.
    pub fn assert_running(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(status) = c.try_wait()? {
                bail!("wal2delta exited with {status}: {}", self.log_text());
            }
        }
        Ok(())
    }

    pub fn log_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // The tail is what matters; logs of long runs are large.
        let start = text.len().saturating_sub(8_000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text[start..].to_owned()
    }
}

/// Where two debug renderings first differ, with some context on both sides: a short
/// line where printing both whole would bury the failure under thousands of rows.
fn first_difference(want: &str, got: &str) -> String {
    let at = want
        .char_indices()
        .zip(got.chars())
        .find(|((_, a), b)| a != b)
        .map_or(want.len().min(got.len()), |((i, _), _)| i);
    let around = |s: &str| {
        let from = s.floor_char_boundary(at.saturating_sub(300));
        let to = s.ceil_char_boundary((at + 300).min(s.len()));
        s[from..to].to_owned()
    };
    format!(
        "first difference at character {at} (want {} long, got {} long)\nwant …{}…\ngot  …{}…",
        want.len(),
        got.len(),
        around(want),
        around(got)
    )
}

impl Drop for StageProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl Drop for Daemon {
    /// Stops the daemon and drops its slot, publication and schema, also when the test
    /// failed or panicked: a leaked slot holds WAL on the shared server for good. The
    /// walsender of a killed daemon takes a moment to release the slot, hence the retries.
    fn drop(&mut self) {
        self.kill9();
        let slot_gone = format!(
            "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE slot_name = '{slot}' AND NOT active; \
             DROP PUBLICATION IF EXISTS \"{publication}\"; \
             SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}';",
            slot = self.slot.replace('\'', "''"),
            publication = self.publication.replace('"', "\"\""),
        );
        if !retry(|| psql(&self.admin_dsn, &slot_gone).as_deref() == Some("0")) {
            eprintln!(
                "could not drop replication slot {} after the test",
                self.slot
            );
        }
        // After the slot: a schema that cannot be dropped (a lock held a moment longer by
        // a killed daemon's backend) must not keep the slot alive.
        let schema_gone = format!(
            "SET lock_timeout = '2s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.schema.replace('"', "\"\"")
        );
        if !retry(|| psql(&self.admin_dsn, &schema_gone).is_some()) {
            eprintln!("could not drop schema {} after the test", self.schema);
        }
    }
}

/// Tries `done` up to 50 times, 200 ms apart; whether it succeeded.
pub(crate) fn retry(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..50 {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// Runs `sql` with psql (no async runtime is needed, so guards can call it from `Drop`);
/// the last line of its output, `None` when psql failed.
pub fn psql(dsn: &str, sql: &str) -> Option<String> {
    let out = Command::new("psql")
        .args(["-X", "-q", "-t", "-A", "-d", dsn, "-c", sql])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| {
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines().last().unwrap_or("").trim().to_owned()
    })
}

fn clear_overrides(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("WAL2DELTA__") {
            cmd.env_remove(k);
        }
    }
}

/// SIGTERM, then waits up to 60 s for the exit status.
fn terminate(child: Option<Child>) -> Result<std::process::ExitStatus> {
    let Some(mut c) = child else {
        bail!("not running")
    };
    unsafe_sigterm(c.id());
    let start = Instant::now();
    loop {
        if let Some(status) = c.try_wait()? {
            return Ok(status);
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = c.kill();
            bail!("wal2delta did not exit within 60 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn unsafe_sigterm(pid: u32) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
}

/// Waits until the log at `path` holds every one of `needles` (`timeout` at most) and
/// returns it; the failure shows the log's end.
pub fn wait_log(path: &Path, needles: &[&str], timeout: Duration) -> Result<String> {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if needles.iter().all(|n| text.contains(n)) {
            return Ok(text);
        }
        if start.elapsed() > timeout {
            let tail = &text[text.floor_char_boundary(text.len().saturating_sub(6_000))..];
            bail!("{tail}\nthe log does not say all of {needles:?} within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
