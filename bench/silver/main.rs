//! `wal2delta-bench-silver`: the worker of `ops/bench silver` (see ops/bench-silver).
//!
//! Each measurement runs in a process of its own so that its peak RSS (VmHWM) is its own:
//!
//! - `snapshot`: writes N snapshot rows (`r`) of a payments table to Bronze;
//! - `changes`: appends change events (updates of random existing keys, a few inserts
//!   and deletes) in 1,000-event source transactions, with their END records;
//! - `apply`: runs Silver rounds (`transaction_counts` + `SilverTable::apply`, as the silver
//!   stage does) until Silver has caught up with Bronze; the measurement;
//! - `floor`: the same change rows read from Bronze and upserted into a copy of the Silver
//!   table with one plain delta-rs MERGE by id (no fold, no positions, no tombstones, no
//!   progress); the floor;
//! - `sums`: row count and content aggregates of a table, to check that Silver and the
//!   floor produced the same table;
//! - `vacuum`: drops the files no longer referenced by Silver (between measurements, to
//!   keep the benchmark's disk use in check).
//!
//! Diagnostics (not used by the benchmark, used to find what bounds memory):
//! `changes --keys` updates chosen keys; `floor --key-ranges K` adds the changed keys' ranges
//! to the MERGE predicate so that file skipping drops files holding none of them; `profile`
//! repeats Silver's steps before its MERGE (Bronze read, plan, fold; the same query and
//! the same public functions) with the peak RSS of each.
//!
//! Each prints one JSON object on stdout. The lake's `bench-state.json` carries the
//! source's position (next key, LSN, transaction id, Kafka offsets) between processes.

mod rules;
mod synth;

/// The daemon's allocator (wal2delta/src/allocator.rs): the rounds measured here allocate
/// as the daemon's do.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wal2delta_lake::bronze::{Append, AppendOutcome, BronzeTable, OffsetRange};
use wal2delta_lake::deltalake::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use wal2delta_lake::deltalake::arrow::compute::concat_batches;
use wal2delta_lake::deltalake::arrow::datatypes::{Field, Schema};
use wal2delta_lake::deltalake::datafusion::prelude::{SessionConfig, SessionContext};
use wal2delta_lake::deltalake::{DeltaTable, DeltaTableBuilder};
use wal2delta_lake::silver::{transaction_counts, SilverTable, TransactionCounts};
use wal2delta_lake::Lake;

use synth::{Event, Op, Rng, Synth};

#[derive(Parser)]
#[command(name = "wal2delta-bench-silver")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes ROWS snapshot rows to the Bronze table of a fresh lake.
    Snapshot {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long)]
        rows: i64,
        /// Kafka partitions of the table's topic.
        #[arg(long, default_value_t = 3)]
        partitions: i32,
        /// Events per Bronze commit (`[bronze] max_batch_events`).
        #[arg(long, default_value_t = 50_000)]
        commit_events: usize,
    },
    /// Appends CHANGES change events to Bronze, with their END records.
    Changes {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long)]
        changes: i64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Of every 1,000 changes, this many delete an existing row ...
        #[arg(long, default_value_t = 5)]
        deletes_per_mille: u64,
        /// ... and this many insert a new one; the rest update existing rows.
        #[arg(long, default_value_t = 5)]
        inserts_per_mille: u64,
        /// Events per source transaction.
        #[arg(long, default_value_t = 1_000)]
        tx_events: i64,
        #[arg(long, default_value_t = 50_000)]
        commit_events: usize,
        /// Diagnostics: update exactly these keys (comma-separated) instead.
        #[arg(long, value_delimiter = ',')]
        keys: Vec<i64>,
        /// Change only rows among the RECENT newest keys (key-local changes, as on a
        /// payments table where recent rows change); 0: any existing key.
        #[arg(long, default_value_t = 0)]
        recent: i64,
    },
    /// Rewrites the Silver table into files of about TARGET_BYTES ordered by the columns
    /// ORDER_BY (comma-separated; a Z-order), keeping Silver's commit info.
    Layout {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long)]
        target_bytes: u64,
        #[arg(long, value_delimiter = ',')]
        order_by: Vec<String>,
    },
    /// Silver rounds until Silver has applied everything in Bronze.
    Apply {
        #[arg(long)]
        lake: PathBuf,
        /// `[silver] max_rows_per_partition`.
        #[arg(long, default_value_t = 100_000)]
        window: i64,
        /// Evaluate this many rules (and the backfill rule) in the rounds.
        #[arg(long, default_value_t = 0)]
        rules: usize,
        /// `[rules] hits_interval_ms` (0: `rules/hits` committed every round).
        #[arg(long, default_value_t = 5_000)]
        hits_interval_ms: u64,
        /// `[silver] max_atomic_transaction_rows`.
        #[arg(long, default_value_t = wal2delta_lake::silver::Pieces::DEFAULT_LIMIT)]
        atomic_limit: u64,
    },
    /// The rules stage alone: RULES rules over ROWS merged Silver rows.
    RulesEval {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long, default_value_t = 300)]
        rules: usize,
        #[arg(long, default_value_t = 100_000)]
        rows: usize,
    },
    /// Prints the benchmark's RULES rules as a rules file for the source table TABLE, the
    /// last LOOKUPS of them looking merchants up in MERCHANTS (ops/bench rules-latency).
    RulesFile {
        #[arg(long, default_value_t = 300)]
        rules: usize,
        #[arg(long)]
        table: String,
        #[arg(long, default_value_t = 10)]
        lookups: usize,
        #[arg(long)]
        merchants: String,
    },
    /// Installs RULES rules on Silver (a backfill of all), then times one new rule's
    /// backfill.
    RulesBackfill {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long, default_value_t = 300)]
        rules: usize,
    },
    /// The floor: the last `changes` batch, read from Bronze and upserted into TARGET (a
    /// copy of the Silver table) with one plain MERGE by id.
    Floor {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long)]
        target: PathBuf,
        /// Diagnostics: also restrict the target to at most this many key ranges around the
        /// changed keys (`AND (target.id BETWEEN a AND b OR ...)`), so that file skipping
        /// drops files holding none of them. 0: the plain MERGE.
        #[arg(long, default_value_t = 0)]
        key_ranges: usize,
    },
    /// Diagnostics: Silver's steps before its MERGE (Bronze read, plan, fold) for the next
    /// round, each with its own peak RSS.
    Profile {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long, default_value_t = 100_000)]
        window: i64,
    },
    /// Row count, distinct keys and content sums of a Silver-shaped table (default: the
    /// lake's Silver table, which must hold as many rows as the synthetic source).
    Sums {
        #[arg(long)]
        lake: PathBuf,
        #[arg(long)]
        table: Option<PathBuf>,
    },
    /// Removes the data files the latest Silver and tombstone versions do not reference.
    Vacuum {
        #[arg(long)]
        lake: PathBuf,
    },
}

/// The synthetic source between processes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    partitions: i32,
    /// Live rows in the source.
    rows: i64,
    next_id: i64,
    /// The last LSN handed out.
    lsn: i64,
    tx_id: i64,
    /// Next Kafka offset per partition of the table topic.
    offsets: Vec<i64>,
    /// Next offset of the transactions topic.
    tx_offset: i64,
    deleted: Vec<i64>,
    /// Offsets (first, last) per partition of the last `changes` batch.
    last_batch: BTreeMap<i32, (i64, i64)>,
    last_changes: i64,
}

fn state_path(lake: &Path) -> PathBuf {
    lake.join("bench-state.json")
}

fn load_state(lake: &Path) -> anyhow::Result<State> {
    let p = state_path(lake);
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn save_state(lake: &Path, s: &State) -> anyhow::Result<()> {
    std::fs::write(state_path(lake), serde_json::to_string(s)?)?;
    Ok(())
}

use wal2delta_model::clock::unix_us as now_us;

/// The CPU seconds (user + system, every thread) this process has used: each measurement
/// runs in a process of its own, so this is the measurement's CPU (plus start-up).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which ends with the last `)`.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let ticks: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // USER_HZ is 100 on every Linux the benchmark runs on (sysconf(_SC_CLK_TCK)).
    ticks.iter().sum::<f64>() / 100.0
}

/// `VmHWM` (peak resident set) and `VmRSS` of this process, KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("VmHWM:"), get("VmRSS:"))
}

fn lake_of(path: &Path) -> anyhow::Result<Lake> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    Ok(Lake::new(&path.to_string_lossy())?)
}

async fn append(table: &mut BronzeTable, topic: &str, batch: RecordBatch) -> anyhow::Result<()> {
    let mut ranges: BTreeMap<i32, OffsetRange> = BTreeMap::new();
    let parts = batch
        .column_by_name("kafka_partition")
        .context("kafka_partition")?
        .as_primitive::<wal2delta_lake::deltalake::arrow::datatypes::Int32Type>()
        .clone();
    let offsets = batch
        .column_by_name("kafka_offset")
        .context("kafka_offset")?
        .as_primitive::<wal2delta_lake::deltalake::arrow::datatypes::Int64Type>()
        .clone();
    for i in 0..batch.num_rows() {
        let (p, o) = (parts.value(i), offsets.value(i));
        ranges
            .entry(p)
            .and_modify(|r| r.last = o)
            .or_insert(OffsetRange { first: o, last: o });
    }
    let outcome = table
        .append(Append {
            topic: topic.to_owned(),
            batches: vec![batch],
            ranges,
        })
        .await?;
    match outcome {
        AppendOutcome::Committed { .. } => Ok(()),
        other => bail!("Bronze append did not commit: {other:?}"),
    }
}

/// The payments Bronze table and the batch builder.
struct BronzeWriter {
    synth: Synth,
    table: BronzeTable,
}

impl BronzeWriter {
    fn new(lake: &Lake) -> anyhow::Result<Self> {
        Ok(BronzeWriter {
            synth: Synth::new()?,
            table: BronzeTable::new(synth::TABLE_NAME, lake.bronze(synth::SCHEMA, synth::TABLE)),
        })
    }

    /// Writes `events`, `commit_events` per commit; the number of commits.
    async fn write(&mut self, events: &[Event], commit_events: usize) -> anyhow::Result<usize> {
        let mut commits = 0;
        for chunk in events.chunks(commit_events.max(1)) {
            let batch = self.synth.batch(chunk, now_us())?;
            append(&mut self.table, synth::TOPIC, batch).await?;
            commits += 1;
        }
        Ok(commits)
    }
}

async fn snapshot(
    path: &Path,
    rows: i64,
    partitions: i32,
    commit_events: usize,
) -> anyhow::Result<Value> {
    std::fs::create_dir_all(path)?;
    let lake = lake_of(path)?;
    if state_path(path).exists() {
        bail!("{} already holds a benchmark lake", path.display());
    }
    let started = Instant::now();
    // Snapshot rows carry the slot's consistent point as their position, ordinals count
    // the rows, and they belong to no transaction (no END record).
    let consistent_point: i64 = 1_000_000;
    let ts = now_us();
    let mut offsets = vec![0i64; partitions as usize];
    let mut commits = 0;
    let mut writer = BronzeWriter::new(&lake)?;
    // Bounded memory: generate and write one commit at a time.
    let per_commit = commit_events.max(1) as i64;
    let mut id = 1;
    while id <= rows {
        let end = (id + per_commit - 1).min(rows);
        let events: Vec<Event> = (id..=end)
            .map(|i| {
                let p = synth::partition_of(i, partitions);
                let offset = offsets[p as usize];
                offsets[p as usize] += 1;
                Event {
                    op: Op::Read,
                    id: i,
                    version: 0,
                    lsn: consistent_point,
                    commit_lsn: consistent_point,
                    ordinal: i,
                    tx_id: 0,
                    commit_ts_us: ts,
                    partition: p,
                    offset,
                }
            })
            .collect();
        commits += writer.write(&events, commit_events).await?;
        id = end + 1;
    }
    let state = State {
        partitions,
        rows,
        next_id: rows + 1,
        lsn: consistent_point,
        tx_id: 1_000,
        offsets,
        tx_offset: 0,
        deleted: Vec::new(),
        last_batch: BTreeMap::new(),
        last_changes: 0,
    };
    save_state(path, &state)?;
    Ok(json!({
        "rows": rows,
        "bronze_commits": commits,
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

#[allow(clippy::too_many_arguments)]
async fn changes(
    path: &Path,
    n: i64,
    seed: u64,
    deletes_per_mille: u64,
    inserts_per_mille: u64,
    tx_events: i64,
    commit_events: usize,
    keys: &[i64],
    recent: i64,
) -> anyhow::Result<Value> {
    let lake = lake_of(path)?;
    let mut s = load_state(path)?;
    let started = Instant::now();
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ s.lsn as u64);
    // Every change of the batch touches a different key (a row is changed once per batch,
    // so the floor's MERGE needs no de-duplication), never a deleted one.
    let mut used: HashSet<i64> = s.deleted.iter().copied().collect();
    let existing = s.next_id - 1;
    if (n as f64) > 0.5 * (s.rows as f64) {
        bail!("{n} changes on {} rows: at most half the table", s.rows);
    }
    // Keys drawn from the newest `span` (deleted ones skipped).
    let span = if recent > 0 {
        if n > recent / 2 {
            bail!("{n} changes among the {recent} newest keys: at most half of them");
        }
        recent.min(existing)
    } else {
        existing
    };
    let n = if keys.is_empty() {
        n
    } else {
        keys.len() as i64
    };
    let mut chosen = keys.iter().copied();
    let mut events = Vec::with_capacity(n as usize);
    let (mut updates, mut inserts, mut deletes) = (0u64, 0u64, 0u64);
    let mut first_offsets: BTreeMap<i32, i64> = BTreeMap::new();
    let mut ends = Vec::new();
    let mut done = 0;
    while done < n {
        let tx_len = tx_events.min(n - done);
        s.tx_id += 1;
        let commit_ts = now_us();
        let lsn_start = s.lsn;
        // LSNs: each change's own, then the commit record after them.
        let commit_lsn = lsn_start + 100 * (tx_len + 1);
        for ordinal in 1..=tx_len {
            let roll = rng.below(1_000);
            let (op, id) = if let Some(k) = chosen.next() {
                updates += 1;
                (Op::Update, k)
            } else if roll < inserts_per_mille {
                let id = s.next_id;
                s.next_id += 1;
                inserts += 1;
                (Op::Insert, id)
            } else {
                let id = loop {
                    let k = existing - rng.below(span as u64) as i64;
                    if used.insert(k) {
                        break k;
                    }
                };
                if roll < inserts_per_mille + deletes_per_mille {
                    deletes += 1;
                    s.deleted.push(id);
                    (Op::Delete, id)
                } else {
                    updates += 1;
                    (Op::Update, id)
                }
            };
            let p = synth::partition_of(id, s.partitions);
            let offset = s.offsets[p as usize];
            s.offsets[p as usize] += 1;
            first_offsets.entry(p).or_insert(offset);
            events.push(Event {
                op,
                id,
                // Any version above 0 changes the row; the transaction id keeps it fresh.
                version: s.tx_id as u32,
                lsn: lsn_start + 100 * ordinal,
                commit_lsn,
                ordinal,
                tx_id: s.tx_id,
                commit_ts_us: commit_ts,
                partition: p,
                offset,
            });
        }
        ends.push(synth::end_record(
            s.tx_id,
            commit_lsn,
            commit_ts,
            tx_len as u64,
        ));
        s.lsn = commit_lsn;
        done += tx_len;
    }
    s.rows += inserts as i64 - deletes as i64;
    let commits = BronzeWriter::new(&lake)?
        .write(&events, commit_events)
        .await?;
    let mut tx_table = BronzeTable::new(synth::TRANSACTIONS_TABLE, lake.bronze_transactions());
    let batch = synth::transactions_batch(&ends, s.tx_offset, now_us())?;
    append(&mut tx_table, synth::TRANSACTIONS_TOPIC, batch).await?;
    s.tx_offset += ends.len() as i64;
    s.last_batch = first_offsets
        .into_iter()
        .map(|(p, first)| (p, (first, s.offsets[p as usize] - 1)))
        .collect();
    s.last_changes = n;
    save_state(path, &s)?;
    Ok(json!({
        "changes": n,
        "updates": updates,
        "inserts": inserts,
        "deletes": deletes,
        "transactions": ends.len(),
        "bronze_commits": commits,
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

/// The `operationMetrics` of the MERGE commits of `table_dir` after version `after`.
fn merge_metrics(table_dir: &Path, after: Option<u64>) -> anyhow::Result<Value> {
    let log = table_dir.join("_delta_log");
    let mut sums: BTreeMap<String, u64> = BTreeMap::new();
    let mut merges = 0;
    let Ok(dir) = std::fs::read_dir(&log) else {
        return Ok(json!({}));
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(v) = name
            .strip_suffix(".json")
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        if after.is_some_and(|a| v <= a) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())?;
        for line in text.lines() {
            let Ok(action) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(ci) = action.get("commitInfo") else {
                continue;
            };
            if ci.get("operation").and_then(Value::as_str) != Some("MERGE") {
                continue;
            }
            merges += 1;
            if let Some(m) = ci.get("operationMetrics").and_then(Value::as_object) {
                for (k, v) in m {
                    if let Some(n) = v.as_u64() {
                        *sums.entry(k.clone()).or_default() += n;
                    }
                }
            }
        }
    }
    let mut out = serde_json::Map::new();
    out.insert("merges".into(), json!(merges));
    for (k, v) in sums {
        out.insert(k, json!(v));
    }
    Ok(Value::Object(out))
}

fn table_version(table_dir: &Path) -> Option<u64> {
    std::fs::read_dir(table_dir.join("_delta_log"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(".json")
                .and_then(|v| v.parse::<u64>().ok())
        })
        .max()
}

fn silver_dir(lake: &Path) -> PathBuf {
    lake.join("silver").join(synth::SCHEMA).join(synth::TABLE)
}

async fn apply(
    path: &Path,
    window: i64,
    rules: usize,
    hits_interval: Duration,
    atomic_limit: u64,
) -> anyhow::Result<Value> {
    let lake = lake_of(path)?;
    let dir = silver_dir(path);
    let before_version = table_version(&dir);
    let (table, reports) = rules::silver_with_rules(&lake, window, rules, hits_interval);
    let mut table = table.with_atomic_limit(atomic_limit);
    // As the stage does once per table when it starts.
    let mut watermark = table.progress().await?.watermark;
    let started = Instant::now();
    let mut rounds = Vec::new();
    let (mut read, mut upserts, mut deletes) = (0usize, 0usize, 0usize);
    let mut caught_up_at = 0.0;
    let (mut rules_transitions, mut rules_eval, mut rules_backfills) = (0usize, 0.0f64, 0usize);
    loop {
        let t = Instant::now();
        let (top, counts) = transaction_counts(&lake, watermark).await?;
        let counts = counts
            .get(synth::TABLE_NAME)
            .cloned()
            .unwrap_or(TransactionCounts {
                top,
                events: Default::default(),
                resolved: Default::default(),
            });
        let r = table.apply(&counts).await?;
        let seconds = t.elapsed().as_secs_f64();
        let (hwm, rss) = memory_kib();
        watermark = r.watermark;
        if r.read == 0 && r.version.is_none() {
            // Caught up: this round found nothing. The rules' `rules/hits` commit waits
            // for its interval; count it here, where a stage would pay it.
            let t = Instant::now();
            table.flush_hooks().await?;
            if rules > 0 {
                caught_up_at += t.elapsed().as_secs_f64();
                eprintln!(
                    "  rules/hits committed in {:.2}s",
                    t.elapsed().as_secs_f64()
                );
            }
            break;
        }
        if r.version.is_none() && !r.again {
            bail!("a round read {} rows and committed nothing: {r:?}", r.read);
        }
        read += r.read;
        upserts += r.upserts;
        deletes += r.deletes;
        for x in reports
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
        {
            rules_transitions += x.transitions.values().sum::<usize>();
            rules_eval += x.eval_time.as_secs_f64();
            rules_backfills += usize::from(x.backfill);
        }
        caught_up_at = started.elapsed().as_secs_f64();
        rounds.push(json!({
            "seconds": seconds, "read": r.read, "upserts": r.upserts, "deletes": r.deletes,
            "waiting": r.waiting, "again": r.again, "rss_kib": rss, "hwm_kib": hwm,
        }));
        eprintln!(
            "  round {}: {} rows in {seconds:.1}s, RSS {} MiB (peak {} MiB)",
            rounds.len(),
            r.read,
            rss / 1024,
            hwm / 1024
        );
    }
    let (peak, _) = memory_kib();
    Ok(json!({
        "seconds": caught_up_at,
        "rounds": rounds.len(),
        "read": read,
        "upserts": upserts,
        "deletes": deletes,
        "watermark": watermark,
        "peak_rss_kib": peak,
        "cpu_seconds": cpu_seconds(),
        "atomic_limit": atomic_limit,
        "rules": rules,
        "rules_transitions": rules_transitions,
        "rules_eval_seconds": rules_eval,
        "rules_backfills": rules_backfills,
        "merge": merge_metrics(&dir, before_version)?,
        "silver_files": count_files(&dir).await,
        "round_detail": rounds,
    }))
}

/// Data files of the table's current version.
async fn count_files(dir: &Path) -> usize {
    match dir_url(dir) {
        Ok(url) => match open(&url).await {
            Ok(t) => t.get_file_uris().map(|f| f.count()).unwrap_or(0),
            Err(_) => 0,
        },
        Err(_) => 0,
    }
}

async fn open(url: &url::Url) -> anyhow::Result<DeltaTable> {
    let mut t = DeltaTableBuilder::from_url(url.clone())?.build()?;
    t.load().await?;
    Ok(t)
}

fn session() -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().set_bool(
        "datafusion.execution.parquet.schema_force_view_types",
        false,
    ))
}

fn dir_url(p: &Path) -> anyhow::Result<url::Url> {
    let p = std::fs::canonicalize(p)?;
    url::Url::from_directory_path(&p).map_err(|_| anyhow::anyhow!("bad path {}", p.display()))
}

/// The last batch's change rows from Bronze, as Silver-shaped rows plus `_op`.
async fn read_changes(path: &Path, s: &State) -> anyhow::Result<RecordBatch> {
    let bronze = open(&dir_url(
        &path.join("bronze").join(synth::SCHEMA).join(synth::TABLE),
    )?)
    .await?;
    let ctx = session();
    ctx.register_table("t", bronze.table_provider().await?)?;
    let ranges: Vec<String> = s
        .last_batch
        .iter()
        .map(|(p, (a, b))| {
            format!("(kafka_partition = {p} AND kafka_offset >= {a} AND kafka_offset <= {b})")
        })
        .collect();
    if ranges.is_empty() {
        bail!("no change batch to apply");
    }
    let sql = format!(
        "SELECT op, key, after, commit_lsn, ordinal, commit_ts FROM t WHERE {}",
        ranges.join(" OR ")
    );
    let batches = ctx.sql(&sql).await?.collect().await?;
    let Some(first) = batches.first() else {
        bail!("the change batch is not in Bronze");
    };
    let b = concat_batches(&first.schema(), &batches)?;
    let after = b.column_by_name("after").context("after")?.as_struct();
    let key = b.column_by_name("key").context("key")?.as_struct();
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (f, a) in after.fields().iter().zip(after.columns()) {
        fields.push(Field::new(f.name(), f.data_type().clone(), true));
        arrays.push(if f.name() == "id" {
            key.column_by_name("id").context("key.id")?.clone()
        } else {
            a.clone()
        });
    }
    for (from, to) in [
        ("commit_lsn", "_commit_lsn"),
        ("ordinal", "_ordinal"),
        ("commit_ts", "_commit_ts"),
        ("op", "_op"),
    ] {
        let a = b.column_by_name(from).context("column")?.clone();
        fields.push(Field::new(to, a.data_type().clone(), true));
        arrays.push(a);
    }
    Ok(RecordBatch::try_new(
        std::sync::Arc::new(Schema::new(fields)),
        arrays,
    )?)
}

/// `target.id` within at most `k` ranges covering every id of `source`: the sorted ids
/// split at their `k - 1` widest gaps.
fn key_ranges(source: &RecordBatch, k: usize) -> anyhow::Result<String> {
    let ids = source
        .column_by_name("id")
        .context("id")?
        .as_primitive::<wal2delta_lake::deltalake::arrow::datatypes::Int64Type>();
    let mut v: Vec<i64> = ids.iter().flatten().collect();
    v.sort_unstable();
    v.dedup();
    let mut gaps: Vec<(i64, usize)> = v
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1] - w[0], i))
        .collect();
    gaps.sort_unstable_by(|a, b| b.cmp(a));
    let mut cuts: Vec<usize> = gaps.iter().take(k.saturating_sub(1)).map(|g| g.1).collect();
    cuts.sort_unstable();
    let mut ranges = Vec::new();
    let mut start = 0;
    for c in cuts.into_iter().chain(std::iter::once(v.len() - 1)) {
        ranges.push(format!("target.id BETWEEN {} AND {}", v[start], v[c]));
        start = c + 1;
    }
    Ok(format!("({})", ranges.join(" OR ")))
}

async fn floor(path: &Path, target: &Path, ranges: usize) -> anyhow::Result<Value> {
    let s = load_state(path)?;
    let started = Instant::now();
    let source = read_changes(path, &s).await?;
    let read_s = started.elapsed().as_secs_f64();
    let rows = source.num_rows();
    let columns: Vec<String> = source
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != "_op")
        .collect();
    let predicate = if ranges > 0 {
        format!("target.id = source.id AND {}", key_ranges(&source, ranges)?)
    } else {
        "target.id = source.id".to_owned()
    };
    let table = open(&dir_url(target)?).await?;
    let ctx = session();
    let df = ctx.read_batch(source)?;
    let q = |c: &str| format!("source.\"{c}\"");
    let set = columns.clone();
    let (_, metrics) = table
        .merge(df, predicate)
        .with_source_alias("source")
        .with_target_alias("target")
        .when_matched_delete(|d| d.predicate("source._op = 'd'"))?
        .when_matched_update(|u| {
            columns
                .iter()
                .fold(u.predicate("source._op <> 'd'"), |u, c| {
                    u.update(c.as_str(), q(c))
                })
        })?
        .when_not_matched_insert(|i| {
            set.iter().fold(i.predicate("source._op <> 'd'"), |i, c| {
                i.set(c.as_str(), q(c))
            })
        })?
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let (peak, _) = memory_kib();
    Ok(json!({
        "seconds": seconds,
        "read_seconds": read_s,
        "merge_seconds": seconds - read_s,
        "rows": rows,
        "peak_rss_kib": peak,
        "cpu_seconds": cpu_seconds(),
        "merge": serde_json::to_value(&metrics)?,
    }))
}

/// Resets this process's peak RSS (VmHWM) to its current RSS.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn batch_bytes(b: &RecordBatch) -> usize {
    b.columns().iter().map(|c| c.get_array_memory_size()).sum()
}

async fn profile(path: &Path, window: i64) -> anyhow::Result<Value> {
    use wal2delta_lake::deltalake::arrow::compute::filter_record_batch;
    use wal2delta_lake::deltalake::kernel::schema::cast::cast_record_batch;
    use wal2delta_lake::silver::{fold, plan, BronzeRows, Pieces};
    let lake = lake_of(path)?;
    let table = SilverTable::new(&lake, synth::SCHEMA, synth::TABLE, window);
    let progress = table.progress().await?;
    let (top, counts) = transaction_counts(&lake, progress.watermark).await?;
    let counts = counts
        .get(synth::TABLE_NAME)
        .cloned()
        .unwrap_or(TransactionCounts {
            top,
            events: Default::default(),
            resolved: Default::default(),
        });
    let mut phases = serde_json::Map::new();
    let mut record = |name: &str, t: Instant, bytes: usize| {
        let (hwm, rss) = memory_kib();
        phases.insert(
            name.into(),
            json!({"seconds": t.elapsed().as_secs_f64(), "peak_rss_kib": hwm, "rss_kib": rss, "batch_bytes": bytes}),
        );
    };
    let (_, base) = memory_kib();
    // The Bronze read, as SilverTable::read_bronze runs it.
    reset_peak();
    let t = Instant::now();
    let bronze = open(&dir_url(
        &path.join("bronze").join(synth::SCHEMA).join(synth::TABLE),
    )?)
    .await?;
    let mut ranges: Vec<String> = progress
        .cursors
        .iter()
        .map(|(p, c)| {
            format!(
                "(kafka_partition = {p} AND kafka_offset > {c} AND kafka_offset <= {})",
                c + window
            )
        })
        .collect();
    let known: Vec<String> = progress.cursors.keys().map(i32::to_string).collect();
    ranges.push(if known.is_empty() {
        format!("kafka_offset < {window}")
    } else {
        format!(
            "(kafka_partition NOT IN ({}) AND kafka_offset < {window})",
            known.join(", ")
        )
    });
    let ctx = session();
    ctx.register_table("t", bronze.table_provider().await?)?;
    let sql = format!(
        "SELECT \"op\", \"before\", \"after\", \"key\", \"commit_lsn\", \"ordinal\", \"commit_ts\", \
         \"unchanged_toast_columns\", \"kafka_partition\", \"kafka_offset\" FROM t WHERE {} \
         ORDER BY kafka_partition, kafka_offset",
        ranges.join(" OR ")
    );
    let batches = ctx.sql(&sql).await?.collect().await?;
    // DataFusion hands out text views; Silver casts them back to the table's types.
    let table_schema = bronze.snapshot()?.snapshot().arrow_schema();
    let plain = std::sync::Arc::new(Schema::new(
        batches
            .first()
            .context("nothing to read")?
            .schema()
            .fields()
            .iter()
            .map(|f| table_schema.field_with_name(f.name()).cloned())
            .collect::<Result<Vec<_>, _>>()?,
    ));
    let batches = batches
        .iter()
        .map(|b| cast_record_batch(b, plain.clone(), false, true))
        .collect::<Result<Vec<_>, _>>()?;
    let rows = concat_batches(&plain, &batches)?;
    drop(batches);
    record("read", t, batch_bytes(&rows));
    reset_peak();
    let t = Instant::now();
    let planned = plan(&BronzeRows::new(&rows)?, &progress, &counts, Pieces::NEVER)?;
    let applicable = filter_record_batch(&rows, &planned.applicable)?;
    record("plan", t, batch_bytes(&applicable));
    reset_peak();
    let t = Instant::now();
    let folded = fold(&BronzeRows::new(&applicable)?, progress.truncated)?;
    let folded_bytes = folded.rows.as_ref().map_or(0, batch_bytes);
    record("fold", t, folded_bytes);
    Ok(json!({
        "rows": rows.num_rows(),
        "folded": folded.rows.as_ref().map_or(0, RecordBatch::num_rows),
        "base_rss_kib": base,
        "phases": phases,
    }))
}

async fn aggregates(dir: &Path) -> anyhow::Result<Vec<String>> {
    let t = open(&dir_url(dir)?).await?;
    let ctx = session();
    ctx.register_table("s", t.table_provider().await?)?;
    let batches = ctx
        .sql(
            "SELECT count(*) AS n, count(DISTINCT id) AS keys, sum(id) AS ids, \
             sum(_commit_lsn) AS lsns, sum(_ordinal) AS ordinals, \
             sum(character_length(note)) AS notes, sum(character_length(status)) AS statuses, \
             sum(CAST(CAST(amount AS DECIMAL(18, 2)) * 100 AS BIGINT)) AS cents, sum(account_id) AS accounts FROM s",
        )
        .await?
        .collect()
        .await?;
    let b = batches.first().context("no aggregate row")?;
    Ok((0..b.num_columns())
        .map(|i| {
            let name = b.schema().field(i).name().clone();
            let v = wal2delta_lake::deltalake::arrow::util::display::array_value_to_string(
                b.column(i),
                0,
            )
            .unwrap_or_default();
            format!("{name}={v}")
        })
        .collect())
}

async fn sums(path: &Path, table: Option<&Path>) -> anyhow::Result<Value> {
    let s = load_state(path)?;
    let sums = aggregates(&table.map_or_else(|| silver_dir(path), Path::to_owned)).await?;
    if table.is_none()
        && (sums.first() != Some(&format!("n={}", s.rows))
            || !sums.contains(&format!("keys={}", s.rows)))
    {
        bail!("Silver should hold {} rows, one per key: {sums:?}", s.rows);
    }
    Ok(json!(sums))
}

async fn layout(path: &Path, target_bytes: u64, order_by: &[String]) -> anyhow::Result<Value> {
    let url = dir_url(&silver_dir(path))?;
    let started = Instant::now();
    let report =
        wal2delta_lake::maintenance::rewrite_ordered("silver", &url, target_bytes, order_by)
            .await?;
    let table = open(&url).await?;
    let sizes: Vec<i64> = table
        .snapshot()?
        .log_data()
        .iter()
        .map(|f| f.size())
        .collect();
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "files_removed": report.files_removed,
        "files": sizes.len(),
        "mean_file_mib": sizes.iter().sum::<i64>() as f64 / sizes.len().max(1) as f64 / 1048576.0,
    }))
}

async fn vacuum(path: &Path) -> anyhow::Result<Value> {
    let mut removed = 0;
    let tombstones = path
        .join("silver")
        .join(wal2delta_lake::INTERNAL_SCHEMA)
        .join("tombstones")
        .join(synth::SCHEMA)
        .join(synth::TABLE);
    for dir in [silver_dir(path), tombstones] {
        if !dir.join("_delta_log").is_dir() {
            continue;
        }
        let (_, metrics) = open(&dir_url(&dir)?)
            .await?
            .vacuum()
            .with_retention_period(chrono::Duration::zero())
            .with_enforce_retention_duration(false)
            .await?;
        removed += metrics.files_deleted.len();
    }
    Ok(json!({ "files_deleted": removed }))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::RulesFile {
        rules,
        table,
        lookups,
        merchants,
    } = &cli.command
    {
        print!("{}", rules::rules_file(*rules, table, *lookups, merchants));
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let out = runtime.block_on(async {
        match cli.command {
            Command::Snapshot {
                lake,
                rows,
                partitions,
                commit_events,
            } => snapshot(&lake, rows, partitions, commit_events).await,
            Command::Changes {
                lake,
                changes: n,
                seed,
                deletes_per_mille,
                inserts_per_mille,
                tx_events,
                commit_events,
                keys,
                recent,
            } => {
                changes(
                    &lake,
                    n,
                    seed,
                    deletes_per_mille,
                    inserts_per_mille,
                    tx_events,
                    commit_events,
                    &keys,
                    recent,
                )
                .await
            }
            Command::Layout {
                lake,
                target_bytes,
                order_by,
            } => layout(&lake, target_bytes, &order_by).await,
            Command::Apply {
                lake,
                window,
                rules,
                hits_interval_ms,
                atomic_limit,
            } => {
                apply(
                    &lake,
                    window,
                    rules,
                    Duration::from_millis(hits_interval_ms),
                    atomic_limit,
                )
                .await
            }
            Command::RulesEval { lake, rules, rows } => rules::eval(&lake, rules, rows).await,
            Command::RulesBackfill { lake, rules } => rules::backfill(&lake, rules).await,
            Command::Floor {
                lake,
                target,
                key_ranges,
            } => floor(&lake, &target, key_ranges).await,
            Command::Profile { lake, window } => profile(&lake, window).await,
            Command::Sums { lake, table } => sums(&lake, table.as_deref()).await,
            Command::Vacuum { lake } => vacuum(&lake).await,
            Command::RulesFile { .. } => bail!("rules-file runs before the runtime starts"),
        }
    })?;
    println!("{out}");
    Ok(())
}
