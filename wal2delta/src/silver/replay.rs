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
    let tables: Vec<(String, String, url::Url)> = lake
        .bronze_tables()
        .await?
        .into_iter()
        .filter(|(s, t, _)| table.is_none_or(|want| names_table(want, s, t)))
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
    let mut rebuilt = 0;
    for (schema, name, url) in tables {
        // Silver merges by primary key: a table without one is kept in Bronze only, as the
        // Silver stage does (it used to stop the whole replay here).
        let ident = format!("{schema}.{name}");
        if wal2delta_lake::bronze::BronzeTable::has_key_at(&ident, &url).await? == Some(false) {
            println!("{ident}: no primary key: kept in Bronze only (append-only history), not in Silver; skipped");
            continue;
        }
        rebuilt += 1;
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
    if rebuilt == 0 {
        eprintln!("wal2delta: no Silver table to rebuild: every table named has no primary key");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
