//! `wal2delta quarantine list|show|replay|resolve`: the quarantine table, for operators.
//!
//! `replay` re-drives open Silver records (rows that failed a quality check): the row is
//! read again from Bronze by its coordinates, checked with the current checks and, when it
//! passes, merged into Silver like any change (it enters only if nothing newer of its key
//! is there). `resolve` closes a record by hand. Both append to `quarantine/resolutions`.
//!
//! Records hold raw payloads (which may be sensitive): `show` prints them to the operator's
//! terminal on request and nothing here logs them.

use std::process::ExitCode;

use anyhow::{anyhow, Result};
use wal2delta_cdc::value::render_text;
use wal2delta_lake::quarantine::{QuarantineTable, Resolution, Resolutions};
use wal2delta_lake::silver::Redrive;
use wal2delta_lake::Lake;
use wal2delta_model::{BaseType, ColumnType, Datum, Special, TypeKind};
use wal2delta_quarantine::{QuarantineRecord, Stage};

use crate::config::Config;

/// The lake of `config`, an error naming `[lake] uri` when it is not one.
pub(crate) fn lake(config: &Config) -> Result<Lake> {
    config.lake.open().map_err(|e| anyhow!("{e} ([lake] uri)"))
}

/// The records no resolution names yet.
pub async fn open_records(lake: &Lake) -> Result<Vec<QuarantineRecord>, wal2delta_lake::LakeError> {
    let records = QuarantineTable::new(lake.quarantine_records())
        .read_all()
        .await?;
    let resolved = Resolutions::new(lake.quarantine_resolutions())
        .read()
        .await?;
    Ok(records
        .into_iter()
        .filter(|r| !resolved.contains_key(&r.id))
        .collect())
}

/// Open records per stage (`bronze`, `silver`).
pub async fn open_counts(
    lake: &Lake,
) -> Result<std::collections::BTreeMap<&'static str, u64>, wal2delta_lake::LakeError> {
    let mut out = std::collections::BTreeMap::new();
    for r in open_records(lake).await? {
        *out.entry(r.stage.as_str()).or_insert(0) += 1;
    }
    Ok(out)
}

async fn records(config: &Config) -> Result<Vec<QuarantineRecord>> {
    let lake = lake(config)?;
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

/// One line per record: id, stage, reason, table, time, and how it was resolved.
pub async fn list(config: &Config) -> Result<ExitCode> {
    let records = records(config).await?;
    let resolved = Resolutions::new(lake(config)?.quarantine_resolutions())
        .read()
        .await?;
    if records.is_empty() {
        println!("quarantine is empty");
        return Ok(ExitCode::SUCCESS);
    }
    for r in &records {
        println!(
            "{}  {}  {}{}  {}  {}  {}",
            r.id,
            r.stage.as_str(),
            r.reason_code,
            r.check
                .as_ref()
                .map_or(String::new(), |c| format!(" ({c})")),
            r.table.as_deref().unwrap_or("-"),
            time(r.quarantined_at_us),
            resolved.get(&r.id).map_or("open", String::as_str),
        );
    }
    let open = records
        .iter()
        .filter(|r| !resolved.contains_key(&r.id))
        .count();
    println!("{} records, {open} open", records.len());
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
        "commit_lsn": r.commit_lsn,
        "ordinal": r.ordinal,
        "quarantined_at": time(r.quarantined_at_us),
        "check": r.check,
        "key_hex": hex(&r.key),
        "raw_hex": hex(&r.raw),
    });
    let mut doc = doc;
    // Silver records hold the (masked) row and key as JSON text.
    if r.stage == Stage::Silver {
        let parse = |b: &Option<Vec<u8>>| {
            b.as_ref()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
        };
        doc["key"] = parse(&r.key).into();
        doc["row"] = parse(&r.raw).into();
    }
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(ExitCode::SUCCESS)
}

/// `quarantine replay [ID]`: re-drives the open Silver record ID, or every open one.
pub async fn replay(config: &Config, id: Option<&str>) -> Result<ExitCode> {
    let lake = lake(config)?;
    let resolutions = Resolutions::new(lake.quarantine_resolutions());
    let resolved = resolutions.read().await?;
    let records = records(config).await?;
    let chosen: Vec<&QuarantineRecord> = match id {
        Some(id) => {
            let Some(r) = records.iter().find(|r| r.id == id) else {
                eprintln!("wal2delta: no quarantine record {id:?} (`wal2delta quarantine list` shows the ids)");
                return Ok(ExitCode::from(1));
            };
            if r.stage != Stage::Silver {
                eprintln!(
                    "wal2delta: record {id:?} is a {} record: only Silver records (rows that failed a check) can be replayed; Bronze records are events that could not be decoded, fix the cause and resolve them with `wal2delta quarantine resolve`",
                    r.stage.as_str()
                );
                return Ok(ExitCode::from(1));
            }
            if let Some(how) = resolved.get(id) {
                println!("{id}: already {how}");
                return Ok(ExitCode::SUCCESS);
            }
            vec![r]
        }
        None => records
            .iter()
            .filter(|r| r.stage == Stage::Silver && !resolved.contains_key(&r.id))
            .collect(),
    };
    let policies = crate::policies::silver(config).await?;
    let mut tables = std::collections::HashMap::new();
    let (mut done, mut failing) = (Vec::new(), 0usize);
    for r in chosen {
        let (Some(table), Some(p), Some(o)) = (r.table.as_deref(), r.partition, r.offset) else {
            println!(
                "{}: has no table or Bronze coordinates; resolve it by hand",
                r.id
            );
            failing += 1;
            continue;
        };
        let Some((schema, name)) = table.split_once('.') else {
            println!("{}: table name {table:?} is not schema.table", r.id);
            failing += 1;
            continue;
        };
        if !tables.contains_key(table) {
            tables.insert(
                table.to_owned(),
                crate::silver::silver_table(config, &policies, &lake, schema, name),
            );
        }
        let silver = tables.get_mut(table).expect("inserted above");
        match silver.redrive(p, o).await? {
            Redrive::Applied => {
                println!("{}: passed the checks and entered Silver", r.id);
                done.push((r.id.clone(), Resolution::Replayed));
            }
            Redrive::Superseded => {
                println!(
                    "{}: passed the checks; a newer change of the key is already in Silver",
                    r.id
                );
                done.push((r.id.clone(), Resolution::Superseded));
            }
            Redrive::StillFails(why) => {
                println!("{}: still fails: {why}", r.id);
                failing += 1;
            }
            Redrive::NotInBronze => {
                println!(
                    "{}: Bronze no longer holds the row; resolve it by hand",
                    r.id
                );
                failing += 1;
            }
        }
    }
    resolutions.record(&done).await?;
    println!("{} re-driven, {failing} still open", done.len());
    Ok(if failing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `quarantine resolve ID`: closes a record by hand.
pub async fn resolve(config: &Config, id: &str) -> Result<ExitCode> {
    let records = records(config).await?;
    if !records.iter().any(|r| r.id == id) {
        eprintln!(
            "wal2delta: no quarantine record {id:?} (`wal2delta quarantine list` shows the ids)"
        );
        return Ok(ExitCode::from(1));
    }
    Resolutions::new(lake(config)?.quarantine_resolutions())
        .record(&[(id.to_owned(), Resolution::Resolved)])
        .await?;
    println!("{id}: resolved");
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
