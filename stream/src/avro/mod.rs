//! Avro schemas and values for change events.

pub mod envelope;
pub mod types;
