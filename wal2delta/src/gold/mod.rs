//! The gold stage: every model of `[gold] models_dir` refreshed, in dependency order, when
//! its inputs changed (`wal2delta_lake::gold`), every `[gold] interval_ms`; and
//! `replay --layer gold`, which rebuilds the models from Silver.
//!
//! A model that fails (a division by zero in its SQL, an input being rewritten) is shown
//! on its own in the stage's status and retried after its own backoff; the models that
//! read it wait for it, the others go on.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use wal2delta_lake::gold::{GoldTable, Input, Model, Models, Refreshed};
use wal2delta_lake::{Lake, LakeError};
use wal2delta_model::TableName;

use crate::config::Config;
use crate::events::{GoldModelFailed, GoldModelLoaded, InternalEvent};
use crate::maintenance::{maintain_tables, Schedule};
use crate::metrics as m;
use crate::supervisor::{OperatorErrors, Supervisor, TableNext, TableRetries};

/// The models, checked against the captured tables (every Silver table a model names
/// must be published). An error names the model and what is wrong with it.
pub async fn load_models(config: &Config) -> anyhow::Result<Models> {
    let Some(dir) = &config.gold.models_dir else {
        anyhow::bail!("the gold stage needs [gold] models_dir: the directory of the model SQL files (docs/gold.md)");
    };
    let tables: BTreeSet<TableName> = crate::policies::source_catalog(config)
        .await?
        .into_keys()
        .collect();
    let models = Models::load(dir, &tables)?;
    tracing::info!(models = models.len(), dir = %dir.display(), "gold models loaded");
    Ok(models)
}

pub async fn run(
    config: &Config,
    models: Models,
    supervisor: Supervisor,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(lake) = supervisor
        .writable_lake(&config.lake, &mut shutdown)
        .await?
    else {
        return Ok(());
    };
    let every = Duration::from_millis(config.gold.interval_ms);
    // An operator error of a model is about its own SQL: the other models go on.
    let mut failing = TableRetries::new(OperatorErrors::HoldTheTable);
    for model in models.iter() {
        GoldModelLoaded { model: &model.name }.emit();
    }
    supervisor.started();
    tracing::info!("gold stage started");
    let mut maintenance = Schedule::every_s(config.gold.maintenance_interval_s);
    loop {
        let started = Instant::now();
        let mut failed_now: BTreeSet<String> = BTreeSet::new();
        for model in models.iter() {
            if failing.waiting(&model.name) {
                failed_now.insert(model.name.clone());
                continue;
            }
            // What a failed model would feed is left as it was until the model works.
            if reads_any(model, &failed_now) {
                failed_now.insert(model.name.clone());
                continue;
            }
            match refresh(&lake, model, false).await {
                Ok(_) => {
                    if failing.succeeded(&supervisor, &model.name) {
                        tracing::info!(model = %model.name, "gold model refreshing again");
                    }
                }
                Err(e) => {
                    failed_now.insert(model.name.clone());
                    let name = &model.name;
                    // Gold holds its models (`OperatorErrors::HoldTheTable`).
                    if let TableNext::RetryIn(retry_in) =
                        failing.failed(&supervisor, name, name, &e)
                    {
                        GoldModelFailed {
                            model: name,
                            error: &e,
                            retry_in,
                        }
                        .emit();
                    }
                }
            }
        }
        supervisor.healthy();
        // Between refreshes: a compaction must not race a MERGE of the same table.
        if maintenance.due() {
            let tables = models
                .iter()
                .map(|model| (model.name.clone(), lake.gold(&model.name)))
                .collect();
            maintain_tables(
                "gold",
                tables,
                config.gold.target_file_bytes,
                config.lake.log_retention(),
            )
            .await;
        }
        let rest = every.saturating_sub(started.elapsed());
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(rest) => {}
        }
    }
    supervisor.stopped();
    tracing::info!("gold stage stopped");
    Ok(())
}

fn reads_any(model: &Model, models: &BTreeSet<String>) -> bool {
    model
        .inputs
        .iter()
        .any(|i| matches!(i, Input::Model(n) if models.contains(n)))
}

/// Refreshes one model (`force`: even when nothing changed), with its metrics.
async fn refresh(lake: &Lake, model: &Model, force: bool) -> Result<Refreshed, LakeError> {
    let started = Instant::now();
    let r = GoldTable::new(lake, model).refresh(force).await?;
    let name = model.name.clone();
    let ms = started.elapsed().as_millis() as u64;
    match &r {
        Refreshed::Written { version, rows } => {
            metrics::counter!(m::GOLD_REFRESHES, "model" => name.clone(), "mode" => "full")
                .increment(1);
            metrics::gauge!(m::GOLD_ROWS, "model" => name.clone()).set(*rows as f64);
            tracing::info!(model = %name, version, rows, ms, "gold model refreshed whole");
        }
        Refreshed::Merged {
            version,
            keys,
            rows,
        } => {
            metrics::counter!(m::GOLD_REFRESHES, "model" => name.clone(), "mode" => "incremental")
                .increment(1);
            metrics::counter!(m::GOLD_KEYS_RECOMPUTED, "model" => name.clone())
                .increment(*keys as u64);
            tracing::info!(model = %name, version, keys, rows, ms, "gold model refreshed incrementally");
        }
        Refreshed::Unchanged | Refreshed::Waiting { .. } => return Ok(r),
        Refreshed::Partial { input, lsn } => {
            tracing::debug!(model = %name, input = %input, commit_lsn = lsn, "gold model waits: its input holds part of a source transaction applied in pieces");
            return Ok(r);
        }
    }
    metrics::histogram!(m::GOLD_REFRESH_SECONDS, "model" => name)
        .record(started.elapsed().as_secs_f64());
    Ok(r)
}

/// `wal2delta replay --layer gold [--table MODEL]`: recomputes the models from Silver as it
/// is now (a model and, with it, every model that reads it).
pub async fn replay(config: &Config, only: Option<&str>) -> anyhow::Result<ExitCode> {
    let lake = crate::quarantine::lake(config)?;
    let models = load_models(config).await?;
    if let Some(want) = only {
        if !models.iter().any(|m| m.name == want) {
            eprintln!("wal2delta: no gold model {want:?} in [gold] models_dir");
            return Ok(ExitCode::from(1));
        }
    }
    let mut chosen: BTreeSet<String> = BTreeSet::new();
    let mut waiting = false;
    for model in models.iter() {
        let wanted = only.is_none_or(|w| w == model.name) || reads_any(model, &chosen);
        if !wanted {
            continue;
        }
        chosen.insert(model.name.clone());
        match refresh(&lake, model, true).await? {
            Refreshed::Written { version, rows } => {
                println!("{}: rebuilt, {rows} rows (version {version})", model.name)
            }
            Refreshed::Waiting { input } => {
                waiting = true;
                println!(
                    "{}: not built: its input {input} does not exist yet",
                    model.name
                )
            }
            Refreshed::Partial { input, lsn } => {
                waiting = true;
                println!(
                    "{}: not built: its input {input} holds part of source transaction {lsn} (applied in pieces); run it again once Silver applied its last piece",
                    model.name
                )
            }
            Refreshed::Unchanged | Refreshed::Merged { .. } => {}
        }
    }
    Ok(if waiting {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
