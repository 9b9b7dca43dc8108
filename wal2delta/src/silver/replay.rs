//! `wal2delta replay --layer silver [--table T]`: rebuilds Silver tables from Bronze alone
//! (`wal2delta_lake::silver` rebuild), without touching the source.

use std::process::ExitCode;

use anyhow::{anyhow, Result};

use crate::config::Config;

/// Whether `want` names the Bronze table `schema.table` (identity parts): by its source
/// name (`public.Order Items`) or by its identity (`public.-4frder-20-49tems`).
fn names_table(want: &str, schema: &str, table: &str) -> bool {
    let ident = format!("{schema}.{table}");
    want == ident
        || wal2delta_model::TableName::from_ident(&ident).is_some_and(|t| t.to_string() == want)
}

pub async fn run(config: &Config, table: Option<&str>) -> Result<ExitCode> {
    let lake = config
        .lake
        .open_for_writing()
        .await
        .map_err(|e| anyhow!("{e} ([lake] uri)"))?;
    let tables: Vec<(String, String)> = lake
        .bronze_tables()
        .await?
        .into_iter()
        .map(|(s, t, _)| (s, t))
        .filter(|(s, t)| table.is_none_or(|want| names_table(want, s, t)))
        .collect();
    if tables.is_empty() {
        eprintln!(
            "wal2delta: {}",
            match table {
                Some(t) => format!("Bronze has no table {t:?} (name it as schema.table; `wal2delta status` lists the Bronze tables)"),
                None => "Bronze has no tables yet: nothing to replay".into(),
            }
        );
        return Ok(ExitCode::from(1));
    }
    let policies = crate::policies::silver(config).await?;
    for (schema, name) in tables {
        let mut silver = crate::silver::silver_table(config, &policies, &lake, &schema, &name);
        let started = std::time::Instant::now();
        let r = silver.rebuild(&lake, &schema, &name).await?;
        println!(
            "{schema}.{name}: rebuilt from {} Bronze rows into {} rows (version {}), watermark {}, {} waiting transactions, {} rows newly quarantined, {:.1} s",
            r.read,
            r.rows,
            r.version.map_or("none".into(), |v| v.to_string()),
            wal2delta_model::Lsn(r.watermark as u64),
            r.waiting,
            r.quarantined,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}
