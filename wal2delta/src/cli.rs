//! Command-line interface (docs/architecture.md, interfaces).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// `wal2delta --version`: the release and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WAL2DELTA_COMMIT"),
    ", lake format ",
    "1",
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "wal2delta",
    version = VERSION,
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
        /// Only the rows matching this SQL condition on the table (e.g. `id > 1000`):
        /// they are read again, nothing is deleted.
        #[arg(long = "where", value_name = "SQL")]
        condition: Option<String>,
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
    /// Migrate the lake's tables an earlier release wrote to this binary's format
    /// (docs/upgrading.md). The stages refuse such tables until then.
    Upgrade {
        /// List every table, its format and what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_the_release_the_commit_and_the_lake_format() {
        let lake = format!("lake format {})", wal2delta_model::format::LAKE_FORMAT);
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")), "{VERSION}");
        assert!(VERSION.ends_with(&lake), "{VERSION} names {lake}");
        let commit = env!("WAL2DELTA_COMMIT");
        assert!(!commit.is_empty() && VERSION.contains(&format!("(commit {commit},")));
    }
}
