//! `wal2delta-dev-registry`: a DEVELOPMENT schema registry (Confluent REST subset, Avro only).
//! Not for production; see `ops/registry/README.md`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// DEVELOPMENT schema registry for wal2delta: a small stand-in that speaks the part of
/// Confluent Schema Registry's REST API that wal2delta and schema_registry_converter use.
/// Avro only; basic auth for one user at most, no references, no modes, one process. NOT
/// FOR PRODUCTION.
#[derive(Debug, Parser)]
#[command(name = "wal2delta-dev-registry", version, about, long_about)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the log says which).
    #[arg(
        long,
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:8081",
        env = "WAL2DELTA_DEV_REGISTRY_LISTEN"
    )]
    listen: String,

    /// JSON file that holds the registry; created on the first change, rewritten atomically
    /// on every change, loaded at start.
    #[arg(long, value_name = "PATH", env = "WAL2DELTA_DEV_REGISTRY_DATA_FILE")]
    data_file: PathBuf,

    /// Require HTTP basic authentication: the file's first line is `user:password`.
    #[arg(long, value_name = "PATH")]
    basic_auth_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let auth = match &args.basic_auth_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            Some(
                wal2delta_dev_registry::BasicAuth::parse(&text)
                    .with_context(|| format!("{} must hold user:password", path.display()))?,
            )
        }
        None => None,
    };
    let state = wal2delta_dev_registry::open(&args.data_file)
        .context("cannot start the development schema registry")?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    tracing::info!(
        data_file = %args.data_file.display(),
        "development schema registry (not for production) listening on http://{addr}"
    );
    wal2delta_dev_registry::serve_with(listener, state, auth, shutdown_signal())
        .await
        .context("the HTTP server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the server");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
