//! Shared by the corpus tests of each crate (`{cdc,stream,wal2delta}/tests/fuzz_corpus.rs`,
//! included with `#[path]`): the committed fuzz corpus (`fuzz/corpus/<target>/`) and every
//! saved reproducer of a fixed crash (`fuzz/regressions/<target>/`), run through the entry
//! functions the cargo-fuzz targets call, on stable, so `ops/test` guards them without
//! nightly. `WAL2DELTA_WRITE_FUZZ_SEEDS=1 cargo test --workspace --test fuzz_corpus`
//! rewrites the generated seed files after a change of the seed builders.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `fuzz/{sub}` of the repository. The package directory is read at run time (`cargo
/// test` sets `CARGO_MANIFEST_DIR`): a test binary reused from another checkout through a
/// shared build cache must read this checkout's corpus, not the one it was built in.
pub fn fuzz_dir(sub: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .join("../fuzz")
        .join(sub)
}

/// Writes (with WAL2DELTA_WRITE_FUZZ_SEEDS set) or checks the generated seed files of
/// `target`'s corpus (named `seed-{name}`).
pub fn seeds(target: &str, seeds: Vec<(String, Vec<u8>)>) {
    let seeds = seeds
        .into_iter()
        .map(|(n, b)| (format!("seed-{n}"), b))
        .collect();
    files_at(&format!("corpus/{target}"), seeds)
}

/// Writes (with WAL2DELTA_WRITE_FUZZ_SEEDS set) or checks generated files under `fuzz/{sub}`.
pub fn files_at(sub: &str, files: Vec<(String, Vec<u8>)>) {
    let dir = fuzz_dir(sub);
    let write = std::env::var_os("WAL2DELTA_WRITE_FUZZ_SEEDS").is_some();
    for (name, bytes) in files {
        let path = dir.join(name);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let committed = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (run with WAL2DELTA_WRITE_FUZZ_SEEDS=1 to write the seeds)",
                    path.display()
                )
            });
            assert!(
                committed == bytes,
                "{} differs from its builder (run with WAL2DELTA_WRITE_FUZZ_SEEDS=1 to rewrite it)",
                path.display()
            );
        }
    }
}

/// Feeds every corpus and regression file of `target` to `entry`; one taking 10 s or more
/// is a hang.
pub fn run(target: &str, entry: fn(&[u8])) {
    let mut count = 0;
    for kind in ["corpus", "regressions"] {
        let Ok(dir) = std::fs::read_dir(fuzz_dir(&format!("{kind}/{target}"))) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = dir.map(|e| e.unwrap().path()).collect();
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path).unwrap();
            let start = Instant::now();
            entry(&bytes);
            let took = start.elapsed();
            assert!(
                took < Duration::from_secs(10),
                "{} took {took:?}: a hang (see docs/fuzzing.md)",
                path.display()
            );
            count += 1;
        }
    }
    assert!(count > 0, "no corpus for fuzz target {target}");
}
