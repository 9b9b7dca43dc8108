//! The fuzz corpus of the PostgreSQL-side targets, on stable (see the runner).

#[path = "../../fuzz/corpus_runner.rs"]
mod corpus_runner;

use corpus_runner::{run, seeds};
use wal2delta_cdc::fuzz;

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
