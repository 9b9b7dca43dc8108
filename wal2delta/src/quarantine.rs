//! `wal2delta quarantine list|show`: the quarantine table, for operators.
//!
//! Records hold raw payloads (which may be sensitive): `show` prints them to the operator's
//! terminal on request and nothing here logs them.

use std::process::ExitCode;

use anyhow::{anyhow, Result};
use wal2delta_cdc::value::render_text;
use wal2delta_lake::quarantine::QuarantineTable;
use wal2delta_lake::Lake;
use wal2delta_model::{BaseType, ColumnType, Datum, Special, TypeKind};
use wal2delta_quarantine::QuarantineRecord;

use crate::config::Config;

async fn records(config: &Config) -> Result<Vec<QuarantineRecord>> {
    let lake = Lake::new(&config.lake.uri).map_err(|e| anyhow!("{e} ([lake] uri)"))?;
    let mut table = QuarantineTable::new(lake.quarantine_records());
    let mut records = table.read_all().await?;
    records.sort_by(|a, b| {
        a.quarantined_at_us
            .cmp(&b.quarantined_at_us)
            .then(a.id.cmp(&b.id))
    });
    Ok(records)
}

/// A quarantine time as PostgreSQL prints a `timestamptz` in UTC.
fn time(us: i64) -> String {
    let ty = ColumnType {
        oid: 1184,
        typmod: -1,
        name: "timestamp with time zone".into(),
        kind: TypeKind::Base(BaseType::TimestampTz),
    };
    render_text(&ty, &Datum::TimestampTz(Special::Value(us)))
}

/// One line per record: id, stage, reason, table, time.
pub async fn list(config: &Config) -> Result<ExitCode> {
    let records = records(config).await?;
    if records.is_empty() {
        println!("quarantine is empty");
        return Ok(ExitCode::SUCCESS);
    }
    for r in &records {
        println!(
            "{}  {}  {}  {}  {}",
            r.id,
            r.stage.as_str(),
            r.reason_code,
            r.table.as_deref().unwrap_or("-"),
            time(r.quarantined_at_us)
        );
    }
    println!("{} records", records.len());
    Ok(ExitCode::SUCCESS)
}

/// One record in full, as JSON (bytes as hex).
pub async fn show(config: &Config, id: &str) -> Result<ExitCode> {
    let records = records(config).await?;
    let Some(r) = records.iter().find(|r| r.id == id) else {
        eprintln!(
            "wal2delta: no quarantine record {id:?} (`wal2delta quarantine list` shows the ids)"
        );
        return Ok(ExitCode::from(1));
    };
    let hex = |b: &Option<Vec<u8>>| {
        b.as_ref()
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>())
    };
    let doc = serde_json::json!({
        "id": r.id,
        "stage": r.stage.as_str(),
        "reason_code": r.reason_code,
        "detail": r.detail,
        "table": r.table,
        "kafka_topic": r.topic,
        "kafka_partition": r.partition,
        "kafka_offset": r.offset,
        "source_lsn": r.source_lsn,
        "quarantined_at": time(r.quarantined_at_us),
        "key_hex": hex(&r.key),
        "raw_hex": hex(&r.raw),
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_printed_like_postgresql_timestamptz_in_utc() {
        assert_eq!(super::time(0), "1970-01-01 00:00:00+00");
        assert_eq!(
            super::time(1_700_000_000_123_456),
            "2023-11-14 22:13:20.123456+00"
        );
        assert_eq!(super::time(951_782_400_000_000), "2000-02-29 00:00:00+00");
    }
}
