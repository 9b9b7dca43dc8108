//! The commands (README.md; docs/architecture.md, interfaces).

use std::process::ExitCode;

use anyhow::{anyhow, bail};
use tokio::sync::watch;
use wal2delta_cdc::{setup, slot, source};

use crate::cli::{Cli, Command, Layer, QuarantineAction, Stage};
use crate::config::Config;
use crate::{bronze, capture, health, metrics, quarantine, reconcile, silver, telemetry};

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
        Command::Setup => run_setup(&config).await,
        Command::Run {
            stage,
            allow_slot_ahead,
        } => run_daemon(&config, &stage, allow_slot_ahead).await,
        Command::Status { json } => status(&config, json).await,
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
            layer: Layer::Gold, ..
        } => not_built("replay --layer gold", "the Gold stage is not built yet"),
        Command::Quarantine { action } => match action {
            QuarantineAction::List => quarantine::list(&config).await,
            QuarantineAction::Show { id } => quarantine::show(&config, &id).await,
            QuarantineAction::Replay { id } => quarantine::replay(&config, id.as_deref()).await,
            QuarantineAction::Resolve { id } => quarantine::resolve(&config, &id).await,
        },
        Command::Rules { .. } => not_built("rules", "the rules stage is not built yet"),
    }
}

fn not_built(command: &str, why: &str) -> anyhow::Result<ExitCode> {
    eprintln!("wal2delta: `{command}` is not available in this version: {why}.");
    Ok(ExitCode::from(2))
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
            create_slot: config.snapshot.mode != crate::config::SnapshotMode::Initial,
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

fn with_hint(e: wal2delta_cdc::CdcError) -> anyhow::Error {
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
    const BUILT: [Stage; 3] = [Stage::Capture, Stage::Bronze, Stage::Silver];
    let stages: Vec<Stage> = if stages.is_empty() {
        BUILT.to_vec()
    } else {
        stages.to_vec()
    };
    let unbuilt: Vec<String> = stages
        .iter()
        .filter(|s| !BUILT.contains(s))
        .map(|s| format!("{s:?}").to_lowercase())
        .collect();
    if !unbuilt.is_empty() {
        bail!(
            "stage(s) {} are not built in this version; run with --stage capture,bronze,silver",
            unbuilt.join(", ")
        );
    }
    // Before anything starts: a policy naming no real table or column is an error.
    let policies = crate::policies::at_startup(
        config,
        stages.contains(&Stage::Capture),
        stages.contains(&Stage::Silver),
    )
    .await?;
    metrics::install(&config.metrics.listen)?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested; draining");
        let _ = tx.send(true);
    });
    // The stages run side by side; the first to fail stops the others.
    let capture = async {
        if stages.contains(&Stage::Capture) {
            capture::run(config, rx.clone(), allow_slot_ahead).await
        } else {
            Ok(())
        }
    };
    let bronze = async {
        if stages.contains(&Stage::Bronze) {
            bronze::run(config, rx.clone()).await
        } else {
            Ok(())
        }
    };
    let silver = async {
        if stages.contains(&Stage::Silver) {
            silver::run(config, policies.clone(), rx.clone()).await
        } else {
            Ok(())
        }
    };
    tokio::try_join!(capture, bronze, silver)?;
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

async fn status(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let dsn = config.source.effective_dsn()?;
    let client = source::connect(&dsn).await.map_err(with_hint)?;
    // Two samples a second apart give the current WAL rate for the time-to-invalidation.
    let mut rate = slot::WalRate::default();
    let first = slot::slot_info(&client, &config.source.slot).await?;
    let Some(first) = first else {
        bail!(
            "replication slot {:?} does not exist: run `wal2delta setup`",
            config.source.slot
        );
    };
    rate.sample(std::time::Instant::now(), first.current_wal);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let info = slot::slot_info(&client, &config.source.slot)
        .await?
        .ok_or_else(|| anyhow!("replication slot {:?} disappeared", config.source.slot))?;
    let wal_rate = rate.sample(std::time::Instant::now(), info.current_wal);
    let snapshots = snapshot_progress(config).await;
    let bronze_lag = bronze::status::lag(config).await;
    let quarantine = quarantine_counts(config).await;
    let silver = silver_positions(config).await;
    let held = held_by_bronze_quarantine(config).await;
    let held_for = |t: &str, w: i64| -> Vec<(String, Option<i64>)> {
        held.get(t)
            .map(|v| {
                v.iter()
                    .filter(|(_, l)| l.is_none_or(|l| l > w))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let confirmed = info.confirmed_flush.map(|l| l.0 as i64);
    let behind = |w: i64| confirmed.map(|c| (c - w).max(0));
    if json {
        let mut doc = health::to_json(&info, wal_rate);
        doc["stages"]["snapshot"] = health::snapshot_json(&snapshots);
        doc["stages"]["bronze"] = match &bronze_lag {
            Ok(tables) => serde_json::json!({ "tables": tables }),
            Err(e) => serde_json::json!({ "error": e }),
        };
        doc["stages"]["silver"] = match &silver {
            Ok(tables) => {
                serde_json::json!({ "tables": tables.iter().map(|(t, w)| match w {
                Some(w) => {
                    let mut doc = serde_json::json!({
                        "table": t,
                        "watermark_lsn": wal2delta_model::Lsn(*w as u64).to_string(),
                        "lag_bytes": behind(*w),
                    });
                    let held = held_for(t, *w);
                    if !held.is_empty() {
                        doc["held_by_quarantine"] = serde_json::json!(held.iter().map(|(id, l)| serde_json::json!({
                            "id": id,
                            "commit_lsn": l.map(|l| wal2delta_model::Lsn(l as u64).to_string()),
                        })).collect::<Vec<_>>());
                        doc["held_reason"] = serde_json::json!(HELD);
                    }
                    doc
                }
                None => serde_json::json!({
                    "table": t,
                    "not_in_silver": KEYLESS,
                }),
            }).collect::<Vec<_>>() })
            }
            Err(e) => serde_json::json!({ "error": e }),
        };
        doc["quarantine"] = match &quarantine {
            Ok(counts) => serde_json::json!(counts),
            Err(e) => serde_json::json!({ "error": e }),
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", health::to_text(&info, wal_rate));
        print!("{}", health::snapshot_text(&snapshots));
        match &bronze_lag {
            Ok(tables) if tables.is_empty() => println!("bronze: no table topics yet"),
            Ok(tables) => {
                println!("bronze:");
                for t in tables {
                    println!(
                        "  {}: {} events behind Kafka (table version {}){}",
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
                        println!(
                            "    STALLED: no Bronze commit for {s} s while events wait; is a bronze writer running, and does it hold partitions? (docs/bronze.md)"
                        );
                    }
                }
            }
            Err(e) => println!("bronze: unknown ({e})"),
        }
        match &silver {
            Ok(tables) if tables.is_empty() => println!("silver: no tables yet"),
            Ok(tables) => {
                println!("silver:");
                for (t, w) in tables {
                    let Some(w) = w else {
                        println!("  {t}: not in Silver ({KEYLESS})");
                        continue;
                    };
                    println!(
                        "  {t}: watermark {}{}",
                        wal2delta_model::Lsn(*w as u64),
                        behind(*w).map_or(String::new(), |b| format!(
                            " ({b} bytes behind the slot's confirmed position)"
                        ))
                    );
                    let held = held_for(t, *w);
                    if !held.is_empty() {
                        println!(
                            "    HELD: {HELD}; open: {}",
                            held.iter()
                                .map(|(id, l)| match l {
                                    Some(l) => format!(
                                        "{id} (commit LSN {})",
                                        wal2delta_model::Lsn(*l as u64)
                                    ),
                                    None => id.clone(),
                                })
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                }
            }
            Err(e) => println!("silver: unknown ({e})"),
        }
        match &quarantine {
            Ok(counts) if counts.is_empty() => println!("quarantine: no open records"),
            Ok(counts) => {
                println!("quarantine (open records):");
                for (k, n) in counts {
                    println!("  {k}: {n}");
                }
            }
            Err(e) => println!("quarantine: unknown ({e})"),
        }
    }
    // A lost slot is an emergency: say so in the exit code too.
    Ok(if info.is_lost() {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// Why a table is not in Silver when its source table has no primary key.
pub const KEYLESS: &str = "no primary key: Bronze only (append-only history)";

/// Each Silver table's watermark (commit LSN), by `schema.table`; `None` for a table
/// without a primary key, which Silver does not hold.
async fn silver_positions(config: &Config) -> Result<Vec<(String, Option<i64>)>, String> {
    let lake = wal2delta_lake::Lake::new(&config.lake.uri).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (schema, table, url) in lake.bronze_tables() {
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
        out.push((name, Some(p.watermark)));
    }
    Ok(out)
}

/// Why a Silver table's watermark holds while Bronze quarantine records of its changes
/// are open.
pub const HELD: &str = "the watermark waits for events Bronze quarantined (their transaction's END record counts them); fix the cause (`wal2delta quarantine show ID`), then `wal2delta quarantine resolve ID` lets Silver pass the transaction without them";

/// Open Bronze quarantine records by table, with the commit LSN of their change when
/// known. Empty when the quarantine cannot be read (the quarantine section says why).
async fn held_by_bronze_quarantine(
    config: &Config,
) -> std::collections::BTreeMap<String, Vec<(String, Option<i64>)>> {
    let mut out = std::collections::BTreeMap::<String, Vec<_>>::new();
    let Ok(lake) = wal2delta_lake::Lake::new(&config.lake.uri) else {
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
async fn quarantine_counts(
    config: &Config,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let lake = wal2delta_lake::Lake::new(&config.lake.uri).map_err(|e| e.to_string())?;
    let records = quarantine::open_records(&lake)
        .await
        .map_err(|e| e.to_string())?;
    let mut counts = std::collections::BTreeMap::new();
    for r in records {
        *counts
            .entry(format!("{}/{}", r.stage.as_str(), r.reason_code))
            .or_insert(0) += 1;
    }
    Ok(counts)
}

/// Snapshot progress from Kafka; `Err` with the reason when it cannot be read.
pub(crate) async fn snapshot_progress(
    config: &Config,
) -> Result<std::collections::HashMap<String, wal2delta_stream::snapshots::SnapshotProgress>, String>
{
    let (brokers, topic, slot) = (
        config.kafka.brokers.clone(),
        config.kafka.snapshots_topic(),
        config.source.slot.clone(),
    );
    let read = tokio::task::spawn_blocking(move || {
        wal2delta_stream::snapshots::load(&brokers, &topic, &slot)
    });
    match tokio::time::timeout(std::time::Duration::from_secs(20), read).await {
        Ok(Ok(Ok(p))) => Ok(p),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("Kafka did not answer within 20 s".into()),
    }
}
