//! The evaluation budget of each rule (docs/rules.md, "Limits"): a rule whose condition
//! costs more than `[rules] max_eval_us_per_row` per row, in a round where it took at
//! least [`JUDGED_AFTER`], is disabled with the reason, and the stage goes on. A rule set
//! by anyone who may write the rules table must not be able to take the stage down.
//!
//! A disabled rule is skipped like a rule that cannot be compiled: its hits stay as they
//! were, it emits no transition, the log and `wal2delta_rules_disabled_total` say why. It is
//! enabled again by a new version (an edit), which is backfilled, or by a restart: the
//! rule set recorded with the transitions leaves the disabled rules out
//! ([`Budget::fingerprint`]), so a start with them enabled again backfills the table and
//! its hits catch up with what changed while they were disabled.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Rule, RuleError};

/// The default `[rules] max_eval_us_per_row`: 1 ms per row is a thousand times what a
/// comparison of columns costs, and would hold a round of a million rows for 15 minutes.
pub const DEFAULT_MAX_EVAL_PER_ROW: Duration = Duration::from_millis(1);

/// A rule is judged only in a round where its condition took at least this long: a round
/// of a few rows has fixed costs that say nothing of the rule.
pub const JUDGED_AFTER: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct Budget {
    per_row: Duration,
    /// Disabled rules: id → (version, reason).
    disabled: BTreeMap<String, (i64, String)>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(DEFAULT_MAX_EVAL_PER_ROW)
    }
}

impl Budget {
    pub fn new(per_row: Duration) -> Self {
        Budget {
            per_row,
            disabled: BTreeMap::new(),
        }
    }

    /// Why `rule` (this version of it) is disabled, as a rule error; `None` when enabled.
    pub fn refusal(&self, rule: &Rule) -> Option<RuleError> {
        let (version, reason) = self.disabled.get(&rule.id)?;
        (*version == rule.version).then(|| RuleError {
            id: rule.id.clone(),
            reason: reason.clone(),
        })
    }

    /// Judges a round in which each rule's condition took `took` over `rows` rows: the
    /// rules of `rules` over budget are disabled, and returned.
    pub fn judge(
        &mut self,
        rules: &[Rule],
        took: &BTreeMap<String, Duration>,
        rows: usize,
    ) -> Vec<RuleError> {
        let mut out = Vec::new();
        if rows == 0 {
            return out;
        }
        for r in rules {
            let Some(&t) = took.get(&r.id) else { continue };
            let per_row = t / rows as u32;
            if t < JUDGED_AFTER || per_row <= self.per_row || self.refusal(r).is_some() {
                continue;
            }
            let reason = format!(
                "disabled: its condition took {} µs per row over {rows} rows, past [rules] max_eval_us_per_row ({} µs); its hits stay as they were until a new version of the rule (or a restart) enables it again",
                per_row.as_micros(),
                self.per_row.as_micros()
            );
            self.disabled
                .insert(r.id.clone(), (r.version, reason.clone()));
            out.push(RuleError {
                id: r.id.clone(),
                reason,
            });
        }
        out
    }

    /// The fingerprint of `rules` as the hits reflect them: without the disabled ones.
    pub fn fingerprint(&self, rules: &[Rule]) -> i64 {
        let enabled: Vec<Rule> = rules
            .iter()
            .filter(|r| self.refusal(r).is_none())
            .cloned()
            .collect();
        super::store::fingerprint(&enabled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal2delta_model::TableName;

    fn rule(id: &str, version: i64) -> Rule {
        Rule {
            id: id.into(),
            version,
            table: TableName::new("s", "t"),
            when: "true".into(),
            active: true,
            lookups: Vec::new(),
        }
    }

    #[test]
    fn a_rule_over_its_budget_is_disabled_until_a_new_version() {
        let mut b = Budget::new(Duration::from_micros(100));
        let rules = [rule("slow", 1), rule("fast", 1)];
        let took = BTreeMap::from([
            ("slow".to_owned(), Duration::from_secs(2)),
            ("fast".to_owned(), Duration::from_millis(150)),
        ]);
        let before = b.fingerprint(&rules);
        // 2 s over 10,000 rows is 200 µs a row, over; 150 ms is 15 µs a row.
        let off = b.judge(&rules, &took, 10_000);
        assert_eq!(off.len(), 1, "only slow: {off:?}");
        assert_eq!(off[0].id, "slow");
        assert!(
            off[0].reason.contains("200 µs per row"),
            "{}",
            off[0].reason
        );
        assert!(b.refusal(&rules[0]).is_some());
        assert!(b.refusal(&rules[1]).is_none());
        assert_ne!(
            b.fingerprint(&rules),
            before,
            "the hits no longer reflect slow"
        );
        // Judged once; a new version is enabled.
        assert!(b.judge(&rules, &took, 10_000).is_empty());
        assert!(b.refusal(&rule("slow", 2)).is_none());
        // A short round is not judged, however few its rows.
        let mut b = Budget::new(Duration::from_micros(1));
        let took = BTreeMap::from([("fast".to_owned(), Duration::from_millis(99))]);
        assert!(b.judge(&rules, &took, 1).is_empty());
        assert!(b.judge(&rules, &took, 0).is_empty());
    }
}
