//! Folding a batch of Bronze changes into one change per primary key.
//!
//! Changes are ordered by their position `(commit_lsn, ordinal)`; per key the highest wins.
//! Duplicates (the same change delivered twice) have the same position and the same
//! content, so which copy wins does not matter: the fold is idempotent.
//!
//! - `c`, `r` (snapshot read) and `u` are upserts of the row in `after`; `d` deletes the
//!   key in `key`. A create or update whose `before` holds a different key (the primary
//!   key was changed) also deletes the old key, at the same position. Capture sends a key
//!   change as `d` (old key, ordinal n) then `c` (new key, `before` = old row, ordinal
//!   n + 1); earlier releases sent one `u`. Both fold to: old key deleted, new key present.
//! - `t` (TRUNCATE) removes every change positioned before it; the caller also removes
//!   every Silver row positioned before it ([`Folded::truncate`]).
//! - A column an update left unchanged (unchanged TOAST) takes its value from the key's
//!   latest earlier upsert in the batch that carried it, following key moves back to the
//!   old key (past the move's own delete of it). When the batch has none, the
//!   column is listed in `_unchanged` and MERGE keeps the Silver value.
//!
//! The steps, one file each: [`keys`] extracts every row's key (new and, for key moves,
//! old), [`groups`] groups the changes by key, [`toast`] picks each key's winner and the
//! rows that fill its unchanged columns, [`output`] builds the folded batch.

use std::collections::BTreeSet;

use deltalake::arrow::array::RecordBatch;
use wal2delta_model::ChangeOp;

use super::rows::{BronzeError, BronzeRows};
use super::Position;

mod groups;
mod keys;
mod output;
mod toast;

/// Why a batch could not be folded (the Bronze rows are not what Silver expects).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FoldError(pub String);

impl From<BronzeError> for FoldError {
    fn from(e: BronzeError) -> Self {
        FoldError(e.to_string())
    }
}

/// An Arrow error while folding.
fn arrow(e: impl std::fmt::Display) -> FoldError {
    FoldError(e.to_string())
}

/// The result of folding one batch.
pub struct Folded {
    /// One row per key: the value columns (key columns taken from the key), then
    /// `_commit_lsn`, `_ordinal`, `_commit_ts`, `_op` (`u` upsert, `d` delete) and
    /// `_unchanged` (columns whose Silver value must be kept). `None` when no change
    /// survived.
    pub rows: Option<RecordBatch>,
    /// The latest TRUNCATE in the batch, if any.
    pub truncate: Option<Position>,
    /// Columns that appear in some `_unchanged` list.
    pub unchanged_columns: BTreeSet<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Upsert,
    Delete,
}

/// What one change does to one key.
#[derive(Clone, Copy)]
struct Action {
    row: usize,
    /// The key is in `before` (the old key of a key update), not in `key`.
    old_key: bool,
    kind: Kind,
    pos: Position,
}

/// Folds `rows` (it reads `op`, `before`, `after`, `key`, the position, `commit_ts` and
/// `unchanged_toast_columns`), dropping every change positioned before `truncated` (a
/// TRUNCATE already applied).
pub fn fold(rows: &BronzeRows, truncated: Option<Position>) -> Result<Folded, FoldError> {
    let after = rows.after()?;
    let truncate = (0..rows.num_rows())
        .filter(|&i| rows.op(i) == Some(ChangeOp::Truncate))
        .map(|i| rows.position(i))
        .chain(truncated)
        .max();
    let keys = keys::Keys::extract(rows, after)?;
    let groups = groups::Groups::of(rows, &keys, truncate)?;
    if groups.order.is_empty() {
        return Ok(Folded {
            rows: None,
            truncate,
            unchanged_columns: BTreeSet::new(),
        });
    }
    let winners = toast::Winners::pick(rows, after.fields(), &groups);
    let unchanged_columns = winners.unresolved.iter().flatten().cloned().collect();
    let out = output::build(rows, after, &keys, &winners)?;
    Ok(Folded {
        rows: Some(out),
        truncate,
        unchanged_columns,
    })
}

/// Every key's state after each source transaction of `rows` that changed it (what rules
/// are evaluated on), with the same columns as [`Folded::rows`] and the same TOAST fill.
/// Unlike [`fold`], a TRUNCATE inside `rows` does not drop the changes before it (each
/// transaction's result counts); only `truncated` (applied before) does.
pub struct Versions {
    /// One row per (key, transaction), in key order then position order.
    pub rows: Option<RecordBatch>,
    /// Per version, the row of `rows` (the input) that decided it.
    pub sources: Vec<usize>,
}

/// The per-transaction versions of `rows` (see [`Versions`]).
pub fn versions(rows: &BronzeRows, truncated: Option<Position>) -> Result<Versions, FoldError> {
    let after = rows.after()?;
    let keys = keys::Keys::extract(rows, after)?;
    let groups = groups::Groups::of(rows, &keys, truncated)?;
    if groups.order.is_empty() {
        return Ok(Versions {
            rows: None,
            sources: Vec::new(),
        });
    }
    let winners = toast::Winners::versions(rows, after.fields(), &groups);
    let sources = winners.actions.iter().map(|a| a.row).collect();
    let out = output::build(rows, after, &keys, &winners)?;
    Ok(Versions {
        rows: Some(out),
        sources,
    })
}

#[cfg(test)]
mod tests;
