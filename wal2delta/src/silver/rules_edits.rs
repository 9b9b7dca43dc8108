//! The rules table, followed by the silver stage so that each edit takes effect at its own
//! commit position (docs/rules.md, "Rule changes without restart").
//!
//! The rules table is a captured table like any other; the stage applies it first in
//! every round, one source transaction of it at a time ([`RulesEdits::cap`]), and after
//! each round that changed its rows records the new rule set as in effect after the rules
//! table's watermark, which is then the edit's commit LSN `E` ([`RulesEdits::sync`];
//! persisted in `rules/versions` before any table goes past `E`). Every other table is
//! held at the rules table's watermark (as for a lookup, with the same timeout) and never
//! crosses a recorded edit in one round ([`RulesEdits::edit_cap`]): it stops at `E`,
//! its next round backfills the new rules over Silver as it is at `E`, and goes on. So the
//! transitions depend on the source history and the edits' positions only.
//!
//! While the last change of the rules table is not recorded (the lake failed), the rules
//! table does not move, so no table passes an edit that is not recorded.

use wal2delta_lake::rules::{lake_name, versions, Rule, RuleSource};
use wal2delta_lake::silver::TransactionCounts;
use wal2delta_lake::Lake;
use wal2delta_model::TableName;

use crate::metrics as m;
use crate::rules::rules_table::{read, validated};

/// The rules table as the silver stage follows it.
pub(super) struct RulesEdits {
    table: TableName,
    /// The silver stage's name of the rules table.
    name: String,
    source: RuleSource,
    /// The versions recorded in `rules/versions` (`None`: not read yet).
    recorded: Option<Vec<(i64, Vec<Rule>)>>,
    /// The rules table's rows may have changed since they were last recorded.
    dirty: bool,
    /// The Silver version of the rules table last recorded, or refused.
    synced: Option<u64>,
    /// The Silver version the rules table's last round committed.
    version: Option<u64>,
}

impl RulesEdits {
    pub(super) fn new(table: TableName, source: RuleSource) -> Self {
        RulesEdits {
            name: lake_name(&table),
            table,
            source,
            recorded: None,
            dirty: true,
            synced: None,
            version: None,
        }
    }

    /// The silver stage's name of the rules table.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// What the rules table may apply this round: its changes up to its next source
    /// transaction (inclusive), or none while its last change is not recorded.
    pub(super) fn cap(&self, counts: TransactionCounts, watermark: i64) -> TransactionCounts {
        let top = if self.dirty {
            watermark
        } else {
            counts
                .events
                .range(watermark.saturating_add(1)..)
                .next()
                .map_or(counts.top, |(lsn, _)| *lsn)
        };
        TransactionCounts {
            top: top.min(counts.top),
            ..counts
        }
    }

    /// The position other tables are held at: the rules table's watermark, or, before it
    /// has a Silver table of its own, just below its first change in the records (`None`:
    /// it has none; `counts`: its transaction records).
    pub(super) fn hold_at(
        &self,
        watermark: Option<i64>,
        counts: Option<&TransactionCounts>,
    ) -> Option<i64> {
        watermark.or_else(|| {
            counts
                .and_then(|c| c.events.keys().next())
                .map(|l| l.saturating_sub(1))
        })
    }

    /// `counts` of a table at `watermark`, stopped at the next recorded edit.
    pub(super) fn edit_cap(&self, counts: TransactionCounts, watermark: i64) -> TransactionCounts {
        match self.source.next_edit_after(watermark) {
            Some(e) if e < counts.top => TransactionCounts { top: e, ..counts },
            _ => counts,
        }
    }

    /// The rules table's round went through: its rows may have changed when it read
    /// Bronze rows and committed, or when Silver versions were committed by others since
    /// the last round (a `quarantine replay`, a rebuild).
    pub(super) fn applied(&mut self, round: super::Applied) {
        if let Some(v) = round.version {
            let skipped = self.version.is_some_and(|last| v > last + 1);
            self.dirty |= round.read > 0 || skipped;
            self.version = Some(v);
        }
    }

    /// Records the rules table's rules as in effect after `watermark` (its Silver
    /// watermark) when they differ from the version in effect there and are all valid; a
    /// set with a bad rule is refused (logged with each reason, counted), and the rules
    /// in effect go on. Returns an error when the lake cannot be read or written: the
    /// rules table then stays where it is.
    pub(super) async fn sync(&mut self, lake: &Lake, watermark: i64) -> anyhow::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        if self.recorded.is_none() {
            self.recorded = Some(versions::load(lake).await?);
        }
        let Some(snapshot) = read(lake, &self.table).await? else {
            self.dirty = false;
            return Ok(());
        };
        if self.synced == Some(snapshot.version) {
            self.dirty = false;
            return Ok(());
        }
        let (rules, errors) = validated(lake, &snapshot.rows).await?;
        let recorded = self.recorded.get_or_insert_with(Vec::new);
        if !errors.is_empty() {
            metrics::counter!(m::RULES_RELOAD_FAILURES).increment(1);
            tracing::error!(table = %self.table, version = snapshot.version, invalid = errors.len(), errors = %errors.join("; "), "the new rules of the rules table are not installed; the rules in effect go on");
        } else if in_effect(recorded, watermark) != Some(&rules) {
            if recorded.last().is_some_and(|(p, _)| *p > watermark) {
                // A replay of the rules table from Bronze, behind the recorded history:
                // the history stands (it is what the tables were tagged with).
                tracing::warn!(table = %self.table, watermark, "the rules table's rows differ from the rules recorded for this position in rules/versions (a replay?): the recorded rules stay in effect");
            } else {
                versions::append(lake, watermark, &rules).await?;
                recorded.retain(|(p, _)| *p < watermark);
                recorded.push((watermark, rules.clone()));
                self.source.record(watermark, &rules);
                tracing::info!(rules = rules.len(), table = %self.table, version = snapshot.version, effective_after_lsn = watermark, "new rules installed from the rules table: in effect for changes committed after the edit; each table backfills them when its Silver reaches the edit");
            }
        }
        self.synced = Some(snapshot.version);
        self.dirty = false;
        Ok(())
    }
}

/// The rules recorded as in effect after `watermark`.
fn in_effect(recorded: &[(i64, Vec<Rule>)], watermark: i64) -> Option<&Vec<Rule>> {
    let i = recorded.partition_point(|(p, _)| *p <= watermark);
    i.checked_sub(1).map(|i| &recorded[i].1)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn counts(top: i64, txns: &[i64]) -> TransactionCounts {
        TransactionCounts {
            top,
            events: txns.iter().map(|l| (*l, 1)).collect::<BTreeMap<_, _>>(),
            ..TransactionCounts::default()
        }
    }

    #[test]
    fn the_rules_table_moves_one_transaction_at_a_time_and_not_while_unrecorded() {
        let mut e = RulesEdits::new(TableName::new("public", "rules"), RuleSource::default());
        assert_eq!(e.cap(counts(500, &[100, 300]), 50).top, 50, "dirty: stays");
        e.dirty = false;
        assert_eq!(e.cap(counts(500, &[100, 300]), 50).top, 100);
        assert_eq!(e.cap(counts(500, &[100, 300]), 100).top, 300);
        assert_eq!(e.cap(counts(500, &[100, 300]), 300).top, 500);
        assert_eq!(e.cap(counts(80, &[100]), 50).top, 80);
        assert_eq!(e.hold_at(None, Some(&counts(500, &[100]))), Some(99));
        assert_eq!(e.hold_at(Some(40), Some(&counts(500, &[100]))), Some(40));
        assert_eq!(e.hold_at(None, None), None);
    }

    #[test]
    fn tables_stop_at_each_recorded_edit() {
        let source = RuleSource::default();
        source.record(100, &[]);
        source.record(200, &[]);
        let e = RulesEdits::new(TableName::new("public", "rules"), source);
        assert_eq!(e.edit_cap(counts(500, &[]), 50).top, 100);
        assert_eq!(e.edit_cap(counts(500, &[]), 100).top, 200);
        assert_eq!(e.edit_cap(counts(500, &[]), 200).top, 500);
        assert_eq!(e.edit_cap(counts(150, &[]), 120).top, 150);
    }
}
