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
//!   above `W` wait. The one exception is a transaction larger than
//!   `[silver] max_atomic_transaction_rows` ([`Pieces`]): it is applied in pieces, in
//!   successive commits recorded as partial, and `W` passes it after its last piece.
//! - **Exactly-once progress.** What was read from Bronze is a Kafka offset per
//!   partition, stored as `txn` actions in the same commit as the rows, next to `W`.
//!   The offset never passes a change that is still waiting, so a restart re-reads it.

mod checks;
pub mod columns;
mod counts;
mod files;
mod fold;
pub mod hook;
mod kept;
mod key_repair;
pub mod mask;
mod merge;
mod progress;
mod rebuild;
mod redrive;
mod round;
mod rows;
mod screen;
mod settle;
mod table;
mod text_decimals;
mod tombstones;
mod unapplied;
mod window;

pub use checks::{evaluate as evaluate_checks, Check, CheckError, Failure};
pub use columns::{
    Position, COMMIT_LSN, COMMIT_TS, MASKING_KEY, MOVED_FROM, OP, ORDINAL, UNCHANGED, UNRESOLVED,
};
pub use counts::{transaction_counts, TransactionLog};
pub use fold::{fold, versions, FoldError, Folded, Versions};
pub use merge::Rewritten;
pub use progress::{plan, Pieces, Plan, Progress, TransactionCounts};
pub use rebuild::RebuildReport;
pub use rows::{BronzeError, BronzeRows};
pub use screen::{ScreenError, CHECK_FAILED, MISSING_KEY};
pub use settle::settle;
pub use table::{ApplyReport, Redrive, SilverTable, Steps};
pub use tombstones::Tombstones;
pub(crate) use tombstones::{keys_equal, newer};
pub use unapplied::Unapplied;
