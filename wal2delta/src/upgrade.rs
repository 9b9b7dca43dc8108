//! `wal2delta upgrade [--dry-run]`: migrates the lake's tables an earlier release wrote to
//! this binary's format, explicitly (docs/upgrading.md, "Format versions"). The stages
//! refuse such tables until then; they never migrate them on their own.

use std::process::ExitCode;

use anyhow::Result;
use wal2delta_lake::upgrade::{migrate, survey};
use wal2delta_model::format::{FormatCheck, LAKE_FORMAT};

use crate::config::Config;

/// Lists every table with its format and what the upgrade does to it; without `dry_run`,
/// does it. Exit 0 when every table is (now) current, 1 when a table cannot be migrated
/// by this binary (a newer or unreadable format).
pub async fn run(config: &Config, dry_run: bool) -> Result<ExitCode> {
    let lake = crate::quarantine::lake(config)?;
    let tables = survey(&lake).await?;
    println!(
        "lake {}: {} table(s); this binary writes lake format {LAKE_FORMAT}{}",
        lake.root(),
        tables.len(),
        if dry_run {
            " (dry run: nothing is changed)"
        } else {
            ""
        }
    );
    let (mut migrated, mut refused, mut pending) = (0, 0, 0);
    for t in &tables {
        println!("  {}: {}", t.path, t.plan());
        match t.check {
            FormatCheck::Current => {}
            FormatCheck::Older(_) if dry_run => pending += 1,
            FormatCheck::Older(_) => {
                if migrate(t).await? {
                    migrated += 1;
                    tracing::info!(table = %t.path, to = LAKE_FORMAT, "table migrated to the current lake format");
                }
            }
            FormatCheck::Newer(_) | FormatCheck::Unreadable => refused += 1,
        }
    }
    if dry_run {
        println!("would migrate {pending} table(s); run `wal2delta upgrade` to do it");
    } else {
        println!("migrated {migrated} table(s)");
    }
    if refused > 0 {
        println!(
            "{refused} table(s) cannot be used by this binary: run the release that wrote them (docs/upgrading.md)"
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
