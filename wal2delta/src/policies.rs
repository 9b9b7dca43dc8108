//! Checking the config's policies (`[silver.mask]`, `[[silver.checks]]`, `[tokenize]`)
//! against the source's catalog at startup.
//!
//! Policies name real (source) tables and columns. A name that matches nothing — a typo, a
//! column spelled as Silver spells it, a table not created yet — would silently leave
//! values raw, so it stops the start with an error naming the entry. The catalog is read
//! only when some policy is configured; only table and column names are read.

use std::collections::BTreeMap;

use anyhow::anyhow;
use wal2delta_cdc::{catalog::published_columns, source};
use wal2delta_model::TableName;

use crate::config::{Config, Policies};

/// The published tables with their column names, in the order capture sends them.
pub async fn source_catalog(config: &Config) -> anyhow::Result<BTreeMap<TableName, Vec<String>>> {
    let dsn = config.source.effective_dsn()?;
    let with_hint = |e: wal2delta_cdc::CdcError| match e.hint() {
        Some(h) => anyhow!("{e} (hint: {h})"),
        None => anyhow!(e),
    };
    let client = source::connect(&dsn).await.map_err(with_hint)?;
    published_columns(&client, &config.source.publication)
        .await
        .map_err(|e| {
            anyhow!(
                "cannot read the published tables' columns (to check the policies and models): {e}"
            )
        })
}

/// Silver's policies resolved against the source (no connection when none is configured).
pub async fn silver(config: &Config) -> anyhow::Result<Policies> {
    if !config.silver.has_policies() {
        return Ok(Policies::default());
    }
    let catalog = source_catalog(config).await?;
    Ok(config.silver.resolve(&catalog)?)
}

/// At daemon start: checks `[tokenize]` when capture runs and resolves Silver's policies
/// when the silver stage runs; errors name the entry at fault.
pub async fn at_startup(config: &Config, capture: bool, silver: bool) -> anyhow::Result<Policies> {
    let tokenize = capture && !config.tokenize.columns.is_empty();
    let exclude = capture
        && !(config.source.exclude_columns.is_empty() && config.source.include_columns.is_empty());
    let policies = silver && config.silver.has_policies();
    if !tokenize && !exclude && !policies {
        return Ok(Policies::default());
    }
    let catalog = source_catalog(config).await?;
    if tokenize {
        config.tokenize.check_names(&catalog)?;
    }
    if exclude {
        crate::config::check_column_names(
            "source.exclude_columns",
            &config.source.exclude_columns,
            &catalog,
        )?;
        crate::config::check_column_names(
            "source.include_columns",
            &config.source.include_columns,
            &catalog,
        )?;
    }
    Ok(if policies {
        config.silver.resolve(&catalog)?
    } else {
        Policies::default()
    })
}
