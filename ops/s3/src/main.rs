//! `wal2delta-dev-s3`: a DEVELOPMENT S3-compatible object store for `ops/stack` and the
//! tests (the server is the library, [`wal2delta_dev_s3`]). Not for production.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// DEVELOPMENT S3-compatible object store for wal2delta's stack and tests: path-style
/// requests, SigV4 with one access key, objects stored as files under the root (one
/// directory per bucket), `If-None-Match: *` and `If-Match` honoured atomically. NOT FOR
/// PRODUCTION.
#[derive(Debug, Parser)]
#[command(name = "wal2delta-dev-s3", version, about, long_about)]
struct Args {
    /// Address to listen on.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9000")]
    listen: String,

    /// Directory holding the buckets (created when missing).
    #[arg(long, value_name = "DIR")]
    root: PathBuf,

    /// Buckets to create at start when missing.
    #[arg(long = "bucket", value_name = "NAME")]
    buckets: Vec<String>,

    /// The access key id clients sign with.
    #[arg(long, env = "WAL2DELTA_DEV_S3_ACCESS_KEY")]
    access_key: String,

    /// Ignore `If-None-Match` / `If-Match` on uploads, like a server without conditional
    /// writes (tests of wal2delta's refusal to commit on such a store).
    #[arg(long)]
    ignore_preconditions: bool,

    /// The secret access key, read from this environment variable (never a flag, so it
    /// does not show in `ps`).
    #[arg(long, env = "WAL2DELTA_DEV_S3_SECRET_KEY", hide_env_values = true)]
    secret_key: String,
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

    std::fs::create_dir_all(&args.root)
        .with_context(|| format!("cannot create {}", args.root.display()))?;
    for bucket in &args.buckets {
        let dir = args.root.join(bucket);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create bucket directory {}", dir.display()))?;
    }
    let store = wal2delta_dev_s3::DirStore::open(&args.root, args.ignore_preconditions)
        .with_context(|| format!("cannot serve {}", args.root.display()))?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, root = %args.root.display(), "development S3 server listening");
    wal2delta_dev_s3::serve(
        listener,
        store,
        args.access_key,
        args.secret_key,
        shutdown(),
    )
    .await;
    tracing::info!("development S3 server stopped");
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
