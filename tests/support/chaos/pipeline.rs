//! The daemon's processes during a chaos run (one `wal2delta run`, or one process per
//! stage), restarted when they exit on their own, and the drain after the faults.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{Schedule, TABLE_NAMES};
use crate::daemon::Daemon;
use crate::{current_wal_lsn, ops_stack, wait_confirmed, Stack};

/// One `wal2delta run` process of the pipeline.
pub(super) struct Proc {
    pub(super) stages: Option<&'static str>,
    pub(super) child: Option<Child>,
    pub(super) log: PathBuf,
}

impl Proc {
    pub(super) fn label(&self) -> &'static str {
        self.stages.unwrap_or("run")
    }
    pub(super) fn kill9(&mut self) {
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

/// The pipeline's processes: one `wal2delta run` (all stages), or one process per stage
/// (the rules run in the silver process: they are part of its rounds).
pub(super) struct Pipeline {
    pub(super) procs: Vec<Proc>,
    pub(super) starts: u32,
    /// Exits nobody asked for: (process, status, tail of its log).
    pub(super) unexpected_exits: Vec<String>,
}

impl Pipeline {
    pub(super) fn new(d: &Daemon, separate: bool) -> Result<Pipeline> {
        let stages: Vec<Option<&'static str>> = if separate {
            vec![
                Some("capture"),
                Some("bronze"),
                Some("silver"),
                Some("gold"),
            ]
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

    pub(super) fn start(&mut self, d: &Daemon, i: usize) -> Result<()> {
        let p = &mut self.procs[i];
        let mut cmd = d.command_line(&["run"]);
        if let Some(s) = p.stages {
            cmd.args(["--stage", s]);
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p.log)?;
        cmd.env("RUST_LOG", crate::daemon_log_filter())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        p.child = Some(cmd.spawn().context("starting wal2delta run")?);
        self.starts += 1;
        Ok(())
    }

    /// Restarts every process that exited on its own, noting it.
    pub(super) fn supervise(&mut self, d: &Daemon, sched: &Schedule, start: Instant) -> Result<()> {
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

    pub(super) fn kill_all(&mut self) {
        for p in &mut self.procs {
            p.kill9();
        }
    }
}

pub(super) fn log_tail(path: &PathBuf, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(n);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    text[start..].replace('\n', " | ")
}

/// How many times the broker's log shows tansu 0.6's storage panic after a restart
/// (see tests/capture_failures.rs): the broker then answers nothing and is restarted.
pub(super) fn broker_storage_panics(stack: &Stack) -> usize {
    std::fs::read_to_string(format!("{}/broker.log", stack.stack_dir))
        .map_or(0, |log| log.matches("more or less than one row").count())
}

/// Restarts the broker when its log shows a new storage panic (a known tansu 0.6 problem
/// that stops it serving a partition).
pub(super) fn restart_panicked_broker(
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

pub(super) async fn drain(
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
