//! Kafka and schema-registry side of wal2delta: Avro schemas and encoding, topic naming,
//! the producer with ordered acknowledgements, and the dead-letter record.

pub mod ack;
pub mod avro;
pub mod dlq;
mod error;
pub mod positions;
pub mod producer;
pub mod registry;
pub mod topic;

pub use error::StreamError;
