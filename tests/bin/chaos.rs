//! `wal2delta-chaos [--minutes M] [--seed S] [--large-tx ROWS] [--fault-gap MIN-MAX]`: one
//! chaos run (tests/support/chaos/) against the stack in the environment (`ops/chaos`
//! starts a private one). Exit 0 when every check passed, 1 when one failed, 2 on bad
//! arguments. The last line printed is a one-line summary.

use std::process::ExitCode;
use std::time::Duration;

use wal2delta_tests::chaos::{run, Options};
use wal2delta_tests::Stack;

const USAGE: &str =
    "usage: wal2delta-chaos [--minutes M] [--seed S] [--large-tx ROWS] [--fault-gap MIN-MAX seconds]";

fn parse() -> Result<Options, String> {
    let mut opts = Options {
        seed: rand::random::<u64>() % 1_000_000_000,
        duration: Duration::from_secs(600),
        large_tx_rows: 1_000_000,
        fault_gap_secs: (5, 20),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value; {USAGE}"));
        match a.as_str() {
            "--minutes" => {
                let m: f64 = value("--minutes")?
                    .parse()
                    .map_err(|_| format!("--minutes takes a number of minutes; {USAGE}"))?;
                if !(m > 0.0 && m < 10_000.0) {
                    return Err(format!("--minutes must be above 0; {USAGE}"));
                }
                opts.duration = Duration::from_secs_f64(m * 60.0);
            }
            "--seed" => {
                opts.seed = value("--seed")?
                    .parse()
                    .map_err(|_| format!("--seed takes an unsigned integer; {USAGE}"))?;
            }
            "--large-tx" => {
                opts.large_tx_rows = value("--large-tx")?
                    .parse()
                    .map_err(|_| format!("--large-tx takes a row count; {USAGE}"))?;
            }
            "--fault-gap" => {
                let v = value("--fault-gap")?;
                let (a, b) = v
                    .split_once('-')
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                    .filter(|(a, b): &(u64, u64)| a <= b && *b > 0)
                    .ok_or(format!(
                        "--fault-gap takes MIN-MAX seconds, e.g. 5-20; {USAGE}"
                    ))?;
                opts.fault_gap_secs = (a, b);
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(opts)
}

#[tokio::main]
async fn main() -> ExitCode {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let stack = Stack::from_env();
    match run(&stack, &opts).await {
        Ok(o) if o.ok => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            println!(
                "chaos: FAIL seed={} (the run could not start: {e:#})",
                opts.seed
            );
            ExitCode::from(1)
        }
    }
}
