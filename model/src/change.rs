//! Change events as capture produces them.

use crate::{Datum, Lsn, TableName};

/// What happened to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeOp {
    Insert,
    Update,
    Delete,
    Truncate,
    /// A row read by the initial snapshot.
    Read,
    /// The end of a table's re-snapshot after the slot was re-created (`[source]
    /// on_slot_lost = "recreate"`): sent to every partition of the table's topic after the
    /// last snapshot row, at the re-snapshot's start position. Every row of the table that
    /// has no change at or after that position was deleted at the source (Silver deletes
    /// it). Not a Debezium op.
    SnapshotEnd,
}

impl ChangeOp {
    /// Debezium's one-letter `op` code.
    pub fn code(self) -> &'static str {
        match self {
            ChangeOp::Insert => "c",
            ChangeOp::Update => "u",
            ChangeOp::Delete => "d",
            ChangeOp::Truncate => "t",
            ChangeOp::Read => "r",
            ChangeOp::SnapshotEnd => "s",
        }
    }

    /// The op of a one-letter `op` code ([`Self::code`]); `None` for any other text.
    pub fn from_code(code: &str) -> Option<ChangeOp> {
        Some(match code {
            "c" => ChangeOp::Insert,
            "u" => ChangeOp::Update,
            "d" => ChangeOp::Delete,
            "t" => ChangeOp::Truncate,
            "r" => ChangeOp::Read,
            "s" => ChangeOp::SnapshotEnd,
            _ => return None,
        })
    }
}

/// One column of a row image.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValue {
    Null,
    /// A TOASTed value the update did not change; pgoutput does not send it. Consumers
    /// must keep the previous value. Never replaced by a placeholder or NULL.
    UnchangedToast,
    Value(Datum),
}

/// A row image, one entry per column of the table's schema at the time of the change.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Row {
    pub values: Vec<ColumnValue>,
}

/// Where a change sits in the source's commit order.
///
/// `(commit_lsn, ordinal)` is the total order Silver merges by: the commit LSN orders
/// transactions, the ordinal orders changes inside one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPosition {
    /// LSN of the transaction's commit record (the end LSN a slot may be confirmed to).
    pub commit_lsn: Lsn,
    /// The change's own WAL position (0/0 for snapshot reads).
    pub lsn: Lsn,
    /// 1-based position of the change within its transaction.
    pub ordinal: u64,
    pub xid: u32,
    /// Commit time, microseconds since the Unix epoch.
    pub commit_ts_us: i64,
}

/// One captured change.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub table: TableName,
    pub op: ChangeOp,
    pub before: Option<Row>,
    pub after: Option<Row>,
    pub position: TxPosition,
}

#[cfg(test)]
mod tests {
    use super::ChangeOp;

    #[test]
    fn every_op_code_parses_back_and_nothing_else_does() {
        use ChangeOp::*;
        for op in [Insert, Update, Delete, Truncate, Read, SnapshotEnd] {
            assert_eq!(ChangeOp::from_code(op.code()), Some(op));
        }
        for other in ["", "x", "C", "cu"] {
            assert_eq!(ChangeOp::from_code(other), None);
        }
    }
}
