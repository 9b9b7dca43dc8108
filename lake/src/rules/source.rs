//! The running rule set, shared between the rules stage and the Silver tables, with the
//! source position each version takes effect at.
//!
//! A rule set edited in the rules table takes effect at the edit's own commit LSN `E`
//! (docs/rules.md, "Rule changes without restart"): the changes a table commits at or
//! below `E` are tagged under the rules before the edit, the changes above it under the
//! new ones, and the new rules are backfilled over the table as Silver holds it at `E`
//! (the backfill's transitions carry the LSN `E`). The silver stage makes that exact by
//! never letting a table's round cross an edit ([`RuleSource::next_edit_after`]): a table
//! stops at `E`, backfills, then goes on. So the transitions are a function of the source
//! history and the edits' positions alone, whatever the round sizes, and a replay from
//! Bronze with the same history ([`super::versions`]) gives the same ones.
//!
//! A rules file has no position in the source: its edits take effect at each table's
//! next round ([`RuleSource::replace`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use super::Rule;

/// Active rules per Silver table name, sorted by id.
type ByTable = BTreeMap<String, Vec<Rule>>;

/// The position of the first version: in effect for every change.
pub const FROM_THE_START: i64 = i64::MIN;

/// The rule set's versions, each with the LSN after which it is in effect (ascending).
#[derive(Default)]
struct History {
    versions: Vec<(i64, Arc<ByTable>)>,
}

impl History {
    /// The version in effect for the changes committed after `watermark`.
    fn at(&self, watermark: i64) -> Option<&Arc<ByTable>> {
        let i = self.versions.partition_point(|(lsn, _)| *lsn <= watermark);
        i.checked_sub(1).map(|i| &self.versions[i].1)
    }
}

/// The running rule set, shared by whoever loads it (the rules stage for a rules file, the
/// silver stage for a rules table) and every Silver table (which installs the version in
/// effect at its watermark at its next round).
#[derive(Clone, Default)]
pub struct RuleSource(Arc<RwLock<History>>);

/// `rules` grouped by Silver table name (`schema.table` with the lake's parts); only
/// active rules, sorted by id.
fn by_table(rules: &[Rule]) -> ByTable {
    let mut by_table = ByTable::new();
    for r in rules.iter().filter(|r| r.active) {
        let (schema, table) = r.table.ident_parts();
        by_table
            .entry(format!("{schema}.{table}"))
            .or_default()
            .push(r.clone());
    }
    for v in by_table.values_mut() {
        v.sort_by(|a, b| a.id.cmp(&b.id));
    }
    by_table
}

impl RuleSource {
    /// A source holding `rules` for every change.
    pub fn new(rules: &[Rule]) -> Self {
        let s = RuleSource::default();
        s.replace(rules);
        s
    }

    /// A source with the recorded versions `history` ((LSN, rules), ascending).
    pub fn with_history(history: &[(i64, Vec<Rule>)]) -> Self {
        let s = RuleSource::default();
        for (lsn, rules) in history {
            s.record(*lsn, rules);
        }
        s
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, History> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, History> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }

    /// `rules` in effect for every change from now on, whatever was recorded (a rules
    /// file: each table installs them at its next round).
    pub fn replace(&self, rules: &[Rule]) {
        self.write().versions = vec![(FROM_THE_START, Arc::new(by_table(rules)))];
    }

    /// `rules` in effect for the changes committed after `lsn`. A version at or below the
    /// last one's position replaces the versions from there on (never the case in a run:
    /// the silver stage records edits in source order).
    pub fn record(&self, lsn: i64, rules: &[Rule]) {
        let mut h = self.write();
        h.versions.retain(|(l, _)| *l < lsn);
        h.versions.push((lsn, Arc::new(by_table(rules))));
    }

    /// Whether a version was ever recorded or installed.
    pub fn is_empty(&self) -> bool {
        self.read().versions.is_empty()
    }

    /// The position of the last version (`None`: none yet).
    pub fn last_position(&self) -> Option<i64> {
        self.read().versions.last().map(|(l, _)| *l)
    }

    /// The position of the first version in effect after `watermark`: a table at
    /// `watermark` applies no change above it in its round (see the module docs).
    pub fn next_edit_after(&self, watermark: i64) -> Option<i64> {
        let h = self.read();
        let i = h.versions.partition_point(|(lsn, _)| *lsn <= watermark);
        h.versions.get(i).map(|(l, _)| *l)
    }

    /// Per Silver table, the tables its active rules look up (docs/rules.md, "Lookups"),
    /// in the version in effect after `watermark` or any later one: the silver stage
    /// applies those first and holds the table's changes until they caught up. A lookup
    /// an edit removed stops holding anyone once every table passed that edit.
    pub fn lookup_targets(&self, watermark: i64) -> BTreeMap<String, BTreeSet<String>> {
        let h = self.read();
        let from = h
            .versions
            .partition_point(|(lsn, _)| *lsn <= watermark)
            .saturating_sub(1);
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (_, set) in &h.versions[from..] {
            for (table, rules) in set.iter() {
                for l in rules.iter().flat_map(|r| &r.lookups) {
                    out.entry(table.clone())
                        .or_default()
                        .insert(super::lake_name(&l.table));
                }
            }
        }
        out
    }

    /// The active rules of Silver table `table` in the last version.
    pub fn of(&self, table: &str) -> Vec<Rule> {
        let h = self.read();
        h.versions
            .last()
            .and_then(|(_, set)| set.get(table).cloned())
            .unwrap_or_default()
    }

    /// The active rules of Silver table `table` for its changes committed after
    /// `watermark`.
    pub fn at(&self, table: &str, watermark: i64) -> Vec<Rule> {
        let h = self.read();
        h.at(watermark)
            .and_then(|set| set.get(table).cloned())
            .unwrap_or_default()
    }

    /// Every active rule in effect after `watermark`, sorted by table and id.
    pub fn all_at(&self, watermark: i64) -> Vec<Rule> {
        let h = self.read();
        h.at(watermark)
            .map(|set| set.values().flatten().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use wal2delta_model::TableName;

    use super::*;

    fn rule(id: &str, when: &str) -> Rule {
        Rule {
            id: id.into(),
            table: TableName::new("s", "t"),
            when: when.into(),
            version: 1,
            active: true,
            lookups: Vec::new(),
        }
    }

    #[test]
    fn each_version_is_in_effect_after_its_position_and_rounds_stop_at_the_next() {
        let s = RuleSource::with_history(&[
            (FROM_THE_START, vec![rule("a", "x > 1")]),
            (100, vec![rule("a", "x > 2")]),
            (200, vec![]),
        ]);
        let when = |w| s.at("s.t", w).first().map(|r| r.when.clone());
        assert_eq!(when(0), Some("x > 1".into()));
        // The edit's own transaction is tagged under the rules before it.
        assert_eq!(when(99), Some("x > 1".into()));
        assert_eq!(when(100), Some("x > 2".into()));
        assert_eq!(when(199), Some("x > 2".into()));
        assert_eq!(when(200), None);
        assert_eq!(s.next_edit_after(0), Some(100));
        assert_eq!(s.next_edit_after(100), Some(200));
        assert_eq!(s.next_edit_after(200), None);
        assert_eq!(s.of("s.t"), Vec::new(), "the last version");
        // Recording at an earlier position replaces the versions from there on.
        s.record(150, &[rule("b", "true")]);
        assert_eq!(s.last_position(), Some(150));
        assert_eq!(s.at("s.t", 160)[0].id, "b");
        assert_eq!(s.at("s.t", 120)[0].when, "x > 2");
    }

    #[test]
    fn a_removed_lookup_holds_no_table_once_every_table_passed_its_edit() {
        let mut looking = rule("a", "m.risk > 5");
        looking.lookups = vec![super::super::Lookup {
            name: "m".into(),
            table: TableName::new("s", "m"),
            on: vec![("merchant".into(), "id".into())],
        }];
        let s = RuleSource::with_history(&[
            (FROM_THE_START, vec![looking]),
            (100, vec![rule("a", "x > 2")]),
        ]);
        let looked_up = |w| s.lookup_targets(w).get("s.t").cloned().unwrap_or_default();
        assert_eq!(looked_up(50).len(), 1, "in effect before the edit");
        assert_eq!(looked_up(99).len(), 1, "the edit's own transaction");
        assert!(looked_up(100).is_empty(), "every table passed the edit");
    }

    #[test]
    fn a_source_without_versions_has_no_rules_and_no_edits() {
        let s = RuleSource::default();
        assert!(s.is_empty());
        assert!(s.at("s.t", 5).is_empty());
        assert_eq!(s.next_edit_after(5), None);
        s.replace(&[rule("a", "true")]);
        assert_eq!(s.at("s.t", i64::MIN).len(), 1);
        assert_eq!(s.next_edit_after(i64::MIN), None);
    }
}
