//! The chaos suite (issue 11): the whole pipeline under a randomised workload while a
//! fault injector driven by one printed seed SIGKILLs the daemon and single stages,
//! restarts PostgreSQL (fast and immediate) and SIGKILLs the broker. After the drain it
//! checks what the product promises (docs/reliability.md):
//!
//! - `wal2delta reconcile` finds every table equal (exit 0);
//! - every Kafka offset of every table topic is in Bronze exactly once;
//! - every committed change is in Bronze, per transaction and table, against the change
//!   log the workload keeps in the source database in the same transaction as the change;
//! - no Bronze row belongs to a transaction the log does not hold (rolled back, or lost
//!   to a crash of PostgreSQL);
//! - the slot's retained WAL is back near zero.
//!
//! The seed fixes the workload's choices and the fault schedule (kinds and delays); the
//! exact interleaving of the two still depends on timing, so a failing seed is a strong
//! hint, not an exact replay. Run it with `ops/chaos [--minutes M] [--seed S]`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use serde_json::Value;
use tokio_postgres::Client;
use wal2delta_model::names::ident_part;

use crate::daemon::Daemon;
use crate::kafka::read_topic_to_end;
use crate::lake::{duckdb, scan};
use crate::proxy::Proxy;
use crate::{connect, current_wal_lsn, ops_stack, unique, wait_confirmed, Stack};

/// What one chaos run does.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// How long the workload and the faults run (the drain and checks come after).
    pub duration: Duration,
    /// Rows of the one large transaction.
    pub large_tx_rows: u64,
    /// Seconds between two faults: drawn from this range.
    pub fault_gap_secs: (u64, u64),
}

/// The result of a run: `ok`, and the one-line summary (the last line printed).
#[derive(Debug)]
pub struct Outcome {
    pub ok: bool,
    pub summary: String,
}

/// The captured tables (in schema `{s}`). `doc.body` is TOASTed (random hex, about
/// 6 kB, so it is stored out of line even compressed); `"Order Items"` has an odd name
/// and a composite key; `bulk` takes the large transaction and the truncates.
const TABLES: &str = r#"
CREATE SCHEMA {s};
CREATE TABLE {s}.acct (id bigint PRIMARY KEY, owner text, balance bigint NOT NULL DEFAULT 0);
CREATE TABLE {s}."Order Items" (order_id int, line int, qty int, note text, PRIMARY KEY (order_id, line));
CREATE TABLE {s}.doc (id int PRIMARY KEY, title text, body text);
CREATE TABLE {s}.bulk (id bigint PRIMARY KEY, v int);
CREATE SCHEMA {s}_log;
CREATE TABLE {s}_log.tx (txid bigint PRIMARY KEY, at timestamptz DEFAULT now());
CREATE TABLE {s}_log.changes (txid bigint, tbl text, events bigint, PRIMARY KEY (txid, tbl));
CREATE TABLE {s}_log.aborted (txid bigint PRIMARY KEY);
CREATE TABLE {s}_log.dlq (txid bigint, tbl text, id bigint, PRIMARY KEY (txid, tbl, id));
"#;

const TOML: &str = r#"[bronze]
max_batch_ms = 500
topic_refresh_ms = 500
[silver]
interval_ms = 500
[capture]
heartbeat_interval_ms = 500
"#;

/// Source table name (as PostgreSQL spells it, unquoted) and its SQL spelling.
const TABLE_NAMES: [(&str, &str); 4] = [
    ("acct", "acct"),
    ("Order Items", "\"Order Items\""),
    ("doc", "doc"),
    ("bulk", "bulk"),
];

/// The fault schedule as it happened, shared by the injector and the report.
#[derive(Clone, Default)]
struct Schedule(Arc<Mutex<Vec<String>>>);

impl Schedule {
    fn note(&self, start: Instant, what: impl Into<String>) {
        let line = format!("t+{:6.1}s {}", start.elapsed().as_secs_f64(), what.into());
        eprintln!("chaos: {line}");
        self.0.lock().unwrap().push(line);
    }
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// One `wal2delta run` process of the pipeline.
struct Proc {
    stages: Option<&'static str>,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn label(&self) -> &'static str {
        self.stages.unwrap_or("run")
    }
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The pipeline's processes: one `wal2delta run` (all stages), or three processes with
/// one stage each.
struct Pipeline {
    procs: Vec<Proc>,
    starts: u32,
    /// Exits nobody asked for: (process, status, tail of its log).
    unexpected_exits: Vec<String>,
}

impl Pipeline {
    fn new(d: &Daemon, separate: bool) -> Result<Pipeline> {
        let stages: Vec<Option<&'static str>> = if separate {
            vec![Some("capture"), Some("bronze"), Some("silver")]
        } else {
            vec![None]
        };
        let mut p = Pipeline {
            procs: Vec::new(),
            starts: 0,
            unexpected_exits: Vec::new(),
        };
        for s in stages {
            p.procs.push(Proc {
                stages: s,
                child: None,
                log: d.dir.join(format!("{}.log", s.unwrap_or("run"))),
            });
        }
        for i in 0..p.procs.len() {
            p.start(d, i)?;
        }
        Ok(p)
    }

    fn start(&mut self, d: &Daemon, i: usize) -> Result<()> {
        let p = &mut self.procs[i];
        let mut cmd = d.command_line(&["run"]);
        if let Some(s) = p.stages {
            cmd.args(["--stage", s]);
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p.log)?;
        cmd.env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        p.child = Some(cmd.spawn().context("starting wal2delta run")?);
        self.starts += 1;
        Ok(())
    }

    /// Restarts every process that exited on its own, noting it.
    fn supervise(&mut self, d: &Daemon, sched: &Schedule, start: Instant) -> Result<()> {
        for i in 0..self.procs.len() {
            let exited = match self.procs[i].child.as_mut() {
                Some(c) => c.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                self.procs[i].child = None;
                let tail = log_tail(&self.procs[i].log, 1500);
                let line = format!(
                    "{} exited on its own ({status}); restarted. Log tail: {tail}",
                    self.procs[i].label()
                );
                sched.note(
                    start,
                    format!("{} exited on its own ({status})", self.procs[i].label()),
                );
                self.unexpected_exits.push(line);
                self.start(d, i)?;
            }
        }
        Ok(())
    }

    fn kill_all(&mut self) {
        for p in &mut self.procs {
            p.kill9();
        }
    }
}

fn log_tail(path: &PathBuf, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(n);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    text[start..].replace('\n', " | ")
}

/// How many times the broker's log shows tansu 0.6's storage panic after a restart
/// (see tests/capture_failures.rs): the broker then answers nothing and is restarted.
fn broker_storage_panics(stack: &Stack) -> usize {
    std::fs::read_to_string(format!("{}/broker.log", stack.stack_dir))
        .map_or(0, |log| log.matches("more or less than one row").count())
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillPipeline,
    KillOneStage,
    PgFast,
    PgImmediate,
    KillBroker,
    KillRegistry,
    /// Close every connection between the daemon and PostgreSQL (the driver's proxy).
    CutPg,
    /// The proxy forwards nothing for a while; connections stay open.
    StallPg,
    /// Every file and directory of the lake immutable (`chattr +i`) for a while.
    LakeReadOnly,
}

/// Makes the lake (or a directory of it) read-only while it lives. Tests run as root, for
/// whom `chmod` changes nothing; the immutable attribute (`chattr +i`, ext4 and most Linux
/// filesystems) makes creating, renaming, deleting and writing files fail with EPERM even
/// for root. Dropped, even when a test fails, it makes the tree writable again.
pub struct ReadOnlyLake(PathBuf);

impl ReadOnlyLake {
    pub fn set(path: PathBuf) -> Result<ReadOnlyLake> {
        chattr(&path, "+i")?;
        Ok(ReadOnlyLake(path))
    }
}

impl Drop for ReadOnlyLake {
    fn drop(&mut self) {
        if let Err(e) = chattr(&self.0, "-i") {
            eprintln!("chaos: could not make the lake writable again: {e:#}");
        }
    }
}

/// Moves a table's data files away while it lives (a storage that cannot serve them: a
/// 404, an object store outage), and back when dropped, also when the test fails.
pub struct FilesAway {
    moved: Vec<(std::path::PathBuf, std::path::PathBuf)>,
}

impl FilesAway {
    pub fn take(table: &std::path::Path, to: &std::path::Path) -> Result<FilesAway> {
        std::fs::create_dir_all(to)?;
        let mut moved = Vec::new();
        for entry in std::fs::read_dir(table)? {
            let from = entry?.path();
            if from.extension().is_some_and(|e| e == "parquet") {
                let away = to.join(from.file_name().unwrap_or_default());
                std::fs::rename(&from, &away)?;
                moved.push((from, away));
            }
        }
        ensure!(!moved.is_empty(), "no data file in {}", table.display());
        Ok(FilesAway { moved })
    }
}

impl Drop for FilesAway {
    fn drop(&mut self) {
        for (home, away) in &self.moved {
            if let Err(e) = std::fs::rename(away, home) {
                eprintln!("could not put {} back: {e}", home.display());
            }
        }
    }
}

fn chattr(path: &PathBuf, flag: &str) -> Result<()> {
    let out = Command::new("chattr")
        .args(["-R", "-f", flag])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .context("running chattr")?;
    if !out.status.success() {
        bail!(
            "chattr -R {flag} {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `host:port` of a `postgres://user:password@host:port/db` DSN.
fn dsn_host_port(dsn: &str) -> Result<String> {
    let rest = dsn
        .split_once('@')
        .map(|(_, r)| r)
        .context("the DSN has no @host part")?;
    Ok(rest.split(['/', '?']).next().unwrap_or(rest).to_owned())
}

/// Counters the workload shares with the report.
#[derive(Default)]
struct Counts {
    committed: AtomicU64,
    aborted: AtomicU64,
    unknown: AtomicU64,
    errors: AtomicU64,
}

/// The workload: one connection, transactions chosen by its own RNG, each committed
/// transaction recording its txid and per-table event counts in `{s}_log` in the same
/// transaction. Runs until `stop`; reconnects after PostgreSQL restarts.
struct Workload {
    stack: Stack,
    s: String,
    rng: StdRng,
    next_id: i64,
    next_order: i32,
    extra_column: bool,
    large_done: bool,
    /// The oversized change committed (or its transaction's outcome is in the log).
    oversized_done: bool,
    /// A `doc` row whose last change went to the DLQ: the next transaction rewrites it.
    repair: Option<i64>,
    counts: Arc<Counts>,
}

/// `[kafka] message_max_bytes` of the chaos runs, and the oversized value: `md5` strings
/// of 32 characters each, about 320 kB in all (random hex does not compress to nothing).
const MESSAGE_MAX_BYTES: usize = 262_144;
const OVERSIZED_MD5S: usize = 10_000;

impl Workload {
    async fn client(&self) -> Client {
        loop {
            match connect(&self.stack.dsn).await {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }

    /// One random statement: its table and SQL.
    fn statement(&mut self) -> (&'static str, String) {
        let s = self.s.clone();
        let r = self.rng.random_range(0..100);
        let probe = self.rng.random_range(0..self.next_id.max(2));
        let pick_acct =
            format!("(SELECT id FROM {s}.acct WHERE id >= {probe} ORDER BY id LIMIT 1)");
        let pick_doc = format!("(SELECT id FROM {s}.doc WHERE id >= {probe} ORDER BY id LIMIT 1)");
        let order = self.rng.random_range(0..self.next_order.max(2));
        match r {
            0..=14 => {
                let id = self.next_id;
                self.next_id += 1;
                let (extra, extra_v) = if self.extra_column { (", extra", ", 'x'") } else { ("", "") };
                ("acct", format!(
                    "INSERT INTO {s}.acct (id, owner, balance{extra}) VALUES ({id}, 'o{id}', {}{extra_v})",
                    self.rng.random_range(0..1000)
                ))
            }
            15..=29 => {
                let set_extra = if self.extra_column { ", extra = 'e' || balance" } else { "" };
                ("acct", format!(
                    "UPDATE {s}.acct SET balance = balance + {}, owner = 'u' || id{set_extra} WHERE id = {pick_acct}",
                    self.rng.random_range(1..100)
                ))
            }
            30..=34 => {
                // A primary-key change: the row moves to a fresh key.
                let id = self.next_id;
                self.next_id += 1;
                ("acct", format!("UPDATE {s}.acct SET id = {id} WHERE id = {pick_acct}"))
            }
            35..=39 => ("acct", format!("DELETE FROM {s}.acct WHERE id = {pick_acct}")),
            40..=49 => {
                let o = self.next_order;
                self.next_order += 1;
                let lines = self.rng.random_range(1..=5);
                ("Order Items", format!(
                    "INSERT INTO {s}.\"Order Items\" SELECT {o}, g, g * 2, 'n' || g FROM generate_series(1, {lines}) g"
                ))
            }
            50..=59 => ("Order Items", format!(
                "UPDATE {s}.\"Order Items\" SET qty = qty + 1 WHERE order_id = (SELECT order_id FROM {s}.\"Order Items\" WHERE order_id >= {order} ORDER BY order_id LIMIT 1)"
            )),
            60..=62 => ("Order Items", format!(
                // A key change inside a composite key.
                "UPDATE {s}.\"Order Items\" SET line = line + 100 WHERE order_id = (SELECT order_id FROM {s}.\"Order Items\" WHERE order_id >= {order} ORDER BY order_id LIMIT 1) AND line < 100"
            )),
            63..=66 => ("Order Items", format!(
                "DELETE FROM {s}.\"Order Items\" WHERE order_id = (SELECT order_id FROM {s}.\"Order Items\" WHERE order_id >= {order} ORDER BY order_id LIMIT 1)"
            )),
            67..=74 => {
                let id = self.next_id;
                self.next_id += 1;
                ("doc", format!(
                    "INSERT INTO {s}.doc SELECT {id}, 't{id}', string_agg(md5(random()::text), '') FROM generate_series(1, 200)"
                ))
            }
            // An update that leaves the TOASTed body unchanged.
            75..=84 => ("doc", format!("UPDATE {s}.doc SET title = title || '+' WHERE id = {pick_doc}")),
            85..=88 => ("doc", format!(
                "UPDATE {s}.doc SET body = (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 150)) WHERE id = {pick_doc}"
            )),
            89..=90 => {
                // A key change of a row whose TOASTed value stays unchanged.
                let id = self.next_id;
                self.next_id += 1;
                ("doc", format!("UPDATE {s}.doc SET id = {id} WHERE id = {pick_doc}"))
            }
            91..=93 => ("doc", format!("DELETE FROM {s}.doc WHERE id = {pick_doc}")),
            _ => {
                let id = self.next_id;
                let n = self.rng.random_range(10..500);
                self.next_id += n;
                ("bulk", format!(
                    "INSERT INTO {s}.bulk SELECT g, g % 1000 FROM generate_series({id}, {}) g",
                    id + n - 1
                ))
            }
        }
    }

    /// Runs one transaction of `stmts` statements; `abort` rolls it back. Returns
    /// whether it was committed (false also when the outcome is unknown).
    async fn transaction(
        &mut self,
        pg: &Client,
        stmts: Vec<(&'static str, String)>,
        abort: bool,
    ) -> Result<bool> {
        let s = self.s.clone();
        pg.batch_execute("BEGIN").await?;
        let txid: i64 = pg
            .query_one(
                "SELECT (pg_current_xact_id()::text::bigint % 4294967296)",
                &[],
            )
            .await?
            .get(0);
        let mut events: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (table, sql) in &stmts {
            let n = pg.execute(sql.as_str(), &[]).await?;
            // TRUNCATE reports no rows but is one event per table. A primary-key change is
            // two events: a delete of the old key and a create of the new one (its
            // tombstone is not an event).
            let n = if sql.starts_with("TRUNCATE") {
                1
            } else if is_key_change(sql) {
                2 * n
            } else {
                n
            };
            *events.entry(table).or_default() += n;
        }
        if abort {
            pg.batch_execute("ROLLBACK").await?;
            pg.execute(
                &format!("INSERT INTO {s}_log.aborted VALUES ($1) ON CONFLICT DO NOTHING"),
                &[&txid],
            )
            .await?;
            self.counts.aborted.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let mut log = format!("INSERT INTO {s}_log.tx (txid) VALUES ({txid});");
        for (t, n) in &events {
            if *n > 0 {
                write!(
                    log,
                    "INSERT INTO {s}_log.changes VALUES ({txid}, '{}', {n});",
                    t.replace('\'', "''")
                )?;
            }
        }
        pg.batch_execute(&log).await?;
        match pg.batch_execute("COMMIT").await {
            Ok(()) => {
                self.counts.committed.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                // The outcome is unknown; the log, written in the same transaction, says.
                self.counts.unknown.fetch_add(1, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    /// A value over `[kafka] message_max_bytes`: one `doc` row's body replaced by about
    /// 320 kB, alone in its transaction. Capture sends the event to the DLQ, not to Kafka's
    /// table topic. The log records the (txid, table, key) in `{s}_log.dlq`, not in
    /// `{s}_log.changes` (Bronze never sees the event), in the same transaction. Returns
    /// the key changed, if a row was there to change.
    async fn oversized(&mut self, pg: &Client) -> Result<Option<i64>> {
        let s = self.s.clone();
        let probe = self.rng.random_range(0..self.next_id.max(2));
        pg.batch_execute("BEGIN").await?;
        let txid: i64 = pg
            .query_one(
                "SELECT (pg_current_xact_id()::text::bigint % 4294967296)",
                &[],
            )
            .await?
            .get(0);
        let rows = pg
            .query(
                &format!(
                    "UPDATE {s}.doc SET body = (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, {OVERSIZED_MD5S})) WHERE id = (SELECT id FROM {s}.doc WHERE id >= {probe} ORDER BY id LIMIT 1) RETURNING id"
                ),
                &[],
            )
            .await?;
        let Some(id) = rows.first().map(|r| r.get::<_, i32>(0)) else {
            pg.batch_execute("ROLLBACK").await?;
            return Ok(None);
        };
        let id = i64::from(id);
        // Set before COMMIT: whatever its outcome, rewriting the row is harmless.
        self.repair = Some(id);
        pg.batch_execute(&format!(
            "INSERT INTO {s}_log.tx (txid) VALUES ({txid}); INSERT INTO {s}_log.dlq VALUES ({txid}, 'doc', {id}); COMMIT"
        ))
        .await?;
        self.counts.committed.fetch_add(1, Ordering::Relaxed);
        Ok(Some(id))
    }

    /// The transaction that rewrites the row whose change went to the DLQ, with a value
    /// that fits (what docs/capture.md tells an operator to do), so Silver holds the row's
    /// state again.
    fn repair_statement(&self, id: i64) -> (&'static str, String) {
        let s = &self.s;
        (
            "doc",
            format!("UPDATE {s}.doc SET body = 'repaired ' || id WHERE id = {id}"),
        )
    }

    /// A workload statement failed (a fault is going on): counted; the session is
    /// replaced when the connection is gone, else its transaction is rolled back.
    async fn failed(&self, pg: Client) -> Client {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        if pg.is_closed() {
            self.client().await
        } else {
            let _ = pg.batch_execute("ROLLBACK").await;
            pg
        }
    }

    async fn run(
        mut self,
        stop: Arc<AtomicBool>,
        start: Instant,
        duration: Duration,
        (large_at, large_rows): (Duration, u64),
        oversized_at: Duration,
        sched: Schedule,
    ) -> Result<()> {
        let s = self.s.clone();
        let mut pg = self.client().await;
        let add_at = duration.mul_f64(0.3);
        let drop_at = duration.mul_f64(0.6);
        let mut added = false;
        let mut dropped = false;
        while !stop.load(Ordering::Relaxed) {
            let elapsed = start.elapsed();
            if let Some(id) = self.repair {
                // Before anything else touches the row (an update leaving its TOASTed body
                // unchanged would leave Silver's old body in place).
                let stmt = self.repair_statement(id);
                match self.transaction(&pg, vec![stmt], false).await {
                    Ok(_) => self.repair = None,
                    Err(_) => pg = self.failed(pg).await,
                }
                continue;
            }
            if !self.oversized_done && elapsed >= oversized_at {
                match self.oversized(&pg).await {
                    Ok(Some(id)) => {
                        self.oversized_done = true;
                        sched.note(
                            start,
                            format!("workload: a doc row's body over message_max_bytes committed (key {id}); rewritten next"),
                        );
                    }
                    Ok(None) => {}
                    Err(_) => pg = self.failed(pg).await,
                }
                continue;
            }
            let mut large = false;
            let (stmts, abort, ddl): (Vec<(&'static str, String)>, bool, Option<String>) = if !added
                && elapsed >= add_at
            {
                (vec![], false, Some(format!("ALTER TABLE {s}.acct ADD COLUMN extra text; ALTER TABLE {s}.\"Order Items\" ADD COLUMN gift boolean")))
            } else if added && !dropped && elapsed >= drop_at {
                (vec![], false, Some(format!("ALTER TABLE {s}.acct DROP COLUMN extra; ALTER TABLE {s}.\"Order Items\" DROP COLUMN note")))
            } else if !self.large_done && elapsed >= large_at {
                large = true;
                let id = self.next_id;
                self.next_id += large_rows as i64;
                let sql = format!(
                    "INSERT INTO {s}.bulk SELECT g, g % 1000 FROM generate_series({id}, {}) g",
                    id + large_rows as i64 - 1
                );
                (vec![("bulk", sql)], false, None)
            } else {
                let r = self.rng.random_range(0..1000);
                if r < 3 {
                    let (t, sql) = if self.rng.random_bool(0.7) {
                        ("bulk", "bulk")
                    } else {
                        ("Order Items", "\"Order Items\"")
                    };
                    (vec![(t, format!("TRUNCATE {s}.{sql}"))], false, None)
                } else {
                    let n = self.rng.random_range(1..=5);
                    let stmts = (0..n).map(|_| self.statement()).collect();
                    // About 6% of the transactions roll back.
                    (stmts, r < 60, None)
                }
            };
            let result = if let Some(sql) = &ddl {
                pg.batch_execute(sql)
                    .await
                    .map(|_| true)
                    .map_err(anyhow::Error::from)
            } else {
                self.transaction(&pg, stmts, abort).await
            };
            match result {
                Ok(done) => {
                    if let Some(sql) = ddl {
                        if sql.contains("ADD COLUMN") {
                            added = true;
                            self.extra_column = true;
                            sched.note(start, "workload: ADD COLUMN on acct and \"Order Items\"");
                        } else {
                            dropped = true;
                            self.extra_column = false;
                            sched.note(start, "workload: DROP COLUMN on acct and \"Order Items\"");
                        }
                    } else if large && done {
                        self.large_done = true;
                        sched.note(
                            start,
                            format!("workload: large transaction of {large_rows} rows committed"),
                        );
                    }
                }
                Err(_) => pg = self.failed(pg).await,
            }
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(5..40))).await;
        }
        // Make every table change once more, so Silver sees the last ALTERs' columns, and
        // retry until it commits.
        loop {
            let mut stmts = vec![
                (
                    "acct",
                    format!(
                        "INSERT INTO {s}.acct (id, owner) VALUES ({}, 'last')",
                        self.next_id
                    ),
                ),
                (
                    "Order Items",
                    format!(
                        "INSERT INTO {s}.\"Order Items\" (order_id, line, qty) VALUES ({}, 1, 1)",
                        self.next_order
                    ),
                ),
                (
                    "doc",
                    format!(
                        "INSERT INTO {s}.doc VALUES ({}, 'last', 'b')",
                        self.next_id + 1
                    ),
                ),
                (
                    "bulk",
                    format!("INSERT INTO {s}.bulk VALUES ({}, 1)", self.next_id + 2),
                ),
            ];
            if let Some(id) = self.repair {
                stmts.push(self.repair_statement(id));
            }
            self.next_id += 3;
            self.next_order += 1;
            match self.transaction(&pg, stmts, false).await {
                Ok(_) => {
                    self.repair = None;
                    break;
                }
                Err(_) => {
                    if pg.is_closed() {
                        pg = self.client().await;
                    } else {
                        let _ = pg.batch_execute("ROLLBACK").await;
                    }
                }
            }
        }
        if !self.large_done {
            sched.note(
                start,
                "workload: the large transaction did not commit (faults hit it each time)",
            );
        }
        Ok(())
    }
}

/// Runs one chaos round on the stack; prints progress to stderr and the report to stdout.
pub async fn run(stack: &Stack, opts: &Options) -> Result<Outcome> {
    println!(
        "chaos: seed {} duration {}s large transaction {} rows (rerun: ops/chaos --seed {} --minutes {})",
        opts.seed,
        opts.duration.as_secs(),
        opts.large_tx_rows,
        opts.seed,
        opts.duration.as_secs_f64() / 60.0
    );
    let name = unique("chaos");
    let pg = stack.connect().await?;
    pg.batch_execute(&TABLES.replace("{s}", &name)).await?;
    let mut d = Daemon::new(stack, &name, TOML)?;
    // The daemon reaches PostgreSQL (query and replication connections) through a proxy of
    // the driver's own, which can cut and stall them.
    let upstream = dsn_host_port(&stack.dsn)?;
    let proxy = Proxy::start(upstream.clone()).await?;
    d.env.push((
        "WAL2DELTA__SOURCE__DSN".into(),
        stack
            .dsn
            .replacen(&upstream, &format!("127.0.0.1:{}", proxy.port), 1),
    ));
    d.env
        .push(("WAL2DELTA__KAFKA__TOPIC_PARTITIONS".into(), "3".into()));
    d.env.push((
        "WAL2DELTA__KAFKA__MESSAGE_MAX_BYTES".into(),
        MESSAGE_MAX_BYTES.to_string(),
    ));
    d.setup()?;
    drop(pg);

    let sched = Schedule::default();
    let start = Instant::now();
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let large_at = opts.duration.mul_f64(rng.random_range(0.2..0.7));
    let oversized_at = opts.duration.mul_f64(rng.random_range(0.15..0.85));
    let workload = Workload {
        stack: stack.clone(),
        s: name.clone(),
        rng: StdRng::seed_from_u64(opts.seed ^ 0x5eed_5eed_5eed_5eed),
        next_id: 1,
        next_order: 1,
        extra_column: false,
        large_done: false,
        oversized_done: false,
        repair: None,
        counts: counts.clone(),
    };
    let wl = tokio::spawn(workload.run(
        stop.clone(),
        start,
        opts.duration,
        (large_at, opts.large_tx_rows),
        oversized_at,
        sched.clone(),
    ));

    // First half: one `wal2delta run`; second half: the stages as three processes.
    let mut pipe = Pipeline::new(&d, false)?;
    sched.note(start, "pipeline: one `wal2delta run` process (all stages)");
    let mut separate = false;
    let mut panics = broker_storage_panics(stack);
    let mut next_fault = start
        + Duration::from_secs(rng.random_range(opts.fault_gap_secs.0..=opts.fault_gap_secs.1));
    let mut faults = 0u32;
    let result: Result<()> = async {
        while start.elapsed() < opts.duration {
            tokio::time::sleep(Duration::from_millis(250)).await;
            pipe.supervise(&d, &sched, start)?;
            restart_panicked_broker(stack, &sched, start, &mut panics)?;
            if !separate && start.elapsed() >= opts.duration / 2 {
                pipe.kill_all();
                pipe = Pipeline::new(&d, true)?;
                separate = true;
                sched.note(
                    start,
                    "pipeline: SIGKILLed; now capture, bronze and silver as three processes",
                );
            }
            if Instant::now() < next_fault {
                continue;
            }
            faults += 1;
            let fault = match rng.random_range(0..100) {
                0..=21 => Fault::KillPipeline,
                22..=34 => Fault::KillOneStage,
                35..=45 => Fault::PgFast,
                46..=59 => Fault::PgImmediate,
                60..=73 => Fault::KillBroker,
                74..=81 => Fault::KillRegistry,
                82..=87 => Fault::CutPg,
                88..=93 => Fault::StallPg,
                _ => Fault::LakeReadOnly,
            };
            let pause = Duration::from_millis(rng.random_range(0..3000));
            let which = rng.random_range(0..3usize);
            match fault {
                Fault::KillPipeline => {
                    sched.note(
                        start,
                        format!("fault: SIGKILL every pipeline process, restart after {pause:?}"),
                    );
                    pipe.kill_all();
                    tokio::time::sleep(pause).await;
                    for i in 0..pipe.procs.len() {
                        pipe.start(&d, i)?;
                    }
                }
                Fault::KillOneStage => {
                    let i = which % pipe.procs.len();
                    sched.note(
                        start,
                        format!(
                            "fault: SIGKILL {}, restart after {pause:?}",
                            pipe.procs[i].label()
                        ),
                    );
                    pipe.procs[i].kill9();
                    tokio::time::sleep(pause).await;
                    pipe.start(&d, i)?;
                }
                Fault::PgFast => {
                    sched.note(start, "fault: PostgreSQL restart -m fast");
                    ops_stack(&["restart-pg", "fast"])?;
                }
                Fault::PgImmediate => {
                    sched.note(start, "fault: PostgreSQL restart -m immediate");
                    ops_stack(&["restart-pg", "immediate"])?;
                }
                Fault::KillBroker => {
                    sched.note(
                        start,
                        format!("fault: SIGKILL the broker, start it after {pause:?}"),
                    );
                    ops_stack(&["kill-broker"])?;
                    tokio::time::sleep(pause).await;
                    ops_stack(&["start-broker"])?;
                }
                Fault::CutPg => {
                    sched.note(
                        start,
                        "fault: cut every connection of the daemon to PostgreSQL (proxy)",
                    );
                    proxy.cut();
                }
                Fault::StallPg => {
                    let d = Duration::from_millis(2000 + pause.as_millis() as u64 * 2);
                    sched.note(
                        start,
                        format!(
                            "fault: stall the daemon's PostgreSQL connections for {d:?} (proxy)"
                        ),
                    );
                    proxy.stall(d);
                }
                Fault::LakeReadOnly => {
                    let d_ro = Duration::from_millis(3000 + pause.as_millis() as u64 * 2);
                    match ReadOnlyLake::set(d.lake()) {
                        Ok(guard) => {
                            sched.note(start, format!("fault: lake read-only for {d_ro:?}"));
                            // Keep supervising meanwhile: a stage may exit on the errors.
                            let until = Instant::now() + d_ro;
                            while Instant::now() < until {
                                tokio::time::sleep(Duration::from_millis(250)).await;
                                pipe.supervise(&d, &sched, start)?;
                            }
                            drop(guard);
                            sched.note(start, "fault: lake writable again");
                        }
                        Err(e) => {
                            let _ = chattr(&d.lake(), "-i");
                            sched.note(start, format!("fault: lake read-only skipped ({e:#})"));
                        }
                    }
                }
                Fault::KillRegistry => {
                    sched.note(
                        start,
                        format!("fault: SIGKILL the schema registry, start it after {pause:?}"),
                    );
                    ops_stack(&["kill-registry"])?;
                    tokio::time::sleep(pause).await;
                    ops_stack(&["start-registry"])?;
                }
            }
            next_fault = Instant::now()
                + Duration::from_secs(
                    rng.random_range(opts.fault_gap_secs.0..=opts.fault_gap_secs.1),
                );
        }
        Ok(())
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let wl_result = wl.await;
    let mut report = Report::new(opts, sched.clone());
    if let Err(e) = result {
        report.fail(format!("the fault injector failed: {e:#}"));
    }
    match wl_result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => report.fail(format!("the workload failed: {e:#}")),
        Err(e) => report.fail(format!("the workload panicked: {e}")),
    }
    report.faults = faults;
    report.committed = counts.committed.load(Ordering::Relaxed);
    report.aborted = counts.aborted.load(Ordering::Relaxed);
    report.workload_errors = counts.errors.load(Ordering::Relaxed);

    // The drain: everything up, the slot caught up, then the checks.
    sched.note(start, "drain: faults stopped");
    ops_stack(&["up"]).ok();
    let drained = drain(stack, &d, &mut pipe, &sched, start, &mut panics).await;
    if let Err(e) = drained {
        report.fail(format!("the drain failed: {e:#}"));
    } else {
        sched.note(start, "drain: Bronze holds every Kafka offset; checking");
        if let Err(e) = checks(stack, &d, &name, &mut report).await {
            report.fail(format!("a check could not run: {e:#}"));
        }
    }
    report.unexpected_exits = pipe.unexpected_exits.clone();
    pipe.kill_all();
    report.elapsed = start.elapsed();
    Ok(report.finish())
}

/// Restarts the broker when its log shows a new storage panic (a known tansu 0.6 problem
/// that stops it serving a partition).
fn restart_panicked_broker(
    stack: &Stack,
    sched: &Schedule,
    start: Instant,
    panics: &mut usize,
) -> Result<()> {
    if broker_storage_panics(stack) > *panics {
        sched.note(
            start,
            "broker: tansu's storage panicked; restarting it (known tansu 0.6 problem)",
        );
        ops_stack(&["kill-broker"])?;
        ops_stack(&["start-broker"])?;
        *panics = broker_storage_panics(stack);
    }
    Ok(())
}

async fn drain(
    stack: &Stack,
    d: &Daemon,
    pipe: &mut Pipeline,
    sched: &Schedule,
    start: Instant,
    panics: &mut usize,
) -> Result<()> {
    let mut progress = DrainProgress::new();
    let mut last_confirmed = None;
    loop {
        pipe.supervise(d, sched, start)?;
        restart_panicked_broker(stack, sched, start, panics)?;
        let deadline = progress.deadline();
        let pg = match stack.connect().await {
            Ok(pg) => pg,
            Err(e) => {
                if Instant::now() > deadline {
                    bail!("PostgreSQL did not answer: {e:#}");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let confirmed = crate::slot_confirmed(&pg, &d.slot).await.ok().flatten();
        if confirmed > last_confirmed {
            last_confirmed = confirmed;
            progress.moved();
        }
        let target = current_wal_lsn(&pg).await?;
        match wait_confirmed(&pg, &d.slot, target, Duration::from_secs(20)).await {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => {
                let tails: Vec<String> = pipe
                    .procs
                    .iter()
                    .map(|p| format!("{}: {}", p.label(), log_tail(&p.log, 2000)))
                    .collect();
                bail!("{e:#} ({}); logs: {}", progress.why(), tails.join(" || "))
            }
            Err(_) => {}
        }
    }
    sched.note(
        start,
        "drain: slot caught up; waiting for Bronze to reach Kafka's end",
    );
    // Bronze must hold every partition up to its high watermark before the checks, so a
    // slow or starved Bronze is reported as such rather than as a reconcile difference.
    let mut progress = DrainProgress::new();
    let mut least_behind = i64::MAX;
    loop {
        pipe.supervise(d, sched, start)?;
        restart_panicked_broker(stack, sched, start, panics)?;
        let last = match bronze_lag(d) {
            // The four tables and the transactions topic.
            // The transactions topic keeps growing while capture is idle (a WATERMARK record
            // per heartbeat, every 500 ms here), so it may be a few records behind at any
            // moment.
            Ok(lags)
                if lags.len() > TABLE_NAMES.len()
                    && lags.iter().all(|(t, l)| {
                        *l == 0 || (t == "_wal2delta.transactions" && (0..=50).contains(l))
                    }) =>
            {
                return Ok(())
            }
            Ok(lags) => {
                let behind = lags.iter().map(|(_, l)| *l).sum::<i64>();
                if behind < least_behind {
                    least_behind = behind;
                    progress.moved();
                }
                lags
            }
            Err(e) => vec![(format!("status failed: {e:#}"), -1)],
        };
        if Instant::now() > progress.deadline() {
            bail!(
                "Bronze did not reach Kafka's end: {}; events behind per table {last:?}",
                progress.why()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// How long each phase of the drain (capture catching up, then Bronze reaching Kafka's
/// end) may go without progress: the slot's confirmed position moving, or fewer events
/// behind in Bronze than ever before in the phase. A long run re-sends and stores a
/// 1,000,000-row transaction for as long as that takes, while a stage that stopped moving
/// fails the run after this long.
const DRAIN_STALL_SECS: u64 = 600;
/// The most a drain phase may take, progress or not.
const DRAIN_MAX_SECS: u64 = 3 * 3600;

/// A drain phase's deadline: [`DRAIN_STALL_SECS`] after its last progress, at most
/// [`DRAIN_MAX_SECS`] after it began.
struct DrainProgress {
    began: Instant,
    last_moved: Instant,
}

impl DrainProgress {
    fn new() -> Self {
        let now = Instant::now();
        DrainProgress {
            began: now,
            last_moved: now,
        }
    }

    fn moved(&mut self) {
        self.last_moved = Instant::now();
    }

    fn deadline(&self) -> Instant {
        (self.last_moved + Duration::from_secs(DRAIN_STALL_SECS))
            .min(self.began + Duration::from_secs(DRAIN_MAX_SECS))
    }

    fn why(&self) -> String {
        if self.began.elapsed() >= Duration::from_secs(DRAIN_MAX_SECS) {
            format!("still moving after the drain's limit of {DRAIN_MAX_SECS} s")
        } else {
            format!("no progress for {DRAIN_STALL_SECS} s")
        }
    }
}

/// Per Bronze table (and the transactions table): events in Kafka not yet in Bronze,
/// from `wal2delta status --json` (high watermark minus the offsets the table holds).
fn bronze_lag(d: &Daemon) -> Result<Vec<(String, i64)>> {
    let out = d.command(&["status", "--json"])?;
    let doc: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "status --json: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    let bronze = &doc["stages"]["bronze"];
    if let Some(e) = bronze.get("error") {
        bail!("status: bronze lag unknown: {e}");
    }
    Ok(bronze["tables"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t["table"].as_str().unwrap_or("?").to_owned(),
                t["lag_events"].as_i64().unwrap_or(-1),
            )
        })
        .collect())
}

struct Report {
    seed: u64,
    minutes: f64,
    sched: Schedule,
    failures: Vec<String>,
    faults: u32,
    committed: u64,
    aborted: u64,
    workload_errors: u64,
    tables_equal: usize,
    bronze_events: u64,
    republished: u64,
    /// Distinct oversized changes found in the DLQ.
    dlq_events: usize,
    retained_wal: Option<i64>,
    unexpected_exits: Vec<String>,
    elapsed: Duration,
}

impl Report {
    fn new(opts: &Options, sched: Schedule) -> Report {
        Report {
            seed: opts.seed,
            minutes: opts.duration.as_secs_f64() / 60.0,
            sched,
            failures: Vec::new(),
            faults: 0,
            committed: 0,
            aborted: 0,
            workload_errors: 0,
            tables_equal: 0,
            bronze_events: 0,
            republished: 0,
            dlq_events: 0,
            retained_wal: None,
            unexpected_exits: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    fn fail(&mut self, what: String) {
        eprintln!("chaos: FAILED CHECK: {what}");
        self.failures.push(what);
    }

    fn finish(self) -> Outcome {
        let ok = self.failures.is_empty();
        let mut out = String::new();
        if !ok {
            let _ = writeln!(out, "chaos: FAILED with seed {}", self.seed);
            let _ = writeln!(out, "chaos: fault schedule:");
            for l in self.sched.lines() {
                let _ = writeln!(out, "  {l}");
            }
            let _ = writeln!(out, "chaos: what failed:");
            for f in &self.failures {
                let _ = writeln!(out, "  - {f}");
            }
        }
        if !self.unexpected_exits.is_empty() {
            let _ = writeln!(
                out,
                "chaos: processes that exited on their own (restarted):"
            );
            for e in &self.unexpected_exits {
                let _ = writeln!(out, "  - {e}");
            }
        }
        print!("{out}");
        let summary = format!(
            "chaos: {} seed={} minutes={:.1} elapsed={}s faults={} committed_tx={} aborted_tx={} workload_errors={} bronze_events={} republished={} dlq_events={} tables_equal={} retained_wal={} unexpected_exits={}{}",
            if ok { "PASS" } else { "FAIL" },
            self.seed,
            self.minutes,
            self.elapsed.as_secs(),
            self.faults,
            self.committed,
            self.aborted,
            self.workload_errors,
            self.bronze_events,
            self.republished,
            self.dlq_events,
            self.tables_equal,
            self.retained_wal.map_or("?".into(), |b| format!("{b}B")),
            self.unexpected_exits.len(),
            if ok { String::new() } else { format!(" failed_checks={}", self.failures.len()) },
        );
        println!("{summary}");
        Outcome { ok, summary }
    }
}

async fn checks(stack: &Stack, d: &Daemon, s: &str, report: &mut Report) -> Result<()> {
    // 1. reconcile: every table equal.
    let out = d.command(&[
        "reconcile",
        "--json",
        "--wait-secs",
        "600",
        "--max-keys",
        "10",
    ])?;
    let code = out.status.code().unwrap_or(-1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str::<Value>(&stdout) {
        Ok(doc) => {
            for t in doc["tables"].as_array().cloned().unwrap_or_default() {
                if t["equal"] == Value::Bool(true) {
                    report.tables_equal += 1;
                } else {
                    report.fail(format!(
                        "reconcile: {} not equal: error {}, differences {}, columns only in source {}, first differing keys {}",
                        t["name"], t["error"], t["differences"], t["columns_only_in_source"], t["differing_keys"]
                    ));
                }
            }
            for k in ["tables_not_in_silver", "tables_without_primary_key"] {
                if doc[k].as_array().is_some_and(|a| !a.is_empty()) {
                    report.fail(format!("reconcile: {k}: {}", doc[k]));
                }
            }
        }
        Err(_) => report.fail(format!(
            "reconcile exited {code} without a report: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
    if code != 0 && report.failures.is_empty() {
        report.fail(format!("reconcile exited {code}"));
    }

    // The change log, as PostgreSQL committed it.
    let pg = stack.connect().await?;
    let mut logged: HashMap<String, HashMap<i64, i64>> = HashMap::new();
    for r in pg
        .query(
            &format!("SELECT txid, tbl, events FROM {s}_log.changes"),
            &[],
        )
        .await?
    {
        logged
            .entry(r.get::<_, String>(1))
            .or_default()
            .insert(r.get(0), r.get(2));
    }
    let aborted: HashSet<i64> = pg
        .query(&format!("SELECT txid FROM {s}_log.aborted"), &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();

    // Quarantined Bronze offsets are known holes.
    let qpath = d.lake().join("quarantine/records");
    let mut quarantined: HashMap<(String, i64), i64> = HashMap::new();
    if qpath.join("_delta_log").exists() {
        for r in duckdb(&format!(
            "SELECT topic, \"partition\", count(*) FROM {} WHERE stage = 'bronze' GROUP BY 1, 2",
            scan(&qpath)
        ))? {
            let topic = r[0].as_str().unwrap_or_default().to_owned();
            quarantined.insert(
                (topic, r[1].as_i64().unwrap_or(-1)),
                r[2].as_i64().unwrap_or(0),
            );
        }
        let n: i64 = quarantined.values().sum();
        if n > 0 {
            report.fail(format!(
                "{n} Bronze events were quarantined (the workload makes none that should be)"
            ));
        }
    }

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .set("group.id", "wal2delta-chaos-check")
        .create()?;
    for (table, _) in TABLE_NAMES {
        let path = d.bronze(&ident_part(table));
        let topic = format!("{}.{}.{}", d.prefix, ident_part(s), ident_part(table));
        // 2. Every Kafka offset exactly once.
        let rows = duckdb(&format!(
            "SELECT kafka_partition, count(*), count(DISTINCT kafka_offset), min(kafka_offset), max(kafka_offset) FROM {} GROUP BY 1 ORDER BY 1",
            scan(&path)
        ))?;
        let md = consumer.fetch_metadata(Some(&topic), Duration::from_secs(20))?;
        let parts = md
            .topics()
            .first()
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        // Capture follows every delete with a tombstone (a null value), which Bronze skips.
        let mut tombstones: HashMap<i32, i64> = HashMap::new();
        for r in read_topic_to_end(&stack.brokers, &topic)? {
            if r.tombstone {
                *tombstones.entry(r.partition).or_default() += 1;
            }
        }
        let mut by_part: HashMap<i64, Vec<i64>> = HashMap::new();
        for r in rows {
            by_part.insert(
                r[0].as_i64().unwrap_or(-1),
                r.iter().skip(1).map(|v| v.as_i64().unwrap_or(-1)).collect(),
            );
        }
        for p in 0..parts as i32 {
            let (low, high) = consumer.fetch_watermarks(&topic, p, Duration::from_secs(20))?;
            let q = quarantined
                .get(&(topic.clone(), i64::from(p)))
                .copied()
                .unwrap_or(0);
            let v = by_part
                .get(&i64::from(p))
                .cloned()
                .unwrap_or_else(|| vec![0, 0, low, high - 1]);
            let (count, distinct) = (v[0], v[1]);
            if count != distinct {
                report.fail(format!(
                    "Bronze {table}: partition {p} holds {} duplicated offsets",
                    count - distinct
                ));
            }
            let t = tombstones.get(&p).copied().unwrap_or(0);
            if distinct + q + t != high - low || (count > 0 && (v[2] < low || v[3] >= high)) {
                report.fail(format!(
                    "Bronze {table}: partition {p} holds {distinct} distinct offsets in [{}, {}] (+{q} quarantined, +{t} tombstones), Kafka has [{low}, {high})",
                    v[2], v[3]
                ));
            }
            report.bronze_events += u64::try_from(count).unwrap_or(0);
        }
        // 3. Every committed change in Bronze, and nothing of other transactions.
        let rows = duckdb(&format!(
            // Capture publishes at least once (docs/capture.md): after a restart it re-sends
            // from the slot's confirmed position, and PostgreSQL 15 does not persist a
            // confirmed position that moved alone, so a restart of PostgreSQL rewinds it.
            // A change is one (commit_lsn, lsn, ordinal); its copies are counted apart.
            "SELECT tx_id, count(DISTINCT (commit_lsn, lsn, ordinal)), count(*) FROM {} WHERE NOT coalesce(snapshot, false) GROUP BY 1",
            scan(&path)
        ))?;
        let in_bronze: HashMap<i64, i64> = rows
            .iter()
            .map(|r| (r[0].as_i64().unwrap_or(-1), r[1].as_i64().unwrap_or(0)))
            .collect();
        report.republished += rows
            .iter()
            .map(|r| {
                u64::try_from(r[2].as_i64().unwrap_or(0) - r[1].as_i64().unwrap_or(0)).unwrap_or(0)
            })
            .sum::<u64>();
        let want = logged.remove(table).unwrap_or_default();
        let mut missing = Vec::new();
        let mut wrong = Vec::new();
        for (tx, n) in &want {
            match in_bronze.get(tx) {
                None => missing.push(*tx),
                Some(m) if m != n => wrong.push(format!("tx {tx}: {m} events, log says {n}")),
                Some(_) => {}
            }
        }
        let mut foreign = Vec::new();
        let mut from_aborted = Vec::new();
        for tx in in_bronze.keys() {
            if aborted.contains(tx) {
                from_aborted.push(*tx);
            } else if !want.contains_key(tx) {
                foreign.push(*tx);
            }
        }
        for (what, mut v) in [
            ("committed transactions missing from Bronze", missing),
            ("transactions of a rolled-back txid in Bronze", from_aborted),
            (
                "transactions in Bronze that the change log does not hold (aborted or lost)",
                foreign,
            ),
        ] {
            if !v.is_empty() {
                v.sort_unstable();
                report.fail(format!(
                    "Bronze {table}: {} {what}, first txids {:?}",
                    v.len(),
                    &v[..v.len().min(10)]
                ));
            }
        }
        if !wrong.is_empty() {
            wrong.sort();
            report.fail(format!(
                "Bronze {table}: {} transactions with the wrong event count, e.g. {:?}",
                wrong.len(),
                &wrong[..wrong.len().min(5)]
            ));
        }
    }

    // 5. The oversized change is in the DLQ (it is not in Bronze: its transaction has no
    // `changes` row, so check 3 fails on any Bronze event of it), and nothing else is.
    let wanted: HashSet<(i64, i64)> = pg
        .query(&format!("SELECT txid, id FROM {s}_log.dlq"), &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let dlq_topic = format!("{}.dlq", d.prefix);
    let letters = match read_topic_to_end(&stack.brokers, &dlq_topic) {
        Ok(l) => l,
        // The topic is created on the first dead letter.
        Err(_) if wanted.is_empty() => Vec::new(),
        Err(e) => return Err(e.context(format!("reading {dlq_topic}"))),
    };
    let doc_table = format!("{s}.doc");
    let mut found: HashSet<(i64, i64)> = HashSet::new();
    let mut unexpected = Vec::new();
    for l in &letters {
        let v: Value = serde_json::from_slice(&l.payload).unwrap_or(Value::Null);
        let key = (
            v["xid"].as_i64().unwrap_or(-1),
            v["key"]["id"]
                .as_str()
                .and_then(|k| k.parse().ok())
                .unwrap_or(-1),
        );
        if v["reason_kind"] == "message_too_large"
            && v["table"] == doc_table.as_str()
            && wanted.contains(&key)
        {
            found.insert(key);
        } else {
            unexpected.push(format!(
                "{} {} xid {} key {}",
                v["reason_kind"], v["table"], v["xid"], v["key"]
            ));
        }
    }
    // Copies (capture is at least once) count once.
    report.dlq_events = found.len();
    let mut missing: Vec<_> = wanted.difference(&found).collect();
    if !missing.is_empty() {
        missing.sort_unstable();
        report.fail(format!(
            "DLQ: {} oversized changes of the change log have no message_too_large letter in {dlq_topic}: (txid, key) {missing:?}",
            missing.len()
        ));
    }
    if !unexpected.is_empty() {
        report.fail(format!(
            "DLQ: {} unexpected dead letters, e.g. {:?}",
            unexpected.len(),
            &unexpected[..unexpected.len().min(5)]
        ));
    }

    // 4. Retained WAL back near zero (capture confirms on heartbeats while idle).
    let limit: i64 = 64 << 20;
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let retained: Option<i64> = pg
            .query_opt(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
                &[&d.slot],
            )
            .await?
            .and_then(|r| r.get(0));
        report.retained_wal = retained;
        match retained {
            Some(b) if b <= limit => break,
            _ if Instant::now() > until => {
                report.fail(format!(
                    "the slot retains {retained:?} bytes of WAL after the drain (limit {limit})"
                ));
                break;
            }
            _ => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
    Ok(())
}

/// Whether a workload statement changes primary keys (see `Workload::statement`).
fn is_key_change(sql: &str) -> bool {
    sql.contains(" SET id = ") || sql.contains(" SET line = line + 100 ")
}
