//! Kafka and schema-registry side of wal2delta: Avro schemas and encoding, topic naming,
//! the producer with ordered acknowledgements, the change-topic consumer positioned from
//! the lake, decoding, and the dead-letter record.

pub mod avro;
pub mod batch_producer;
pub mod connection;
pub mod consumer;
pub mod decode;
pub mod dlq;
mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod positions;
pub mod producer;
pub mod registry;
pub mod registry_connection;
pub mod snapshots;
mod state_format;
pub mod topic;
pub mod transaction_acks;
pub mod transactions;

pub use error::StreamError;

/// How long one request to the broker (metadata, watermarks, a seek, a flush, a topic
/// admin operation) may take before it counts as failed (transient: the caller retries).
/// Longer than a healthy broker's answer by far, short enough that a shutdown request
/// is seen within it.
pub const KAFKA_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A consumer group id unique to one read (see `positions` and `snapshots`).
pub(crate) fn reader_group(base: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static READS: AtomicU64 = AtomicU64::new(0);
    let nanos = wal2delta_model::clock::subsec_nanos();
    format!(
        "{base}-{}-{}-{nanos}",
        std::process::id(),
        READS.fetch_add(1, Ordering::Relaxed)
    )
}
