//! The names Silver's modules share, defined once: Silver's own columns, the fold's
//! output columns, and a change's position. The Bronze columns Silver reads are named in
//! `wal2delta_model::bronze` (shared with their writer) and typed by [`super::rows`].
//! Every other Silver module imports from here (downward); nothing here imports them.

/// Silver's column with the commit LSN of the change that wrote the row.
pub const COMMIT_LSN: &str = "_commit_lsn";
/// Silver's column with the change's ordinal within its transaction.
pub const ORDINAL: &str = "_ordinal";
/// Silver's column with the source commit time of the change that wrote the row.
pub const COMMIT_TS: &str = "_commit_ts";
/// Silver's column listing the columns whose value Silver has not seen yet: an update
/// left them unchanged (TOAST) before the row's earlier image (a snapshot row) arrived.
/// The earlier image fills them when it comes; normally empty.
pub const UNRESOLVED: &str = "_unresolved";
/// Fold output only: `u` upsert or `d` delete.
pub const OP: &str = "_op";
/// Fold output only: columns whose Silver value an update left unchanged.
pub const UNCHANGED: &str = "_unchanged";
/// Fold output only: prefix of the old-key columns of a moved row whose unchanged values
/// Silver's old row supplies.
pub const MOVED_FROM: &str = "_moved_from_";

/// A change's place in the source's commit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub i64, pub i64);

/// Commit metadata key of the masking policies a Silver commit was written under.
pub const MASKING_KEY: &str = "wal2delta.masking";
