//! The short form of the chaos suite (issue 11, tests/support/chaos/): a fixed seed and
//! one random seed, 75 s of workload and faults each, with a large
//! transaction of 20,000 rows. The long form is `ops/chaos --minutes M`.

use std::time::Duration;

use anyhow::{ensure, Result};
use wal2delta_tests::chaos::{run, Options};
use wal2delta_tests::Stack;

#[tokio::test(flavor = "multi_thread")]
async fn chaos_short_fixed_and_random_seed() -> Result<()> {
    let stack = Stack::from_env();
    let random = rand::random::<u64>() % 1_000_000_000;
    let mut failed = Vec::new();
    // Seed 99's first faults include every kind (registry SIGKILL, a stall and a cut of the
    // PostgreSQL connections, the lake read-only), see docs/reliability.md.
    for seed in [99, random] {
        let outcome = run(
            &stack,
            &Options {
                seed,
                duration: Duration::from_secs(75),
                large_tx_rows: 20_000,
                fault_gap_secs: (4, 10),
            },
        )
        .await?;
        if !outcome.ok {
            failed.push(outcome.summary);
        }
    }
    ensure!(failed.is_empty(), "chaos runs failed: {failed:?}");
    Ok(())
}
