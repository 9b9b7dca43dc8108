//! The shape of a captured table as the replication stream describes it.

use crate::{ColumnType, TableName};

/// One column of a captured table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
    /// Part of the replica identity (the primary key unless configured otherwise).
    pub is_key: bool,
}

/// How much of the old row PostgreSQL logs for updates and deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaIdentity {
    /// Key columns only (the primary key).
    Default,
    /// Every column of the old row.
    Full,
    /// The columns of a chosen unique index.
    Index,
    /// No old row at all: updates and deletes cannot be keyed.
    Nothing,
}

impl ReplicaIdentity {
    pub fn from_code(code: u8) -> ReplicaIdentity {
        match code {
            b'f' => ReplicaIdentity::Full,
            b'i' => ReplicaIdentity::Index,
            b'n' => ReplicaIdentity::Nothing,
            _ => ReplicaIdentity::Default,
        }
    }
}

/// A table's columns at one point of the stream. A new `TableSchema` is made whenever
/// PostgreSQL sends a new Relation message (after DDL), and the Avro schemas follow it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableSchema {
    pub relation_oid: u32,
    pub table: TableName,
    pub columns: Vec<Column>,
    pub replica_identity: ReplicaIdentity,
}

impl TableSchema {
    /// Indexes of the key columns, in column order.
    pub fn key_indexes(&self) -> Vec<usize> {
        self.columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_key)
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether the table's key columns are a primary key. The decoder marks the
    /// primary-key columns when the table has one, else the replica identity's, which
    /// pgoutput makes every column under REPLICA IDENTITY FULL: a table whose key is empty,
    /// or is every column under FULL, has no primary key (a primary key over every column
    /// of a FULL table reads the same, and is taken as none).
    pub fn has_primary_key(&self) -> bool {
        let keys = self.columns.iter().filter(|c| c.is_key).count();
        keys > 0 && !(self.replica_identity == ReplicaIdentity::Full && keys == self.columns.len())
    }
}
