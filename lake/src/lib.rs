//! Delta Lake side of wal2delta: where tables live, the Bronze append with Kafka offsets in
//! the same commit, Silver's idempotent MERGE, Gold models, rule compilation, and table maintenance.
//!
//! Everything is written with delta-rs; the tables are plain Delta tables that DuckDB's
//! delta extension, Spark and the `deltalake` Python package read as they are.

pub mod bronze;
mod conditions;
mod delta;
mod error;
mod follow;
pub mod gold;
mod location;
pub mod maintenance;
pub mod quarantine;
pub mod reconcile;
pub mod rules;
pub mod silver;
mod stopwatch;
pub mod storage;
mod txns;
pub mod upgrade;
pub mod widen;

pub use deltalake;
pub use error::LakeError;
pub use location::{Lake, INTERNAL_SCHEMA};
pub use storage::StorageOptions;
/// Table locations are URLs (`Lake::bronze_tables` and friends).
pub use url::Url;
