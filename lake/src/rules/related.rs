//! The Silver tables a table's rules look up, kept open between rounds.
//!
//! Every round needs them twice: their schemas, to know whether the compiled rules still
//! hold, and their rows, for the lookups. Opening a Silver table replays its log from the
//! last checkpoint, and an idle Silver table still commits its progress every round, so
//! that replay grew through a run (docs/benchmarks.md). Kept open, each round reads only
//! the commits since ([`delta::Kept`]); a round that fails forgets them ([`Self::forget`]),
//! so a table removed and made again is opened afresh.

use std::collections::HashMap;

use deltalake::DeltaTable;

use super::compile::{lake_name, Related};
use super::Rule;
use crate::{delta, Lake, LakeError};

#[derive(Default)]
pub(super) struct RelatedTables {
    kept: HashMap<String, delta::Kept>,
    /// The latest state of each, as of the last [`Self::refresh`] (by lake name); a table
    /// with no Silver table yet is absent.
    latest: HashMap<String, DeltaTable>,
}

impl RelatedTables {
    /// Brings every Silver table `rules` look up to its latest state; returns their
    /// schemas (of those that exist).
    pub(super) async fn refresh(
        &mut self,
        lake: &Lake,
        rules: &[Rule],
    ) -> Result<Related, LakeError> {
        let mut schemas = Related::new();
        let mut seen = std::collections::HashSet::new();
        self.latest.clear();
        for l in rules.iter().flat_map(|r| &r.lookups) {
            let name = lake_name(&l.table);
            if !seen.insert(name.clone()) {
                continue;
            }
            let (schema, table) = l.table.ident_parts();
            let label = format!("silver/{}", l.table);
            let kept = self.kept.entry(name.clone()).or_default();
            if let Some(t) = kept.latest(&label, &lake.silver(&schema, &table)).await? {
                schemas.insert(name.clone(), delta::arrow_schema(&label, &t)?);
                self.latest.insert(name, t);
            }
        }
        // Tables no rule looks up any more (or that are gone) are let go.
        self.kept.retain(|n, _| self.latest.contains_key(n));
        Ok(schemas)
    }

    /// The Silver table of the related table named `name` (its lake name), as of the last
    /// refresh.
    pub(super) fn get(&self, name: &str) -> Option<&DeltaTable> {
        self.latest.get(name)
    }

    /// Drops every kept table: the next refresh opens them afresh.
    pub(super) fn forget(&mut self) {
        self.kept.clear();
        self.latest.clear();
    }
}
