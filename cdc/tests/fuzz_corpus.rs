//! The committed fuzz corpus (`fuzz/corpus/<target>/`) and every saved reproducer of a
//! fixed crash (`fuzz/regressions/<target>/`), run through the entry functions the
//! cargo-fuzz targets call, on stable: `ops/test` guards them without nightly.
//! `WAL2DELTA_WRITE_FUZZ_SEEDS=1 cargo test -p wal2delta-cdc --test fuzz_corpus` rewrites
//! the generated seed files after a change of the seed builders.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use wal2delta_cdc::fuzz;

fn fuzz_dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join(target)
}

/// Writes (with WAL2DELTA_WRITE_FUZZ_SEEDS set) or checks the generated seed files.
fn seeds(target: &str, seeds: Vec<(String, Vec<u8>)>) {
    let dir = fuzz_dir("corpus", target);
    let seeds: Vec<(String, Vec<u8>)> = seeds
        .into_iter()
        .map(|(n, b)| (format!("seed-{n}"), b))
        .collect();
    let write = std::env::var_os("WAL2DELTA_WRITE_FUZZ_SEEDS").is_some();
    for (name, bytes) in seeds {
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

/// Feeds every corpus and regression file of `target` to `entry`.
fn run(target: &str, entry: fn(&[u8])) {
    let mut count = 0;
    for kind in ["corpus", "regressions"] {
        let Ok(dir) = std::fs::read_dir(fuzz_dir(kind, target)) else {
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

#[test]
fn pgoutput_corpus() {
    seeds("pgoutput", fuzz::seed_messages());
    run("pgoutput", fuzz::pgoutput);
}

#[test]
fn text_value_corpus() {
    seeds("text_value", fuzz::seed_texts());
    run("text_value", fuzz::text_value);
}
