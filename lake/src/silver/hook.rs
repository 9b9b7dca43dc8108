//! What a Silver round offers to the hooks that run inside it: the rounds' `hooks` step (plan → read → screen → fold → hooks → commit).
//!
//! A hook sees exactly the changes a round applies (screened, masked, folded with TOAST
//! values filled and tombstones respected) and takes part in the round's commit, so what it
//! records is exactly what Silver holds: the rules (`crate::rules`) are one; a filter topic
//! or a re-publisher would be others. The round calls, in order:
//!
//! 1. [`RoundHook::begin`], with Silver as it is before the round: the hook may do work of
//!    its own (the rules backfill a changed rule set) and says which changes it has already
//!    seen ([`Begun::covered`]: a round repeated after a failure must not show them again);
//! 2. [`RoundHook::changes`], after the fold and before the Silver commit, with the rows the
//!    round applies and the progress it commits;
//! 3. the Silver commit, carrying [`RoundHook::commit_actions`] (how the hook knows, at the
//!    next start, which of its own commits Silver followed).
//!
//! A round that fails calls [`RoundHook::failed`]; nothing a hook did is undone, so a hook
//! commits first what it must never lose and relies on `begin` to skip what it covered.

use deltalake::kernel::Transaction;
use deltalake::DeltaTable;
use futures::future::BoxFuture;
use wal2delta_quarantine::QuarantineRecord;

use super::{BronzeRows, Position, Progress, Tombstones};
use crate::LakeError;

/// The round as it starts.
pub struct Begin<'a> {
    /// The Silver table before the round (`None`: not created yet).
    pub silver: Option<&'a DeltaTable>,
    /// Its progress before the round.
    pub before: &'a Progress,
    /// The table's primary-key columns (Silver's names; empty when the round read no row).
    pub keys: &'a [String],
    /// The table's delete tombstones.
    pub tombstones: &'a Tombstones,
}

/// What a hook did as the round started.
#[derive(Default)]
pub struct Begun {
    /// Changes at or below this progress were seen already (their effects committed by the
    /// hook); the round still applies them to Silver.
    pub covered: Option<Progress>,
    /// The hook committed work that only a Silver commit records ([`RoundHook::commit_actions`]):
    /// the round commits even when it applies no change.
    pub needs_commit: bool,
    /// Rows the hook could not handle, for the quarantine table (appended before the
    /// Silver commit).
    pub quarantined: Vec<QuarantineRecord>,
}

/// The changes of a round, between its fold and its commit.
pub struct Changes<'a, 'r> {
    /// The Bronze rows the round applies, screened and masked as Silver stores them.
    pub rows: &'a BronzeRows<'r>,
    /// The TRUNCATE applied before the round.
    pub truncated: Option<Position>,
    /// What this hook's [`Begun::covered`] said.
    pub covered: Option<&'a Progress>,
    /// The Silver table before the round.
    pub silver: Option<&'a DeltaTable>,
    pub tombstones: &'a Tombstones,
    /// The progress the round commits.
    pub after: &'a Progress,
    /// The round completes a re-snapshot: rows the source no longer holds leave Silver
    /// (a hook holding state per row compares everything again).
    pub resnapshot: bool,
}

/// What a hook did with a round's changes.
#[derive(Default)]
pub struct Outcome {
    /// Rows the hook could not handle, for the quarantine table.
    pub quarantined: Vec<QuarantineRecord>,
}

/// A hook that runs inside every Silver round of a table (see the module docs).
pub trait RoundHook: Send {
    fn begin<'a>(&'a mut self, round: Begin<'a>) -> BoxFuture<'a, Result<Begun, LakeError>>;

    fn changes<'a>(
        &'a mut self,
        round: Changes<'a, '_>,
    ) -> BoxFuture<'a, Result<Outcome, LakeError>>;

    /// The `txn` actions the round's Silver commit carries for this hook.
    fn commit_actions(&self) -> Vec<Transaction>;

    /// The `txn` actions of a Silver commit the hook took no part in (a rebuild from
    /// Bronze): such a commit must not look as if the hook had seen its rows.
    fn untagged_actions(&self) -> Vec<Transaction>;

    /// The round failed: in this hook (`in_hook`; the hook forgets what it holds in
    /// memory and loads it again) or elsewhere (the hook only drops the tables it keeps
    /// open, as the round does).
    fn failed(&mut self, in_hook: bool);

    /// Commits what the hook holds pending (a clean stop, a benchmark's end).
    fn flush(&mut self) -> BoxFuture<'_, Result<(), LakeError>> {
        Box::pin(async { Ok(()) })
    }
}
