//! Logging setup. Logs go to stderr; row values and secrets are never logged.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Libraries that log every commit and scan at INFO; quieted to WARN unless the filter
/// names them.
const CHATTY: [&str; 5] = [
    "deltalake_core",
    "buoyant_kernel",
    "delta_kernel",
    "datafusion",
    "object_store",
];

/// Modules that warn on every call about something no operator can act on (delta-rs'
/// MERGE: "Missing target skipped-file metric", once per MERGE); quieted to ERROR unless
/// the filter names them.
const NOISY: [&str; 1] = ["deltalake_core::operations::merge"];

pub fn init(log: &LogConfig) {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| log.level.clone());
    let mut filter = EnvFilter::try_new(&spec).unwrap_or_else(|_| EnvFilter::new(&log.level));
    let quiet = CHATTY
        .iter()
        .map(|t| (t, "warn"))
        .chain(NOISY.iter().map(|t| (t, "error")));
    for (target, level) in quiet {
        if !spec.contains(target) {
            if let Ok(d) = format!("{target}={level}").parse() {
                filter = filter.add_directive(d);
            }
        }
    }
    // Colours only for a terminal: a log file, journald or a collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if log.format == LogFormat::Json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
