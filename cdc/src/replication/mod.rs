//! The streaming replication protocol: a walsender connection in logical replication mode.
//!
//! tokio-postgres does not speak the CopyBoth sub-protocol, so this module frames the
//! wire messages itself and uses `postgres-protocol` for message encoding, backend message
//! parsing and SCRAM authentication.

mod connection;
mod frame;
mod socket;
mod stream;

pub use connection::{ConnectParams, ReplicationConnection};
pub use stream::{pg_ts_to_unix_us, ReplicationMessage, ReplicationStream};
