//! The `wal2delta` binary: loads the config, sets up tracing and metrics, runs a command.

mod allocator;
mod bronze;
mod capture;
mod cli;
mod commands;
mod endpoint;
mod events;
mod gold;
use wal2delta::config;
mod health;
mod maintenance;
mod metrics;
mod policies;
mod quarantine;
mod reconcile;
mod rules;
mod silver;
mod status;
mod supervisor;
mod telemetry;
mod upgrade;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wal2delta: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes, joined.
            eprintln!("wal2delta: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
