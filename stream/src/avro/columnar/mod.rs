//! Change events read from their Avro bytes straight into Bronze's Arrow columns.
//!
//! The mirror of [`super::binary`] on the reading side. Decoding each event into an
//! `apache_avro` `Value` tree and then walking the trees into columns
//! ([`super::columns`]) costs Bronze an allocation per field, a `String` per field name
//! and the trees' drops: most of its CPU per event. Here a writer schema is compiled once
//! into a plan ([`plan`]), and every event's bytes are read field by field into growing
//! column buffers ([`buffers`]), which become Arrow arrays at the end of the run.
//!
//! Invariant: for every event, the columns equal what [`super::columns::envelope_columns`],
//! [`super::columns::key_column`] and [`super::columns::out_of_range_column`] build from
//! apache-avro's decoding of the same bytes (`proptests.rs` holds them equal for every
//! column type, operation, NULL, unchanged TOAST value, keyless table and out-of-range
//! date). Where this reader differs, it is kinder: a malformed event, or one without
//! `op` or `source`, fails alone and leaves nothing in the columns, instead of failing
//! the events read with it.

mod buffers;
pub mod envelope;
pub mod plan;
mod read;

pub use envelope::{EnvelopePlan, EnvelopeReader, EventPosition, KeyPlan};
pub use read::ReadError;
