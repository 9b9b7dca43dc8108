//! The running rule set, shared between the rules stage and the Silver tables.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use super::Rule;

/// Active rules per Silver table name, sorted by id.
type ByTable = BTreeMap<String, Vec<Rule>>;

/// The running rule set, shared by the rules stage (which replaces it when a valid new
/// set is loaded) and every Silver table (which installs it at its next round).
#[derive(Clone, Default)]
pub struct RuleSource(Arc<RwLock<Arc<ByTable>>>);

impl RuleSource {
    /// `rules` grouped by Silver table name (`schema.table` with the lake's parts); only
    /// active rules, sorted by id.
    pub fn new(rules: &[Rule]) -> Self {
        let s = RuleSource::default();
        s.replace(rules);
        s
    }

    pub fn replace(&self, rules: &[Rule]) {
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
        let mut guard = self.0.write().unwrap_or_else(|e| e.into_inner());
        *guard = Arc::new(by_table);
    }

    /// Per Silver table, the tables its active rules look up (docs/rules.md, "Lookups"):
    /// the silver stage applies those first and holds the table's changes until they
    /// caught up.
    pub fn lookup_targets(&self) -> BTreeMap<String, std::collections::BTreeSet<String>> {
        let guard = self.0.read().unwrap_or_else(|e| e.into_inner());
        let mut out: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for (table, rules) in guard.iter() {
            for l in rules.iter().flat_map(|r| &r.lookups) {
                out.entry(table.clone())
                    .or_default()
                    .insert(super::lake_name(&l.table));
            }
        }
        out
    }

    /// The active rules of Silver table `table`.
    pub fn of(&self, table: &str) -> Vec<Rule> {
        let guard = self.0.read().unwrap_or_else(|e| e.into_inner());
        guard.get(table).cloned().unwrap_or_default()
    }
}
