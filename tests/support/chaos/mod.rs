//! The chaos suite (issue 11): the whole pipeline under a randomised workload while a
//! fault injector driven by one printed seed SIGKILLs the daemon and single stages,
//! restarts PostgreSQL (fast and immediate), SIGKILLs the broker and takes the lake or a
//! looked-up table away. After the drain it
//! checks what the product promises (docs/reliability.md):
//!
//! - `wal2delta reconcile` finds every table equal (exit 0);
//! - every Kafka offset of every table topic is in Bronze exactly once;
//! - every committed change is in Bronze, per transaction and table, against the change
//!   log the workload keeps in the source database in the same transaction as the change;
//! - no Bronze row belongs to a transaction the log does not hold (rolled back, or lost
//!   to a crash of PostgreSQL);
//! - the slot's retained WAL is back near zero;
//! - the rules' hits equal PostgreSQL's evaluation of the final rules (edited twice during
//!   the run; one rule looks up another table), each (rule, key)'s transitions alternate
//!   and none repeats, and Gold equals its model computed over Silver ([`rules`]).
//!
//! The seed fixes the workload's choices and the fault schedule (kinds and delays); the
//! exact interleaving of the two still depends on timing, so a failing seed is a strong
//! hint, not an exact replay. Run it with `ops/chaos [--minutes M] [--seed S]`.
//!
//! The driver's parts: [`workload`] (the transactions and the change log), [`faults`]
//! (what breaks), [`pipeline`] (the daemon's processes and the drain), [`checks`] (what
//! must hold after it, with [`rules`] for the rules and Gold).

mod checks;
mod faults;
mod pipeline;
mod rules;
mod workload;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::daemon::Daemon;
use crate::proxy::Proxy;
use crate::{ops_stack, unique, Stack};
use checks::{checks, Report};
use faults::{chattr, dsn_host_port, Fault};
pub use faults::{FilesAway, ReadOnlyLake};
use pipeline::{broker_storage_panics, drain, restart_panicked_broker, Pipeline};
use workload::{Counts, Workload, MESSAGE_MAX_BYTES};

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
pub(super) const TABLES: &str = r#"
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

pub(super) const TOML: &str = r#"[bronze]
max_batch_ms = 500
topic_refresh_ms = 500
[silver]
interval_ms = 500
[capture]
heartbeat_interval_ms = 500
"#;

/// Source table name (as PostgreSQL spells it, unquoted) and its SQL spelling.
pub(super) const TABLE_NAMES: [(&str, &str); 4] = [
    ("acct", "acct"),
    ("Order Items", "\"Order Items\""),
    ("doc", "doc"),
    ("bulk", "bulk"),
];

/// The fault schedule as it happened, shared by the injector and the report.
#[derive(Clone, Default)]
pub(super) struct Schedule(Arc<Mutex<Vec<String>>>);

impl Schedule {
    pub(super) fn note(&self, start: Instant, what: impl Into<String>) {
        let line = format!("t+{:6.1}s {}", start.elapsed().as_secs_f64(), what.into());
        eprintln!("chaos: {line}");
        self.0.lock().unwrap().push(line);
    }
    pub(super) fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
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
    pg.batch_execute(&rules::ddl(&name)).await?;
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
    // The rules come from a rules table; Gold refreshes a keyed model (rules.rs).
    d.env.push((
        "WAL2DELTA__RULES__TABLE".into(),
        format!("{name}.wal2delta_rules"),
    ));
    let models = d.dir.join("models");
    rules::models(&models, &name)?;
    d.env.push((
        "WAL2DELTA__GOLD__MODELS_DIR".into(),
        models.display().to_string(),
    ));
    d.env
        .push(("WAL2DELTA__GOLD__INTERVAL_MS".into(), "1000".into()));
    d.setup()?;
    pg.batch_execute(&rules::first_rules(&name)).await?;
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
        rule_edits: rules::edits(&name)
            .into_iter()
            .map(|(at, sql)| (opts.duration.mul_f64(at), sql))
            .collect(),
    };
    let wl = tokio::spawn(workload.run(
        stop.clone(),
        start,
        opts.duration,
        (large_at, opts.large_tx_rows),
        oversized_at,
        sched.clone(),
    ));

    // First half: one `wal2delta run`; second half: one process per stage.
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
                    "pipeline: SIGKILLed; now capture, bronze, silver (with rules) and gold as four processes",
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
                94..=97 => Fault::LakeReadOnly,
                _ => Fault::LookupUnreadable,
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
                Fault::LookupUnreadable => {
                    let d_away = Duration::from_millis(2000 + pause.as_millis() as u64);
                    match FilesAway::take(&d.silver("doc"), &d.dir.join("away")) {
                        Ok(away) => {
                            sched.note(
                                start,
                                format!("fault: the looked-up table (Silver doc) unreadable for {d_away:?}"),
                            );
                            let until = Instant::now() + d_away;
                            while Instant::now() < until {
                                tokio::time::sleep(Duration::from_millis(250)).await;
                                pipe.supervise(&d, &sched, start)?;
                            }
                            drop(away);
                        }
                        Err(e) => sched.note(start, format!("fault: lookup unreadable skipped ({e:#})")),
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
        if let Err(e) = rules::checks(stack, &d, &name, &mut report).await {
            report.fail(format!("a rules or Gold check could not run: {e:#}"));
        }
    }
    report.unexpected_exits = pipe.unexpected_exits.clone();
    pipe.kill_all();
    report.elapsed = start.elapsed();
    Ok(report.finish())
}
