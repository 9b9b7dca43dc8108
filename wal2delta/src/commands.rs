//! The commands (README.md; docs/architecture.md, interfaces).

use std::process::ExitCode;

use anyhow::{anyhow, bail};
use tokio::sync::watch;
use wal2delta_cdc::{setup, source};

use crate::cli::{Cli, Command, Layer, QuarantineAction, RulesAction, Stage};
use crate::config::Config;
use crate::supervisor::{Stages, Supervisor};
use crate::{
    bronze, capture, endpoint, gold, quarantine, reconcile, rules, silver, status, telemetry,
    upgrade,
};

pub async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        // reconcile's exit 1 means "different": failing to run it at all is 2.
        Err(e) if matches!(cli.command, Command::Reconcile { .. }) => {
            eprintln!("wal2delta: error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    telemetry::init(&config.log);
    match cli.command {
        Command::CheckConfig => {
            print!("{}", config.summary(&cli.config));
            Ok(ExitCode::SUCCESS)
        }
        Command::Setup => run_setup(&config).await,
        Command::Run {
            stage,
            allow_slot_ahead,
        } => run_daemon(&config, &stage, allow_slot_ahead).await,
        Command::Status { json } => status::run(&config, json).await,
        Command::Reconcile {
            table,
            json,
            wait_secs,
            max_keys,
        } => Ok(reconcile::run(
            &config,
            &reconcile::Options {
                table,
                json,
                wait_secs,
                max_keys,
            },
        )
        .await),
        Command::Replay {
            layer: Layer::Silver,
            table,
        } => silver::replay::run(&config, table.as_deref()).await,
        Command::Replay {
            layer: Layer::Gold,
            table,
        } => gold::replay(&config, table.as_deref()).await,
        Command::Upgrade { dry_run } => upgrade::run(&config, dry_run).await,
        Command::Snapshot { table, condition } => {
            capture::request::run(&config, &table, condition.as_deref()).await
        }
        Command::Quarantine { action } => match action {
            QuarantineAction::List => quarantine::list(&config).await,
            QuarantineAction::Show { id } => quarantine::show(&config, &id).await,
            QuarantineAction::Replay { id } => quarantine::replay(&config, id.as_deref()).await,
            QuarantineAction::Resolve { id } => quarantine::resolve(&config, &id).await,
        },
        Command::Rules {
            action: RulesAction::Validate { file },
        } => rules::validate(&config, file).await,
        Command::Rules {
            action: RulesAction::List,
        } => rules::list(&config).await,
        Command::Rules {
            action: RulesAction::Apply { file },
        } => match file {
            Some(f) => rules::apply(&config, f).await,
            None => {
                eprintln!(
                    "wal2delta: name the rules file to install: `wal2delta rules apply FILE`"
                );
                Ok(ExitCode::from(2))
            }
        },
    }
}

async fn run_setup(config: &Config) -> anyhow::Result<ExitCode> {
    let dsn = config.source.effective_dsn()?;
    let client = source::connect(&dsn).await.map_err(with_hint)?;
    let report = setup::run(
        &client,
        &setup::SetupOptions {
            slot: &config.source.slot,
            publication: &config.source.publication,
            table_patterns: &config.source.tables,
            exclude_patterns: &config.source.exclude_tables,
            create_slot: config.snapshot.mode != crate::config::SnapshotMode::Initial,
            failover: config.source.failover_slot,
        },
    )
    .await
    .map_err(with_hint)?;
    if report.changed.is_empty() && report.notes.is_empty() {
        println!(
            "nothing to change: publication {:?} and slot {:?} are in place",
            config.source.publication, config.source.slot
        );
    }
    for c in &report.changed {
        println!("changed: {c}");
    }
    println!(
        "captured tables ({}): {}",
        report.tables.len(),
        report
            .tables
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for n in &report.notes {
        println!("note: {n}");
    }
    for w in &report.warnings {
        println!("warning: {w}");
    }
    for r in &report.recommendations {
        println!("recommend: {r}");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn with_hint(e: wal2delta_cdc::CdcError) -> anyhow::Error {
    match e.hint() {
        Some(h) => anyhow!("{e} (hint: {h})"),
        None => anyhow!(e),
    }
}

async fn run_daemon(
    config: &Config,
    stages: &[Stage],
    allow_slot_ahead: bool,
) -> anyhow::Result<ExitCode> {
    const ALL_STAGES: [Stage; 5] = [
        Stage::Capture,
        Stage::Bronze,
        Stage::Silver,
        Stage::Gold,
        Stage::Rules,
    ];
    // By default every stage; gold when models are configured, rules when a rules
    // file is.
    let mut stages: Vec<Stage> = if stages.is_empty() {
        ALL_STAGES
            .into_iter()
            .filter(|s| *s != Stage::Gold || config.gold.models_dir.is_some())
            .filter(|s| *s != Stage::Rules || config.rules.is_set())
            .collect()
    } else {
        stages.to_vec()
    };
    if stages.contains(&Stage::Rules) && !config.rules.is_set() {
        bail!("the rules stage needs [rules] file (a TOML file of [[rule]] tables) or [rules] table (docs/rules.md)");
    }
    // Rules are evaluated in Silver's rounds: with rules configured, Silver never runs without
    // them (changes Silver applied untagged would be missing from the transitions).
    if stages.contains(&Stage::Rules) && !stages.contains(&Stage::Silver) {
        bail!("the rules stage runs inside Silver's rounds: run it with silver (--stage silver,rules)");
    }
    if stages.contains(&Stage::Silver) && config.rules.is_set() && !stages.contains(&Stage::Rules) {
        stages.push(Stage::Rules);
    }
    // Before anything starts: a policy naming no real table or column is an error.
    let policies = crate::policies::at_startup(
        config,
        stages.contains(&Stage::Capture),
        stages.contains(&Stage::Silver),
    )
    .await?;
    // Models that cannot run (a cycle, an unknown table or model) stop the start, naming
    // the model.
    let models = if stages.contains(&Stage::Gold) {
        Some(gold::load_models(config).await?)
    } else {
        None
    };
    let rules_startup = if stages.contains(&Stage::Rules) {
        rules::at_startup(config).await?
    } else {
        None
    };
    let rule_source = rules_startup.as_ref().map(|s| s.source.clone());
    let stages_status = Stages::new(&stages);
    endpoint::serve(config.metrics.listen, stages_status.clone()).await?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested; draining");
        let _ = tx.send(true);
    });
    // The stages run side by side. One stopped by an error that needs an operator does not
    // stop the others (Bronze and Silver drain what Kafka holds while capture waits for a
    // fix): it is surfaced by its supervisor, and the daemon exits, non-zero, once no stage
    // runs.
    let runs = |stage: Stage| {
        stages
            .contains(&stage)
            .then(|| Supervisor::new(stage, &stages_status))
    };
    let running = std::sync::atomic::AtomicUsize::new(
        ALL_STAGES.iter().filter(|s| stages.contains(s)).count(),
    );
    // A stage that stops while others go on says why in the log; the last one's error is
    // the daemon's exit message.
    let ended = |result: anyhow::Result<()>| {
        let left = running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) - 1;
        if let Err(e) = &result {
            if left > 0 {
                tracing::error!(error = %format!("{e:#}"), stages_left = left, "a stage stopped; the others go on (see /readyz)");
            }
        }
        result
    };
    let capture = async {
        match runs(Stage::Capture) {
            Some(sup) => ended(capture::run(config, sup, rx.clone(), allow_slot_ahead).await),
            None => Ok(()),
        }
    };
    let bronze = async {
        match runs(Stage::Bronze) {
            Some(sup) => ended(bronze::run(config, sup, rx.clone()).await),
            None => Ok(()),
        }
    };
    let silver = async {
        match runs(Stage::Silver) {
            Some(sup) => ended(
                silver::run(
                    config,
                    policies.clone(),
                    rule_source.clone(),
                    sup,
                    rx.clone(),
                )
                .await,
            ),
            None => Ok(()),
        }
    };
    let gold = async {
        match (runs(Stage::Gold), models) {
            (Some(sup), Some(models)) => ended(gold::run(config, models, sup, rx.clone()).await),
            _ => Ok(()),
        }
    };
    let rules_stage = async {
        match (runs(Stage::Rules), rules_startup) {
            (Some(sup), Some(startup)) => ended(rules::run(config, startup, sup, rx.clone()).await),
            _ => Ok(()),
        }
    };
    let all = async { tokio::join!(capture, bronze, silver, gold, rules_stage) };
    // The slot is watched for as long as the process runs the capture stage, also while
    // capture is down; the watch ends with the stages.
    let watch = async {
        if stages.contains(&Stage::Capture) {
            capture::watch_slot(config).await
        } else {
            std::future::pending::<std::convert::Infallible>().await
        }
    };
    let (c, b, s, g, r) = tokio::select! {
        ended = all => ended,
        never = watch => match never {},
    };
    let failed: Vec<String> = [c, b, s, g, r]
        .into_iter()
        .filter_map(Result::err)
        .map(|e| format!("{e:#}"))
        .collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
