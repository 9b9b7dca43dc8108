//! Types shared by the wal2delta crates.
//!
//! Nothing here talks to an external system: PostgreSQL specifics live in `wal2delta-cdc`,
//! Kafka and Avro in `wal2delta-stream`, Delta in `wal2delta-lake`.

pub mod bronze;
pub mod change;
pub mod clock;
pub mod datum;
pub mod dead_letter;
pub mod decimal;
pub mod error_class;
pub mod format;
pub mod lsn;
pub mod names;
pub mod pg_type;
pub mod schema;
pub mod table;

pub use change::{Change, ChangeOp, ColumnValue, Row, TxPosition};
pub use datum::{Datum, Special};
pub use error_class::ErrorClass;
pub use lsn::Lsn;
pub use pg_type::{BaseType, ColumnType, TypeKind};
pub use schema::{Column, ReplicaIdentity, TableSchema};
pub use table::TableName;
