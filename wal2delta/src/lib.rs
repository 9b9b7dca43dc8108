//! The library half of the `wal2delta` package: the configuration loader, shared by the
//! binary (`main.rs`), the fuzz target of the loader (`fuzz/`) and the corpus regression
//! test (`wal2delta/tests/fuzz_corpus.rs`). Everything else lives in the binary.

pub mod config;
#[doc(hidden)]
pub mod fuzz;
