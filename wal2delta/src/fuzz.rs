//! Entry point of the config-loader fuzz target (`fuzz/`, cargo-fuzz on nightly) and of
//! the corpus regression test (`wal2delta/tests/fuzz_corpus.rs`, stable).

use std::path::Path;

use crate::config::Config;

/// The line that separates a config fuzz input's TOML text from its environment
/// overrides (one `VAR=value` per line after it).
pub const ENV_SEPARATOR: &str = "\n#-- env\n";

/// The config target: the input is TOML text, optionally followed by [`ENV_SEPARATOR`]
/// and `WAL2DELTA__SECTION__KEY=value` lines, loaded and validated exactly as
/// `wal2delta --config` does ([`Config::from_sources`]). Errors are expected; panics,
/// hangs and unbounded allocations are findings.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (toml, env) = text.split_once(ENV_SEPARATOR).unwrap_or((text, ""));
    let env: Vec<(String, String)> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    match Config::from_sources(Path::new("fuzz.toml"), toml, env) {
        Ok(c) => {
            // Validation is idempotent, and the derived names never panic.
            assert!(c.validate().is_ok(), "a loaded config fails validation");
            let _ = (c.kafka.dlq_topic(), c.kafka.positions_topic());
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
