//! What the lake's integration tests share.

use wal2delta_lake::Lake;

/// A lake in a new directory under the system's temporary directory, named after
/// `prefix`, the process and the time; the test removes it.
pub fn temp_lake(prefix: &str) -> (Lake, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    (Lake::new(dir.to_str().unwrap()).unwrap(), dir)
}
