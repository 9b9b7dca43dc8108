//! Logging setup. Logs go to stderr; row values and secrets are never logged.

use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

pub fn init(log: &LogConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if log.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
