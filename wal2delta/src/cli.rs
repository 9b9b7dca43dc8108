//! Command-line interface (docs/architecture.md, interfaces).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "wal2delta",
    version,
    about = "PostgreSQL WAL → Kafka (Avro) → Delta Lake, with rule tagging"
)]
pub struct Cli {
    /// Configuration file (TOML). Every key can be overridden as WAL2DELTA__SECTION__KEY.
    #[arg(
        long,
        global = true,
        default_value = "wal2delta.toml",
        env = "WAL2DELTA_CONFIG"
    )]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check prerequisites and create the publication and slot (idempotent).
    Setup,
    /// Run the daemon: every stage this version has, or those named with --stage.
    Run {
        /// Comma-separated stages: capture, bronze, silver, gold, rules. Default: every
        /// stage, gold when [gold] models_dir is set, rules when [rules] file or table is.
        #[arg(long, value_delimiter = ',')]
        stage: Vec<Stage>,
        /// Start even when the slot is ahead of the last position recorded in Kafka
        /// (accepting that changes in between may be missing from Kafka).
        #[arg(long)]
        allow_slot_ahead: bool,
    },
    /// Slot lag, confirmed LSN, stage positions and quarantine counts.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Compare the source (read in one snapshot) with Silver at the snapshot's LSN: row
    /// counts, checksums and differing keys. Exit 0 equal, 1 different, 2 not compared.
    Reconcile {
        /// Only this table (`schema.table`).
        #[arg(long)]
        table: Option<String>,
        /// Print the report as JSON (shape in docs/reconcile.md).
        #[arg(long)]
        json: bool,
        /// Seconds to wait, in all, for Silver's watermarks to reach the snapshot.
        #[arg(long, default_value_t = 120)]
        wait_secs: u64,
        /// Differing keys listed per table.
        #[arg(long, default_value_t = 20)]
        max_keys: usize,
    },
    /// Rebuild Silver or Gold from Bronze without touching the source.
    Replay {
        #[arg(long)]
        layer: Layer,
        #[arg(long)]
        table: Option<String>,
    },
    /// Re-snapshot one table on demand: a running capture reads it again, and Silver then
    /// deletes the rows the source no longer holds.
    Snapshot {
        /// The table, `schema.table`.
        #[arg(long)]
        table: String,
    },
    /// Inspect and re-drive quarantined records.
    Quarantine {
        #[command(subcommand)]
        action: QuarantineAction,
    },
    /// Inspect and change the active rule set.
    Rules {
        #[command(subcommand)]
        action: RulesAction,
    },
    /// Load and validate the config file with its environment overrides, print what is in
    /// effect (no secrets) and exit: 0 valid, 1 not. Connects to nothing.
    CheckConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Stage {
    Capture,
    Bronze,
    Silver,
    Gold,
    Rules,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Layer {
    Silver,
    Gold,
}

#[derive(Debug, Subcommand)]
pub enum QuarantineAction {
    List,
    Show { id: String },
    Replay { id: Option<String> },
    Resolve { id: String },
}

#[derive(Debug, Subcommand)]
pub enum RulesAction {
    List,
    Validate { file: Option<PathBuf> },
    Apply { file: Option<PathBuf> },
}
