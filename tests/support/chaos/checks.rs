//! What must hold after a chaos run's drain (docs/reliability.md), and the report.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use serde_json::Value;
use wal2delta_model::names::ident_part;

use super::{Options, Outcome, Schedule, TABLE_NAMES};
use crate::daemon::Daemon;
use crate::kafka::read_topic_to_end;
use crate::lake::{duckdb, scan};
use crate::Stack;

pub(super) struct Report {
    pub(super) seed: u64,
    pub(super) minutes: f64,
    pub(super) sched: Schedule,
    pub(super) failures: Vec<String>,
    pub(super) faults: u32,
    pub(super) committed: u64,
    pub(super) aborted: u64,
    pub(super) workload_errors: u64,
    pub(super) tables_equal: usize,
    pub(super) bronze_events: u64,
    pub(super) republished: u64,
    /// Distinct oversized changes found in the DLQ.
    pub(super) dlq_events: usize,
    pub(super) retained_wal: Option<i64>,
    /// Hits of the final rules, transitions in the lake, rows of the Gold model.
    pub(super) rule_hits: usize,
    pub(super) transitions: usize,
    pub(super) gold_rows: usize,
    pub(super) unexpected_exits: Vec<String>,
    pub(super) elapsed: Duration,
}

impl Report {
    pub(super) fn new(opts: &Options, sched: Schedule) -> Report {
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
            rule_hits: 0,
            transitions: 0,
            gold_rows: 0,
            unexpected_exits: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    pub(super) fn fail(&mut self, what: String) {
        eprintln!("chaos: FAILED CHECK: {what}");
        self.failures.push(what);
    }

    pub(super) fn finish(self) -> Outcome {
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
            "chaos: {} seed={} minutes={:.1} elapsed={}s faults={} committed_tx={} aborted_tx={} workload_errors={} bronze_events={} republished={} dlq_events={} tables_equal={} rule_hits={} transitions={} gold_rows={} retained_wal={} unexpected_exits={}{}",
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
            self.rule_hits,
            self.transitions,
            self.gold_rows,
            self.retained_wal.map_or("?".into(), |b| format!("{b}B")),
            self.unexpected_exits.len(),
            if ok { String::new() } else { format!(" failed_checks={}", self.failures.len()) },
        );
        println!("{summary}");
        Outcome { ok, summary }
    }
}

pub(super) async fn checks(stack: &Stack, d: &Daemon, s: &str, report: &mut Report) -> Result<()> {
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
