//! The committed config fuzz corpus (`fuzz/corpus/config/`) and every saved reproducer
//! of a fixed crash (`fuzz/regressions/config/`), run through the entry function the
//! cargo-fuzz target calls, on stable: `ops/test` guards it without nightly.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[test]
fn config_corpus() {
    let mut count = 0;
    for kind in ["corpus", "regressions"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz")
            .join(kind)
            .join("config");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path).unwrap();
            let start = Instant::now();
            wal2delta::fuzz::config(&bytes);
            let took = start.elapsed();
            assert!(
                took < Duration::from_secs(10),
                "{} took {took:?}: a hang (see docs/fuzzing.md)",
                path.display()
            );
            count += 1;
        }
    }
    assert!(count > 0, "no corpus for fuzz target config");
}
