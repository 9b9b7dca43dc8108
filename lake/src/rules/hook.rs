//! The rules as a hook of Silver's rounds ([`crate::silver::hook`]): a round's start loads
//! the state and backfills a changed rule set ([`TableRules::start`]), its changes are
//! tagged between the fold and the Silver commit ([`TableRules::stream`]), and the Silver
//! commit records the rules seq it follows ([`TableRules::silver_txn`]).
//!
//! What a round of rules did is told to the observer the daemon gives
//! ([`TableRules::with_observer`]: metrics and logs live with the daemon), not returned
//! through Silver, which knows nothing of rules.

use std::sync::Arc;

use deltalake::kernel::Transaction;
use futures::future::BoxFuture;

use super::table::{untagged_silver_txn, RulesReport, TableRules};
use crate::silver::hook::{Begin, Begun, Changes, Outcome, RoundHook};
use crate::LakeError;

/// Told every round of rules of a table, with the table's name: a backfill (at a round's
/// start) or a streamed round (between its fold and its commit).
pub type RulesObserver = Arc<dyn Fn(&str, &RulesReport) + Send + Sync>;

impl TableRules {
    fn observe(&self, report: &RulesReport) {
        if let Some(o) = &self.observer {
            o(&self.name, report);
        }
    }
}

impl RoundHook for TableRules {
    fn begin<'a>(&'a mut self, round: Begin<'a>) -> BoxFuture<'a, Result<Begun, LakeError>> {
        Box::pin(async move {
            let start = self.start(round.silver, round.before, round.keys).await?;
            if start.covered.is_none() {
                self.reopen(
                    round.silver,
                    round.before,
                    round.keys,
                    round.tombstones,
                    start.report.is_some(),
                )
                .await?;
            }
            let mut begun = Begun {
                covered: start.covered,
                ..Begun::default()
            };
            if let Some(mut backfill) = start.report {
                // The backfill committed a new rules seq: the round records it in Silver
                // even with nothing to apply, or the next rule change would wait for the
                // table's next change.
                begun.needs_commit = true;
                begun.quarantined = std::mem::take(&mut backfill.quarantined);
                self.observe(&backfill);
            }
            Ok(begun)
        })
    }

    fn changes<'a>(
        &'a mut self,
        round: Changes<'a, '_>,
    ) -> BoxFuture<'a, Result<Outcome, LakeError>> {
        Box::pin(async move {
            if round.resnapshot {
                self.backfill_next();
            }
            let mut report = self
                .stream(
                    round.rows,
                    round.truncated,
                    round.covered,
                    round.silver,
                    round.tombstones,
                    round.after,
                )
                .await?;
            let quarantined = std::mem::take(&mut report.quarantined);
            self.observe(&report);
            Ok(Outcome { quarantined })
        })
    }

    fn commit_actions(&self) -> Vec<Transaction> {
        self.silver_txn().into_iter().collect()
    }

    fn untagged_actions(&self) -> Vec<Transaction> {
        vec![untagged_silver_txn(&self.name)]
    }

    fn failed(&mut self, in_hook: bool) {
        if in_hook {
            self.reset();
        } else {
            self.forget_tables();
        }
    }

    fn flush(&mut self) -> BoxFuture<'_, Result<(), LakeError>> {
        Box::pin(self.flush_hits(true))
    }
}

/// The hook of a table Silver applies without rules: its commits say so (a rules seq no
/// rules round writes), so rules started later backfill instead of trusting a seq recorded
/// before the table was applied untagged.
pub struct Untagged {
    table: String,
}

impl Untagged {
    pub fn new(table: &str) -> Self {
        Untagged {
            table: table.to_owned(),
        }
    }
}

impl RoundHook for Untagged {
    fn begin<'a>(&'a mut self, _: Begin<'a>) -> BoxFuture<'a, Result<Begun, LakeError>> {
        Box::pin(async { Ok(Begun::default()) })
    }

    fn changes<'a>(&'a mut self, _: Changes<'a, '_>) -> BoxFuture<'a, Result<Outcome, LakeError>> {
        Box::pin(async { Ok(Outcome::default()) })
    }

    fn commit_actions(&self) -> Vec<Transaction> {
        vec![untagged_silver_txn(&self.table)]
    }

    fn untagged_actions(&self) -> Vec<Transaction> {
        self.commit_actions()
    }

    fn failed(&mut self, _: bool) {}
}
