//! Silver: the current state of every source row, built from Bronze by an idempotent MERGE.
//!
//! Invariants (docs/architecture.md, promises 2 and 6):
//!
//! - **Highest position wins.** Every change has a position `(commit_lsn, ordinal)`; per
//!   primary key the change with the highest position decides the row. Silver rows keep
//!   theirs in `_commit_lsn` and `_ordinal`, and MERGE applies a change only when it is
//!   higher, so a duplicate, a replayed range or a late old change changes nothing.
//! - **No resurrection.** A deleted key is remembered in the tombstone table with its
//!   position (written *before* the Silver commit, so a crash between the two only repeats
//!   work); an upsert at or below a tombstone's position is dropped. A TRUNCATE's position
//!   is kept in the Silver table's `txn` actions and drops every change before it.
//! - **Whole transactions.** Silver's watermark `W` is a commit LSN such that every source
//!   transaction at or below it that touched the table is either fully applied or not
//!   at all. It only moves to `T` (the highest LSN the transaction records have reached)
//!   when, for every END record in `(W, T]` naming the table, Bronze holds as many
//!   distinct events `(commit_lsn, partition, ordinal)` as the record counts. Changes
//!   above `W` wait.
//! - **Exactly-once progress.** What was read from Bronze is a Kafka offset per
//!   partition, stored as `txn` actions in the same commit as the rows, next to `W`.
//!   The offset never passes a change that is still waiting, so a restart re-reads it.

mod checks;
mod fold;
mod keys;
pub mod mask;
mod progress;
mod rebuild;
mod screen;
mod table;
mod tombstones;
mod window;

pub use checks::{evaluate as evaluate_checks, Check, CheckError, Failure};
pub use fold::{fold, FoldError, Folded};
pub use progress::{plan, Plan, Progress, TransactionCounts};
pub use rebuild::RebuildReport;
pub use screen::{ScreenError, CHECK_FAILED, MISSING_KEY};
pub use table::{transaction_counts, ApplyReport, Redrive, SilverTable, MASKING_KEY};

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
