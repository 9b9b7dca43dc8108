//! PostgreSQL side of wal2delta: setup checks, slot and publication, the replication
//! protocol, pgoutput and value decoding.

pub mod catalog;
pub mod decoder;
pub mod dsn;
mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod pgoutput;
pub mod replication;
pub mod setup;
pub mod slot;
pub mod snapshot;
pub mod source;
pub mod stream_buffer;
pub mod tls;
pub mod value;

pub use error::CdcError;
pub use wal2delta_model::Lsn;
