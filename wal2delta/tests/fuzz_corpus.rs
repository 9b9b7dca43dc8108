//! The config fuzz corpus, on stable (see the runner).

#[path = "../../fuzz/corpus_runner.rs"]
mod corpus_runner;

#[test]
fn config_corpus() {
    corpus_runner::run("config", wal2delta::fuzz::config);
}
