//! Slot health: exported as metrics by the daemon and printed by `wal2delta status`.

use std::time::Duration;

use serde_json::json;
use wal2delta_cdc::slot::SlotInfo;

use crate::metrics as m;

const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

/// Sets every slot gauge from one sample. `wal_rate` is the observed WAL bytes/s.
pub fn export(info: &SlotInfo, wal_rate: Option<f64>) {
    if let Some(lag) = info.lag_bytes() {
        metrics::gauge!(m::SLOT_LAG_BYTES).set(lag as f64);
    }
    if let Some(r) = info.retained_bytes() {
        metrics::gauge!(m::SLOT_RETAINED_BYTES).set(r as f64);
    }
    if let Some(s) = info.safe_wal_size {
        metrics::gauge!(m::SLOT_SAFE_WAL_SIZE_BYTES).set(s as f64);
    }
    if let Some(k) = info.max_slot_wal_keep_size {
        metrics::gauge!(m::SLOT_MAX_WAL_KEEP_SIZE_BYTES).set(k as f64);
    }
    metrics::gauge!(m::SLOT_LOST).set(if info.is_lost() { 1.0 } else { 0.0 });
    metrics::gauge!(m::SLOT_ACTIVE).set(if info.active { 1.0 } else { 0.0 });
    for status in WAL_STATUSES {
        let on = info.wal_status.as_deref() == Some(status);
        metrics::gauge!(m::SLOT_WAL_STATUS, "status" => status).set(if on { 1.0 } else { 0.0 });
    }
    if let Some(rate) = wal_rate {
        metrics::gauge!(m::SLOT_WAL_RATE_BYTES_PER_SECOND).set(rate);
        if let Some(t) = info.time_to_invalidation(rate) {
            metrics::gauge!(m::SLOT_SECONDS_TO_INVALIDATION).set(t.as_secs_f64());
        }
    }
    metrics::gauge!(m::SLOT_SPILL_BYTES).set(info.spill.spill_bytes as f64);
    metrics::gauge!(m::SLOT_SPILL_TRANSACTIONS).set(info.spill.spill_txns as f64);
    metrics::gauge!(m::SLOT_STREAM_BYTES).set(info.spill.stream_bytes as f64);
}

fn lsn_text(l: Option<wal2delta_model::Lsn>) -> Option<String> {
    l.map(|l| l.to_string())
}

/// The `status --json` document.
pub fn to_json(info: &SlotInfo, wal_rate: Option<f64>) -> serde_json::Value {
    let tti = wal_rate
        .and_then(|r| info.time_to_invalidation(r))
        .map(|d| d.as_secs_f64());
    json!({
        "slot": {
            "name": info.name,
            "active": info.active,
            "active_pid": info.active_pid,
            "walsender_state": info.walsender_state,
            "confirmed_flush_lsn": lsn_text(info.confirmed_flush),
            "restart_lsn": lsn_text(info.restart_lsn),
            "current_wal_lsn": info.current_wal.to_string(),
            "lag_bytes": info.lag_bytes(),
            "retained_bytes": info.retained_bytes(),
            "wal_status": info.wal_status,
            "safe_wal_size": info.safe_wal_size,
            "max_slot_wal_keep_size": info.max_slot_wal_keep_size,
            "wal_rate_bytes_per_second": wal_rate,
            "seconds_to_invalidation": tti,
            "spill": {
                "spill_txns": info.spill.spill_txns, "spill_count": info.spill.spill_count,
                "spill_bytes": info.spill.spill_bytes, "stream_txns": info.spill.stream_txns,
                "stream_bytes": info.spill.stream_bytes, "total_txns": info.spill.total_txns,
                "total_bytes": info.spill.total_bytes,
            },
        },
        "stages": {
            "capture": { "confirmed_lsn": lsn_text(info.confirmed_flush), "lag_bytes": info.lag_bytes() },
        },
    })
}

fn bytes(n: Option<i64>) -> String {
    match n {
        None => "unlimited".into(),
        Some(b) => human(b as f64),
    }
}

fn human(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v.abs() >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b:.0} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=172_799 => format!("{:.1} h", s as f64 / 3600.0),
        _ => format!("{:.1} days", s as f64 / 86_400.0),
    }
}

/// The human-readable `status` text.
pub fn to_text(info: &SlotInfo, wal_rate: Option<f64>) -> String {
    let lsn =
        |l: Option<wal2delta_model::Lsn>| l.map(|l| l.to_string()).unwrap_or_else(|| "-".into());
    let mut out = String::new();
    let state = match (&info.walsender_state, info.active) {
        (Some(s), _) => format!("active ({s})"),
        (None, true) => "active".into(),
        (None, false) => "inactive".into(),
    };
    out += &format!("slot {}: {state}\n", info.name);
    out += &format!(
        "  wal_status            {}\n",
        info.wal_status.as_deref().unwrap_or("-")
    );
    out += &format!("  confirmed flush lsn   {}\n", lsn(info.confirmed_flush));
    out += &format!("  restart lsn           {}\n", lsn(info.restart_lsn));
    out += &format!("  current wal lsn       {}\n", info.current_wal);
    out += &format!(
        "  lag (to confirmed)    {}\n",
        bytes(info.lag_bytes().map(|b| b as i64))
    );
    out += &format!(
        "  retained WAL          {}\n",
        bytes(info.retained_bytes().map(|b| b as i64))
    );
    out += &format!(
        "  max WAL keep size     {}\n",
        bytes(info.max_slot_wal_keep_size)
    );
    out += &format!("  safe_wal_size         {}\n", bytes(info.safe_wal_size));
    out += &format!(
        "  WAL rate              {}\n",
        wal_rate
            .map(|r| format!("{}/s", human(r)))
            .unwrap_or_else(|| "-".into())
    );
    out += &format!(
        "  time to invalidation  {}\n",
        match (
            info.safe_wal_size,
            wal_rate.and_then(|r| info.time_to_invalidation(r))
        ) {
            (None, _) => "never (max_slot_wal_keep_size unlimited)".to_owned(),
            (Some(_), Some(t)) => duration(t),
            (Some(_), None) => "not while no WAL is written".to_owned(),
        }
    );
    out += &format!(
        "  decoding spill        {} in {} txns; streamed {} in {} txns\n",
        human(info.spill.spill_bytes as f64),
        info.spill.spill_txns,
        human(info.spill.stream_bytes as f64),
        info.spill.stream_txns
    );
    out
}

type Snapshots = Result<
    std::collections::HashMap<String, wal2delta_stream::snapshots::SnapshotProgress>,
    String,
>;

/// Snapshot progress per table for `status --json`.
pub fn snapshot_json(snapshots: &Snapshots) -> serde_json::Value {
    match snapshots {
        Err(e) => json!({ "error": e }),
        Ok(map) => {
            let tables: serde_json::Map<String, serde_json::Value> = map
                .values()
                .map(|p| {
                    (p.table.clone(), json!({ "state": p.state, "rows_done": p.rows_done, "rows_estimate": p.rows_estimate }))
                })
                .collect();
            json!({ "tables": tables })
        }
    }
}

/// Snapshot progress per table for `status`.
pub fn snapshot_text(snapshots: &Snapshots) -> String {
    match snapshots {
        Err(e) => format!("snapshot progress unavailable: {e}\n"),
        Ok(map) if map.is_empty() => "snapshot: none recorded\n".to_owned(),
        Ok(map) => {
            let mut tables: Vec<_> = map.values().collect();
            tables.sort_by(|a, b| a.table.cmp(&b.table));
            let mut out = String::from("snapshot:\n");
            for p in tables {
                let pct = if p.rows_estimate > 0 && !p.is_done() {
                    format!(
                        " (~{:.0}%)",
                        100.0 * p.rows_done as f64 / p.rows_estimate as f64
                    )
                } else {
                    String::new()
                };
                out += &format!(
                    "  {:<40} {:<8} {} rows of ~{}{pct}\n",
                    p.table, p.state, p.rows_done, p.rows_estimate
                );
            }
            out
        }
    }
}
