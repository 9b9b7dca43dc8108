//! The chaos workload: random transactions on the captured tables, each recording its
//! txid and per-table event counts in `{s}_log` in the same transaction.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::Rng;
use tokio_postgres::Client;

use super::Schedule;
use crate::{connect, Stack};

/// Counters the workload shares with the report.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) committed: AtomicU64,
    pub(super) aborted: AtomicU64,
    pub(super) unknown: AtomicU64,
    pub(super) errors: AtomicU64,
}

/// The workload: one connection, transactions chosen by its own RNG, each committed
/// transaction recording its txid and per-table event counts in `{s}_log` in the same
/// transaction. Runs until `stop`; reconnects after PostgreSQL restarts.
pub(super) struct Workload {
    pub(super) stack: Stack,
    pub(super) s: String,
    pub(super) rng: StdRng,
    pub(super) next_id: i64,
    pub(super) next_order: i32,
    pub(super) extra_column: bool,
    pub(super) large_done: bool,
    /// The oversized change committed (or its transaction's outcome is in the log).
    pub(super) oversized_done: bool,
    /// A `doc` row whose last change went to the DLQ: the next transaction rewrites it.
    pub(super) repair: Option<i64>,
    pub(super) counts: Arc<Counts>,
    /// Rule edits (rules.rs) and when they are due, in order; each its own transaction,
    /// outside the change log (the rules table is checked by reconcile and the rules checks).
    pub(super) rule_edits: Vec<(Duration, String)>,
}

/// `[kafka] message_max_bytes` of the chaos runs, and the oversized value: `md5` strings
/// of 32 characters each, about 320 kB in all (random hex does not compress to nothing).
pub(super) const MESSAGE_MAX_BYTES: usize = 262_144;
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
        let txid = begin(pg).await?;
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
        let txid = begin(pg).await?;
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

    pub(super) async fn run(
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
            if let Some((at, sql)) = self.rule_edits.first().cloned() {
                if elapsed >= at {
                    match pg.batch_execute(&sql).await {
                        Ok(()) => {
                            self.rule_edits.remove(0);
                            sched.note(start, "workload: a rule edit committed");
                        }
                        Err(_) => pg = self.failed(pg).await,
                    }
                    continue;
                }
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
                // Every order line changes once more after the last change of `doc`, so
                // its rule's lookup sees the final `doc` (a change of a looked-up row alone
                // re-evaluates nothing, docs/rules.md) and the hits equal PostgreSQL's
                // evaluation of the final rows.
                (
                    "Order Items",
                    format!("UPDATE {s}.\"Order Items\" SET qty = qty"),
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

/// Whether a workload statement changes primary keys (see `Workload::statement`).
pub(super) fn is_key_change(sql: &str) -> bool {
    sql.contains(" SET id = ") || sql.contains(" SET line = line + 100 ")
}

/// Opens a transaction on `pg`; its xid as the events carry it (32 bits, the epoch cut off).
async fn begin(pg: &Client) -> Result<i64> {
    pg.batch_execute("BEGIN").await?;
    Ok(pg
        .query_one(
            "SELECT (pg_current_xact_id()::text::bigint % 4294967296)",
            &[],
        )
        .await?
        .get(0))
}
