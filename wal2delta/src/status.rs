//! `wal2delta status`: the slot's health, snapshot progress, Bronze lag, Silver
//! watermarks, open quarantine records and, when the daemon answers on `[metrics] listen`,
//! each stage's state (`/readyz`).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wal2delta_cdc::slot::{self, SlotInfo};
use wal2delta_cdc::source;
use wal2delta_model::Lsn;
use wal2delta_stream::snapshots::SnapshotProgress;

use crate::bronze::lag::TableLag;
use crate::commands::with_hint;
use crate::config::Config;
use crate::{health, quarantine};

/// Everything `status` reports, gathered once.
struct Report {
    slot: String,
    /// `None` when the slot does not exist.
    info: Option<SlotInfo>,
    wal_rate: Option<f64>,
    snapshots: Result<HashMap<String, SnapshotProgress>, String>,
    bronze: Result<Vec<TableLag>, String>,
    silver: Result<Vec<(String, Option<SilverPosition>)>, String>,
    /// Open Bronze quarantine records by table: (id, commit LSN).
    held: BTreeMap<String, Vec<(String, Option<i64>)>>,
    quarantine: Result<BTreeMap<String, u64>, String>,
    /// The daemon's `/readyz` document, or why it could not be read.
    daemon: Result<Value, String>,
    /// The early filter's counters per table, from the daemon's `/metrics`.
    filter: Result<BTreeMap<String, FilterCounts>, String>,
}

/// The early filter of one table since the daemon started: events in, events out, and
/// the reduction factor (in ÷ out; `None` until an event passed).
#[derive(Debug, Default, Clone, PartialEq)]
struct FilterCounts {
    events_in: f64,
    events_out: f64,
    reduction: Option<f64>,
}

impl Report {
    /// Bytes between a Silver watermark and the slot's confirmed position.
    fn behind(&self, watermark: i64) -> Option<i64> {
        self.info
            .as_ref()
            .and_then(|i| i.confirmed_flush)
            .map(|c| (c.0 as i64 - watermark).max(0))
    }

    /// The open Bronze quarantine records that hold `table`'s watermark at `watermark`.
    fn held_for(&self, table: &str, watermark: i64) -> Vec<(String, Option<i64>)> {
        self.held
            .get(table)
            .map(|v| {
                v.iter()
                    .filter(|(_, l)| l.is_none_or(|l| l > watermark))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub async fn run(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let report = gather(config).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&to_json(&report))?);
    } else {
        print!("{}", to_text(&report));
    }
    // A lost or missing slot is an emergency: say so in the exit code too.
    Ok(if report.info.as_ref().is_none_or(SlotInfo::is_lost) {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

async fn gather(config: &Config) -> anyhow::Result<Report> {
    let dsn = config.source.effective_dsn()?;
    let client = source::connect(&dsn).await.map_err(with_hint)?;
    // Two samples a second apart give the current WAL rate for the time-to-invalidation.
    let mut rate = slot::WalRate::default();
    let mut wal_rate = None;
    let mut info = slot::slot_info(&client, &config.source.slot).await?;
    if let Some(first) = &info {
        rate.sample(Instant::now(), first.current_wal);
        tokio::time::sleep(Duration::from_secs(1)).await;
        info = slot::slot_info(&client, &config.source.slot).await?;
        wal_rate = info
            .as_ref()
            .and_then(|i| rate.sample(Instant::now(), i.current_wal));
    }
    Ok(Report {
        slot: config.source.slot.clone(),
        info,
        wal_rate,
        snapshots: snapshot_progress(config).await,
        bronze: crate::bronze::lag::lag(config).await,
        silver: silver_positions(config).await,
        held: held_by_bronze_quarantine(config).await,
        quarantine: quarantine_counts(config).await,
        daemon: daemon_stages(config.metrics.local_address()).await,
        filter: match &config.rules.filter_topic {
            Some(_) => daemon_metrics(config.metrics.local_address())
                .await
                .map(|text| filter_counts(&text)),
            None => Ok(BTreeMap::new()),
        },
    })
}

/// The running daemon's `/metrics` text (the early filter's counters live only there:
/// they count what this process published, since it started).
async fn daemon_metrics(addr: SocketAddr) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .map_err(|e| e.to_string())?;
    let answer = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .map_err(|_| format!("no daemon answers on {addr} ([metrics] listen)"))?;
    answer.text().await.map_err(|e| e.to_string())
}

/// The early filter's counters per table in Prometheus text.
fn filter_counts(text: &str) -> BTreeMap<String, FilterCounts> {
    use crate::metrics as m;
    let mut out = BTreeMap::<String, FilterCounts>::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(table) = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("table=\""))
            .and_then(|t| t.split('"').next())
        else {
            continue;
        };
        let entry = out.entry(table.to_owned()).or_default();
        match name {
            n if n == m::RULES_FILTER_EVENTS_IN => entry.events_in = value,
            n if n == m::RULES_FILTER_EVENTS_OUT => entry.events_out = value,
            n if n == m::RULES_FILTER_REDUCTION => entry.reduction = Some(value),
            _ => {}
        }
    }
    out.retain(|_, c| c.events_in > 0.0 || c.events_out > 0.0);
    out
}

/// The running daemon's `/readyz` document, asked at `addr`
/// ([`crate::config::MetricsConfig::local_address`]).
async fn daemon_stages(addr: SocketAddr) -> Result<Value, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .map_err(|e| e.to_string())?;
    let answer = client
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .map_err(|_| format!("no daemon answers on {addr} ([metrics] listen): not running, or listening elsewhere"))?;
    answer
        .json::<Value>()
        .await
        .map_err(|e| format!("the daemon on {addr} answered /readyz with no JSON: {e}"))
}

fn or_error<T>(r: &Result<T, String>, ok: impl FnOnce(&T) -> Value) -> Value {
    match r {
        Ok(v) => ok(v),
        Err(e) => json!({ "error": e }),
    }
}

fn lsn_text(l: i64) -> String {
    Lsn(l as u64).to_string()
}

/// What a missing slot means, for both outputs.
const MISSING: &str = "the replication slot does not exist: on a first start run `wal2delta setup`; if wal2delta ran before, it was dropped (the daemon's stages below say what capture did about it)";

fn to_json(r: &Report) -> Value {
    let mut doc = match &r.info {
        Some(info) => health::to_json(info, r.wal_rate),
        None => json!({
            "slot": { "name": r.slot, "missing": true, "reason": MISSING },
            "stages": {},
        }),
    };
    doc["stages"]["snapshot"] = health::snapshot_json(&r.snapshots);
    doc["stages"]["bronze"] = or_error(&r.bronze, |tables| json!({ "tables": tables }));
    doc["stages"]["silver"] = or_error(&r.silver, |tables| {
        let tables: Vec<Value> = tables
            .iter()
            .map(|(t, w)| match w {
                Some((w, partial)) => silver_table_json(r, t, *w, *partial),
                None => json!({ "table": t, "not_in_silver": KEYLESS }),
            })
            .collect();
        json!({ "tables": tables })
    });
    doc["quarantine"] = or_error(&r.quarantine, |counts| json!(counts));
    doc["daemon"] = or_error(&r.daemon, Value::clone);
    doc["stages"]["rules"]["filter"] = or_error(&r.filter, |tables| {
        let tables: serde_json::Map<String, Value> = tables
            .iter()
            .map(|(t, c)| {
                (
                    t.clone(),
                    json!({ "events_in": c.events_in, "events_out": c.events_out, "reduction": c.reduction }),
                )
            })
            .collect();
        Value::Object(tables)
    });
    doc
}

fn silver_table_json(r: &Report, table: &str, watermark: i64, partial: Option<i64>) -> Value {
    let mut doc = json!({
        "table": table,
        "watermark_lsn": lsn_text(watermark),
        "lag_bytes": r.behind(watermark),
    });
    if let Some(l) = partial {
        doc["partial_transaction_lsn"] = json!(lsn_text(l));
        doc["partial_reason"] = json!(PARTIAL);
    }
    let held = r.held_for(table, watermark);
    if !held.is_empty() {
        let held: Vec<Value> = held
            .iter()
            .map(|(id, l)| json!({ "id": id, "commit_lsn": l.map(lsn_text) }))
            .collect();
        doc["held_by_quarantine"] = json!(held);
        doc["held_reason"] = json!(HELD);
    }
    doc
}

fn to_text(r: &Report) -> String {
    let mut out = match &r.info {
        Some(info) => health::to_text(info, r.wal_rate),
        None => format!("slot {}: MISSING: {MISSING}\n", r.slot),
    };
    out += &health::snapshot_text(&r.snapshots);
    out += &bronze_text(&r.bronze);
    out += &silver_text(r);
    out += &quarantine_text(&r.quarantine);
    out += &daemon_text(&r.daemon);
    out += &filter_text(&r.filter);
    out
}

/// The early filter per table (only with `[rules] filter_topic`).
fn filter_text(filter: &Result<BTreeMap<String, FilterCounts>, String>) -> String {
    let tables = match filter {
        Err(e) => return format!("rules filter: unknown ({e})\n"),
        Ok(t) if t.is_empty() => return String::new(),
        Ok(t) => t,
    };
    let mut out = String::from("rules filter (since the daemon started):\n");
    for (t, c) in tables {
        let reduction = c.reduction.map_or("no event passed yet".to_owned(), |r| {
            format!("reduction {r:.1}x")
        });
        out += &format!(
            "  {t}: {} events in, {} out, {reduction}\n",
            c.events_in, c.events_out
        );
    }
    out
}

fn bronze_text(bronze: &Result<Vec<TableLag>, String>) -> String {
    let tables = match bronze {
        Err(e) => return format!("bronze: unknown ({e})\n"),
        Ok(t) if t.is_empty() => return "bronze: no table topics yet\n".into(),
        Ok(t) => t,
    };
    let mut out = String::from("bronze:\n");
    for t in tables {
        out += &format!(
            "  {}: {} events behind Kafka (table version {}){}\n",
            t.table,
            t.lag_events,
            t.version.map_or("none".into(), |v| v.to_string()),
            if t.bronze_only {
                "; no primary key: kept in Bronze only (append-only history), not in Silver"
            } else {
                ""
            }
        );
        if let Some(s) = t.stalled_s {
            out += &format!("    STALLED: no Bronze commit for {s} s while events wait; is a bronze writer running, and does it hold partitions? (docs/bronze.md)\n");
        }
    }
    out
}

fn silver_text(r: &Report) -> String {
    let tables = match &r.silver {
        Err(e) => return format!("silver: unknown ({e})\n"),
        Ok(t) if t.is_empty() => return "silver: no tables yet\n".into(),
        Ok(t) => t,
    };
    let mut out = String::from("silver:\n");
    for (t, w) in tables {
        let Some((w, partial)) = *w else {
            out += &format!("  {t}: not in Silver ({KEYLESS})\n");
            continue;
        };
        let behind = r.behind(w).map_or(String::new(), |b| {
            format!(" ({b} bytes behind the slot's confirmed position)")
        });
        out += &format!("  {t}: watermark {}{behind}\n", lsn_text(w));
        if let Some(l) = partial {
            out += &format!("    PARTIAL: transaction {}: {PARTIAL}\n", lsn_text(l));
        }
        let held = r.held_for(t, w);
        if !held.is_empty() {
            let ids: Vec<String> = held
                .iter()
                .map(|(id, l)| match l {
                    Some(l) => format!("{id} (commit LSN {})", lsn_text(*l)),
                    None => id.clone(),
                })
                .collect();
            out += &format!("    HELD: {HELD}; open: {}\n", ids.join(", "));
        }
    }
    out
}

fn quarantine_text(q: &Result<BTreeMap<String, u64>, String>) -> String {
    match q {
        Err(e) => format!("quarantine: unknown ({e})\n"),
        Ok(counts) if counts.is_empty() => "quarantine: no open records\n".into(),
        Ok(counts) => {
            let mut out = String::from("quarantine (open records):\n");
            for (k, n) in counts {
                out += &format!("  {k}: {n}\n");
            }
            out
        }
    }
}

/// The daemon's stages as its `/readyz` reports them.
fn daemon_text(daemon: &Result<Value, String>) -> String {
    let doc = match daemon {
        Err(e) => return format!("daemon: {e}\n"),
        Ok(doc) => doc,
    };
    let mut out = match doc["reason"].as_str() {
        None => "daemon: ready\n".to_owned(),
        Some(reason) => format!("daemon: NOT READY: {reason}\n"),
    };
    if let Some(stages) = doc["stages"].as_object() {
        for (name, st) in stages {
            out += &format!("  {name}: {}", st["state"].as_str().unwrap_or("unknown"));
            if let Some(n) = st["failures"].as_u64().filter(|n| *n > 0) {
                out += &format!(", {n} failures in a row");
            }
            if let Some(e) = st["last_error"].as_str() {
                out += &format!(", last error: {e}");
            }
            if let Some(h) = st["hint"].as_str() {
                out += &format!(" (fix: {h})");
            }
            out += "\n";
            if let Some(tables) = st["failing_tables"].as_object() {
                for (t, f) in tables {
                    out += &format!(
                        "    table {t}: {} failures in a row: {}\n",
                        f["failures"],
                        f["last_error"].as_str().unwrap_or("")
                    );
                }
            }
        }
    }
    out
}

/// Why a table is not in Silver when its source table has no primary key.
pub const KEYLESS: &str = "no primary key: Bronze only (append-only history)";

/// Each Silver table's watermark (commit LSN), by `schema.table`; `None` for a table
/// without a primary key, which Silver does not hold.
async fn silver_positions(
    config: &Config,
) -> Result<Vec<(String, Option<SilverPosition>)>, String> {
    let lake = config.lake.open().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (schema, table, url) in lake.bronze_tables().await.map_err(|e| e.to_string())? {
        let name = format!("{schema}.{table}");
        let has_key = wal2delta_lake::bronze::BronzeTable::has_key_at(&name, &url)
            .await
            .map_err(|e| e.to_string())?;
        if has_key == Some(false) {
            out.push((name, None));
            continue;
        }
        let t = wal2delta_lake::silver::SilverTable::new(&lake, &schema, &table, 1);
        let p = t.progress().await.map_err(|e| e.to_string())?;
        out.push((name, Some((p.watermark, p.partial))));
    }
    Ok(out)
}

/// A Silver table's watermark, and the transaction it applies in pieces, if any.
type SilverPosition = (i64, Option<i64>);

/// What a Silver table applying a transaction in pieces means for readers.
pub const PARTIAL: &str = "larger than [silver] max_atomic_transaction_rows, so applied in pieces: Silver shows it partly applied until its last piece commits (docs/silver.md)";

/// Why a Silver table's watermark holds while Bronze quarantine records of its changes
/// are open.
pub const HELD: &str = "the watermark waits for events Bronze quarantined (their transaction's END record counts them); fix the cause (`wal2delta quarantine show ID`), then `wal2delta quarantine resolve ID` lets Silver pass the transaction without them";

/// Open Bronze quarantine records by table, with the commit LSN of their change when
/// known. Empty when the quarantine cannot be read (the quarantine section says why).
async fn held_by_bronze_quarantine(
    config: &Config,
) -> BTreeMap<String, Vec<(String, Option<i64>)>> {
    let mut out = BTreeMap::<String, Vec<_>>::new();
    let Ok(lake) = config.lake.open() else {
        return out;
    };
    let Ok(records) = quarantine::open_records(&lake).await else {
        return out;
    };
    for r in records {
        if r.stage != wal2delta_quarantine::Stage::Bronze {
            continue;
        }
        if let Some(t) = r.table {
            out.entry(t).or_default().push((r.id, r.commit_lsn));
        }
    }
    out
}

/// Open quarantine records (no resolution yet) by `stage/reason_code`.
async fn quarantine_counts(config: &Config) -> Result<BTreeMap<String, u64>, String> {
    let lake = config.lake.open().map_err(|e| e.to_string())?;
    let records = quarantine::open_records(&lake)
        .await
        .map_err(|e| e.to_string())?;
    let mut counts = BTreeMap::new();
    for r in records {
        *counts
            .entry(format!("{}/{}", r.stage.as_str(), r.reason_code))
            .or_insert(0) += 1;
    }
    Ok(counts)
}

/// Snapshot progress from Kafka; `Err` with the reason when it cannot be read.
pub async fn snapshot_progress(
    config: &Config,
) -> Result<HashMap<String, SnapshotProgress>, String> {
    let (kafka, topic, slot) = (
        config.kafka.connection().map_err(|e| e.to_string())?,
        config.kafka.snapshots_topic(),
        config.source.slot.clone(),
    );
    let read = tokio::task::spawn_blocking(move || {
        wal2delta_stream::snapshots::load(&kafka, &topic, &slot)
    });
    match tokio::time::timeout(Duration::from_secs(20), read).await {
        Ok(Ok(Ok(p))) => Ok(p),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("Kafka did not answer within 20 s".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_counters_are_read_from_the_metrics_text() {
        let text = "# TYPE wal2delta_rules_filter_events_in_total counter\n\
            wal2delta_rules_filter_events_in_total{table=\"s.t\"} 12\n\
            wal2delta_rules_filter_events_out_total{table=\"s.t\"} 3\n\
            wal2delta_rules_filter_reduction{table=\"s.t\"} 4\n\
            wal2delta_rules_evaluations_total{table=\"s.t\"} 99\n\
            wal2delta_rules_filter_events_in_total{table=\"s.u\"} 5\n";
        let c = filter_counts(text);
        assert_eq!(
            c["s.t"],
            FilterCounts {
                events_in: 12.0,
                events_out: 3.0,
                reduction: Some(4.0)
            }
        );
        assert_eq!(c["s.u"].events_out, 0.0);
        assert_eq!(c["s.u"].reduction, None);
        assert!(filter_text(&Ok(c)).contains("s.t: 12 events in, 3 out, reduction 4.0x"));
    }
}
